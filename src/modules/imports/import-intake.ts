import type { IncomingHttpHeaders } from 'node:http';
import type { Readable } from 'node:stream';
import { Busboy, type BusboyFileStream, type BusboyHeaders, type BusboyInstance } from '@fastify/busboy';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { AppError } from '../../shared/app-error.js';
import { IMPORT_KINDS, type ImportKind } from './import-columns.js';
import { MAX_IMPORT_BYTES, payloadTooLarge, readImportFile, removeSpool, type ImportFormat, type SpooledImport } from './import-parser.js';
import type { ImportFileSummary } from './imports.schemas.js';

/**
 * The intake of POST /v1/imports: the file is parsed and checked while it streams (import-parser.ts)
 * and its rows spooled to a local file, whichever way it comes: a multipart/form-data form (a `file`
 * part, and `kind`, `dry_run` fields) or the raw body as text/csv or application/x-ndjson (`kind` and
 * `dry_run` in the query string). Why spool rather than write to the database as it arrives: a slow
 * client must hold no connection or transaction (PostgreSQL ends a transaction idle for 10 s), and
 * an Idempotency-Key's fingerprint needs the file's hash before the handler runs. The body becomes
 * `{file: ImportFileSummary, kind, dry_run}`, for the schema and the fingerprint; the spool itself is
 * importUploadOf(request)'s, removed when the response closes.
 */

export type ImportUpload = { file: SpooledImport; fileName: string | null };
type IntakeState = { closed: boolean; upload?: ImportUpload };
const states = new WeakMap<FastifyRequest, IntakeState>();

/** A form's overhead besides its file: part headers, boundaries, two short fields. */
const FORM_OVERHEAD_BYTES = 64 * 1024;
const TEXT_FIELDS: Readonly<Record<string, number>> = { kind: 32, dry_run: 16 };
const RAW_TYPES: Readonly<Record<string, ImportFormat>> = { 'text/csv': 'csv', 'application/x-ndjson': 'ndjson' };

const unsupported = () =>
  new AppError(
    'unsupported_media_type',
    415,
    'Send the file as multipart/form-data (a `file` part), or as the raw body with Content-Type text/csv or application/x-ndjson (UTF-8).',
    { accepted: ['multipart/form-data', 'text/csv', 'application/x-ndjson'] },
  );

const validKind = (value: unknown): ImportKind | undefined =>
  typeof value === 'string' && (IMPORT_KINDS as readonly string[]).includes(value) ? (value as ImportKind) : undefined;

/** A charset other than UTF-8 on the body's (or the file part's) media type is refused: the file is read as UTF-8. */
function checkCharset(contentType: string | undefined): void {
  const charset = /;\s*charset\s*=\s*"?([^";\s]+)/i.exec(contentType ?? '')?.[1];
  if (charset !== undefined && !/^utf-?8$/i.test(charset)) {
    throw new AppError('unsupported_media_type', 415, `The file must be UTF-8 text; it was sent as ${charset}.`);
  }
}

/** A part's format: its Content-Type, else its name's extension; CSV unless either says NDJSON. */
function formatOfPart(mimeType: string | undefined, fileName: string | undefined): ImportFormat {
  const type = (mimeType ?? '').split(';')[0]!.trim().toLowerCase();
  if (type === 'application/x-ndjson' || type === 'application/jsonl' || /\.(ndjson|jsonl)$/i.test(fileName ?? '')) return 'ndjson';
  return 'csv';
}

function summaryOf(upload: ImportUpload): ImportFileSummary {
  return {
    name: upload.fileName,
    bytes: upload.file.bytes,
    sha256: upload.file.sha256,
    format: upload.file.format,
    rows: upload.file.rowsTotal,
  };
}

/** `kind` and `dry_run` of a form, or of the query string when the form has none; both, if they differ, is a 422. */
function formValue(name: 'kind' | 'dry_run', fields: Record<string, string>, query: Record<string, unknown>): string | undefined {
  const fromQuery = typeof query[name] === 'string' ? query[name] : undefined;
  const fromForm = fields[name];
  if (fromForm !== undefined && fromQuery !== undefined && fromForm !== fromQuery) {
    throw AppError.field(name, 'Sent as a form field and as a query parameter with different values; send it once.');
  }
  return fromForm ?? fromQuery;
}

/** Reads a multipart/form-data import form; settles once its file is read and spooled (or is refused). */
function readImportForm(
  headers: IncomingHttpHeaders,
  payload: Readable,
  query: Record<string, unknown>,
): Promise<{ fields: Record<string, string>; upload: ImportUpload }> {
  if (Number(headers['content-length']) > MAX_IMPORT_BYTES + FORM_OVERHEAD_BYTES) return Promise.reject(payloadTooLarge());
  return new Promise((resolve, reject) => {
    let busboy: BusboyInstance;
    try {
      busboy = Busboy({
        headers: headers as BusboyHeaders,
        limits: { fieldSize: 128, fields: Object.keys(TEXT_FIELDS).length + 1, files: 2, parts: 6, fieldNameSize: 200 },
      });
    } catch {
      reject(new AppError('bad_request', 400, 'The multipart/form-data body has no valid boundary in its Content-Type.'));
      return;
    }
    const fields: Record<string, string> = Object.create(null);
    let reading: Promise<ImportUpload> | undefined;
    let fileStream: BusboyFileStream | undefined;
    let received = 0;
    let settled = false;

    function fail(error: unknown): void {
      if (settled) return;
      settled = true;
      // Stop reading: the rest of the body is neither parsed nor spooled.
      payload.unpipe(busboy);
      payload.off('data', countBytes);
      payload.pause();
      // A file still being read stops (its spool is discarded); one already complete is removed.
      if (fileStream && !fileStream.readableEnded) fileStream.destroy(new Error('upload refused'));
      void reading?.then((upload) => removeSpool(upload.file.spoolPath)).catch(() => undefined);
      reject(error);
    }
    function countBytes(chunk: Buffer): void {
      received += chunk.length;
      if (received > MAX_IMPORT_BYTES + FORM_OVERHEAD_BYTES) fail(payloadTooLarge());
    }

    busboy.on('field', (name: string, value: string, _nameTruncated: boolean, valueTruncated: boolean) => {
      if (settled) return;
      const limit = TEXT_FIELDS[name];
      if (name === 'file') fail(AppError.field(name, 'Must be a file part (with a filename).'));
      else if (limit === undefined) fail(AppError.field(name, 'Unknown field. The form takes file, kind and dry_run.'));
      else if (name in fields) fail(AppError.field(name, 'Sent more than once.'));
      else if (valueTruncated || value.length > limit) fail(AppError.field(name, `Must be at most ${limit} characters.`));
      else fields[name] = value;
    });

    busboy.on('file', (name: string, stream: BusboyFileStream, fileName: string | undefined, _encoding: string, mimeType: string) => {
      if (settled) {
        stream.resume();
        return;
      }
      if (name !== 'file') {
        stream.resume();
        return fail(
          AppError.field(
            name,
            name in TEXT_FIELDS ? 'Must be a text field, not a file.' : 'Unknown field. The form takes file, kind and dry_run.',
          ),
        );
      }
      if (reading) {
        stream.resume();
        return fail(AppError.field('file', 'One file per import.'));
      }
      try {
        checkCharset(mimeType);
      } catch (error) {
        stream.resume();
        return fail(error);
      }
      const format = formatOfPart(mimeType, fileName);
      fileStream = stream;
      reading = readImportFile(stream, { format, kind: () => validKind(fields.kind ?? query.kind) }).then((file) => ({
        file,
        fileName: fileName === undefined || fileName === '' ? null : fileName,
      }));
      reading.catch((error: unknown) => fail(error));
    });

    busboy.on('partsLimit', () => fail(AppError.field('body', 'The form has more parts than an import takes (file, kind, dry_run).')));
    busboy.on('fieldsLimit', () => fail(AppError.field('body', 'The form has more fields than an import takes (kind, dry_run).')));
    busboy.on('filesLimit', () => fail(AppError.field('file', 'One file per import.')));
    busboy.on('error', () => fail(new AppError('bad_request', 400, 'The multipart/form-data body is malformed.')));
    busboy.on('finish', () => {
      if (settled) return;
      if (!reading) return fail(AppError.field('file', 'Required: the file as a file part (with a filename).'));
      reading.then(
        (upload) => {
          if (settled) {
            void removeSpool(upload.file.spoolPath);
            return;
          }
          settled = true;
          payload.off('data', countBytes);
          resolve({ fields: { ...fields }, upload });
        },
        (error: unknown) => fail(error),
      );
    });

    payload.on('data', countBytes);
    // The request stream's own failure (the client went away) is passed on as it is: the error handler recognises it.
    payload.on('error', (error) => fail(error));
    payload.on('close', () => {
      if (!payload.readableEnded) fail(Object.assign(new Error('aborted'), { code: 'ECONNRESET', statusCode: 400 }));
    });
    payload.pipe(busboy);
  });
}

/** Keeps the upload of a request whose response may already be gone: it is removed then. */
function keep(request: FastifyRequest, upload: ImportUpload): void {
  const state = states.get(request);
  if (!state || state.closed) {
    void removeSpool(upload.file.spoolPath);
    throw new AppError('bad_request', 400, 'The connection closed before the upload was read.');
  }
  state.upload = upload;
}

/**
 * Makes the routes of the calling (encapsulated) context take an import file as a multipart form
 * or a raw text/csv or application/x-ndjson body; any other content type, or none, is a 415 before a
 * byte is read. Authentication, scope and rate limits (onRequest) run before the body is read.
 */
export function registerImportIntake(app: FastifyInstance): void {
  app.addHook('onRequest', (request: FastifyRequest, reply: FastifyReply, done) => {
    const state: IntakeState = { closed: false };
    states.set(request, state);
    reply.raw.once('close', () => {
      state.closed = true;
      if (state.upload) void removeSpool(state.upload.file.spoolPath);
    });
    done();
  });

  app.removeAllContentTypeParsers();
  app.addContentTypeParser('multipart/form-data', async (request: FastifyRequest, payload: Readable) => {
    const query = (request.query ?? {}) as Record<string, unknown>;
    const { fields, upload } = await readImportForm(request.headers, payload, query);
    keep(request, upload);
    const body: Record<string, unknown> = { file: summaryOf(upload) };
    const kind = formValue('kind', fields, query);
    const dryRun = formValue('dry_run', fields, query);
    if (kind !== undefined) body.kind = kind;
    if (dryRun !== undefined) body.dry_run = dryRun;
    return body;
  });
  app.addContentTypeParser(Object.keys(RAW_TYPES), async (request: FastifyRequest, payload: Readable) => {
    checkCharset(request.headers['content-type']);
    const query = (request.query ?? {}) as Record<string, unknown>;
    // Known before a byte is read: the header is checked against the kind's columns at once.
    const kind = validKind(query.kind);
    if (!kind) {
      throw AppError.field('kind', `Required as a query parameter with a raw body: one of ${IMPORT_KINDS.join(', ')}.`);
    }
    if (Number(request.headers['content-length']) > MAX_IMPORT_BYTES) throw payloadTooLarge();
    const type = (request.headers['content-type'] ?? '').split(';')[0]!.trim().toLowerCase();
    const file = await readImportFile(payload, { format: RAW_TYPES[type] ?? 'csv', kind: () => kind });
    const upload: ImportUpload = { file, fileName: null };
    keep(request, upload);
    const body: Record<string, unknown> = { file: summaryOf(upload), kind };
    if (typeof query.dry_run === 'string') body.dry_run = query.dry_run;
    return body;
  });
  app.addContentTypeParser('*', (_request: FastifyRequest, _payload: Readable, done: (error: Error | null, body?: unknown) => void) => {
    done(unsupported());
  });
  // No body at all reaches no parser.
  app.addHook('preValidation', (request: FastifyRequest, _reply: FastifyReply, done) => {
    done(states.get(request)?.upload ? undefined : unsupported());
  });
}

/** The spooled upload of a request of a context set up by registerImportIntake. */
export function importUploadOf(request: FastifyRequest): ImportUpload {
  const upload = states.get(request)?.upload;
  if (!upload) throw unsupported();
  return upload;
}
