import { sql } from 'drizzle-orm';
import type { Executor, Tx } from '../db/client.js';

export const IDEMPOTENCY_WINDOW_HOURS = 24;
/** The first key of the two-key advisory locks on idempotency keys ('idem'), so they meet no other lock of the app. */
const IDEMPOTENCY_LOCK_CLASS = 0x6964656d;

/** A reply stored under an Idempotency-Key, with the fingerprint of the request that produced it. */
export type StoredReply = { fingerprint: string; responseStatus: number; responseBody: string };

const LIVE_RECORD = (orgId: string, apiKeyId: string, key: string) => sql`
  SELECT fingerprint, response_status, response_body
    FROM idempotency_keys
   WHERE org_id = ${orgId} AND api_key_id = ${apiKeyId} AND key = ${key}
     AND created_at >= clock_timestamp() - make_interval(hours => ${IDEMPOTENCY_WINDOW_HOURS})`;

type RecordRow = { fingerprint: string; response_status: number; response_body: string };

const toStoredReply = (row: RecordRow | undefined): StoredReply | undefined =>
  row && { fingerprint: row.fingerprint, responseStatus: row.response_status, responseBody: row.response_body };

export function createIdempotencyRepository() {
  return {
    /** The key's live record, without a lock: a stored reply never changes within its window. */
    async find(orgId: string, apiKeyId: string, key: string, executor: Executor): Promise<StoredReply | undefined> {
      return toStoredReply((await executor.execute<RecordRow>(LIVE_RECORD(orgId, apiKeyId, key))).rows[0]);
    },

    /**
     * Serialises the requests that carry this key until this transaction ends (a transaction-scoped
     * advisory lock, so it holds across instances and goes with a rollback), then reads its live
     * record. The two statements leave together (the pool pipelines a transaction's statements),
     * and the read runs after the lock is granted, with a snapshot of its own (READ COMMITTED), so
     * it sees the record a duplicate that held the lock just committed.
     *
     * Why not claim the key by inserting its row first: the row would then be updated with the
     * response in the same transaction, and PostgreSQL checks the foreign keys of a row inserted in
     * the same transaction again on every update (docs/decisions.md, "A write budget per route").
     */
    async lockAndFind(orgId: string, apiKeyId: string, key: string, tx: Tx): Promise<StoredReply | undefined> {
      const [, found] = await Promise.all([
        tx.execute(sql`SELECT pg_advisory_xact_lock(${IDEMPOTENCY_LOCK_CLASS}, hashtext(${apiKeyId} || ':' || ${key}))`),
        tx.execute<RecordRow>(LIVE_RECORD(orgId, apiKeyId, key)),
      ]);
      return toStoredReply(found.rows[0]);
    },

    /**
     * Writes the record once, with its response, at the end of the request's transaction (under the
     * lock of lockAndFind). An expired record of the same key is replaced in place: its keys are
     * unchanged, so no foreign key is checked again.
     */
    async store(
      values: { apiKeyId: string; key: string; orgId: string; fingerprint: string; status: number; body: string },
      tx: Tx,
    ): Promise<void> {
      const result = await tx.execute(sql`
        INSERT INTO idempotency_keys (api_key_id, key, org_id, fingerprint, response_status, response_body)
        VALUES (${values.apiKeyId}, ${values.key}, ${values.orgId}, ${values.fingerprint}, ${values.status}, ${values.body})
        ON CONFLICT (org_id, api_key_id, key) DO UPDATE
           SET fingerprint = EXCLUDED.fingerprint, response_status = EXCLUDED.response_status,
               response_body = EXCLUDED.response_body, created_at = clock_timestamp()
         WHERE idempotency_keys.created_at < clock_timestamp() - make_interval(hours => ${IDEMPOTENCY_WINDOW_HOURS})
      `);
      // Only a writer that skipped the lock could have stored a live record meanwhile.
      if ((result.rowCount ?? 0) !== 1) throw new Error('idempotency record stored concurrently without the key lock');
    },
  };
}
