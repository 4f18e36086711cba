import { createHash } from 'node:crypto';
import stableStringify from 'safe-stable-stringify';
import { AppError } from '../../shared/app-error.js';
import { isUuid } from '../../shared/ids.js';

/** Fingerprint of the filters a walk started with; a cursor only continues the same walk. */
export function filterFingerprint(filters: Record<string, unknown>): string {
  return createHash('sha256').update(stableStringify(filters) ?? '').digest('base64url').slice(0, 16);
}

export function encodeCursor(position: { createdAt: Date; id: string }, fingerprint: string): string {
  return Buffer.from(JSON.stringify({ c: position.createdAt.toISOString(), i: position.id, f: fingerprint })).toString('base64url');
}

export function decodeCursor(cursor: string, fingerprint: string): { createdAt: Date; id: string } {
  let parsed: { c?: unknown; i?: unknown; f?: unknown };
  try {
    parsed = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8'));
  } catch {
    throw AppError.field('cursor', 'Not a cursor returned by this API; pass next_cursor back unchanged.');
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) {
    throw AppError.field('cursor', 'Not a cursor returned by this API; pass next_cursor back unchanged.');
  }
  const createdAt = typeof parsed.c === 'string' ? new Date(parsed.c) : undefined;
  if (!createdAt || Number.isNaN(createdAt.getTime()) || typeof parsed.i !== 'string' || !isUuid(parsed.i)) {
    throw AppError.field('cursor', 'Not a cursor returned by this API; pass next_cursor back unchanged.');
  }
  if (parsed.f !== fingerprint) {
    throw AppError.field('cursor', 'This cursor belongs to a walk with other filters; keep the filters unchanged while paging.');
  }
  return { createdAt, id: parsed.i };
}
