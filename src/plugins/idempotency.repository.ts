import { and, eq, sql } from 'drizzle-orm';
import type { Executor } from '../db/client.js';
import { idempotencyKeys } from '../db/schema.js';

export const IDEMPOTENCY_WINDOW_HOURS = 24;

export function createIdempotencyRepository(db: Executor) {
  return {
    /**
     * Claims the key for this request, or reclaims it when its 24 h window is over. When another
     * transaction holds the same key uncommitted, Postgres makes this statement wait for it, which
     * is what serializes concurrent duplicates across instances. Returns false when a live record
     * already exists (the caller then replays or rejects it).
     */
    async claim(
      values: { apiKeyId: string; key: string; orgId: string; fingerprint: string },
      tx: Executor = db,
    ): Promise<boolean> {
      const result = await tx.execute(sql`
        INSERT INTO idempotency_keys (api_key_id, key, org_id, fingerprint)
        VALUES (${values.apiKeyId}, ${values.key}, ${values.orgId}, ${values.fingerprint})
        ON CONFLICT (org_id, api_key_id, key) DO UPDATE
           SET fingerprint = EXCLUDED.fingerprint, response_status = NULL, response_body = NULL,
               created_at = clock_timestamp()
         WHERE idempotency_keys.created_at < clock_timestamp() - make_interval(hours => ${IDEMPOTENCY_WINDOW_HOURS})
        RETURNING 1
      `);
      return (result.rowCount ?? 0) > 0;
    },

    async find(orgId: string, apiKeyId: string, key: string, tx: Executor = db) {
      const [row] = await tx
        .select()
        .from(idempotencyKeys)
        .where(and(eq(idempotencyKeys.orgId, orgId), eq(idempotencyKeys.apiKeyId, apiKeyId), eq(idempotencyKeys.key, key)));
      return row;
    },

    async storeResponse(orgId: string, apiKeyId: string, key: string, status: number, body: string, tx: Executor = db): Promise<void> {
      await tx
        .update(idempotencyKeys)
        .set({ responseStatus: status, responseBody: body })
        .where(and(eq(idempotencyKeys.orgId, orgId), eq(idempotencyKeys.apiKeyId, apiKeyId), eq(idempotencyKeys.key, key)));
    },

    /** Deletes a batch of expired records; run off the request path. Returns how many went. */
    async deleteExpired(batchSize = 1000, tx: Executor = db): Promise<number> {
      const result = await tx.execute(sql`
        DELETE FROM idempotency_keys
         WHERE ctid IN (
           SELECT ctid FROM idempotency_keys
            WHERE created_at < clock_timestamp() - make_interval(hours => ${IDEMPOTENCY_WINDOW_HOURS})
            LIMIT ${batchSize})
      `);
      return result.rowCount ?? 0;
    },
  };
}
export type IdempotencyRepository = ReturnType<typeof createIdempotencyRepository>;
