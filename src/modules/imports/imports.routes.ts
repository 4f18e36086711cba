import { Readable } from 'node:stream';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { errorEnvelopeSchema } from '../../shared/error-envelope.schema.js';
import { errorResponses } from '../../shared/error-responses.js';
import { listEnvelope } from '../../shared/list-envelope.js';
import { requestContext } from '../../shared/request-context.js';
import type { ImportKind } from './import-columns.js';
import { importUploadOf, registerImportIntake } from './import-intake.js';
import { MAX_CELL_CHARS, MAX_IMPORT_BYTES, MAX_IMPORT_ROWS } from './import-parser.js';
import {
  createImportBody,
  createImportQuery,
  importIdParams,
  importRowSchema,
  importSchema,
  listImportsQuery,
  listRowsQuery,
  templateParams,
} from './imports.schemas.js';

const jsonError = (description: string) => ({ description, content: { 'application/json': { schema: errorEnvelopeSchema } } });
const csvText = z.string().describe('CSV text (UTF-8), a header row first.');

const CREATE_DESCRIPTION =
  'Uploads a file of individuals or entities to create or update in the background, and answers 202 at once with the QUEUED import (poll GET /v1/imports/{id}). ' +
  'Send it as multipart/form-data (a `file` part, and `kind` and `dry_run` fields) or as the raw body with Content-Type `text/csv` or `application/x-ndjson` and `kind` and `dry_run` in the query string. ' +
  `CSV: a header row of the request fields of POST /v1/customers (kind individuals) or POST /v1/entities (kind entities), dotted for nested ones (\`risk.isNewCustomer\`, \`contact.fullName\`), \`;\` between list items (\`designatedServices\`), \`true\`/\`false\` for booleans, an empty cell for a field left out (templates: GET /v1/imports/templates/{kind}.csv). NDJSON: one request body per line. ` +
  `At most ${MAX_IMPORT_ROWS} rows and ${MAX_IMPORT_BYTES} bytes (50 MiB), UTF-8, a cell at most ${MAX_CELL_CHARS} characters. ` +
  'The file is checked as it streams: one that is binary, not UTF-8, has no header, unknown columns, a ragged row or an oversized cell is refused with 422 naming the line, row and column (`details.line`, `details.row`, `details.column`), and nothing is stored. ' +
  'Each row is then applied exactly as its single request would be (the same validation, matching, status derivation, 409 and 422 conditions; audited per record; `added_via` BULK_IMPORT; never starts verification nor charges), in batches each committed on its own; a refused row ends FAILED with the error its request would have had. ' +
  'A dry run validates and matches every row and reports the outcomes it would have, writing no record. One `import.completed` event fires when every row is done. ' +
  'With an Idempotency-Key, a retry carrying the same file replays the first answer; the same key with another file is a 409.';

export async function importsRoutes(fastify: FastifyInstance): Promise<void> {
  const app = fastify.withTypeProvider<ZodTypeProvider>();
  const imports = app.services.imports;
  const tags = ['Imports'];

  // Its own context: this route alone takes multipart/form-data, text/csv and application/x-ndjson bodies.
  await app.register(async (uploads) => {
    registerImportIntake(uploads);
    uploads.withTypeProvider<ZodTypeProvider>().post(
      '/imports',
      {
        schema: {
          operationId: 'createImport',
          tags,
          summary: 'Import a file of individuals or entities',
          description: CREATE_DESCRIPTION,
          consumes: ['multipart/form-data'],
          querystring: createImportQuery,
          body: createImportBody,
          response: {
            202: importSchema,
            ...errorResponses(401, 403, 409, 422, 429),
            413: jsonError(
              `Payload too large: \`payload_too_large\` — the file exceeds ${MAX_IMPORT_BYTES} bytes (50 MiB); nothing was stored.`,
            ),
            415: jsonError(
              'Unsupported media type: `unsupported_media_type` — not multipart/form-data, text/csv or application/x-ndjson, or not UTF-8; nothing was stored.',
            ),
          },
        },
      },
      async (request, reply) => {
        const upload = importUploadOf(request);
        const created = await imports.create(requestContext(request), {
          kind: request.body.kind,
          dryRun: request.body.dry_run ?? false,
          fileName: upload.fileName,
          file: upload.file,
        });
        reply.code(202);
        return created;
      },
    );
  });

  app.get(
    '/imports',
    {
      schema: {
        operationId: 'listImports',
        tags,
        summary: 'List imports',
        description:
          'The organisation’s imports, newest first by (created_at, id), with an opaque cursor. Imports are kept IMPORT_RETENTION_DAYS (30 by default) after they finish.',
        querystring: listImportsQuery,
        response: {
          200: listEnvelope(importSchema, 'newest first (created_at, then id, descending)'),
          ...errorResponses(401, 403, 422, 429),
        },
      },
    },
    async (request) => imports.list(requestContext(request), request.query),
  );

  app.get(
    '/imports/templates/:file',
    {
      schema: {
        operationId: 'getImportTemplate',
        tags,
        summary: 'The CSV template of a kind',
        description:
          'The header row of every column an import of the kind takes (the request fields of POST /v1/customers or /v1/entities, dotted for nested ones), and one example row.',
        params: templateParams,
        response: {
          200: { description: 'The template.', content: { 'text/csv': { schema: csvText } } },
          ...errorResponses(401, 403, 404, 422, 429),
        },
      },
    },
    async (request, reply) => {
      const kind = request.params.file.replace(/\.csv$/, '') as ImportKind;
      reply.header('Content-Type', 'text/csv; charset=utf-8');
      reply.header('Content-Disposition', `attachment; filename="${kind}-template.csv"`);
      return imports.template(kind);
    },
  );

  app.get(
    '/imports/:id',
    {
      schema: {
        operationId: 'getImport',
        tags,
        summary: 'Get an import',
        description: 'Its status, rows_done of rows_total, counts per outcome and its times: poll it while it runs.',
        params: importIdParams,
        response: { 200: importSchema, ...errorResponses(401, 403, 404, 429) },
      },
    },
    async (request) => imports.get(requestContext(request), request.params.id),
  );

  app.get(
    '/imports/:id/rows',
    {
      schema: {
        operationId: 'listImportRows',
        tags,
        summary: 'List the rows of an import and their outcomes',
        description:
          'In row order with an opaque cursor; `outcome=FAILED` gives the rows to fix. With `Accept: text/csv` or `format=csv`, every matching row as one CSV download: row_number, outcome, customer_id, error_code, error_message, then the file’s own columns, every cell neutralised against spreadsheet formulas. A corrected download can be imported again as it is (its first five columns are ignored).',
        params: importIdParams,
        querystring: listRowsQuery,
        response: {
          200: {
            description: 'A page of rows (JSON), or the CSV download.',
            content: {
              'application/json': { schema: listEnvelope(importRowSchema, 'in row order') },
              'text/csv': { schema: csvText },
            },
          },
          ...errorResponses(401, 403, 404, 422, 429),
        },
      },
    },
    async (request, reply) => {
      const wantsCsv =
        request.query.format === 'csv' || (request.query.format === undefined && /\btext\/csv\b/i.test(request.headers.accept ?? ''));
      if (!wantsCsv) return imports.rows(requestContext(request), request.params.id, request.query);
      const csv = await imports.rowsCsv(requestContext(request), request.params.id, request.query);
      reply.header('Content-Type', 'text/csv; charset=utf-8');
      reply.header('Content-Disposition', `attachment; filename="import-${request.params.id}-rows.csv"`);
      // A stream is sent as it is (never serialized); the schema's string only documents it.
      return reply.send(Readable.from(csv) as unknown as string);
    },
  );

  app.post(
    '/imports/:id/cancel',
    {
      schema: {
        operationId: 'cancelImport',
        tags,
        summary: 'Cancel an import',
        description:
          'A QUEUED import is CANCELLED at once; a RUNNING one stops between batches (cancel_requested_at is set now, status CANCELLED once its worker stops). The rows applied so far stay. An import that already finished is a 409.',
        params: importIdParams,
        response: { 200: importSchema, ...errorResponses(401, 403, 404, 409, 429) },
      },
    },
    async (request) => imports.cancel(requestContext(request), request.params.id),
  );
}
