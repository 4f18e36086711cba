import type { DataAccess } from '../../db/client.js';
import { AppError } from '../../shared/app-error.js';
import type { AuditWriter } from '../../shared/audit-writer.js';
import { csvRow, csvRows, type CsvCell } from '../../shared/csv.js';
import { isUuid } from '../../shared/ids.js';
import { QUEUES, type JobQueue } from '../../shared/job-runner.js';
import {
  checkFingerprint,
  decodeCursor,
  encodeCursor,
  filterFingerprint,
  notACursor,
  openCursor,
  signCursor,
  type CursorKey,
} from '../../shared/list-cursor.js';
import { listPage, type ListPage } from '../../shared/list-envelope.js';
import type { OutboxRepository } from '../../shared/outbox.js';
import type { RequestContext } from '../../shared/request-context.js';
import { bodyToCells, DOWNLOAD_COLUMNS, importColumns, TEMPLATE_EXAMPLES, type ImportKind } from './import-columns.js';
import { toImportDto, toImportRowDto } from './import-dto.js';
import { spooledRowChunks, type SpooledImport } from './import-parser.js';
import { createImportWorker, type ImportUpserts } from './import-worker.js';
import type { ImportsRepository } from './imports.repository.js';
import type { ImportDto, ImportRowDto, ListImportsQuery, ListRowsQuery } from './imports.schemas.js';

/** Rows per INSERT while an upload is stored: one statement of a thousand rows, whatever the file's size. */
const INSERT_CHUNK = 1_000;
/** Rows per read while the rows download is written. */
const DOWNLOAD_PAGE = 1_000;
const DEFAULT_PAGE = 50;

/** An accepted upload, read and spooled (readImportFile), to be stored as an import. */
export type NewImport = { kind: ImportKind; dryRun: boolean; fileName: string | null; file: SpooledImport };

function rowCursor(rowNumber: number, fingerprint: string, key: Buffer): string {
  return signCursor({ r: rowNumber, f: fingerprint }, key);
}

function rowOfCursor(cursor: string, fingerprint: string, key: Buffer): number {
  const fields = openCursor(cursor, key);
  if (typeof fields.r !== 'number' || !Number.isSafeInteger(fields.r) || fields.r < 0) throw notACursor();
  checkFingerprint(fields, fingerprint);
  return fields.r;
}

/**
 * Bulk imports (issue 46): storing an upload as an import with its rows and its job (create), reading
 * imports and their rows (JSON pages or one CSV download), cancelling, the templates, and the worker's
 * run (import-worker.ts) that applies the rows through the customers and entities services' upserts.
 */
export function createImportsService(
  deps: ImportUpserts & {
    database: DataAccess;
    cursorKey: CursorKey;
    jobs: JobQueue;
    audit: AuditWriter;
    outbox: OutboxRepository;
    imports: ImportsRepository;
    /** Tests only: rows per batch of the worker (default IMPORT_BATCH). */
    importBatchSize?: number;
  },
) {
  const { database, cursorKey, jobs, audit, imports } = deps;
  const worker = createImportWorker({ ...deps, batchSize: deps.importBatchSize });

  async function requireImport(ctx: RequestContext, id: string) {
    const row = isUuid(id) ? await imports.find(ctx.orgId, id, database.db) : undefined;
    if (!row) throw AppError.notFound('Import');
    return row;
  }

  return {
    /**
     * Stores the upload as a QUEUED import: the import, its rows (from the spool, a thousand per
     * statement), its audit row and its job, in the request's one transaction: all or nothing.
     */
    async create(ctx: RequestContext, input: NewImport): Promise<ImportDto> {
      const { file } = input;
      return ctx.transaction(async (tx) => {
        const row = await imports.insert(
          {
            orgId: ctx.orgId,
            kind: input.kind,
            format: file.format,
            dryRun: input.dryRun,
            fileName: input.fileName,
            fileBytes: file.bytes,
            fileSha256: file.sha256,
            columns: file.format === 'csv' ? file.columns : importColumns(input.kind),
            rowsTotal: file.rowsTotal,
            actorType: ctx.actor.type,
            actorId: ctx.actor.id,
            requestId: ctx.actor.requestId ?? null,
            idempotencyKey: ctx.actor.idempotencyKey ?? null,
          },
          tx,
        );
        let stored = 0;
        for await (const chunk of spooledRowChunks(file.spoolPath, INSERT_CHUNK)) {
          await imports.insertRows(ctx.orgId, row.id, stored + 1, chunk, tx);
          stored += chunk.length;
        }
        if (stored !== file.rowsTotal) throw new Error(`import spool holds ${stored} rows, ${file.rowsTotal} were read`);
        const dto = toImportDto(row);
        await audit.record(
          {
            orgId: ctx.orgId,
            actor: ctx.actor,
            action: 'import.created',
            subjectType: 'import',
            subjectId: row.id,
            before: null,
            after: dto,
          },
          tx,
        );
        // One job per import; at most one import of an organisation runs at a time (jobs.ts, IMPORT_WORK).
        await jobs.send(tx, QUEUES.importRun.name, { orgId: ctx.orgId, importId: row.id }, { group: ctx.orgId });
        return dto;
      });
    },

    async get(ctx: RequestContext, id: string): Promise<ImportDto> {
      return toImportDto(await requireImport(ctx, id));
    },

    /** The organisation's imports, newest first (created_at, then id, descending). */
    async list(ctx: RequestContext, query: ListImportsQuery): Promise<ListPage<ImportDto>> {
      const limit = query.limit ?? DEFAULT_PAGE;
      const fingerprint = filterFingerprint({ list: 'imports' });
      const key = await cursorKey();
      const before = query.cursor ? decodeCursor(query.cursor, fingerprint, key) : undefined;
      const rows = await imports.list(ctx.orgId, { before, limit: limit + 1 }, database.db);
      return listPage(rows, limit, toImportDto, (last) => encodeCursor(last, fingerprint, key));
    },

    /** A page of the import's rows in row order, optionally of one outcome. */
    async rows(ctx: RequestContext, id: string, query: ListRowsQuery): Promise<ListPage<ImportRowDto>> {
      const row = await requireImport(ctx, id);
      const limit = query.limit ?? DEFAULT_PAGE;
      const fingerprint = filterFingerprint({ import: row.id, outcome: query.outcome ?? null });
      const key = await cursorKey();
      const afterRow = query.cursor ? rowOfCursor(query.cursor, fingerprint, key) : 0;
      const rows = await imports.rows(ctx.orgId, row.id, { afterRow, limit: limit + 1, outcome: query.outcome }, database.db);
      const page = rows.slice(0, limit);
      const hasMore = rows.length > limit;
      const last = page.at(-1);
      return {
        object: 'list',
        data: page.map(toImportRowDto),
        has_more: hasMore,
        next_cursor: hasMore && last ? rowCursor(last.rowNumber, fingerprint, key) : null,
        limit,
      };
    },

    /**
     * Every matching row as CSV, written a page at a time: row_number, outcome, customer_id, the error's
     * code and message, then the file's own columns, every cell neutralised (src/shared/csv.ts). The
     * import is looked up first, so a missing one is a 404 before any byte is sent.
     */
    async rowsCsv(ctx: RequestContext, id: string, query: Pick<ListRowsQuery, 'outcome'>): Promise<AsyncIterable<string>> {
      const row = await requireImport(ctx, id);
      const columns = row.columns;
      const cellsOf = (data: unknown): Record<string, unknown> =>
        row.format === 'csv' ? (data as Record<string, unknown>) : bodyToCells(row.kind, data);
      return (async function* () {
        yield csvRow([...DOWNLOAD_COLUMNS, ...columns]);
        let afterRow = 0;
        for (;;) {
          const page = await imports.rows(ctx.orgId, row.id, { afterRow, limit: DOWNLOAD_PAGE, outcome: query.outcome }, database.db);
          if (page.length === 0) return;
          yield csvRows(
            page.map((item) => {
              const error = item.error as { code?: string; message?: string } | null;
              const cells = cellsOf(item.data);
              const own = columns.map((column): CsvCell => (typeof cells[column] === 'string' ? cells[column] : null));
              return [String(item.rowNumber), item.outcome, item.customerId, error?.code ?? null, error?.message ?? null, ...own];
            }),
          );
          if (page.length < DOWNLOAD_PAGE) return;
          afterRow = page.at(-1)!.rowNumber;
        }
      })();
    },

    /**
     * POST /v1/imports/{id}/cancel: a QUEUED import is CANCELLED at once; a RUNNING one stops before its
     * next batch (its rows applied so far stay). One that already finished is a 409.
     */
    async cancel(ctx: RequestContext, id: string): Promise<ImportDto> {
      const existing = await requireImport(ctx, id);
      return ctx.transaction(async (tx) => {
        const row = await imports.requestCancel(ctx.orgId, existing.id, tx);
        if (!row) {
          const current = (await imports.find(ctx.orgId, existing.id, tx)) ?? existing;
          throw AppError.conflict(`The import has already finished (${current.status}); there is nothing to cancel.`, {
            status: current.status,
          });
        }
        const dto = toImportDto(row);
        await audit.record(
          {
            orgId: ctx.orgId,
            actor: ctx.actor,
            action: 'import.cancel_requested',
            subjectType: 'import',
            subjectId: row.id,
            before: toImportDto(existing),
            after: dto,
          },
          tx,
        );
        return dto;
      });
    },

    /** GET /v1/imports/templates/{kind}.csv: the header row and one example row. */
    template(kind: ImportKind): string {
      const columns = importColumns(kind);
      const example = TEMPLATE_EXAMPLES[kind];
      return csvRows([columns, columns.map((column) => example[column] ?? null)]);
    },

    /** Applies the import's rows (the job's work; the CLI may call it too): see createImportWorker. */
    run: worker.run,
  };
}
export type ImportsService = ReturnType<typeof createImportsService>;
