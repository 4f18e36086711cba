import { sql } from 'drizzle-orm';
import type { Executor } from '../../db/client.js';

/** A delivery held by one worker: the stored payload and what is needed to sign and send it. */
export type ClaimedDelivery = {
  id: string;
  orgId: string;
  eventId: string;
  endpointId: string;
  /** This attempt's number (the claim counted it). */
  attempt: number;
  payload: string;
  url: string;
  secret: string;
  endpointEnabled: boolean;
};

export type AttemptRecord = {
  statusCode: number | null;
  latencyMs: number | null;
  error: string | null;
  startedAt: Date;
};

/** How a claimed delivery ends this round. */
export type Settlement =
  | { status: 'succeeded'; attempt: AttemptRecord }
  | { status: 'failed'; attempt: AttemptRecord | null; error?: string; disableEndpointReason?: string }
  | { status: 'retry'; attempt: AttemptRecord; delayMs: number }
  /** Handed back unfinished (the worker is stopping): due again at once for any worker. */
  | { status: 'released'; attempt: AttemptRecord | null };

type ClaimRow = {
  id: string;
  org_id: string;
  event_id: string;
  endpoint_id: string;
  attempts: number;
  payload: string;
  url: string;
  secret: string;
  enabled: boolean;
};

/** The delivery worker's queries; it works across organisations but every join keeps to one. */
export function createDeliveryRepository(db: Executor) {
  return {
    /**
     * Claims up to `limit` due deliveries in one short statement: `FOR UPDATE SKIP LOCKED` lets
     * several workers claim side by side without waiting on or double-taking a row, and the lease
     * (`locked_until`) lets another worker retake a delivery whose worker died.
     */
    async claim(workerId: string, limit: number, leaseMs: number, tx: Executor = db): Promise<ClaimedDelivery[]> {
      const result = await tx.execute<ClaimRow>(sql`
        WITH due AS (
          SELECT id
            FROM webhook_deliveries
           WHERE status = 'pending'
             AND next_attempt_at <= clock_timestamp()
             AND (locked_until IS NULL OR locked_until < clock_timestamp())
           ORDER BY next_attempt_at
           LIMIT ${limit}
           FOR UPDATE SKIP LOCKED
        )
        UPDATE webhook_deliveries delivery
           SET locked_until = clock_timestamp() + ${leaseMs} * interval '1 millisecond',
               locked_by = ${workerId},
               attempts = delivery.attempts + 1,
               updated_at = clock_timestamp()
          FROM due, outbox_events event, webhook_endpoints endpoint
         WHERE delivery.id = due.id
           AND event.id = delivery.event_id AND event.org_id = delivery.org_id
           AND endpoint.id = delivery.endpoint_id AND endpoint.org_id = delivery.org_id
        RETURNING delivery.id, delivery.org_id, delivery.event_id, delivery.endpoint_id, delivery.attempts,
                  event.payload, endpoint.url, endpoint.secret, endpoint.enabled
      `);
      return result.rows.map((row) => ({
        id: row.id,
        orgId: row.org_id,
        eventId: row.event_id,
        endpointId: row.endpoint_id,
        attempt: row.attempts,
        payload: row.payload,
        url: row.url,
        secret: row.secret,
        endpointEnabled: row.enabled,
      }));
    },

    /**
     * Records the attempt and settles the delivery in one transaction (`tx` must be one). The update
     * is fenced on this worker's claim, so a worker whose lease expired cannot overwrite the outcome
     * of the worker that retook the delivery; its attempt is still kept in the history.
     */
    async settle(claim: ClaimedDelivery, workerId: string, settlement: Settlement, tx: Executor = db): Promise<boolean> {
      const attempt = settlement.attempt;
      if (attempt) {
        await tx.execute(sql`
          INSERT INTO webhook_attempts (org_id, delivery_id, attempt_number, worker_id, status_code, latency_ms, error, started_at)
          VALUES (${claim.orgId}, ${claim.id}, ${claim.attempt}, ${workerId}, ${attempt.statusCode}, ${attempt.latencyMs},
                  ${attempt.error}, ${attempt.startedAt.toISOString()})
        `);
      }
      const lastError = settlement.status === 'failed' && settlement.error ? settlement.error : (attempt?.error ?? null);
      const status = settlement.status === 'retry' || settlement.status === 'released' ? 'pending' : settlement.status;
      const delayMs = settlement.status === 'retry' ? settlement.delayMs : 0;
      // An attempt that never reached the network does not count towards the schedule.
      const uncounted = attempt ? 0 : 1;
      const updated = await tx.execute(sql`
        UPDATE webhook_deliveries
           SET status = ${status},
               attempts = attempts - ${uncounted},
               next_attempt_at = CASE WHEN ${status} = 'pending'
                                      THEN clock_timestamp() + ${delayMs} * interval '1 millisecond'
                                      ELSE next_attempt_at END,
               locked_until = NULL,
               locked_by = NULL,
               last_status_code = CASE WHEN ${attempt !== null} THEN ${attempt?.statusCode ?? null}::int ELSE last_status_code END,
               last_error = ${lastError},
               updated_at = clock_timestamp()
         WHERE id = ${claim.id} AND org_id = ${claim.orgId}
           AND status = 'pending' AND locked_by = ${workerId} AND attempts = ${claim.attempt}
      `);
      if (settlement.status === 'failed' && settlement.disableEndpointReason) {
        const reason = settlement.disableEndpointReason;
        await tx.execute(sql`
          UPDATE webhook_endpoints
             SET enabled = false, disabled_reason = ${reason}, updated_at = clock_timestamp()
           WHERE id = ${claim.endpointId} AND org_id = ${claim.orgId} AND enabled
        `);
        await tx.execute(sql`
          UPDATE webhook_deliveries
             SET status = 'failed', last_error = ${`endpoint disabled: ${reason}`}, updated_at = clock_timestamp()
           WHERE endpoint_id = ${claim.endpointId} AND org_id = ${claim.orgId} AND status = 'pending'
             AND (locked_until IS NULL OR locked_until < clock_timestamp())
        `);
      }
      return (updated.rowCount ?? 0) > 0;
    },
  };
}
export type DeliveryRepository = ReturnType<typeof createDeliveryRepository>;
