import type { ImportRow, ImportRowRow } from '../../db/schema.js';
import type { ImportDto, ImportRowDto } from './imports.schemas.js';

const iso = (value: Date | null) => (value ? value.toISOString() : null);

export function toImportDto(row: ImportRow): ImportDto {
  return {
    object: 'import',
    id: row.id,
    kind: row.kind,
    format: row.format,
    status: row.status,
    dry_run: row.dryRun,
    file_name: row.fileName,
    file_bytes: row.fileBytes,
    rows_total: row.rowsTotal,
    rows_done: row.rowsDone,
    counts: { created: row.createdCount, updated: row.updatedCount, unchanged: row.unchangedCount, failed: row.failedCount },
    error: (row.error as ImportDto['error']) ?? null,
    created_at: row.createdAt.toISOString(),
    started_at: iso(row.startedAt),
    finished_at: iso(row.finishedAt),
    cancel_requested_at: iso(row.cancelRequestedAt),
  };
}

export function toImportRowDto(row: ImportRowRow): ImportRowDto {
  return {
    object: 'import_row',
    row_number: row.rowNumber,
    outcome: row.outcome,
    customer_id: row.customerId,
    error: (row.error as ImportRowDto['error']) ?? null,
    data: row.data as Record<string, unknown>,
  };
}
