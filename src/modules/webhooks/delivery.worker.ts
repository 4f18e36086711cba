import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import pino from 'pino';
import type { DataAccess, Database } from '../../db/client.js';
import { createWakeSignal } from '../../shared/wake-signal.js';
import { createDeliveryRepository, type ClaimedDelivery, type EndpointDisableRequest, type Settlement } from './delivery.repository.js';
import { createEndpointDisabler } from './webhooks.service.js';
import { createWebhookSender, DEFAULT_REQUEST_TIMEOUT_MS, type SendResult } from './webhook-sender.js';

export const DELIVERY_CHANNEL = 'webhook_deliveries';

const SECOND = 1000;
const MINUTE = 60 * SECOND;
const HOUR = 60 * MINUTE;
/**
 * Delay before retry n (after attempt n fails): roughly exponential, 15 attempts spread over about
 * three days (71.9 h from the first attempt to the last), so a receiver down for a weekend still
 * gets its events.
 */
export const DEFAULT_RETRY_SCHEDULE_MS: readonly number[] = [
  5 * SECOND,
  30 * SECOND,
  2 * MINUTE,
  5 * MINUTE,
  15 * MINUTE,
  30 * MINUTE,
  1 * HOUR,
  2 * HOUR,
  4 * HOUR,
  8 * HOUR,
  10 * HOUR,
  12 * HOUR,
  16 * HOUR,
  18 * HOUR,
];
/** A receiver may ask for a pause with Retry-After, but not park a delivery beyond a day. */
const MAX_RETRY_AFTER_MS = 24 * HOUR;
/** WEBHOOK_DISABLE_AFTER_HOURS's default: a receiver down for a long weekend keeps its endpoint. */
const DEFAULT_DISABLE_ENDPOINT_AFTER_MS = 72 * HOUR;

/** "72 hours", or for the short periods tests use, seconds. */
function describePeriod(ms: number): string {
  return ms % HOUR === 0 ? `${ms / HOUR} hour${ms === HOUR ? '' : 's'}` : `${ms / SECOND} seconds`;
}

type WorkerLogger = Pick<pino.Logger, 'debug' | 'info' | 'warn' | 'error'>;

export type DeliveryWorkerOptions = {
  database: DataAccess & Pick<Database, 'onWake'>;
  allowPrivateUrls: boolean;
  /** Endpoint ports allowed besides 443 (WEBHOOK_ALLOWED_PORTS). */
  allowedPorts?: readonly number[];
  logger?: WorkerLogger;
  workerId?: string;
  /** Deliveries in flight at once in this worker. */
  concurrency?: number;
  /** Polling, which alone guarantees delivery: a wake after this process's commits only shortens the wait. */
  pollIntervalMs?: number;
  /** Only a 2xx answer completed within this time is a success. */
  requestTimeoutMs?: number;
  /** How long past the request timeout a claim stays exclusive before another worker may retake it. */
  leaseMarginMs?: number;
  retrySchedule?: readonly number[];
  /** Spread of each retry delay: 0.2 means ±20 %, so failing endpoints are not retried in lockstep. */
  jitter?: number;
  maxRetryAfterMs?: number;
  /**
   * An endpoint whose every attempt has failed for longer than this (failing_since) is disabled when
   * its next attempt fails (WEBHOOK_DISABLE_AFTER_HOURS; default 72 h).
   */
  disableEndpointAfterMs?: number;
  /** How long stop() lets in-flight posts finish before aborting and releasing them. */
  stopTimeoutMs?: number;
};

export type DeliveryWorkerStats = {
  claimed: number;
  succeeded: number;
  retried: number;
  failed: number;
  released: number;
  /** Claim statements run (claimed / claimQueries = rows per claim). */
  claimQueries: number;
  /** Settle statements run (settled / settleBatches = rows per batch). */
  settleBatches: number;
};

export type DeliveryWorker = {
  readonly id: string;
  start(): Promise<void>;
  /** Stops claiming, lets in-flight posts finish (bounded), and releases whatever did not finish. */
  stop(): Promise<void>;
  stats(): DeliveryWorkerStats;
};

export function createDeliveryWorker(options: DeliveryWorkerOptions): DeliveryWorker {
  const { database } = options;
  const logger: WorkerLogger = options.logger ?? pino({ level: 'silent' });
  const workerId = options.workerId ?? `${hostname()}:${process.pid}:${randomUUID().slice(0, 8)}`;
  const concurrency = options.concurrency ?? 32;
  const pollIntervalMs = options.pollIntervalMs ?? 2_000;
  const requestTimeoutMs = options.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
  const leaseMs = requestTimeoutMs + (options.leaseMarginMs ?? 30_000);
  const schedule = options.retrySchedule ?? DEFAULT_RETRY_SCHEDULE_MS;
  const maxAttempts = schedule.length + 1;
  const jitter = options.jitter ?? 0.2;
  const maxRetryAfterMs = options.maxRetryAfterMs ?? MAX_RETRY_AFTER_MS;
  const disableAfterMs = options.disableEndpointAfterMs ?? DEFAULT_DISABLE_ENDPOINT_AFTER_MS;
  const stopTimeoutMs = options.stopTimeoutMs ?? 10_000;
  const refillAt = Math.max(1, Math.floor(concurrency / 4));

  const deliveries = createDeliveryRepository();
  const disabler = createEndpointDisabler();
  const sender = createWebhookSender({
    allowPrivateUrls: options.allowPrivateUrls,
    allowedPorts: options.allowedPorts,
    timeoutMs: requestTimeoutMs,
  });
  const wake = createWakeSignal();
  /** Posts on the wire (they hold a concurrency slot and can be aborted on stop). */
  const posting = new Map<string, AbortController>();
  /** Every claimed delivery until its outcome is written, posting or waiting for its settle batch. */
  const tasks = new Set<Promise<void>>();
  /** Claimed ahead of free posting slots, so a claim round trip is not on every post's path. */
  const ready: Array<{ claim: ClaimedDelivery; claimedAt: number }> = [];
  const maxReady = concurrency;
  // Posting, ready and waiting-to-settle together never exceed this, so a slow database pauses claiming.
  const maxHeld = concurrency * 3;
  // A claim that waited this long in the ready queue is handed back rather than posted, so a post
  // can never start so late that it outlives the lease and overlaps another worker's attempt.
  const maxReadyAgeMs = Math.max(0, leaseMs - requestTimeoutMs) / 2;
  const stats: DeliveryWorkerStats = { claimed: 0, succeeded: 0, retried: 0, failed: 0, released: 0, claimQueries: 0, settleBatches: 0 };

  let stopping = false;
  let saturated = false;
  let loop: Promise<void> | undefined;
  let stopped: Promise<void> | undefined;
  let unsubscribe: (() => void) | undefined;

  function retryDelay(attempt: number, result: SendResult): number {
    if (result.retryAfterMs !== null) return Math.min(result.retryAfterMs, maxRetryAfterMs);
    const base = schedule[Math.min(attempt, schedule.length) - 1] ?? 0;
    return Math.round(base * (1 - jitter + 2 * jitter * Math.random()));
  }

  function decide(claim: ClaimedDelivery, result: SendResult, startedAt: Date): Settlement {
    const attempt = { statusCode: result.statusCode, latencyMs: result.latencyMs, error: result.error, startedAt };
    if (result.aborted) return { status: 'released', attempt };
    const code = result.statusCode;
    if (result.error === null && code !== null && code >= 200 && code < 300) return { status: 'succeeded', attempt };
    if (code === 410) {
      return { status: 'failed', attempt, disableEndpoint: { reason: `the endpoint answered 410 Gone on ${startedAt.toISOString()}` } };
    }
    const failing = failingTooLong(claim, result, startedAt);
    if (claim.attempt >= maxAttempts) {
      return {
        status: 'failed',
        attempt,
        error: `${result.error ?? `HTTP ${code}`} (gave up after ${claim.attempt} attempts)`,
        ...failing,
      };
    }
    return { status: 'retry', attempt, delayMs: retryDelay(claim.attempt, result), ...failing };
  }

  /**
   * A failed attempt on an endpoint failing for longer than the period (as the claim saw it) asks for
   * the disable; the database checks the period again under the endpoint's lock, so a success that
   * cleared failing_since meanwhile keeps the endpoint.
   */
  function failingTooLong(claim: ClaimedDelivery, result: SendResult, startedAt: Date): { disableEndpoint?: EndpointDisableRequest } {
    const since = claim.endpointFailingSince;
    if (since === null || startedAt.getTime() - since.getTime() <= disableAfterMs) return {};
    const lastError = result.error ?? `HTTP ${result.statusCode}`;
    return {
      disableEndpoint: {
        reason: `every attempt has failed since ${since.toISOString()} (more than ${describePeriod(disableAfterMs)}); the last: ${lastError}`,
        failingForMs: disableAfterMs,
      },
    };
  }

  /**
   * Settlements are written in batches: whatever finished while the previous batch was being written
   * goes out in the next statement, so under load one round trip settles many deliveries and at low
   * load each is written at once (no timer).
   */
  const settleQueue: Array<{ claim: ClaimedDelivery; settlement: Settlement; done: (error: unknown, applied?: boolean) => void }> = [];
  let flushing = false;

  async function flushSettlements(): Promise<void> {
    flushing = true;
    try {
      while (settleQueue.length > 0) {
        const batch = settleQueue.splice(0, 200);
        try {
          stats.settleBatches += 1;
          const applied = await deliveries.settleMany(batch, workerId, database.db);
          for (const item of batch) item.done(undefined, applied.has(item.claim.id));
        } catch (error) {
          if (batch.length === 1) {
            batch[0]!.done(error);
            continue;
          }
          // One bad row must not cost the others their outcome: settle them one by one.
          for (const item of batch) {
            await deliveries
              .settleMany([item], workerId, database.db)
              .then((applied) => item.done(undefined, applied.has(item.claim.id)))
              .catch((single: unknown) => item.done(single));
          }
        }
      }
    } finally {
      flushing = false;
    }
  }

  /**
   * Settles the delivery and disables its endpoint in one transaction. The delivery is settled first
   * (the order of the batched settlements: delivery, then endpoint); a retry it was given is then
   * failed with the endpoint's other queued deliveries.
   */
  async function settleAndDisable(
    claim: ClaimedDelivery,
    settlement: Settlement,
    request: EndpointDisableRequest,
  ): Promise<{ applied: boolean; disabled: boolean }> {
    return database.transaction(async (tx) => {
      const applied = await deliveries.settle(claim, workerId, settlement, tx);
      const outcome = await disabler.disable(
        {
          orgId: claim.orgId,
          endpointId: claim.endpointId,
          reason: request.reason,
          failingForMs: request.failingForMs,
          actor: { type: 'system', id: workerId },
          cause: { delivery_id: claim.id, event_id: claim.eventId },
        },
        tx,
      );
      return { applied, disabled: outcome?.disabled === true };
    });
  }

  async function settle(claim: ClaimedDelivery, settlement: Settlement): Promise<void> {
    const request = settlement.status === 'failed' || settlement.status === 'retry' ? settlement.disableEndpoint : undefined;
    const { applied, disabled } = request
      ? await settleAndDisable(claim, settlement, request)
      : {
          disabled: false,
          applied: await new Promise<boolean>((resolve, reject) => {
            settleQueue.push({ claim, settlement, done: (error, ok) => (error ? reject(error) : resolve(ok === true)) });
            if (!flushing) void flushSettlements();
          }),
        };
    if (disabled) logger.warn({ endpointId: claim.endpointId, orgId: claim.orgId, reason: request?.reason }, 'webhook endpoint disabled');
    if (!applied) {
      logger.warn({ deliveryId: claim.id, workerId }, 'webhook delivery was retaken by another worker before this attempt settled');
      return;
    }
    const counter = settlement.status === 'retry' ? (disabled ? 'failed' : 'retried') : settlement.status;
    stats[counter] += 1;
  }

  function wantToClaim(): number {
    return Math.min(concurrency - posting.size + maxReady - ready.length, maxHeld - tasks.size - ready.length);
  }

  /** Starts ready claims on free posting slots, and asks the loop for more once enough room opened. */
  function pump(): void {
    while (posting.size < concurrency && ready.length > 0 && !stopping) {
      const { claim, claimedAt } = ready.shift()!;
      if (performance.now() - claimedAt > maxReadyAgeMs) track(claim, settle(claim, { status: 'released', attempt: null }));
      else launch(claim);
    }
    // Refill in batches rather than one claim query per finished post.
    if (saturated && wantToClaim() >= refillAt) wake.notify();
  }

  async function deliver(claim: ClaimedDelivery, signal: AbortSignal): Promise<void> {
    if (!claim.endpointEnabled) {
      await settle(claim, { status: 'failed', attempt: null, error: 'endpoint disabled' });
      return;
    }
    const startedAt = new Date();
    let result: SendResult;
    try {
      result = await sender.send({
        url: claim.url,
        secret: claim.secret,
        previousSecret: claim.previousSecret,
        eventId: claim.eventId,
        payload: claim.payload,
        signal,
      });
    } catch (error) {
      // A request that cannot even be built is a failed attempt like any other, not a stuck claim.
      const message = error instanceof Error ? error.message : String(error);
      result = { statusCode: null, retryAfterMs: null, error: `request failed: ${message}`, latencyMs: 0, aborted: false };
    } finally {
      posting.delete(claim.id);
      pump();
    }
    const settlement = decide(claim, result, startedAt);
    logger.debug(
      {
        deliveryId: claim.id,
        eventId: claim.eventId,
        attempt: claim.attempt,
        outcome: settlement.status,
        statusCode: result.statusCode,
        latencyMs: result.latencyMs,
      },
      'webhook attempt',
    );
    await settle(claim, settlement);
  }

  function track(claim: ClaimedDelivery, work: Promise<void>): void {
    const task: Promise<void> = work
      .catch((error: unknown) => {
        // The lease runs out and another worker retakes the delivery; nothing is lost.
        logger.error({ err: error, deliveryId: claim.id }, 'webhook delivery could not be settled');
      })
      .finally(() => {
        posting.delete(claim.id);
        tasks.delete(task);
        pump();
      });
    tasks.add(task);
  }

  function launch(claim: ClaimedDelivery): void {
    const controller = new AbortController();
    posting.set(claim.id, controller);
    track(claim, deliver(claim, controller.signal));
  }

  /** Hands back claims that were never posted: due again at once, the attempt not counted. */
  async function releaseUnstarted(claims: ClaimedDelivery[]): Promise<void> {
    await Promise.all(
      claims.map((claim) =>
        settle(claim, { status: 'released', attempt: null }).catch((error: unknown) =>
          logger.warn({ err: error, deliveryId: claim.id }, 'could not release a webhook delivery; its lease will expire'),
        ),
      ),
    );
  }

  async function run(): Promise<void> {
    while (!stopping) {
      const want = wantToClaim();
      if (want < refillAt) {
        saturated = true;
        await wake.wait(pollIntervalMs);
        continue;
      }
      let claimed: ClaimedDelivery[];
      try {
        stats.claimQueries += 1;
        claimed = await deliveries.claim(workerId, want, leaseMs, database.db);
      } catch (error) {
        logger.warn({ err: error }, 'claiming webhook deliveries failed; retrying');
        await wake.wait(pollIntervalMs);
        continue;
      }
      stats.claimed += claimed.length;
      if (stopping) {
        await releaseUnstarted(claimed);
        break;
      }
      const claimedAt = performance.now();
      for (const claim of claimed) ready.push({ claim, claimedAt });
      saturated = claimed.length === want;
      pump();
      if (!saturated) await wake.wait(pollIntervalMs);
    }
    await releaseUnstarted(ready.splice(0).map((entry) => entry.claim));
  }

  return {
    id: workerId,

    async start() {
      if (loop) return;
      // Commits on this process's Database wake the loop directly, without a round trip through PostgreSQL.
      unsubscribe = database.onWake(DELIVERY_CHANNEL, () => wake.notify());
      loop = run().catch((error: unknown) => logger.error({ err: error }, 'webhook delivery loop crashed'));
    },

    stop() {
      stopped ??= (async () => {
        stopping = true;
        unsubscribe?.();
        wake.close();
        await loop;
        const pending = () => Promise.allSettled([...tasks]);
        let timer: NodeJS.Timeout | undefined;
        const timedOut = await Promise.race([
          pending().then(() => false),
          new Promise<boolean>((resolve) => {
            timer = setTimeout(() => resolve(true), stopTimeoutMs);
          }),
        ]);
        clearTimeout(timer);
        if (timedOut) {
          logger.warn({ posting: posting.size }, 'releasing unfinished webhook deliveries on stop');
          for (const controller of posting.values()) controller.abort();
          await pending();
        }
        sender.close();
      })();
      return stopped;
    },

    stats() {
      return { ...stats };
    },
  };
}
