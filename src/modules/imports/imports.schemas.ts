import { z } from 'zod';
import { limitParam } from '../../shared/request-params.js';
import { IMPORT_KINDS } from './import-columns.js';
import { IMPORT_FORMATS, MAX_IMPORT_BYTES, MAX_IMPORT_ROWS } from './import-parser.js';

export const IMPORT_STATUSES = ['QUEUED', 'RUNNING', 'COMPLETED', 'FAILED', 'CANCELLED'] as const;
export const ROW_OUTCOMES = ['CREATED', 'UPDATED', 'UNCHANGED', 'FAILED'] as const;

const dateTime = z.string().describe('ISO 8601 date-time (UTC).').meta({ example: '2026-01-31T09:00:00.000Z' });

/** What stands for the uploaded file in the request body once it was read (import-intake.ts): what an Idempotency-Key fingerprint covers. */
export type ImportFileSummary = {
  name: string | null;
  bytes: number;
  sha256: string;
  format: (typeof IMPORT_FORMATS)[number];
  rows: number;
};

function isImportFileSummary(value: unknown): value is ImportFileSummary {
  const summary = value as Partial<ImportFileSummary> | null;
  return typeof summary === 'object' && summary !== null && typeof summary.sha256 === 'string' && typeof summary.rows === 'number';
}

const kindField = z
  .enum(IMPORT_KINDS, { error: `Must be one of ${IMPORT_KINDS.join(', ')}.` })
  .describe('individuals (rows are POST /v1/customers bodies) or entities (rows are POST /v1/entities bodies).')
  .meta({ example: 'individuals' });
const dryRunField = z
  .enum(['true', 'false'], { error: 'Must be true or false.' })
  .transform((value) => value === 'true')
  .optional()
  .describe('true: validate and match every row and report the outcomes it would have, writing no record. Default false.');

export const createImportBody = z
  .object({
    file: z
      .custom<ImportFileSummary>(isImportFileSummary, { message: 'Required: the file as a file part (with a filename).' })
      .describe(
        `The CSV (with a header row) or NDJSON file: at most ${MAX_IMPORT_ROWS} rows and ${MAX_IMPORT_BYTES} bytes (50 MiB), UTF-8. Its type is its part's Content-Type (text/csv or application/x-ndjson), else its name's extension (.csv, .ndjson or .jsonl).`,
      )
      .meta({ type: 'string', format: 'binary' }),
    kind: kindField,
    dry_run: dryRunField,
  })
  .strict();
export type CreateImportBody = z.output<typeof createImportBody>;

export const createImportQuery = z
  .object({
    kind: kindField.optional().describe('For a raw text/csv or application/x-ndjson body: individuals or entities.'),
    dry_run: dryRunField.describe('For a raw body: true for a dry run.'),
  })
  .strict();

export const importIdParams = z
  .object({ id: z.string().min(1).max(255).describe('The import id.').meta({ example: '6f1c2d3e-4b5a-4c6d-8e7f-9a0b1c2d3e4f' }) })
  .strict();

export const templateParams = z
  .object({
    file: z
      .enum(['individuals.csv', 'entities.csv'], { error: 'Must be individuals.csv or entities.csv.' })
      .describe('individuals.csv or entities.csv.')
      .meta({ example: 'individuals.csv' }),
  })
  .strict();

export const listImportsQuery = z
  .object({
    limit: limitParam,
    cursor: z.string().max(1024).optional().describe('Opaque next_cursor of the previous page.'),
  })
  .strict();
export type ListImportsQuery = z.infer<typeof listImportsQuery>;

export const listRowsQuery = z
  .object({
    limit: limitParam,
    cursor: z.string().max(1024).optional().describe('Opaque next_cursor of the previous page (JSON pages only).'),
    outcome: z
      .enum([...ROW_OUTCOMES, 'PENDING'], { error: `Must be one of ${[...ROW_OUTCOMES, 'PENDING'].join(', ')}.` })
      .optional()
      .describe('Only rows with this outcome; PENDING: rows not applied yet.')
      .meta({ example: 'FAILED' }),
    format: z
      .enum(['json', 'csv'], { error: 'Must be json or csv.' })
      .optional()
      .describe('csv: every matching row as one CSV download (as `Accept: text/csv`); json (default): a page of the list.'),
  })
  .strict();
export type ListRowsQuery = z.infer<typeof listRowsQuery>;

const countsSchema = z
  .object({
    created: z.int().describe('Rows that created a record.'),
    updated: z.int().describe('Rows that changed the record they matched.'),
    unchanged: z.int().describe('Rows that matched a record and changed nothing.'),
    failed: z.int().describe('Rows refused, each with the error its single-record request would have had.'),
  })
  .describe('Rows applied so far, by outcome (in a dry run: the outcomes they would have).');

export const importSchema = z
  .object({
    object: z.literal('import').describe('Always import.'),
    id: z.uuid().describe('The import id.'),
    kind: z.enum(IMPORT_KINDS).describe('individuals or entities.'),
    format: z.enum(IMPORT_FORMATS).describe('csv or ndjson.'),
    status: z
      .enum(IMPORT_STATUSES)
      .describe(
        'QUEUED (accepted, waiting for a worker), RUNNING, COMPLETED (every row has its outcome), FAILED (stopped by an internal error: see error), CANCELLED (stopped between batches by POST …/cancel).',
      ),
    dry_run: z.boolean().describe('A dry run writes no record; its rows report the outcomes they would have.'),
    file_name: z.string().nullable().describe('The uploaded file name; null for a raw body.'),
    file_bytes: z.int().describe('The size of the file in bytes.'),
    rows_total: z.int().describe('Data rows in the file (the header not counted).'),
    rows_done: z.int().describe('Rows applied so far (each has its outcome).'),
    counts: countsSchema,
    error: z
      .object({ code: z.string().describe('Error code.'), message: z.string().describe('What stopped it.') })
      .nullable()
      .describe('Why a FAILED import stopped; null otherwise.'),
    created_at: dateTime.describe('When the file was accepted.'),
    started_at: dateTime.nullable().describe('When a worker started it.'),
    finished_at: dateTime.nullable().describe('When it reached COMPLETED, FAILED or CANCELLED.'),
    cancel_requested_at: dateTime.nullable().describe('When a cancel was requested.'),
  })
  .describe('A bulk import of individuals or entities, applied in the background in batches.')
  .meta({
    example: {
      object: 'import',
      id: '6f1c2d3e-4b5a-4c6d-8e7f-9a0b1c2d3e4f',
      kind: 'individuals',
      format: 'csv',
      status: 'RUNNING',
      dry_run: false,
      file_name: 'clients.csv',
      file_bytes: 1843221,
      rows_total: 12000,
      rows_done: 4000,
      counts: { created: 3500, updated: 300, unchanged: 150, failed: 50 },
      error: null,
      created_at: '2026-01-31T09:00:00.000Z',
      started_at: '2026-01-31T09:00:01.000Z',
      finished_at: null,
      cancel_requested_at: null,
    },
  });
export type ImportDto = z.infer<typeof importSchema>;

export const importRowSchema = z
  .object({
    object: z.literal('import_row').describe('Always import_row.'),
    row_number: z.int().describe('1 for the first data row of the file (the header is not a row).'),
    outcome: z.enum(ROW_OUTCOMES).nullable().describe('CREATED, UPDATED, UNCHANGED or FAILED; null until the row is applied.'),
    customer_id: z.uuid().nullable().describe('The record the row created, updated or matched; null when it failed.'),
    error: z
      .object({
        code: z.string().describe('As the single-record route answers: validation_failed, conflict, …'),
        message: z.string().describe('Human-readable explanation.'),
        details: z.record(z.string(), z.unknown()).optional().describe('`issues` (field path → messages) for validation_failed.'),
      })
      .nullable()
      .describe("A FAILED row's error: the envelope body POST /v1/customers (or /v1/entities) would have answered for it."),
    data: z
      .record(z.string(), z.unknown())
      .describe('The row as read: a CSV row as its non-empty cells by column, an NDJSON line as its object.'),
  })
  .describe('One row of an import and its outcome.');
export type ImportRowDto = z.infer<typeof importRowSchema>;
