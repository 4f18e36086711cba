import { createHash, createHmac, timingSafeEqual } from 'node:crypto';
import stableStringify from 'safe-stable-stringify';

/**
 * The hash chain of an organisation's audit rows, in one place: the sealer computes it, `svc audit
 * verify` recomputes it, and an offline verifier of an export must do exactly the same.
 *
 * hash(row) = hex SHA-256 of `${previous hash}\n${canonical content}`, where the previous hash is
 * the hash of the row with the sequence before it, or GENESIS_HASH for sequence 1. The canonical
 * content is the JSON of every stored column that says what happened, with object keys sorted at
 * every depth (safe-stable-stringify), so it reads the same from the database, an export or a test.
 */

/** The "previous hash" of sequence 1: 64 zeros, a value no SHA-256 of real content is expected to take. */
export const GENESIS_HASH = '0'.repeat(64);

/** A chain row as stored: what the canonical content is made of. */
export type ChainRow = {
  orgId: string;
  /** audit_log.id (a bigint): written as its decimal text. */
  id: number | string;
  sequence: number;
  createdAt: Date;
  actorType: string;
  actorId: string | null;
  action: string;
  subjectType: string;
  subjectId: string | null;
  before: unknown;
  after: unknown;
  requestId: string | null;
  idempotencyKey: string | null;
};

/**
 * The canonical content of a row. Bigints are written as decimal text (never a JS number past 2^53),
 * created_at as ISO 8601 with milliseconds (the column's precision), and a missing before/after as null.
 */
function canonicalContent(row: ChainRow): string {
  return stableStringify({
    org_id: row.orgId,
    id: String(row.id),
    sequence: String(row.sequence),
    created_at: row.createdAt.toISOString(),
    actor_type: row.actorType,
    actor_id: row.actorId,
    action: row.action,
    subject_type: row.subjectType,
    subject_id: row.subjectId,
    before: row.before ?? null,
    after: row.after ?? null,
    request_id: row.requestId,
    idempotency_key: row.idempotencyKey,
  }) as string;
}

/** The hash of `row` chained after `previousHash` (GENESIS_HASH for sequence 1). */
export function chainHash(previousHash: string, row: ChainRow): string {
  return createHash('sha256').update(previousHash).update('\n').update(canonicalContent(row)).digest('hex');
}

/** What a checkpoint vouches for: the hash of the organisation's row at `sequence`, the last one a purge removed. */
export type Checkpoint = { orgId: string; sequence: number; hash: string };

/**
 * The signature of a checkpoint: hex HMAC-SHA256, keyed by service_secrets.audit_checkpoint_hmac,
 * over the canonical JSON of {org_id, sequence (decimal text), hash}. Without the key, a checkpoint
 * cannot be moved or made up to hide rows deleted before it.
 */
export function checkpointSignature(key: Buffer, checkpoint: Checkpoint): string {
  const canonical = stableStringify({ org_id: checkpoint.orgId, sequence: String(checkpoint.sequence), hash: checkpoint.hash }) as string;
  return createHmac('sha256', key).update(canonical).digest('hex');
}

/** Whether `signature` is the checkpoint's, compared in constant time. */
export function checkpointSignatureMatches(key: Buffer, checkpoint: Checkpoint, signature: string): boolean {
  const expected = Buffer.from(checkpointSignature(key, checkpoint), 'hex');
  const given = /^[0-9a-f]+$/i.test(signature) ? Buffer.from(signature, 'hex') : Buffer.alloc(0);
  return given.length === expected.length && timingSafeEqual(given, expected);
}
