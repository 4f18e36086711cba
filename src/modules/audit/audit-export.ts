import { csvRow, type CsvCell } from '../../shared/csv.js';
import type { ChainRow } from './audit-chain.js';
import { changesOf } from './audit-changes.js';

/**
 * The file `svc audit export` writes and `svc audit verify --file` reads: one record per sealed row,
 * in sequence order, then a manifest. A record carries what GET /v1/audit-events returns for the row
 * plus its `org_id`, `before`, `after` and `hash`, so the canonical content (audit-chain.ts) can be
 * rebuilt from the file alone and every hash recomputed offline. Its `id` is the row's own id, which
 * the hash covers (the API shows the sequence in its place: the row id comes from a global sequence).
 */

export const EXPORT_FORMATS = ['ndjson', 'csv'] as const;
export type ExportFormat = (typeof EXPORT_FORMATS)[number];

/** A sealed row as the export reads it from the database. */
export type ExportSourceRow = ChainRow & { hash: string | null; keyLabel: string | null };

/** One record of an export (an ndjson line; a csv row flattens actor and subject). */
export type ExportRecord = {
  id: string;
  sequence: number;
  created_at: string;
  actor: { type: string; id: string | null; key_label: string | null };
  action: string;
  subject: { type: string; id: string | null };
  changes: Record<string, { old: unknown; new: unknown }>;
  request_id: string | null;
  idempotency_key: string | null;
  org_id: string;
  before: unknown;
  after: unknown;
  hash: string | null;
};

export type ExportManifest = {
  org_id: string;
  rows: number;
  first_sequence: number | null;
  last_sequence: number | null;
  /** The hash the first row chains to: 64 zeros for sequence 1, else the row (or purge checkpoint) before it. */
  prev_hash: string | null;
  /** The last exported row's hash: the chain's head when the export runs to the end. */
  head_hash: string | null;
  from: string | null;
  to: string | null;
  exported_at: string;
  format: ExportFormat;
};

export function toExportRecord(row: ExportSourceRow): ExportRecord {
  return {
    id: String(row.id),
    sequence: row.sequence,
    created_at: row.createdAt.toISOString(),
    actor: { type: row.actorType, id: row.actorId, key_label: row.keyLabel },
    action: row.action,
    subject: { type: row.subjectType, id: row.subjectId },
    changes: changesOf(row.before, row.after),
    request_id: row.requestId,
    idempotency_key: row.idempotencyKey,
    org_id: row.orgId,
    before: row.before ?? null,
    after: row.after ?? null,
    hash: row.hash,
  };
}

/** The chain row a record stands for: what its hash covers. */
export function chainRowOf(record: ExportRecord): ChainRow {
  return {
    orgId: record.org_id,
    id: record.id,
    sequence: record.sequence,
    createdAt: new Date(record.created_at),
    actorType: record.actor.type,
    actorId: record.actor.id,
    action: record.action,
    subjectType: record.subject.type,
    subjectId: record.subject.id,
    before: record.before,
    after: record.after,
    requestId: record.request_id,
    idempotencyKey: record.idempotency_key,
  };
}

// --- ndjson -----------------------------------------------------------------------------------

export const ndjsonRecord = (record: ExportRecord): string => `${JSON.stringify(record)}\n`;
export const ndjsonManifest = (manifest: ExportManifest): string => `${JSON.stringify({ manifest })}\n`;

// --- csv --------------------------------------------------------------------------------------

/**
 * The csv columns, written by the service's one CSV writer (src/shared/csv.ts): as in PostgreSQL's
 * COPY … CSV, an empty unquoted field is null and `""` is an empty string, and a cell a spreadsheet
 * would read as a formula (an Idempotency-Key of `=HYPERLINK(…)`) carries a leading single quote,
 * which parseCsvRow removes again, so every value round-trips and every hash still verifies; before,
 * after and changes are JSON text.
 */
export const CSV_COLUMNS = [
  'id',
  'sequence',
  'created_at',
  'org_id',
  'actor_type',
  'actor_id',
  'actor_key_label',
  'action',
  'subject_type',
  'subject_id',
  'changes',
  'before',
  'after',
  'request_id',
  'idempotency_key',
  'hash',
] as const;

/** The csv's last line: the manifest as JSON after this prefix (a line no csv record starts with). */
export const CSV_MANIFEST_PREFIX = '# manifest ';

const jsonOrNull = (value: unknown): string | null => (value === null || value === undefined ? null : JSON.stringify(value));

export const csvHeader = (): string => csvRow(CSV_COLUMNS);

export function csvRecord(record: ExportRecord): string {
  const values: Record<(typeof CSV_COLUMNS)[number], string | null> = {
    id: record.id,
    sequence: String(record.sequence),
    created_at: record.created_at,
    org_id: record.org_id,
    actor_type: record.actor.type,
    actor_id: record.actor.id,
    actor_key_label: record.actor.key_label,
    action: record.action,
    subject_type: record.subject.type,
    subject_id: record.subject.id,
    changes: JSON.stringify(record.changes),
    before: jsonOrNull(record.before),
    after: jsonOrNull(record.after),
    request_id: record.request_id,
    idempotency_key: record.idempotency_key,
    hash: record.hash,
  };
  return csvRow(CSV_COLUMNS.map((column) => values[column]));
}

export const csvManifest = (manifest: ExportManifest): string => `${CSV_MANIFEST_PREFIX}${JSON.stringify(manifest)}\n`;

/** A csv record's values (parseCsvRow) back to the record it was written from. */
export function csvToRecord(fields: CsvCell[]): ExportRecord {
  if (fields.length !== CSV_COLUMNS.length) throw new Error(`${fields.length} fields where the header has ${CSV_COLUMNS.length}`);
  const value = Object.fromEntries(CSV_COLUMNS.map((column, index) => [column, fields[index] ?? null])) as Record<
    (typeof CSV_COLUMNS)[number],
    string | null
  >;
  const required = (column: (typeof CSV_COLUMNS)[number]): string => {
    const found = value[column];
    if (found === null) throw new Error(`${column} is empty`);
    return found;
  };
  const json = (column: (typeof CSV_COLUMNS)[number]): unknown => (value[column] === null ? null : JSON.parse(value[column]));
  return {
    id: required('id'),
    sequence: Number(required('sequence')),
    created_at: required('created_at'),
    actor: { type: required('actor_type'), id: value.actor_id, key_label: value.actor_key_label },
    action: required('action'),
    subject: { type: required('subject_type'), id: value.subject_id },
    changes: json('changes') as ExportRecord['changes'],
    request_id: value.request_id,
    idempotency_key: value.idempotency_key,
    org_id: required('org_id'),
    before: json('before'),
    after: json('after'),
    hash: value.hash,
  };
}
