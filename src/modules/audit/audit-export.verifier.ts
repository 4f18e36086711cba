import { createReadStream } from 'node:fs';
import { open } from 'node:fs/promises';
import { createInterface } from 'node:readline';
import { isDeepStrictEqual } from 'node:util';
import { parseCsvRow } from '../../shared/csv.js';
import { chainHash, GENESIS_HASH } from './audit-chain.js';
import type { ChainBreak, ChainProblem } from './audit-chain.verifier.js';
import { changesOf } from './audit-changes.js';
import {
  chainRowOf,
  CSV_COLUMNS,
  CSV_MANIFEST_PREFIX,
  csvToRecord,
  EXPORT_FORMATS,
  type ExportFormat,
  type ExportManifest,
  type ExportRecord,
} from './audit-export.js';

/** What is wrong with an export file: a problem of the chain, or a manifest that contradicts its rows. */
export type FileBreak = Omit<ChainBreak, 'problem'> & { problem: ChainProblem | 'manifest' };

export type FileVerdict =
  | {
      ok: true;
      org_id: string;
      rows: number;
      first_sequence: number | null;
      last_sequence: number | null;
      prev_hash: string | null;
      head_hash: string | null;
      from: string | null;
      to: string | null;
      format: ExportFormat;
    }
  | { ok: false; org_id: string | null; rows_checked: number; broken_at: FileBreak };

/** Bytes read from the end of the file to find the manifest (one line of a few hundred bytes). */
const TAIL_BYTES = 64 * 1024;

/** The file's last line (without its newline), read from its end: the manifest, in a file that ends as written. */
async function lastLine(path: string): Promise<string> {
  const file = await open(path, 'r');
  try {
    const { size } = await file.stat();
    const length = Math.min(size, TAIL_BYTES);
    const buffer = Buffer.alloc(length);
    await file.read(buffer, 0, length, size - length);
    const text = buffer.toString('utf8').replace(/\r?\n$/, '');
    return text.slice(text.lastIndexOf('\n') + 1);
  } finally {
    await file.close();
  }
}

function parseManifest(line: string, format: ExportFormat): ExportManifest | undefined {
  try {
    if (format === 'csv')
      return line.startsWith(CSV_MANIFEST_PREFIX) ? (JSON.parse(line.slice(CSV_MANIFEST_PREFIX.length)) as ExportManifest) : undefined;
    const parsed = JSON.parse(line) as { manifest?: ExportManifest };
    return typeof parsed.manifest === 'object' && parsed.manifest !== null ? parsed.manifest : undefined;
  } catch {
    return undefined;
  }
}

/** ndjson when the first byte opens a JSON object, else csv. */
async function sniffFormat(path: string): Promise<ExportFormat> {
  const file = await open(path, 'r');
  try {
    const buffer = Buffer.alloc(1);
    await file.read(buffer, 0, 1, 0);
    return buffer.toString('utf8') === '{' ? 'ndjson' : 'csv';
  } finally {
    await file.close();
  }
}

/**
 * The records of an export file, in file order, with the 1-based record number; csv records that
 * span lines (a quoted newline) are joined. Stops before the manifest line.
 */
async function* recordsOf(path: string, format: ExportFormat): AsyncGenerator<{ record: ExportRecord | Error; line: string }> {
  const lines = createInterface({ input: createReadStream(path, { encoding: 'utf8' }), crlfDelay: Infinity });
  let pending = '';
  let header = format === 'csv';
  for await (const line of lines) {
    if (format === 'ndjson') {
      if (line.startsWith('{"manifest":')) return;
      try {
        yield { record: JSON.parse(line) as ExportRecord, line };
      } catch (error) {
        yield { record: error as Error, line };
      }
      continue;
    }
    if (pending === '' && line.startsWith(CSV_MANIFEST_PREFIX)) return;
    pending = pending === '' ? line : `${pending}\n${line}`;
    // An odd number of quotes so far: a quoted field goes on to the next line.
    if ((pending.match(/"/g)?.length ?? 0) % 2 === 1) continue;
    const text = pending;
    pending = '';
    if (header) {
      header = false;
      if (text !== CSV_COLUMNS.join(',')) yield { record: new Error(`the header is not ${CSV_COLUMNS.join(',')}`), line: text };
      continue;
    }
    try {
      yield { record: csvToRecord(parseCsvRow(text)), line: text };
    } catch (error) {
      yield { record: error as Error, line: text };
    }
  }
  if (pending !== '') yield { record: new Error('the file ends inside a quoted field'), line: pending };
}

/**
 * Verifies an export file without a database, reading it once at constant memory: every record's
 * hash recomputed from its own fields chained to the one before (the first to the manifest's
 * prev_hash), the sequences continuous, each record's `changes` what its before and after say, and
 * the manifest's rows, first and last sequence and head hash against the records. Names the first
 * break as `svc audit verify` does; `manifest` is a manifest that contradicts intact records.
 */
export async function verifyExportFile(path: string, format?: ExportFormat): Promise<FileVerdict> {
  if (format !== undefined && !EXPORT_FORMATS.includes(format)) throw new Error(`--format must be one of ${EXPORT_FORMATS.join(', ')}`);
  const fileFormat = format ?? (await sniffFormat(path));
  const manifest = parseManifest(await lastLine(path), fileFormat);
  const orgId = manifest?.org_id ?? null;

  let rows = 0;
  let previous: ExportRecord | undefined;
  let previousHash = manifest?.prev_hash ?? undefined;
  let expected = manifest?.first_sequence ?? undefined;
  /** A sequence missing where expected: deleted, unless it turns up further on (then the lines were reordered). */
  let missing: { sequence: number; after: ExportRecord | undefined; next: ExportRecord } | undefined;
  let found: FileBreak | undefined;
  const broken = (at: FileBreak): FileVerdict => ({ ok: false, org_id: orgId, rows_checked: rows, broken_at: at });
  const name = (record: ExportRecord) => `row ${record.id} (sequence ${record.sequence})`;

  /** A record that cannot be read: the file was cut off there if nothing follows it, else edited. */
  let unreadable: Error | undefined;
  let unreadableFollowed = false;

  for await (const { record } of recordsOf(path, fileFormat)) {
    if (missing) {
      // Only looking for the missing sequence now: the break is already found.
      if (!(record instanceof Error) && record.sequence === missing.sequence) {
        found = {
          sequence: missing.sequence,
          id: record.id,
          problem: 'reordered',
          detail: `${name(record)} is out of its place: ${name(missing.next)} comes where it belongs`,
        };
        break;
      }
      continue;
    }
    if (unreadable) {
      unreadableFollowed = true;
      break;
    }
    if (record instanceof Error) {
      unreadable = record;
      continue;
    }
    if (manifest && (manifest.first_sequence === null || manifest.prev_hash === null)) {
      return broken({
        sequence: record.sequence,
        id: record.id,
        problem: 'manifest',
        detail: 'the manifest has no first_sequence or prev_hash to start the chain from, but the file has rows',
      });
    }
    // Without a manifest (a cut-off file) the rows still chain from the first one on.
    expected ??= record.sequence;
    if (previous === undefined && previousHash === undefined && record.sequence === 1) previousHash = GENESIS_HASH;
    if (record.sequence !== expected) {
      if (previous && record.sequence === previous.sequence) {
        return broken({ sequence: record.sequence, id: record.id, problem: 'inserted', detail: `${name(record)} appears twice` });
      }
      if (record.sequence < expected) {
        return broken({
          sequence: record.sequence,
          id: record.id,
          problem: 'reordered',
          detail: `${name(record)} comes after ${previous ? name(previous) : 'the start'}`,
        });
      }
      missing = { sequence: expected, after: previous, next: record };
      continue;
    }
    const hashFollows = previousHash === undefined ? true : record.hash === chainHash(previousHash, chainRowOf(record));
    if ((manifest && record.org_id !== manifest.org_id) || !hashFollows) {
      return broken({
        sequence: record.sequence,
        id: record.id,
        problem: 'edited',
        detail: `${name(record)} no longer matches its hash: its content or hash was changed`,
      });
    }
    if (!isDeepStrictEqual(record.changes, changesOf(record.before, record.after))) {
      return broken({
        sequence: record.sequence,
        id: record.id,
        problem: 'edited',
        detail: `${name(record)}: its changes no longer say what its before and after do`,
      });
    }
    rows += 1;
    previous = record;
    previousHash = record.hash ?? undefined;
    expected += 1;
  }

  if (found) return broken(found);
  if (unreadable && (unreadableFollowed || manifest)) {
    return broken({
      sequence: expected ?? 0,
      id: null,
      problem: 'edited',
      detail: `the record after ${previous ? name(previous) : 'the start'} cannot be read: ${unreadable.message}`,
    });
  }
  if (found) return broken(found);
  if (missing) {
    return broken({
      sequence: missing.sequence,
      id: null,
      problem: 'deleted',
      detail: `sequence ${missing.sequence} is missing: ${missing.after ? name(missing.after) : 'the start'} is followed by ${name(missing.next)}`,
    });
  }
  if (!manifest) {
    return broken({
      sequence: previous ? previous.sequence + 1 : 0,
      id: null,
      problem: 'truncated',
      detail: `the file ends ${previous ? `after ${name(previous)}` : 'before any row'} without its manifest: the rest was cut off`,
    });
  }
  const lastSequence = previous?.sequence ?? null;
  if (manifest.last_sequence !== null && (lastSequence === null || lastSequence < manifest.last_sequence)) {
    const from = lastSequence === null ? (manifest.first_sequence ?? 0) : lastSequence + 1;
    return broken({
      sequence: from,
      id: null,
      problem: 'truncated',
      detail: `the rows end ${previous ? `at ${name(previous)}` : 'before the first'} but the manifest's last_sequence is ${manifest.last_sequence}: the rows after are missing`,
    });
  }
  if (lastSequence !== null && (manifest.last_sequence === null || lastSequence > manifest.last_sequence)) {
    return broken({
      sequence: lastSequence,
      id: previous!.id,
      problem: 'manifest',
      detail: `the rows go on to sequence ${lastSequence} but the manifest's last_sequence is ${manifest.last_sequence}`,
    });
  }
  const mismatch =
    manifest.rows !== rows
      ? `it counts ${manifest.rows} rows, the file has ${rows}`
      : manifest.head_hash !== (previous?.hash ?? null)
        ? `its head_hash ${manifest.head_hash} is not the last row's hash ${previous?.hash ?? null}`
        : manifest.first_sequence === 1 && manifest.prev_hash !== GENESIS_HASH
          ? 'it starts at sequence 1 with a prev_hash other than 64 zeros'
          : undefined;
  if (mismatch) {
    return broken({
      sequence: lastSequence ?? 0,
      id: previous?.id ?? null,
      problem: 'manifest',
      detail: `the manifest contradicts the rows: ${mismatch}`,
    });
  }
  return {
    ok: true,
    org_id: manifest.org_id,
    rows,
    first_sequence: manifest.first_sequence,
    last_sequence: lastSequence,
    prev_hash: manifest.prev_hash,
    head_hash: previous?.hash ?? null,
    from: manifest.from,
    to: manifest.to,
    format: fileFormat,
  };
}
