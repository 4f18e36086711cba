import { createHash, createHmac, timingSafeEqual } from 'node:crypto';
import stableStringify from 'safe-stable-stringify';
import { AppError } from './app-error.js';
import { isWithinDateBounds } from './dates.schema.js';
import { isUuid } from './ids.js';

/**
 * A cursor is `<payload>.<mac>`: the payload is the base64url JSON of the last row's creation time
 * and id and the walk's filter fingerprint; the mac is the first 16 bytes of HMAC-SHA256 over the
 * payload's text, base64url. Nothing in a cursor reaches a query before its mac verifies, so a
 * hand-edited one (an extreme date, another id) is a 422, never a database error.
 */
const MAC_BYTES = 16;
const BASE64URL = /^[A-Za-z0-9_-]+$/;
const NOT_A_CURSOR = 'Not a cursor returned by this API; pass next_cursor back unchanged.';

/** The cursor HMAC key, read when first needed (cursorKeyLoader in modules/service-secrets/cursor-key.ts). */
export type CursorKey = () => Promise<Buffer>;

/** Fingerprint of the filters a walk started with; a cursor only continues the same walk. */
export function filterFingerprint(filters: Record<string, unknown>): string {
  return createHash('sha256')
    .update(stableStringify(filters) ?? '')
    .digest('base64url')
    .slice(0, 16);
}

function macOf(payload: string, key: Buffer): string {
  return createHmac('sha256', key).update(payload).digest().subarray(0, MAC_BYTES).toString('base64url');
}

/** Signs `fields` as a cursor: the base64url JSON of the fields, a dot, the mac. */
export function signCursor(fields: Record<string, unknown>, key: Buffer): string {
  const payload = Buffer.from(JSON.stringify(fields)).toString('base64url');
  return `${payload}.${macOf(payload, key)}`;
}

/**
 * The fields of a cursor signCursor made with `key`, once its mac verifies, else a 422 on `cursor`.
 * The caller checks the fields it expects, and the fingerprint (checkFingerprint).
 */
export function openCursor(cursor: string, key: Buffer): Record<string, unknown> {
  const parts = cursor.split('.');
  const [payload, mac] = parts;
  if (parts.length !== 2 || !payload || !mac || !BASE64URL.test(payload) || !BASE64URL.test(mac)) {
    throw AppError.field('cursor', NOT_A_CURSOR);
  }
  // Compared as the canonical text, so exactly one mac string verifies for a payload.
  const given = Buffer.from(mac);
  const expected = Buffer.from(macOf(payload, key));
  if (given.length !== expected.length || !timingSafeEqual(given, expected)) throw AppError.field('cursor', NOT_A_CURSOR);

  let parsed: unknown;
  try {
    parsed = JSON.parse(Buffer.from(payload, 'base64url').toString('utf8'));
  } catch {
    throw AppError.field('cursor', NOT_A_CURSOR);
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) throw AppError.field('cursor', NOT_A_CURSOR);
  return parsed as Record<string, unknown>;
}

/** A 422 on `cursor`: it verified but is not one of the kind this list hands out. */
export function notACursor(): AppError {
  return AppError.field('cursor', NOT_A_CURSOR);
}

/** A cursor continues only the walk it came from: other filters → 422 on `cursor`. */
export function checkFingerprint(fields: Record<string, unknown>, fingerprint: string): void {
  if (fields.f !== fingerprint) {
    throw AppError.field('cursor', 'This cursor belongs to a walk with other filters; keep the filters unchanged while paging.');
  }
}

export function encodeCursor(position: { createdAt: Date; id: string }, fingerprint: string, key: Buffer): string {
  return signCursor({ c: position.createdAt.toISOString(), i: position.id, f: fingerprint }, key);
}

export function decodeCursor(cursor: string, fingerprint: string, key: Buffer): { createdAt: Date; id: string } {
  const parsed = openCursor(cursor, key);
  const createdAt = typeof parsed.c === 'string' ? new Date(parsed.c) : undefined;
  // The mac already vouches for the payload; the range check stays as a second line should the
  // key ever leak, since an out-of-range date would fail in SQL rather than as a 422.
  if (!createdAt || !isWithinDateBounds(createdAt) || typeof parsed.i !== 'string' || !isUuid(parsed.i)) {
    throw notACursor();
  }
  checkFingerprint(parsed, fingerprint);
  return { createdAt, id: parsed.i };
}

/**
 * A cursor over a list ordered by a per-organisation sequence (GET /v1/audit-events): the last
 * sequence returned and the filter fingerprint, signed like the others.
 */
export function encodeSequenceCursor(sequence: number, fingerprint: string, key: Buffer): string {
  const payload = Buffer.from(JSON.stringify({ s: sequence, f: fingerprint })).toString('base64url');
  return `${payload}.${macOf(payload, key)}`;
}

/** The sequence of a cursor encodeSequenceCursor made, once its mac verifies; else a 422 on `cursor`. */
export function decodeSequenceCursor(cursor: string, fingerprint: string, key: Buffer): number {
  const [payload, mac, ...rest] = cursor.split('.');
  if (rest.length > 0 || !payload || !mac || !BASE64URL.test(payload) || !BASE64URL.test(mac)) throw AppError.field('cursor', NOT_A_CURSOR);
  const given = Buffer.from(mac);
  const expected = Buffer.from(macOf(payload, key));
  if (given.length !== expected.length || !timingSafeEqual(given, expected)) throw AppError.field('cursor', NOT_A_CURSOR);
  let parsed: { s?: unknown; f?: unknown } | null;
  try {
    parsed = JSON.parse(Buffer.from(payload, 'base64url').toString('utf8')) as { s?: unknown; f?: unknown } | null;
  } catch {
    throw AppError.field('cursor', NOT_A_CURSOR);
  }
  // Another list's cursor verifies too (one key); it has no sequence.
  if (typeof parsed !== 'object' || parsed === null || typeof parsed.s !== 'number' || !Number.isSafeInteger(parsed.s) || parsed.s < 0) {
    throw AppError.field('cursor', NOT_A_CURSOR);
  }
  if (parsed.f !== fingerprint) {
    throw AppError.field('cursor', 'This cursor belongs to a walk with other filters; keep the filters unchanged while paging.');
  }
  return parsed.s;
}
