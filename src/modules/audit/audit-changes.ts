import { isDeepStrictEqual } from 'node:util';
import type { AuditEventDto } from './audit.schemas.js';

/*
 * Its own file because two readers of a row need it, GET /v1/audit-events (audit.service.ts) and the
 * export with its verifier (audit-export.ts, audit-export.verifier.ts), and the service imports the export.
 */

type Changes = AuditEventDto['changes'];

const isRecord = (value: unknown): value is Record<string, unknown> => typeof value === 'object' && value !== null && !Array.isArray(value);

/**
 * The fields that differ between a row's before and after, each with its old and new value. A field
 * missing on one side counts as null there (a creation lists every field with old null). Rows whose
 * before/after is not an object compare as a whole, under `value`.
 */
export function changesOf(before: unknown, after: unknown): Changes {
  const changes: Changes = {};
  if (!isRecord(before ?? {}) || !isRecord(after ?? {})) {
    if (!isDeepStrictEqual(before ?? null, after ?? null)) changes.value = { old: before ?? null, new: after ?? null };
    return changes;
  }
  const old = (before ?? {}) as Record<string, unknown>;
  const next = (after ?? {}) as Record<string, unknown>;
  for (const field of [...new Set([...Object.keys(old), ...Object.keys(next)])].sort()) {
    const was = old[field] ?? null;
    const is = next[field] ?? null;
    if (!isDeepStrictEqual(was, is)) changes[field] = { old: was, new: is };
  }
  return changes;
}
