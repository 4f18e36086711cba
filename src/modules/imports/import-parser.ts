import { createHash, randomUUID } from 'node:crypto';
import { once } from 'node:events';
import { createReadStream, createWriteStream, type WriteStream } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { Readable } from 'node:stream';
import { CsvError, parse as parseCsv, type Options as CsvOptions } from 'csv-parse';
import secureJson from 'secure-json-parse';
import { AppError } from '../../shared/app-error.js';
import { csvCellValue } from '../../shared/csv.js';
import { DOWNLOAD_COLUMNS, isKnownColumn, isKnownField, type ImportKind } from './import-columns.js';

export const IMPORT_FORMATS = ['csv', 'ndjson'] as const;
export type ImportFormat = (typeof IMPORT_FORMATS)[number];

/** At most this many rows per import (issue 46). */
export const MAX_IMPORT_ROWS = 100_000;
/** At most this many bytes per file (50 MiB). */
export const MAX_IMPORT_BYTES = 50 * 1024 * 1024;
/** The longest cell of a CSV file, in characters: a whole row of the single route's fields fits many times over. */
export const MAX_CELL_CHARS = 64 * 1024;
/** The longest CSV row or NDJSON line, in characters: what the parser holds of one row at most. */
export const MAX_ROW_CHARS = 256 * 1024;

/**
 * A file read and checked while it streamed: its rows spooled to a local file (one JSON document a
 * line: a CSV row's non-empty cells by column, or an NDJSON line's object), never held in memory.
 * The caller owns `spoolPath` and removes it (removeSpool).
 */
export type SpooledImport = {
  format: ImportFormat;
  /** The file's columns in its order (CSV: its header, less the rows download's own columns); empty for NDJSON. */
  columns: string[];
  rowsTotal: number;
  bytes: number;
  /** Lower-case hex SHA-256 of the bytes as received. */
  sha256: string;
  spoolPath: string;
};

type Position = { line?: number; row?: number; column?: string };

/** A 422 about the file itself: nothing of it is stored. `details` names the line, row and column when known. */
export function fileProblem(message: string, position: Position = {}): AppError {
  const where = [
    position.row !== undefined ? `row ${position.row}` : undefined,
    position.line !== undefined ? `line ${position.line}` : undefined,
    position.column !== undefined ? `column "${position.column}"` : undefined,
  ].filter(Boolean);
  const text = where.length > 0 ? `${capitalise(where.join(', '))}: ${message}` : message;
  return new AppError('validation_failed', 422, `The file cannot be imported: ${text}`, {
    issues: { file: [text] },
    ...(position.line !== undefined ? { line: position.line } : {}),
    ...(position.row !== undefined ? { row: position.row } : {}),
    ...(position.column !== undefined ? { column: position.column } : {}),
  });
}

const capitalise = (text: string) => text.charAt(0).toUpperCase() + text.slice(1);

export function payloadTooLarge(): AppError {
  return new AppError(
    'payload_too_large',
    413,
    `An import file may be at most ${MAX_IMPORT_BYTES} bytes (50 MiB); split it into several imports. Nothing was stored.`,
    { max_bytes: MAX_IMPORT_BYTES },
  );
}

/** Removes a spooled file; one already gone is fine. */
export async function removeSpool(path: string): Promise<void> {
  await rm(path, { force: true }).catch(() => undefined);
}

/** The spooled rows, a chunk of JSON lines at a time, in row order. */
export async function* spooledRowChunks(path: string, chunkSize: number): AsyncGenerator<string[]> {
  const lines = createInterface({ input: createReadStream(path, { encoding: 'utf8', highWaterMark: 256 * 1024 }), crlfDelay: Infinity });
  let chunk: string[] = [];
  for await (const line of lines) {
    if (line === '') continue;
    chunk.push(line);
    if (chunk.length >= chunkSize) {
      yield chunk;
      chunk = [];
    }
  }
  if (chunk.length > 0) yield chunk;
}

/** Writes JSON lines to the spool, a buffer of them at a time, waiting when the disk is behind. */
class SpoolWriter {
  private buffer = '';
  readonly stream: WriteStream;
  constructor(readonly path: string) {
    this.stream = createWriteStream(path, { flags: 'wx', mode: 0o600 });
  }
  async write(line: string): Promise<void> {
    this.buffer += line + '\n';
    if (this.buffer.length >= 64 * 1024) await this.flush();
  }
  private async flush(): Promise<void> {
    const text = this.buffer;
    this.buffer = '';
    if (text !== '' && !this.stream.write(text)) await once(this.stream, 'drain');
  }
  async close(): Promise<void> {
    await this.flush();
    this.stream.end();
    await once(this.stream, 'close');
  }
  async discard(): Promise<void> {
    this.stream.destroy();
    if (!this.stream.closed) await once(this.stream, 'close').catch(() => undefined);
    await removeSpool(this.path);
  }
}

/** Byte-level checks and UTF-8 decoding of the file as it streams: size, hash, binary content, encoding. */
class TextSource {
  bytes = 0;
  /** Lines fully decoded so far (for positions in errors). */
  private lines = 1;
  private readonly hash = createHash('sha256');
  private readonly decoder = new TextDecoder('utf-8', { fatal: true });

  constructor(private readonly source: Readable) {}

  digest(): string {
    return this.hash.digest('hex');
  }

  private lineAt(text: string, index: number): number {
    let line = this.lines;
    for (let at = text.indexOf('\n'); at >= 0 && at < index; at = text.indexOf('\n', at + 1)) line += 1;
    return line;
  }

  async *text(): AsyncGenerator<string> {
    let first = true;
    // The request stream is left open on a refusal (the error answer still has to go out on it).
    for await (const raw of this.source.iterator({ destroyOnReturn: false })) {
      const chunk = typeof raw === 'string' ? Buffer.from(raw) : (raw as Buffer);
      this.bytes += chunk.length;
      if (this.bytes > MAX_IMPORT_BYTES) throw payloadTooLarge();
      this.hash.update(chunk);
      if (first && chunk.length > 0) {
        first = false;
        if ((chunk[0] === 0xff && chunk[1] === 0xfe) || (chunk[0] === 0xfe && chunk[1] === 0xff)) {
          throw fileProblem('the file is UTF-16 text; save it as UTF-8 (in a spreadsheet: "CSV UTF-8").', { line: 1 });
        }
      }
      const nul = chunk.indexOf(0);
      if (nul >= 0) {
        const before = new TextDecoder('utf-8').decode(chunk.subarray(0, nul));
        throw fileProblem('the file is binary (it holds NUL bytes), not CSV or NDJSON text.', { line: this.lineAt(before, before.length) });
      }
      let text: string;
      try {
        text = this.decoder.decode(chunk, { stream: true });
      } catch {
        const lenient = new TextDecoder('utf-8').decode(chunk);
        throw fileProblem('the file is not valid UTF-8 text; save it as UTF-8 (in a spreadsheet: "CSV UTF-8").', {
          line: this.lineAt(lenient, Math.max(0, lenient.indexOf('\uFFFD'))),
        });
      }
      this.lines = this.lineAt(text, text.length);
      if (text !== '') yield text;
    }
    let rest: string;
    try {
      rest = this.decoder.decode();
    } catch {
      throw fileProblem('the file ends inside a UTF-8 character: it is not valid UTF-8 text.', { line: this.lines });
    }
    if (rest !== '') yield rest;
  }
}

export type ReadImportOptions = {
  format: ImportFormat;
  /**
   * The kind the rows are of, once known: a CSV header is checked against its columns at once, or
   * at the end of the file when the kind came after it (a multipart field sent after the file).
   */
  kind: () => ImportKind | undefined;
};

/**
 * Reads an import file from `source` as it streams, checking it as it goes, and spools its rows. Refusals
 * stop reading at once (nothing is spooled then): 413 past MAX_IMPORT_BYTES; 422 `validation_failed`
 * naming the line, row and column for a file that is binary, not UTF-8, has no header or no rows,
 * unknown, empty or repeated columns, a row with another number of cells than the header, a cell over
 * MAX_CELL_CHARS, more than MAX_IMPORT_ROWS rows, or (NDJSON) a line that is not a JSON object.
 */
export async function readImportFile(source: Readable, options: ReadImportOptions): Promise<SpooledImport> {
  const text = new TextSource(source);
  const spool = new SpoolWriter(join(tmpdir(), `svc-import-${randomUUID()}`));
  try {
    const { columns, rowsTotal } =
      options.format === 'csv' ? await readCsv(text, spool, options.kind) : await readNdjson(text, spool, options.kind);
    await spool.close();
    return { format: options.format, columns, rowsTotal, bytes: text.bytes, sha256: text.digest(), spoolPath: spool.path };
  } catch (error) {
    await spool.discard();
    throw error;
  }
}

/** The header's problems for `kind`, or none: unknown columns, each named with its place. */
function checkHeader(header: string[], kind: ImportKind): void {
  for (const [index, name] of header.entries()) {
    if (!isKnownColumn(kind, name)) {
      throw fileProblem(
        `unknown column for ${kind} (column ${index + 1}). Columns are the request fields of POST /v1/${kind === 'entities' ? 'entities' : 'customers'}, dotted for nested ones (see GET /v1/imports/templates/${kind}.csv).`,
        { line: 1, column: name },
      );
    }
  }
}

async function readCsv(text: TextSource, spool: SpoolWriter, kindOf: () => ImportKind | undefined) {
  // The header as the parser met it: its own refusals (a row too long, a ragged row) can come before
  // the loop below has taken the header record.
  let parsedHeader: string[] | undefined;
  const csvOptions: CsvOptions = {
    bom: true,
    // A quote inside an unquoted cell (`=HYPERLINK("…")`, `5" screen`) is text, as spreadsheets read it.
    relax_quotes: true,
    on_record: (record: string[]) => {
      // With `info`, a record comes as { record, info } (the typings say otherwise).
      parsedHeader ??= (record as unknown as { record: string[] }).record.map((name) => name.trim());
      return record;
    },
    relax_column_count: false,
    max_record_size: MAX_ROW_CHARS,
    skip_empty_lines: true,
    skip_records_with_empty_values: true,
    info: true,
  };
  const parser = parseCsv(csvOptions);
  const input = Readable.from(text.text(), { objectMode: false });
  input.on('error', (error) => parser.destroy(error));
  input.pipe(parser);

  let header: string[] | undefined;
  let headerChecked = false;
  const ignored = new Set<number>();
  let rows = 0;
  try {
    for await (const { record, info } of parser as AsyncIterable<{ record: string[]; info: { lines: number } }>) {
      if (!header) {
        header = record.map((name) => name.trim());
        for (const [index, name] of header.entries()) {
          if (name === '') throw fileProblem(`column ${index + 1} of the header has no name.`, { line: info.lines });
          if (header.indexOf(name) !== index)
            throw fileProblem('the column appears twice in the header.', { line: info.lines, column: name });
          if ((DOWNLOAD_COLUMNS as readonly string[]).includes(name)) ignored.add(index);
        }
        const kind = kindOf();
        if (kind) {
          checkHeader(header, kind);
          headerChecked = true;
        }
        continue;
      }
      rows += 1;
      if (rows > MAX_IMPORT_ROWS) {
        throw fileProblem(`an import takes at most ${MAX_IMPORT_ROWS} rows; split the file into several imports.`, {
          row: rows,
          line: info.lines,
        });
      }
      const cells: Record<string, string> = {};
      for (const [index, cell] of record.entries()) {
        if (cell === '' || ignored.has(index)) continue;
        const column = header[index]!;
        if (cell.length > MAX_CELL_CHARS) {
          throw fileProblem(`a cell may hold at most ${MAX_CELL_CHARS} characters.`, { row: rows, line: info.lines, column });
        }
        // A download's neutralising quote (src/shared/csv.ts) is removed: a corrected download imports as it was written from.
        cells[column] = csvCellValue(cell);
      }
      await spool.write(JSON.stringify(cells));
    }
  } catch (error) {
    input.unpipe(parser);
    input.destroy();
    throw csvProblem(error, header ?? parsedHeader);
  }
  if (!header) throw fileProblem('the file is empty: it has no header row naming its columns.', { line: 1 });
  if (!headerChecked) {
    const kind = kindOf();
    if (kind) checkHeader(header, kind);
  }
  if (rows === 0) throw fileProblem('the file has a header but no rows.', { line: 2 });
  return { columns: header.filter((_, index) => !ignored.has(index)), rowsTotal: rows };
}

/** csv-parse's refusals as 422s naming the row (counting from the first data row), line and column. */
function csvProblem(error: unknown, header: string[] | undefined): unknown {
  if (!(error instanceof CsvError)) return error;
  const csvError = error as CsvError & { lines?: number; records?: number; column?: number | string | null; record?: unknown[] };
  const line = csvError.lines;
  // `records` counts the records parsed before the refused one, the header first among them.
  const row = header && typeof csvError.records === 'number' ? Math.max(1, csvError.records) : undefined;
  const column =
    typeof csvError.column === 'number' && header
      ? (header[csvError.column] ?? `column ${csvError.column + 1}`)
      : typeof csvError.column === 'string'
        ? csvError.column
        : undefined;
  switch (csvError.code) {
    case 'CSV_RECORD_INCONSISTENT_FIELDS_LENGTH':
      return fileProblem(
        `the row has ${csvError.record?.length ?? 'another number of'} cells but the header has ${header?.length ?? '?'} columns (a ragged row).`,
        { row, line },
      );
    case 'CSV_MAX_RECORD_SIZE':
      return fileProblem(
        `the row is longer than ${MAX_ROW_CHARS} characters (a cell may hold at most ${MAX_CELL_CHARS}); nothing of it was read further.`,
        { row, line, column },
      );
    default:
      return fileProblem(`the file is not valid CSV (${csvError.message}).`, { row, line });
  }
}

async function readNdjson(text: TextSource, spool: SpoolWriter, kindOf: () => ImportKind | undefined) {
  let pending = '';
  let line = 0;
  let rows = 0;
  const handle = async (raw: string) => {
    line += 1;
    const content = raw.endsWith('\r') ? raw.slice(0, -1) : raw;
    if (content.trim() === '') return;
    if (content.length > MAX_ROW_CHARS) throw fileProblem(`a line may hold at most ${MAX_ROW_CHARS} characters.`, { line });
    let value: unknown;
    try {
      value = secureJson.parse(line === 1 && content.startsWith('\uFEFF') ? content.slice(1) : content, undefined, {
        protoAction: 'error',
        constructorAction: 'error',
      });
    } catch {
      throw fileProblem('the line is not valid JSON (NDJSON: one JSON object per line).', { line });
    }
    if (value === null || typeof value !== 'object' || Array.isArray(value)) {
      throw fileProblem('the line is not a JSON object (NDJSON: one request body per line).', { line });
    }
    rows += 1;
    if (rows > MAX_IMPORT_ROWS) {
      throw fileProblem(`an import takes at most ${MAX_IMPORT_ROWS} rows; split the file into several imports.`, { row: rows, line });
    }
    const kind = kindOf();
    if (kind) {
      for (const key of Object.keys(value)) {
        if (!isKnownField(kind, key)) {
          throw fileProblem(
            `unknown field for ${kind}: lines are request bodies of POST /v1/${kind === 'entities' ? 'entities' : 'customers'}.`,
            {
              row: rows,
              line,
              column: key,
            },
          );
        }
      }
    }
    await spool.write(JSON.stringify(value));
  };
  for await (const chunk of text.text()) {
    // `pending` holds at most the start of one line (MAX_ROW_CHARS).
    const joined = pending + chunk;
    let start = 0;
    for (let newline = joined.indexOf('\n'); newline >= 0; newline = joined.indexOf('\n', start)) {
      await handle(joined.slice(start, newline));
      start = newline + 1;
    }
    pending = joined.slice(start);
    if (pending.length > MAX_ROW_CHARS) throw fileProblem(`a line may hold at most ${MAX_ROW_CHARS} characters.`, { line: line + 1 });
  }
  if (pending !== '') await handle(pending);
  if (rows === 0) throw fileProblem('the file has no rows (NDJSON: one JSON object per line).', { line: 1 });
  return { columns: [] as string[], rowsTotal: rows };
}
