import { createHash, randomUUID } from 'node:crypto';
import { createReadStream, createWriteStream, type ReadStream, type WriteStream } from 'node:fs';
import { rm } from 'node:fs/promises';
import type { IncomingHttpHeaders } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Transform, type Readable, type TransformCallback } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { Busboy, type BusboyFileStream, type BusboyHeaders, type BusboyInstance } from '@fastify/busboy';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { AppError } from '../../shared/app-error.js';
import { MAX_DOCUMENT_BYTES, type DocumentMediaType } from './document-types.js';

/** The longest file name kept with a document (what common file systems allow); a longer one is refused. */
const MAX_FILE_NAME_LENGTH = 255;

/**
 * Streaming multipart/form-data intake for document uploads. Each file is spooled to a temp file
 * while its size and SHA-256 are computed and its media type is sniffed from its first bytes; the
 * request is answered from the spooled copy. Why spool rather than stream into the database: a slow
 * client must not hold a database connection, a transaction and the idempotency lock for the whole
 * upload, and the fingerprint of an idempotent upload needs the file's hash before the handler runs.
 * The database write is then one short transaction reading from local disk.
 */

/** A file of the form, complete on local disk. `path` is removed once the response has gone. */
export type SpooledFile = {
  /** The form field it came in. */
  field: string;
  /** The name the client gave it (display only: never trusted for the type); null without one. */
  fileName: string | null;
  size: number;
  /** Lower-case hex. */
  sha256: string;
  /** Sniffed from the content; the part's declared Content-Type is ignored. */
  mediaType: DocumentMediaType;
  path: string;
};

export type MultipartForm = { fields: Record<string, string>; files: SpooledFile[] };

export type MultipartIntakeOptions = {
  /** The fields that may carry a file. */
  fileFields: readonly string[];
  /** At most this many files in all. */
  maxFiles: number;
  /** The text fields allowed, each with its longest value in characters. */
  textFields: Readonly<Record<string, number>>;
  /** The largest file accepted; default MAX_DOCUMENT_BYTES (10 MiB). */
  maxFileBytes?: number;
  /** The issue for a file part in a field that is not a file field; default "Unknown field." (or, for a text field, that it must be text). */
  refusedFileField?: (field: string) => string;
  /** The issue for a file beyond maxFiles; default "At most N file(s) per request." */
  tooManyFiles?: string;
};

/**
 * What one request's form may carry, known before its body is read (the upload page: the request's
 * outstanding types, and what is left of its allowance of documents): it narrows the context's options.
 */
export type FormNarrowing = Required<Pick<MultipartIntakeOptions, 'fileFields' | 'maxFiles'>> &
  Pick<MultipartIntakeOptions, 'refusedFileField' | 'tooManyFiles'>;

/** What a form may carry besides its files' bytes: part headers, boundaries, text fields. */
const FORM_OVERHEAD_BYTES = 64 * 1024;
const SPOOL_PREFIX = 'svc-upload-';

/**
 * The media type of a document by its first bytes: PDF (`%PDF-`), PNG (its 8-byte signature) or
 * JPEG (FF D8 FF); undefined for anything else. Eight bytes decide every case.
 */
const SNIFF_BYTES = 8;
const PDF = Buffer.from('%PDF-', 'latin1');
const PNG = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
const JPEG = Buffer.from([0xff, 0xd8, 0xff]);
function sniffMediaType(head: Buffer): DocumentMediaType | undefined {
  const startsWith = (signature: Buffer) => head.length >= signature.length && head.subarray(0, signature.length).equals(signature);
  if (startsWith(PDF)) return 'application/pdf';
  if (startsWith(PNG)) return 'image/png';
  if (startsWith(JPEG)) return 'image/jpeg';
  return undefined;
}

/** The largest request body a form under `options` can be. */
function multipartBodyLimit(options: MultipartIntakeOptions): number {
  return (options.maxFileBytes ?? MAX_DOCUMENT_BYTES) * options.maxFiles + FORM_OVERHEAD_BYTES;
}

function payloadTooLarge(maxFileBytes: number): AppError {
  return new AppError(
    'payload_too_large',
    413,
    `A file may be at most ${maxFileBytes} bytes (${maxFileBytes / (1024 * 1024)} MiB); nothing was stored.`,
    {
      max_bytes: maxFileBytes,
    },
  );
}

function unsupportedContent(): AppError {
  return new AppError(
    'unsupported_media_type',
    415,
    'The file is not a PDF, PNG or JPEG document (its type is read from its content, not its name or declared type); nothing was stored.',
    { accepted: ['application/pdf', 'image/png', 'image/jpeg'] },
  );
}

/** Counts, hashes and sniffs a file on its way to disk, failing as soon as it is too large or of a refused type. */
class FileMeter extends Transform {
  size = 0;
  mediaType: DocumentMediaType | undefined;
  private readonly hash = createHash('sha256');
  private head: Buffer = Buffer.alloc(0);

  constructor(
    private readonly maxBytes: number,
    /** True for a part an HTML form sends for a file input left empty: no bytes is then no file, not a refusal. */
    private readonly mayBeEmpty = false,
    /** Asked when the first bytes arrive (a part that may be empty counts as a file only then): a refusal, or none. */
    private readonly onFirstBytes?: () => AppError | undefined,
  ) {
    super();
  }

  override _transform(chunk: Buffer, _encoding: BufferEncoding, callback: TransformCallback): void {
    if (this.size === 0 && chunk.length > 0 && this.onFirstBytes) {
      const refusal = this.onFirstBytes();
      if (refusal) return callback(refusal);
    }
    this.size += chunk.length;
    if (this.size > this.maxBytes) return callback(payloadTooLarge(this.maxBytes));
    if (this.head.length < SNIFF_BYTES) {
      this.head = Buffer.concat([this.head, chunk.subarray(0, SNIFF_BYTES - this.head.length)]);
      if (this.head.length >= SNIFF_BYTES && !this.sniff()) return callback(unsupportedContent());
    }
    this.hash.update(chunk);
    callback(null, chunk);
  }

  override _flush(callback: TransformCallback): void {
    if (this.size === 0 && this.mayBeEmpty) return callback();
    if (this.mediaType === undefined && !this.sniff()) return callback(unsupportedContent());
    callback();
  }

  private sniff(): boolean {
    this.mediaType = sniffMediaType(this.head);
    return this.mediaType !== undefined;
  }

  digest(): string {
    return this.hash.digest('hex');
  }
}

/** Removes spooled files; a file already gone is fine. */
async function removeSpooledFiles(paths: Iterable<string>): Promise<void> {
  await Promise.all([...paths].map((path) => rm(path, { force: true }).catch(() => undefined)));
}

/** Settles once the write stream has closed its file (or never opened one). */
function closedStream(stream: WriteStream): Promise<void> {
  if (stream.closed) return Promise.resolve();
  return new Promise((resolve) => stream.once('close', () => resolve()));
}

/** Opens a spooled file for reading (e.g. as the source of DocumentStorage.write). */
export function openSpooledFile(file: SpooledFile): ReadStream {
  return createReadStream(file.path, { highWaterMark: 64 * 1024 });
}

/**
 * Reads a multipart/form-data body from `payload`, spooling its files to temp files, and settles once
 * every file is complete on disk. Refusals stop reading at once and remove what was spooled:
 * 413 `payload_too_large` (a file over the limit, or a body over multipartBodyLimit), 415
 * `unsupported_media_type` (a file that is not PDF/PNG/JPEG by content), 422 `validation_failed`
 * naming the field (an unknown field, a file where text belongs or text where a file belongs, too many
 * files, a repeated or over-long text field), 400 `bad_request` (malformed multipart, or the client
 * went away). Each file part is judged by its headers (its field, the count so far, its name) before a
 * byte of it is spooled. `narrowing` narrows the fields and the count for this one form; the body's
 * bound stays the context's. The caller owns the files of a settled form and removes them (removeSpooledFiles).
 */
function readMultipartForm(
  headers: IncomingHttpHeaders,
  payload: Readable,
  contextOptions: MultipartIntakeOptions,
  narrowing?: FormNarrowing,
): Promise<MultipartForm> {
  const options: MultipartIntakeOptions = narrowing
    ? {
        ...contextOptions,
        ...narrowing,
        fileFields: narrowing.fileFields.filter((field) => contextOptions.fileFields.includes(field)),
        maxFiles: Math.max(0, Math.min(contextOptions.maxFiles, narrowing.maxFiles)),
      }
    : contextOptions;
  const maxFileBytes = options.maxFileBytes ?? MAX_DOCUMENT_BYTES;
  // The context's bound: a form narrowed to fewer files is refused by count, at the next file's headers.
  const bodyLimit = multipartBodyLimit(contextOptions);
  const declaredLength = Number(headers['content-length']);
  if (declaredLength > bodyLimit) return Promise.reject(payloadTooLarge(maxFileBytes));
  const longestText = Math.max(0, ...Object.values(options.textFields));

  return new Promise<MultipartForm>((resolve, reject) => {
    let busboy: BusboyInstance;
    try {
      busboy = Busboy({
        headers: headers as BusboyHeaders,
        limits: {
          // UTF-8 takes at most 4 bytes a character; the character count is checked once decoded.
          fieldSize: longestText * 4 + 1,
          fields: Object.keys(options.textFields).length + 1,
          // A form may also carry a part per file input left empty (no file chosen).
          parts: Object.keys(options.textFields).length + options.maxFiles + options.fileFields.length + 2,
          fieldNameSize: 200,
        },
      });
    } catch {
      reject(new AppError('bad_request', 400, 'The multipart/form-data body has no valid boundary in its Content-Type.'));
      return;
    }

    const fields: Record<string, string> = Object.create(null);
    const files: SpooledFile[] = [];
    const spools: Promise<void>[] = [];
    const reading = new Set<FileMeter>();
    const issues: Record<string, string[]> = Object.create(null);
    let fileCount = 0;
    /** Files counted against maxFiles: every part with a file name, and a nameless one once it has bytes. */
    let claimedFiles = 0;
    let received = 0;
    let settled = false;
    let busboyDone = false;

    const addIssue = (path: string, message: string) => (issues[path] ??= []).push(message);
    const hasIssues = () => Object.keys(issues).length > 0;

    function fail(error: unknown): void {
      if (settled) return;
      settled = true;
      // Stop reading: the rest of the body is never parsed nor spooled (the connection is closed after the answer).
      payload.unpipe(busboy);
      payload.off('data', countBytes);
      payload.pause();
      // Files still being written are removed by their own spool once closed (below): removing one
      // before its write stream has opened it would leave the file the open then creates.
      // (The meter, not busboy's file stream: that one emits neither close nor error when destroyed.)
      for (const meter of reading) meter.destroy(new Error('upload refused'));
      void removeSpooledFiles(files.filter(Boolean).map((file) => file.path)).finally(() => reject(error));
    }

    function failOnIssues(): void {
      fail(AppError.validation({ ...issues }));
    }

    const tooManyFiles = options.tooManyFiles ?? `At most ${options.maxFiles} file(s) per request.`;
    /** Counts one more file; false when that is more than the form takes. */
    function claimFile(): boolean {
      if (claimedFiles >= options.maxFiles) return false;
      claimedFiles += 1;
      return true;
    }

    function finish(): void {
      if (settled || !busboyDone) return;
      Promise.all(spools).then(
        () => {
          if (settled) return;
          if (hasIssues()) return failOnIssues();
          settled = true;
          payload.off('data', countBytes);
          resolve({ fields: { ...fields }, files: files.filter((file) => file !== undefined) });
        },
        (error: unknown) => fail(error),
      );
    }

    function countBytes(chunk: Buffer): void {
      received += chunk.length;
      if (received > bodyLimit) fail(payloadTooLarge(maxFileBytes));
    }

    busboy.on('field', (name: string, value: string, _nameTruncated: boolean, valueTruncated: boolean) => {
      if (settled) return;
      const limit = options.textFields[name];
      if (options.fileFields.includes(name)) addIssue(name, 'Must be a file part (with a filename).');
      else if (limit === undefined) addIssue(name, 'Unknown field.');
      else if (name in fields) addIssue(name, 'Sent more than once.');
      else if (valueTruncated || value.length > limit) addIssue(name, `Must be at most ${limit} characters.`);
      else fields[name] = value;
    });

    busboy.on('file', (name: string, stream: BusboyFileStream, fileName: string | undefined) => {
      if (settled) {
        stream.resume();
        return;
      }
      // A part is judged by its headers, before a byte of it is spooled: a file that cannot be
      // accepted is refused at once, and reading stops there.
      if (!options.fileFields.includes(name)) {
        addIssue(
          name,
          name in options.textFields ? 'Must be a text field, not a file.' : (options.refusedFileField?.(name) ?? 'Unknown field.'),
        );
        stream.resume();
        return failOnIssues();
      }
      // A browser sends a file input left empty as a part with filename="" and no bytes (HTML's form
      // submission algorithm): that input chose no file, so it is skipped rather than refused as 415,
      // and counts as a file only if bytes come after all.
      const unchosen = fileName === '';
      if (!unchosen && !claimFile()) {
        addIssue(name, tooManyFiles);
        stream.resume();
        return failOnIssues();
      }
      if (fileName !== undefined && fileName.length > MAX_FILE_NAME_LENGTH) {
        addIssue(name, `The file name must be at most ${MAX_FILE_NAME_LENGTH} characters.`);
        stream.resume();
        return failOnIssues();
      }
      const index = fileCount++;
      const path = join(tmpdir(), `${SPOOL_PREFIX}${randomUUID()}`);
      const meter = new FileMeter(
        maxFileBytes,
        unchosen,
        unchosen ? () => (claimFile() ? undefined : AppError.validation({ [name]: [tooManyFiles] })) : undefined,
      );
      const spool = createWriteStream(path, { flags: 'wx', mode: 0o600 });
      const removeOnceClosed = () =>
        closedStream(spool)
          .then(() => rm(path, { force: true }))
          .catch(() => undefined);
      reading.add(meter);
      spools.push(
        pipeline(stream, meter, spool).then(
          () => {
            reading.delete(meter);
            if (settled || (unchosen && meter.size === 0)) return removeOnceClosed();
            files[index] = {
              field: name,
              fileName: fileName === undefined || fileName === '' ? null : fileName,
              size: meter.size,
              sha256: meter.digest(),
              mediaType: meter.mediaType!,
              path,
            };
          },
          (error: unknown) => {
            reading.delete(meter);
            fail(error);
            return removeOnceClosed();
          },
        ),
      );
    });

    busboy.on('partsLimit', () => {
      addIssue('body', 'The form has more parts than this request takes.');
      failOnIssues();
    });
    busboy.on('fieldsLimit', () => {
      addIssue('body', 'The form has more text fields than this request takes.');
      failOnIssues();
    });
    busboy.on('error', () => fail(new AppError('bad_request', 400, 'The multipart/form-data body is malformed.')));
    busboy.on('finish', () => {
      busboyDone = true;
      finish();
    });

    payload.on('data', countBytes);
    // The request stream's own failure (the client went away) is passed on as it is, so the error
    // handler recognises a client abort.
    payload.on('error', (error) => fail(error));
    payload.on('close', () => {
      if (!payload.readableEnded) fail(Object.assign(new Error('aborted'), { code: 'ECONNRESET', statusCode: 400 }));
    });
    payload.pipe(busboy);
  });
}

type IntakeState = { closed: boolean; form?: MultipartForm; narrowing?: FormNarrowing };
const intakeStates = new WeakMap<FastifyRequest, IntakeState>();

/** The summary of a spooled file that stands for it in `request.body`: what an idempotency fingerprint must cover. */
export type FileSummary = { name: string | null; size: number; sha256: string };

/**
 * Makes the routes of the calling (encapsulated) Fastify context take multipart/form-data through
 * readMultipartForm, and nothing else: any other content type, or no body at all, is a 415. The body
 * becomes the text fields plus, per file field, a FileSummary (no temp path among its fields), so the
 * schema validates it and the idempotency fingerprint covers the file's hash; the spooled files
 * themselves come from multipartFormOf(request). Every spooled file is removed when the response
 * closes, whether it was sent, failed or the client went away.
 *
 * Authentication and rate limits (onRequest) run before the body is read, so a refused request is
 * answered without spooling it.
 */
export function registerMultipartIntake(app: FastifyInstance, options: MultipartIntakeOptions): void {
  app.addHook('onRequest', (request: FastifyRequest, reply: FastifyReply, done) => {
    const state: IntakeState = { closed: false };
    intakeStates.set(request, state);
    reply.raw.once('close', () => {
      state.closed = true;
      if (state.form) void removeSpooledFiles(state.form.files.map((file) => file.path));
    });
    done();
  });

  app.removeAllContentTypeParsers();
  app.addContentTypeParser('multipart/form-data', async (request: FastifyRequest, payload: Readable) => {
    const form = await readMultipartForm(request.headers, payload, options, intakeStates.get(request)?.narrowing);
    const state = intakeStates.get(request);
    if (!state || state.closed) {
      await removeSpooledFiles(form.files.map((file) => file.path));
      throw new AppError('bad_request', 400, 'The connection closed before the upload was read.');
    }
    state.form = form;
    const body: Record<string, unknown> = { ...form.fields };
    for (const file of form.files) {
      const summary: FileSummary = { name: file.fileName, size: file.size, sha256: file.sha256 };
      const previous = body[file.field];
      body[file.field] = previous === undefined ? summary : [...(Array.isArray(previous) ? previous : [previous]), summary];
    }
    return body;
  });
  // Refused before a byte of the body is read.
  app.addContentTypeParser('*', (_request: FastifyRequest, _payload: Readable, done: (error: Error | null, body?: unknown) => void) => {
    done(notMultipart());
  });
  app.addHook('preValidation', (request: FastifyRequest, _reply: FastifyReply, done) => {
    done(intakeStates.get(request)?.form ? undefined : notMultipart());
  });
}

function notMultipart(): AppError {
  return new AppError('unsupported_media_type', 415, 'Send the upload as multipart/form-data.');
}

/**
 * Narrows what this request's form may carry (a hook before the body is read, e.g. preParsing, knows
 * it): parts outside it are refused by their headers, before a byte of them is spooled.
 */
export function narrowMultipartForm(request: FastifyRequest, narrowing: FormNarrowing): void {
  const state = intakeStates.get(request);
  if (state) state.narrowing = narrowing;
}

/** The spooled form of a request of a context set up by registerMultipartIntake. */
export function multipartFormOf(request: FastifyRequest): MultipartForm {
  const form = intakeStates.get(request)?.form;
  if (!form) throw notMultipart();
  return form;
}
