import { sql } from 'drizzle-orm';
import type { Executor } from '../../db/client.js';
import { claimFairly, createOrgRotation, dueOrganisations } from '../../shared/fair-claims.js';

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
  /** The secret a rotation replaced, while its grace lasts (null otherwise): deliveries carry its signature too. */
  previousSecret: string | null;
  endpointEnabled: boolean;
  /** Since when every attempt to the endpoint has failed, as the claim saw it; null when its last attempt succeeded. */
  endpointFailingSince: Date | null;
};

export type AttemptRecord = {
  statusCode: number | null;
  latencyMs: number | null;
  error: string | null;
  startedAt: Date;
};

/**
 * The endpoint is to be disabled with the settlement (the worker does it in the settlement's
 * transaction), only while it has failed for longer than `failingForMs` when that is given.
 */
export type EndpointDisableRequest = { reason: string; failingForMs?: number };

/** How a claimed delivery ends this round. */
export type Settlement =
  | { status: 'succeeded'; attempt: AttemptRecord }
  | { status: 'failed'; attempt: AttemptRecord | null; error?: string; disableEndpoint?: EndpointDisableRequest }
  | { status: 'retry'; attempt: AttemptRecord; delayMs: number; disableEndpoint?: EndpointDisableRequest }
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
  previous_secret: string | null;
  enabled: boolean;
  failing_since_ms: number | null;
};

const MAX_ERROR_LENGTH = 1000;
const truncate = (text: string | null) => (text && text.length > MAX_ERROR_LENGTH ? `${text.slice(0, MAX_ERROR_LENGTH - 1)}…` : text);

/**
 * The delivery worker's queries. It works across organisations, but every statement keeps to one:
 * a claim finds the organisations with due deliveries, then claims within each (fair-claims.ts).
 */
export function createDeliveryRepository() {
  // Where this worker's next claim starts looking for organisations.
  const rotation = createOrgRotation();

  /**
   * Organisations after `after` (org_id order) with a delivery due now and not held, at most
   * `limit`: a skip scan of webhook_deliveries_due_idx, one probe per organisation with pending
   * deliveries and one to check it has a due one.
   */
  async function organisationsWithDueDeliveries(after: string, limit: number, tx: Executor): Promise<string[]> {
    const result = await tx.execute<{ org_id: string }>(sql`
      WITH RECURSIVE pending AS (
        (SELECT org_id FROM webhook_deliveries WHERE status = 'pending' AND org_id > ${after}::uuid ORDER BY org_id LIMIT 1)
        UNION ALL
        SELECT (SELECT d.org_id FROM webhook_deliveries d WHERE d.status = 'pending' AND d.org_id > pending.org_id ORDER BY d.org_id LIMIT 1)
          FROM pending
         WHERE pending.org_id IS NOT NULL
      )
      SELECT org_id FROM pending
       WHERE org_id IS NOT NULL
         AND EXISTS (SELECT 1 FROM webhook_deliveries d
                      WHERE d.org_id = pending.org_id AND d.status = 'pending' AND d.next_attempt_at <= clock_timestamp()
                        AND (d.locked_until IS NULL OR d.locked_until < clock_timestamp()))
       LIMIT ${limit}`);
    return result.rows.map((row) => row.org_id);
  }

  /**
   * Claims up to `limit` due deliveries of one organisation in one short statement: `FOR UPDATE SKIP
   * LOCKED` lets several workers claim side by side without waiting on or double-taking a row, and
   * the lease (`locked_until`) lets another worker retake a delivery whose worker died.
   */
  async function claimIn(orgId: string, workerId: string, limit: number, leaseMs: number, tx: Executor): Promise<ClaimedDelivery[]> {
    const result = await tx.execute<ClaimRow>(sql`
      WITH due AS (
        SELECT id
          FROM webhook_deliveries
         WHERE org_id = ${orgId}
           AND status = 'pending'
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
       WHERE delivery.org_id = ${orgId} AND delivery.id = due.id
         AND event.id = delivery.event_id AND event.org_id = delivery.org_id
         AND endpoint.id = delivery.endpoint_id AND endpoint.org_id = delivery.org_id
      RETURNING delivery.id, delivery.org_id, delivery.event_id, delivery.endpoint_id, delivery.attempts,
                event.payload, endpoint.url, endpoint.secret, endpoint.enabled,
                (extract(epoch FROM endpoint.failing_since) * 1000)::float8 AS failing_since_ms,
                CASE WHEN endpoint.previous_secret_expires_at > clock_timestamp() THEN endpoint.previous_secret END AS previous_secret
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
      previousSecret: row.previous_secret,
      endpointEnabled: row.enabled,
      endpointFailingSince: row.failing_since_ms === null ? null : new Date(row.failing_since_ms),
    }));
  }

  const repository = {
    /**
     * Claims up to `limit` due deliveries across organisations: an equal share of each organisation
     * with due deliveries first, so one busy organisation does not hold up the others. Each
     * organisation's claim is a statement of its own, committed on its own.
     */
    async claim(workerId: string, limit: number, leaseMs: number, tx: Executor): Promise<ClaimedDelivery[]> {
      const orgIds = await dueOrganisations(rotation, limit, (after, count) => organisationsWithDueDeliveries(after, count, tx));
      return claimFairly(orgIds, limit, (orgId, count) => claimIn(orgId, workerId, count, leaseMs, tx));
    },

    /**
     * Records the attempts and settles the deliveries of one worker in one statement (atomic without
     * an explicit transaction, one round trip and one commit for the whole batch). Each update is
     * fenced on this worker's claim, so a worker whose lease expired cannot overwrite the outcome of
     * the worker that retook the delivery; its attempt is still kept in the history. Returns the ids
     * whose settlement applied.
     *
     * The same statement keeps each endpoint's failing_since: the start of the first failed attempt
     * after its last success (null after a success). It writes an endpoint only when that changes, so
     * a steadily failing or steadily healthy endpoint costs no write, and only while it is enabled (an
     * attempt settling after a disable leaves a re-enabled endpoint a fresh start). Endpoints are
     * locked in key order, so two batches touching the same endpoints cannot deadlock.
     */
    async settleMany(
      items: Array<{ claim: ClaimedDelivery; settlement: Settlement }>,
      workerId: string,
      tx: Executor,
    ): Promise<Set<string>> {
      if (items.length === 0) return new Set();
      const rows = items.map(({ claim, settlement }) => {
        const attempt = settlement.attempt;
        const status = settlement.status === 'retry' || settlement.status === 'released' ? 'pending' : settlement.status;
        const delayMs = settlement.status === 'retry' ? Math.round(settlement.delayMs) : 0;
        const lastError = truncate(settlement.status === 'failed' && settlement.error ? settlement.error : (attempt?.error ?? null));
        // An attempt that never reached the network does not count towards the schedule.
        const uncounted = attempt ? 0 : 1;
        // What the receiver's health is judged on: an interrupted attempt (released) says nothing about it.
        const outcome =
          attempt === null || settlement.status === 'released' ? null : settlement.status === 'succeeded' ? 'success' : 'failure';
        return sql`(${claim.id}::uuid, ${claim.orgId}::uuid, ${claim.endpointId}::uuid, ${claim.attempt}::int, ${status}::text, ${delayMs}::bigint,
                    ${uncounted}::int, ${attempt !== null}::boolean, ${attempt?.statusCode ?? null}::int,
                    ${attempt?.latencyMs ?? null}::int, ${truncate(attempt?.error ?? null)}::text,
                    ${attempt?.startedAt.toISOString() ?? null}::timestamptz, ${lastError}::text, ${outcome}::text)`;
      });
      const result = await tx.execute<{ id: string }>(sql`
        WITH input (id, org_id, endpoint_id, attempt_number, status, delay_ms, uncounted, has_attempt, status_code, latency_ms, error, started_at, last_error, outcome) AS (
          VALUES ${sql.join(rows, sql`, `)}
        ),
        recorded AS (
          INSERT INTO webhook_attempts (org_id, delivery_id, attempt_number, worker_id, status_code, latency_ms, error, started_at)
          SELECT input.org_id, input.id, input.attempt_number, ${workerId}, input.status_code, input.latency_ms, input.error, input.started_at
            FROM input
            -- A delivery deleted with its endpoint while this attempt was posting drops the attempt
            -- rather than failing the batch on the foreign key. (Not locked: a row lock here would
            -- skip the rows this statement itself updates. A delete committing during the statement
            -- still fails it, and the worker then settles the batch one by one.)
            JOIN webhook_deliveries kept ON kept.org_id = input.org_id AND kept.id = input.id
           WHERE input.has_attempt
        ),
        last_success AS (
          SELECT org_id, endpoint_id, max(started_at) FILTER (WHERE outcome = 'success') AS at
            FROM input
           WHERE outcome IS NOT NULL
           GROUP BY org_id, endpoint_id
        ),
        health AS (
          SELECT ls.org_id, ls.endpoint_id, ls.at AS last_success,
                 (SELECT min(i.started_at) FROM input i
                   WHERE i.org_id = ls.org_id AND i.endpoint_id = ls.endpoint_id AND i.outcome = 'failure'
                     AND (ls.at IS NULL OR i.started_at > ls.at)) AS failing_from
            FROM last_success ls
        ),
        changed AS (
          SELECT endpoint.org_id, endpoint.id,
                 CASE WHEN health.last_success IS NULL THEN coalesce(endpoint.failing_since, health.failing_from)
                      ELSE health.failing_from END AS failing_since
            FROM webhook_endpoints endpoint
            JOIN health ON endpoint.org_id = health.org_id AND endpoint.id = health.endpoint_id
           WHERE endpoint.enabled
             AND endpoint.failing_since IS DISTINCT FROM
                 CASE WHEN health.last_success IS NULL THEN coalesce(endpoint.failing_since, health.failing_from)
                      ELSE health.failing_from END
           ORDER BY endpoint.org_id, endpoint.id
             FOR UPDATE OF endpoint
        ),
        tracked AS (
          UPDATE webhook_endpoints endpoint
             SET failing_since = changed.failing_since
            FROM changed
           WHERE endpoint.org_id = changed.org_id AND endpoint.id = changed.id
        )
        UPDATE webhook_deliveries delivery
           SET status = input.status,
               attempts = delivery.attempts - input.uncounted,
               next_attempt_at = CASE WHEN input.status = 'pending'
                                      THEN clock_timestamp() + input.delay_ms * interval '1 millisecond'
                                      ELSE delivery.next_attempt_at END,
               locked_until = NULL,
               locked_by = NULL,
               last_status_code = CASE WHEN input.has_attempt THEN input.status_code ELSE delivery.last_status_code END,
               last_error = input.last_error,
               updated_at = clock_timestamp()
          FROM input
         WHERE delivery.id = input.id AND delivery.org_id = input.org_id
           AND delivery.status = 'pending' AND delivery.locked_by = ${workerId} AND delivery.attempts = input.attempt_number
        RETURNING delivery.id
      `);
      return new Set(result.rows.map((row) => row.id));
    },

    /** Settles one delivery (in the caller's transaction when it gives one); false when another worker had retaken it. */
    async settle(claim: ClaimedDelivery, workerId: string, settlement: Settlement, tx: Executor): Promise<boolean> {
      return (await repository.settleMany([{ claim, settlement }], workerId, tx)).has(claim.id);
    },
  };
  return repository;
}
