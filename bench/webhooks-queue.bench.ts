/**
 * Webhook delivery on pg-boss against the current delivery worker: can delivery move onto the job
 * queue without losing throughput?
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npx tsx bench/webhooks-queue.bench.ts
 *
 * Options (environment): BENCH_EVENTS (2000), BENCH_ROUNDS (3), BENCH_COMMIT_TRANSACTIONS (2000),
 * BENCH_POLL_VARIANTS (on; `off` leaves out the three poll-only pg-boss runs, about N/64 s each),
 * BENCH_RESULTS (bench/results/webhooks-queue.md).
 *
 * In one scratch database (dropped after), with one pool of 10 connections for everything the
 * process does (the app's statements and pg-boss's, through a pg-boss `db` adapter on that pool):
 *
 * 1. Delivery, after an unmeasured warm-up of each side, in BENCH_ROUNDS rounds in ABBA order (A
 *    first in odd rounds, last in even ones):
 *    A. the current worker (createDeliveryWorker, concurrency 32, listen off) delivering N seeded
 *       events, from start() until the loopback receiver has seen N distinct webhook-ids;
 *    B. a pg-boss prototype: every seeded delivery also gets a pg-boss job, sent in the transaction
 *       that wrote the delivery; boss.work (32 deliveries in flight per instance, in three shapes)
 *       whose handler loads its batch's deliveries in one statement (the claim's UPDATE, by key: it
 *       counts the attempt and takes the lease, so the repository's settleMany applies unchanged),
 *       posts with createWebhookSender (same timeout as the worker), settles through settleMany
 *       (coalesced across the instance's handlers as the worker coalesces its settlements) and
 *       returns per-job results for pg-boss to complete. Polling interval 0.5 s (the minimum); the
 *       worker re-fetches at once while there is work (`burstWhenBatchFull`, or at batchSize 1, where
 *       pg-boss ignores it, a notifyWorker to the instance's workers after each job). Then the same
 *       three shapes once each as the job runner configures workers today (poll only: one fetch per
 *       worker per 0.5 s).
 *    Each run gets an organisation and endpoint of its own, so its outcome can be checked: every
 *    delivery succeeded with one attempt recorded (what GET /webhook-endpoints/{id}/deliveries shows),
 *    every job completed, nothing posted twice. Each run also reports the CPU this process and the
 *    scratch database's backends used (from /proc, when PostgreSQL runs on this machine).
 * 2. The commit path: BENCH_COMMIT_TRANSACTIONS transactions by 8 concurrent writers, each writing
 *    one event with its delivery (outbox.record), with and without the pg-boss send in the same
 *    transaction, ABBA.
 * 3. A raw ceiling: fetch (batchSize 32) + complete of N jobs, no HTTP, no settle; one loop, and four.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createRequire } from 'node:module';
import { cpus, loadavg } from 'node:os';
import { sql } from 'drizzle-orm';
import pg from 'pg';
import { PgBoss, fromDrizzle, type Job, type JobResult } from 'pg-boss';
import { createDatabase } from '../src/db/client.js';
import { runMigrations } from '../src/db/migrate.js';
import { createDeliveryRepository, type ClaimedDelivery, type Settlement } from '../src/modules/webhooks/delivery.repository.js';
import { createDeliveryWorker } from '../src/modules/webhooks/delivery.worker.js';
import { createWebhookSender, DEFAULT_REQUEST_TIMEOUT_MS, type SendResult } from '../src/modules/webhooks/webhook-sender.js';
import { loadConfig } from '../src/config/config.js';
import { createServices } from '../src/services.js';
import { lazyJobQueue } from '../src/shared/job-runner.js';
import { createTextSealer } from '../src/shared/text-sealer.js';
import { createOutboxRepository } from '../src/shared/outbox.js';

const databaseUrl = process.env.DATABASE_URL;
if (!databaseUrl) {
  process.stderr.write('DATABASE_URL is required (the benchmark creates and drops a scratch database on that server)\n');
  process.exit(1);
}
const EVENTS = Number(process.env.BENCH_EVENTS ?? 2000);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
const COMMIT_TRANSACTIONS = Number(process.env.BENCH_COMMIT_TRANSACTIONS ?? 2000);
const POLL_VARIANTS = process.env.BENCH_POLL_VARIANTS !== 'off';
const RESULTS = process.env.BENCH_RESULTS ?? 'bench/results/webhooks-queue.md';
const pgBossVersion = (createRequire(import.meta.url)('pg-boss/package.json') as { version: string }).version;
/** Deliveries in flight per instance, on both sides. */
const IN_FLIGHT = 32;
/** Every connection of this process: the app's pool, which pg-boss uses too. */
const POOL_SIZE = 10;
const WRITERS = 8;
const POLLING_INTERVAL_SECONDS = 0.5;
const SEED_CHUNK = 500;
/** The worker's lease: request timeout plus its default margin. */
const LEASE_MS = DEFAULT_REQUEST_TIMEOUT_MS + 30_000;

const SCHEMA = 'pgboss';
const DELIVERY_QUEUE = 'bench-webhook-delivery';
const COMMIT_QUEUE = 'bench-webhook-commit-path';
const RAW_QUEUE = 'bench-raw-ceiling';
/** Retries as the worker's schedule would need; an attempt outlives the request timeout. */
const QUEUE_OPTIONS = { retryLimit: 14, retryDelay: 5, retryBackoff: true, retryDelayMax: 18 * 3600, expireInSeconds: 60 } as const;

function withDatabase(url: string, name: string): string {
  const parsed = new URL(url);
  parsed.pathname = `/${name}`;
  return parsed.toString();
}

async function admin<T>(work: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: databaseUrl });
  await client.connect();
  try {
    return await work(client);
  } finally {
    await client.end();
  }
}

const median = (values: number[]) => {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[middle]! : (sorted[middle - 1]! + sorted[middle]!) / 2;
};
const percentile = (values: number[], p: number) => {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
};
const fmt = (value: number) => Math.round(value).toLocaleString('en-US');
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** CPU ticks (user + system) of every client backend of database `name` on this machine, by pid (empty when PostgreSQL runs elsewhere). */
function backendTicks(name: string): Map<number, number> {
  const ticks = new Map<number, number>();
  let entries: string[];
  try {
    entries = readdirSync('/proc');
  } catch {
    return ticks;
  }
  for (const entry of entries) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const title = readFileSync(`/proc/${entry}/cmdline`, 'utf8');
      if (!title.startsWith('postgres:') || !title.includes(` ${name} `) || title.includes('autovacuum')) continue;
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      ticks.set(Number(entry), Number(fields[11]) + Number(fields[12]));
    } catch {
      // The process ended meanwhile.
    }
  }
  return ticks;
}
const TICK_US = 1_000_000 / 100;

/**
 * While a phase runs: the CPU its database's backends used (sampled every 200 ms, so a connection the
 * pool closes meanwhile is still counted up to its last sample), and the longest queue for a pooled connection.
 */
function startSampler(name: string, pool: pg.Pool) {
  const baseline = backendTicks(name);
  const last = new Map(baseline);
  let maxWaiting = 0;
  const sample = () => {
    for (const [pid, ticks] of backendTicks(name)) {
      if (!baseline.has(pid)) baseline.set(pid, 0);
      last.set(pid, ticks);
    }
    maxWaiting = Math.max(maxWaiting, pool.waitingCount);
  };
  const timer = setInterval(sample, 200);
  const waitingTimer = setInterval(() => (maxWaiting = Math.max(maxWaiting, pool.waitingCount)), 10);
  return {
    stop() {
      clearInterval(timer);
      clearInterval(waitingTimer);
      sample();
      let ticks = 0;
      for (const [pid, now] of last) ticks += now - (baseline.get(pid) ?? 0);
      return { dbCpuUs: last.size > 0 ? ticks * TICK_US : null, maxWaiting };
    },
  };
}

/** A receiver that answers 200 at once and counts distinct webhook-ids (and every POST). */
async function startReceiver() {
  const seen = new Set<string>();
  let posts = 0;
  let target = 0;
  let onDone: (() => void) | undefined;
  const server = createServer((request, response) => {
    request.resume();
    request.on('end', () => {
      posts += 1;
      seen.add(String(request.headers['webhook-id']));
      response.writeHead(200).end();
      if (seen.size >= target && onDone) {
        const done = onDone;
        onDone = undefined;
        done();
      }
    });
  });
  server.keepAliveTimeout = 60_000;
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook`,
    /** Resolves once `count` distinct ids have arrived since this call. */
    expect(count: number) {
      seen.clear();
      posts = 0;
      target = count;
      return new Promise<void>((resolve) => {
        onDone = resolve;
      });
    },
    counts: () => ({ distinct: seen.size, posts }),
    async close() {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/** A payload of realistic size: an individual DTO. */
const customer = {
  id: randomUUID(),
  external_id: 'crm-000123',
  type: 'INDIVIDUAL',
  full_name: 'Jane Citizen',
  email: 'jane@example.com',
  kyc_status: 'VERIFIED',
  kyc_started_at: new Date().toISOString(),
  kyc_completed_at: new Date().toISOString(),
  identity: { verified_legal_name: 'Jane Citizen', verified_country: 'AUS' },
  aml: { status: 'CLEAR', pep: false, sanctions: false, adverse_media: false, terrorism: false },
  added_via: 'INTEGRATION',
  created_at: new Date().toISOString(),
  updated_at: new Date().toISOString(),
};

/** What a delivery job carries: the delivery's key (outbox.record returns the event, not the delivery). */
type DeliveryJob = { orgId: string; eventId: string; endpointId: string };

type Variant = {
  key: string;
  label: string;
  batchSize: number;
  localConcurrency: number;
  /** How a worker takes its next batch while there is work: at once, or at its next poll. */
  refetch: 'burst' | 'notify' | 'poll';
};

/** The shapes compared with A in every round: each re-fetches at once while there is work. */
const B_VARIANTS: Variant[] = [
  { key: 'B32x1', label: 'B pg-boss 32 × 1, burstWhenBatchFull', batchSize: 32, localConcurrency: 1, refetch: 'burst' },
  { key: 'B8x4', label: 'B pg-boss 8 × 4, burstWhenBatchFull', batchSize: 8, localConcurrency: 4, refetch: 'burst' },
  { key: 'B1x32', label: 'B pg-boss 1 × 32, notifyWorker after each job', batchSize: 1, localConcurrency: 32, refetch: 'notify' },
];
/**
 * The same shapes as the job runner configures workers today (no burst): one fetch per worker per
 * poll, so at most batchSize × localConcurrency jobs per 0.5 s whatever the machine does. Run once each.
 */
const POLL_ONLY_VARIANTS: Variant[] = POLL_VARIANTS
  ? [
      { key: 'P32x1', label: 'B pg-boss 32 × 1, poll only (job runner today)', batchSize: 32, localConcurrency: 1, refetch: 'poll' },
      { key: 'P8x4', label: 'B pg-boss 8 × 4, poll only (job runner today)', batchSize: 8, localConcurrency: 4, refetch: 'poll' },
      { key: 'P1x32', label: 'B pg-boss 1 × 32, poll only (job runner today)', batchSize: 1, localConcurrency: 32, refetch: 'poll' },
    ]
  : [];
/** Events of the unmeasured warm-up of each side (JIT, pool connections, prepared statements, caches). */
const WARM_UP_EVENTS = Math.min(EVENTS, 300);

type DeliveryRun = {
  side: string;
  round: number;
  eventsPerSecond: number;
  /** Including the drain: the worker stopped / offWork returned, every outcome written. */
  settledPerSecond: number;
  seconds: number;
  seedPerSecond: number;
  firstJobMs: number | null;
  cpuUsPerEvent: number;
  /** This database's backends (null when PostgreSQL is not on this machine). */
  dbCpuUsPerEvent: number | null;
  /** The longest queue of statements waiting for one of the pool's connections. */
  poolWaitingMax: number;
  statements: string;
};

type Verified = { ok: number; total: number; attempts: number; jobsCompleted: number | null; posts: number; distinct: number };

const benchStart = performance.now();
const startLoad = loadavg();
const scratch = `svc_bench_${randomBytes(4).toString('hex')}`;
await admin((client) => client.query(`CREATE DATABASE ${scratch}`));
const url = withDatabase(databaseUrl, scratch);
const receiver = await startReceiver();
let exitCode = 0;
try {
  await runMigrations(url);
  const database = createDatabase(url, { poolSize: POOL_SIZE });
  const services = createServices({
    config: loadConfig({ WEBHOOK_ALLOW_PRIVATE_URLS: 'true' }),
    database,
    sealer: createTextSealer(randomBytes(32)),
    jobs: lazyJobQueue(database),
  });
  const organisations = services.organisations;
  const webhooks = services.webhooks;
  const outbox = createOutboxRepository();
  const deliveries = createDeliveryRepository();

  const bossErrors: string[] = [];
  const boss = new PgBoss({
    // pg-boss on the app's pool: every connection this process opens is one of the same ten.
    db: { executeSql: (text, values) => database.pool.query(text, values) },
    schema: SCHEMA,
    migrate: false,
    supervise: false,
    schedule: false,
    registerInstance: false,
  });
  boss.on('error', (error) => bossErrors.push(String(error.message ?? error)));
  await boss.start();
  for (const queue of [DELIVERY_QUEUE, COMMIT_QUEUE, RAW_QUEUE]) await boss.createQueue(queue, QUEUE_OPTIONS);

  const [pgVersion] = (await database.pool.query<{ server_version: string }>('SHOW server_version')).rows;

  async function newEndpoint(name: string) {
    const org = await organisations.create({ name, features: [], credits: 0, defaultPayer: 'organization' });
    const endpoint = await webhooks.addEndpoint({ orgId: org.id, url: receiver.url });
    return { orgId: org.id, endpointId: endpoint.id };
  }

  /** N events with their deliveries (and with `jobs`, each delivery's job, in the same transaction). */
  async function seed(orgId: string, endpointId: string, jobs: boolean, events: number): Promise<number> {
    const started = performance.now();
    for (let done = 0; done < events; done += SEED_CHUNK) {
      await database.transaction(async (tx) => {
        for (let index = done; index < Math.min(events, done + SEED_CHUNK); index += 1) {
          const eventId = await outbox.record({ orgId, type: 'customer.updated', customerId: customer.id, customer }, tx);
          if (jobs) await boss.send(DELIVERY_QUEUE, { orgId, eventId, endpointId } satisfies DeliveryJob, { db: fromDrizzle(tx, sql) });
        }
      });
    }
    return events / ((performance.now() - started) / 1000);
  }

  async function verify(orgId: string, jobs: boolean): Promise<Verified> {
    const [row] = (
      await database.pool.query<{ ok: number; total: number; attempts: number }>(
        `SELECT count(*) FILTER (WHERE status = 'succeeded' AND attempts = 1 AND last_status_code = 200 AND locked_by IS NULL)::int AS ok,
                count(*)::int AS total,
                (SELECT count(*)::int FROM webhook_attempts a WHERE a.org_id = $1 AND a.status_code = 200) AS attempts
           FROM webhook_deliveries WHERE org_id = $1`,
        [orgId],
      )
    ).rows;
    let jobsCompleted: number | null = null;
    if (jobs) {
      const [counted] = (
        await database.pool.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM ${SCHEMA}.job WHERE name = $1 AND state = 'completed' AND data->>'orgId' = $2`,
          [DELIVERY_QUEUE, orgId],
        )
      ).rows;
      jobsCompleted = counted!.n;
    }
    return { ...row!, jobsCompleted, ...receiver.counts() };
  }

  function check(side: string, verified: Verified, jobs: boolean, events: number): void {
    const problems = [
      verified.total !== events && `${verified.total} deliveries`,
      verified.ok !== events && `${verified.ok} succeeded with one attempt`,
      verified.attempts !== events && `${verified.attempts} attempts recorded`,
      jobs && verified.jobsCompleted !== events && `${verified.jobsCompleted} jobs completed`,
      verified.posts !== events && `${verified.posts} POSTs for ${verified.distinct} ids`,
    ].filter(Boolean);
    if (problems.length > 0) throw new Error(`${side}: expected ${events} of each, got ${problems.join(', ')}`);
  }

  async function runCurrentWorker(round: number, events = EVENTS): Promise<DeliveryRun> {
    const { orgId } = await newEndpoint(`Bench A ${round}`);
    const seedPerSecond = await seed(orgId, '', false, events);
    const worker = createDeliveryWorker({ database, allowPrivateUrls: true, concurrency: IN_FLIGHT });
    const delivered = receiver.expect(events);
    const sampler = startSampler(scratch, database.pool);
    const cpu = process.cpuUsage();
    const started = performance.now();
    await worker.start();
    await delivered;
    const deliveredMs = performance.now() - started;
    await worker.stop();
    const settledMs = performance.now() - started;
    const used = process.cpuUsage(cpu);
    const sampled = sampler.stop();
    const stats = worker.stats();
    check('A', await verify(orgId, false), false, events);
    return {
      side: 'A',
      round,
      eventsPerSecond: events / (deliveredMs / 1000),
      settledPerSecond: events / (settledMs / 1000),
      seconds: deliveredMs / 1000,
      seedPerSecond,
      firstJobMs: null,
      cpuUsPerEvent: (used.user + used.system) / events,
      dbCpuUsPerEvent: sampled.dbCpuUs === null ? null : sampled.dbCpuUs / events,
      poolWaitingMax: sampled.maxWaiting,
      statements: `${stats.claimQueries} claims, ${stats.settleBatches} settles`,
    };
  }

  /** The worker's settlement batching: whatever finished while a batch was written goes out in the next statement. */
  function createSettler(workerId: string) {
    const queue: Array<{ claim: ClaimedDelivery; settlement: Settlement; done: (error: unknown, applied?: boolean) => void }> = [];
    let flushing = false;
    let batches = 0;
    async function flush(): Promise<void> {
      flushing = true;
      try {
        while (queue.length > 0) {
          const batch = queue.splice(0, 200);
          batches += 1;
          try {
            const applied = await deliveries.settleMany(batch, workerId, database.db);
            for (const item of batch) item.done(undefined, applied.has(item.claim.id));
          } catch (error) {
            for (const item of batch) item.done(error);
          }
        }
      } finally {
        flushing = false;
      }
    }
    return {
      settle(claim: ClaimedDelivery, settlement: Settlement): Promise<boolean> {
        return new Promise<boolean>((resolve, reject) => {
          queue.push({ claim, settlement, done: (error, applied) => (error ? reject(error) : resolve(applied === true)) });
          if (!flushing) void flush();
        });
      },
      batches: () => batches,
    };
  }

  type LoadRow = {
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

  /** One statement per batch: the claim's UPDATE by the jobs' keys (counts the attempt, takes the lease) with what posting needs. */
  async function loadDeliveries(jobs: Job<DeliveryJob>[], workerId: string): Promise<ClaimedDelivery[]> {
    const result = await database.pool.query<LoadRow>(
      `UPDATE webhook_deliveries delivery
          SET locked_until = clock_timestamp() + $5 * interval '1 millisecond',
              locked_by = $4,
              attempts = delivery.attempts + 1,
              updated_at = clock_timestamp()
         FROM unnest($1::uuid[], $2::uuid[], $3::uuid[]) AS job (org_id, event_id, endpoint_id),
              outbox_events event, webhook_endpoints endpoint
        WHERE delivery.org_id = job.org_id AND delivery.event_id = job.event_id AND delivery.endpoint_id = job.endpoint_id
          AND delivery.status = 'pending'
          AND (delivery.locked_until IS NULL OR delivery.locked_until < clock_timestamp())
          AND event.id = delivery.event_id AND event.org_id = delivery.org_id
          AND endpoint.id = delivery.endpoint_id AND endpoint.org_id = delivery.org_id
      RETURNING delivery.id, delivery.org_id, delivery.event_id, delivery.endpoint_id, delivery.attempts,
                event.payload, endpoint.url, endpoint.secret, endpoint.enabled,
                (extract(epoch FROM endpoint.failing_since) * 1000)::float8 AS failing_since_ms,
                CASE WHEN endpoint.previous_secret_expires_at > clock_timestamp() THEN endpoint.previous_secret END AS previous_secret`,
      [jobs.map((job) => job.data.orgId), jobs.map((job) => job.data.eventId), jobs.map((job) => job.data.endpointId), workerId, LEASE_MS],
    );
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

  async function runPgBoss(variant: Variant, round: number, events = EVENTS): Promise<DeliveryRun> {
    const { orgId, endpointId } = await newEndpoint(`Bench ${variant.key} ${round}`);
    const seedPerSecond = await seed(orgId, endpointId, true, events);
    const workerId = `bench-pgboss-${variant.key}-${round}`;
    const sender = createWebhookSender({ allowPrivateUrls: true, timeoutMs: DEFAULT_REQUEST_TIMEOUT_MS });
    const settler = createSettler(workerId);
    let loads = 0;
    let failures = 0;
    let firstJobAt: number | undefined;
    let workerIds: string[] = [];

    async function deliver(claim: ClaimedDelivery): Promise<boolean> {
      if (!claim.endpointEnabled) {
        await settler.settle(claim, { status: 'failed', attempt: null, error: 'endpoint disabled' });
        return true;
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
        });
      } catch (error) {
        const message = error instanceof Error ? error.message : String(error);
        result = { statusCode: null, retryAfterMs: null, error: `request failed: ${message}`, latencyMs: 0, aborted: false };
      }
      const attempt = { statusCode: result.statusCode, latencyMs: result.latencyMs, error: result.error, startedAt };
      const ok = result.error === null && result.statusCode !== null && result.statusCode >= 200 && result.statusCode < 300;
      // A failure would be retried by pg-boss (the job fails); the row waits as the worker's retry would.
      await settler.settle(claim, ok ? { status: 'succeeded', attempt } : { status: 'retry', attempt, delayMs: 5_000 });
      if (!ok) failures += 1;
      return ok;
    }

    async function handler(jobs: Job<DeliveryJob>[]): Promise<JobResult[]> {
      firstJobAt ??= performance.now();
      loads += 1;
      const claims = await loadDeliveries(jobs, workerId);
      const byKey = new Map(claims.map((claim) => [`${claim.eventId}/${claim.endpointId}`, claim]));
      const results = await Promise.all(
        jobs.map(async (job): Promise<JobResult> => {
          const claim = byKey.get(`${job.data.eventId}/${job.data.endpointId}`);
          // Settled already (or its endpoint deleted): nothing left to send.
          if (!claim) return { id: job.id, status: 'completed' };
          return { id: job.id, status: (await deliver(claim)) ? 'completed' : 'failed' };
        }),
      );
      // At batchSize 1 pg-boss has no burst of its own: wake the instance's workers so they fetch at once.
      if (variant.refetch === 'notify') for (const id of workerIds) boss.notifyWorker(id);
      return results;
    }

    const delivered = receiver.expect(events);
    const sampler = startSampler(scratch, database.pool);
    const cpu = process.cpuUsage();
    const started = performance.now();
    const workId = await boss.work<DeliveryJob>(
      DELIVERY_QUEUE,
      {
        batchSize: variant.batchSize,
        localConcurrency: variant.localConcurrency,
        pollingIntervalSeconds: POLLING_INTERVAL_SECONDS,
        burstWhenBatchFull: variant.refetch === 'burst',
        perJobResults: true,
      },
      handler,
    );
    workerIds = boss
      .getWipData()
      .filter((worker) => worker.workId === workId)
      .map((worker) => worker.id);
    await delivered;
    const deliveredMs = performance.now() - started;
    await boss.offWork(DELIVERY_QUEUE, { wait: true });
    const settledMs = performance.now() - started;
    const used = process.cpuUsage(cpu);
    const sampled = sampler.stop();
    sender.close();
    if (failures > 0) throw new Error(`${variant.key}: ${failures} failed attempts`);
    check(variant.key, await verify(orgId, true), true, events);
    return {
      side: variant.key,
      round,
      eventsPerSecond: events / (deliveredMs / 1000),
      settledPerSecond: events / (settledMs / 1000),
      seconds: deliveredMs / 1000,
      seedPerSecond,
      firstJobMs: firstJobAt === undefined ? null : firstJobAt - started,
      cpuUsPerEvent: (used.user + used.system) / events,
      dbCpuUsPerEvent: sampled.dbCpuUs === null ? null : sampled.dbCpuUs / events,
      poolWaitingMax: sampled.maxWaiting,
      statements: `${loads} fetches+loads, ${settler.batches()} settles`,
    };
  }

  // 1. Delivery: a warm-up of each side, then ABBA rounds, then the poll-only shapes once each.
  const log = (run: DeliveryRun, label: string) =>
    process.stderr.write(
      `${label} ${run.side.padEnd(6)} ${fmt(run.eventsPerSecond).padStart(6)} events/s (settled ${fmt(run.settledPerSecond)}/s, ${run.seconds.toFixed(2)} s, first job ${run.firstJobMs === null ? '-' : `${run.firstJobMs.toFixed(0)} ms`}, ${run.statements})\n`,
    );
  for (const variant of [undefined, ...B_VARIANTS]) {
    log(variant ? await runPgBoss(variant, -1, WARM_UP_EVENTS) : await runCurrentWorker(-1, WARM_UP_EVENTS), 'warm-up');
  }
  const sides = ['A', ...B_VARIANTS.map((variant) => variant.key)];
  const runs: DeliveryRun[] = [];
  for (let round = 0; round < ROUNDS; round += 1) {
    const order = round % 2 === 0 ? sides : [...sides].reverse();
    for (const side of order) {
      const variant = B_VARIANTS.find((candidate) => candidate.key === side);
      const run = variant ? await runPgBoss(variant, round) : await runCurrentWorker(round);
      runs.push(run);
      log(run, `round ${round + 1}`);
      await sleep(200);
    }
  }
  const pollRuns: DeliveryRun[] = [];
  for (const variant of POLL_ONLY_VARIANTS) {
    const run = await runPgBoss(variant, 0);
    pollRuns.push(run);
    log(run, 'once');
  }

  // 2. The commit path, ABBA.
  const commitTarget = await newEndpoint('Bench commit path');
  async function commitPath(withJob: boolean) {
    const latencies: number[] = [];
    let next = 0;
    const sampler = startSampler(scratch, database.pool);
    const started = performance.now();
    await Promise.all(
      Array.from({ length: WRITERS }, async () => {
        while (next < COMMIT_TRANSACTIONS) {
          next += 1;
          const began = performance.now();
          await database.transaction(async (tx) => {
            const eventId = await outbox.record(
              { orgId: commitTarget.orgId, type: 'customer.updated', customerId: customer.id, customer },
              tx,
            );
            if (withJob) {
              const data: DeliveryJob = { orgId: commitTarget.orgId, eventId, endpointId: commitTarget.endpointId };
              await boss.send(COMMIT_QUEUE, data, { db: fromDrizzle(tx, sql) });
            }
          });
          latencies.push(performance.now() - began);
        }
      }),
    );
    const ms = performance.now() - started;
    const { dbCpuUs } = sampler.stop();
    return {
      perSecond: COMMIT_TRANSACTIONS / (ms / 1000),
      p50: percentile(latencies, 50),
      p99: percentile(latencies, 99),
      dbCpuUsPerTransaction: dbCpuUs === null ? null : dbCpuUs / COMMIT_TRANSACTIONS,
    };
  }
  const commitRuns: Array<{
    withJob: boolean;
    round: number;
    perSecond: number;
    p50: number;
    p99: number;
    dbCpuUsPerTransaction: number | null;
  }> = [];
  for (let round = 0; round < ROUNDS; round += 1) {
    for (const withJob of round % 2 === 0 ? [false, true] : [true, false]) {
      const result = await commitPath(withJob);
      commitRuns.push({ withJob, round, ...result });
      process.stderr.write(
        `round ${round + 1} commit ${withJob ? 'with job   ' : 'without job'} ${fmt(result.perSecond)} tx/s (p50 ${result.p50.toFixed(1)} ms, p99 ${result.p99.toFixed(1)} ms)\n`,
      );
    }
  }
  const [commitJobs] = (
    await database.pool.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${SCHEMA}.job WHERE name = $1`, [COMMIT_QUEUE])
  ).rows;
  if (commitJobs!.n !== ROUNDS * COMMIT_TRANSACTIONS) throw new Error(`commit path: ${commitJobs!.n} jobs sent`);

  // 3. The raw ceiling: fetch + complete, nothing else.
  async function rawCeiling(loops: number) {
    for (let done = 0; done < EVENTS; done += SEED_CHUNK) {
      const count = Math.min(SEED_CHUNK, EVENTS - done);
      await boss.insert(
        RAW_QUEUE,
        Array.from({ length: count }, (_, index) => ({ data: { n: done + index } })),
      );
    }
    let completed = 0;
    const started = performance.now();
    await Promise.all(
      Array.from({ length: loops }, async () => {
        for (;;) {
          const jobs = await boss.fetch(RAW_QUEUE, { batchSize: 32 });
          if (jobs.length === 0) return;
          await boss.complete(RAW_QUEUE, jobs);
          completed += jobs.length;
        }
      }),
    );
    const ms = performance.now() - started;
    const [left] = (
      await database.pool.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${SCHEMA}.job WHERE name = $1 AND state <> 'completed'`, [
        RAW_QUEUE,
      ])
    ).rows;
    if (completed !== EVENTS || left!.n !== 0) throw new Error(`raw ceiling: ${completed} fetched, ${left!.n} not completed`);
    return EVENTS / (ms / 1000);
  }
  const rawRuns: Array<{ loops: number; round: number; perSecond: number }> = [];
  for (let round = 0; round < ROUNDS; round += 1) {
    for (const loops of round % 2 === 0 ? [1, 4] : [4, 1]) {
      const perSecond = await rawCeiling(loops);
      rawRuns.push({ loops, round, perSecond });
      process.stderr.write(`round ${round + 1} raw fetch+complete × ${loops} loop${loops > 1 ? 's' : ''}: ${fmt(perSecond)} jobs/s\n`);
    }
  }

  await boss.stop({ graceful: true, timeout: 5_000 });
  await database.close();
  const totalSeconds = (performance.now() - benchStart) / 1000;
  const endLoad = loadavg();

  // The report.
  const rates = (side: string) => runs.filter((run) => run.side === side);
  const range = (values: number[]) => `${fmt(Math.min(...values))}–${fmt(Math.max(...values))}`;
  const medianOrDash = (values: Array<number | null>) => {
    const known = values.filter((value): value is number => value !== null);
    return known.length ? fmt(median(known)) : '—';
  };
  const aRates = rates('A').map((run) => run.eventsPerSecond);
  const aMedian = median(aRates);
  const ratioPerRound = (side: string) =>
    rates(side).map((run) => run.eventsPerSecond / rates('A').find((a) => a.round === run.round)!.eventsPerSecond);
  const lines: string[] = [];
  lines.push('# Webhook delivery: the current worker against a pg-boss prototype');
  lines.push('');
  lines.push(
    `Run ${new Date().toISOString().slice(0, 16).replace('T', ' ')} UTC, \`npx tsx bench/webhooks-queue.bench.ts\`, BENCH_EVENTS=${EVENTS}, BENCH_ROUNDS=${ROUNDS}, ` +
      `${COMMIT_TRANSACTIONS} commit-path transactions per side and round; took ${(totalSeconds / 60).toFixed(1)} min. ` +
      `${cpus().length} × ${cpus()[0]?.model.trim() ?? 'CPU'}, Node ${process.version}, PostgreSQL ${pgVersion?.server_version}, pg-boss ${pgBossVersion} (on the app's pool, one pool of ${POOL_SIZE} for the whole process). ` +
      `Load average at start ${startLoad.map((value) => value.toFixed(2)).join(' / ')}, at end ${endLoad.map((value) => value.toFixed(2)).join(' / ')}.`,
  );
  lines.push('');
  lines.push(
    '**Machine caveat:** a small shared machine (the receiver, the workers and PostgreSQL share its cores, and other work, test suites among it, may run against the same PostgreSQL meanwhile); absolute figures move from run to run, the ABBA order puts a drift on both sides alike, and the per-round ratios are the figures to read.',
  );
  lines.push('');
  lines.push(`## Delivery: ${EVENTS} seeded events, one endpoint, loopback receiver answering 200 at once`);
  lines.push('');
  lines.push(
    `Events/s from start (\`worker.start()\` / \`boss.work()\`) until the receiver has seen all ${EVENTS} distinct webhook-ids; 32 deliveries in flight per instance on every side; pg-boss polling interval ${POLLING_INTERVAL_SECONDS} s. ` +
      `${ROUNDS} rounds in ABBA order (A first in odd rounds, last in even ones) after an unmeasured warm-up of each side (${WARM_UP_EVENTS} events); B/A is each round's B against the same round's A. ` +
      '"Settled" runs on until the worker has stopped (A) or `offWork` has returned (B): every attempt recorded, every delivery settled, every job completed. ' +
      'Every run was checked: each delivery `succeeded` with one attempt row and status 200, each job completed, no webhook-id posted twice.',
  );
  lines.push('');
  lines.push(
    '| Side | Events/s median | Range | Per round | B/A per round | B/A median | Settled events/s median | First job after | CPU µs/event: this process / its database backends | Pool queue max | Statements per run (last round) |',
  );
  lines.push('|---|---:|---|---|---|---:|---:|---:|---|---:|---|');
  for (const side of sides) {
    const sideRuns = rates(side);
    const values = sideRuns.map((run) => run.eventsPerSecond);
    const variant = B_VARIANTS.find((candidate) => candidate.key === side);
    const label = variant ? variant.label : 'A current worker (createDeliveryWorker, concurrency 32)';
    const firstJobs = sideRuns.map((run) => run.firstJobMs).filter((value): value is number => value !== null);
    lines.push(
      `| ${label} | ${fmt(median(values))} | ${range(values)} | ${values.map(fmt).join(', ')} | ` +
        `${
          variant
            ? ratioPerRound(side)
                .map((ratio) => ratio.toFixed(2))
                .join(', ')
            : '—'
        } | ${variant ? median(ratioPerRound(side)).toFixed(2) : '—'} | ` +
        `${fmt(median(sideRuns.map((run) => run.settledPerSecond)))} | ${firstJobs.length ? `${median(firstJobs).toFixed(0)} ms` : '—'} | ` +
        `${fmt(median(sideRuns.map((run) => run.cpuUsPerEvent)))} / ${medianOrDash(sideRuns.map((run) => run.dbCpuUsPerEvent))} | ` +
        `${Math.max(...sideRuns.map((run) => run.poolWaitingMax))} | ${sideRuns.at(-1)!.statements} |`,
    );
  }
  if (pollRuns.length > 0) {
    lines.push('');
    lines.push(
      `The same shapes as the job runner configures its workers today (\`pollingIntervalSeconds\` ${POLLING_INTERVAL_SECONDS}, no burst), after the rounds, one run each; B/A against A's median:`,
    );
    lines.push('');
    lines.push(
      '| Side | Events/s | B/A (A median) | Settled events/s | First job after | CPU µs/event: this process / its database backends | Statements |',
    );
    lines.push('|---|---:|---:|---:|---:|---|---|');
    for (const run of pollRuns) {
      const variant = POLL_ONLY_VARIANTS.find((candidate) => candidate.key === run.side)!;
      lines.push(
        `| ${variant.label} | ${fmt(run.eventsPerSecond)} | ${(run.eventsPerSecond / aMedian).toFixed(2)} | ${fmt(run.settledPerSecond)} | ` +
          `${run.firstJobMs === null ? '—' : `${run.firstJobMs.toFixed(0)} ms`} | ${fmt(run.cpuUsPerEvent)} / ${run.dbCpuUsPerEvent === null ? '—' : fmt(run.dbCpuUsPerEvent)} | ${run.statements} |`,
      );
    }
  }
  lines.push('');
  const seedA = median(rates('A').map((run) => run.seedPerSecond));
  const seedB = median([...runs, ...pollRuns].filter((run) => run.side !== 'A').map((run) => run.seedPerSecond));
  lines.push(
    `Seeding (${SEED_CHUNK} events per transaction, not timed in the figures above): ${fmt(seedA)} events/s without jobs, ${fmt(seedB)} events/s with a pg-boss send per event (medians).`,
  );
  lines.push('');
  lines.push('## Commit path: one event with its delivery per transaction');
  lines.push('');
  lines.push(
    `${COMMIT_TRANSACTIONS} transactions per side and round, ${WRITERS} concurrent writers, each transaction \`outbox.record\` (event + delivery), with or without \`boss.send(queue, data, { db: fromDrizzle(tx, sql) })\` in the same transaction; ABBA.`,
  );
  lines.push('');
  lines.push(
    '| Side | Transactions/s median | Range | Per round | p50 / p99 ms (median of rounds) | Database backends CPU µs per transaction |',
  );
  lines.push('|---|---:|---|---|---|---:|');
  for (const withJob of [false, true]) {
    const sideRuns = commitRuns.filter((run) => run.withJob === withJob);
    const values = sideRuns.map((run) => run.perSecond);
    lines.push(
      `| ${withJob ? 'with the pg-boss job' : 'without (today)'} | ${fmt(median(values))} | ${range(values)} | ${values.map(fmt).join(', ')} | ` +
        `${median(sideRuns.map((run) => run.p50)).toFixed(1)} / ${median(sideRuns.map((run) => run.p99)).toFixed(1)} | ` +
        `${medianOrDash(sideRuns.map((run) => run.dbCpuUsPerTransaction))} |`,
    );
  }
  const commitRatios = Array.from({ length: ROUNDS }, (_, round) => {
    const find = (withJob: boolean) => commitRuns.find((run) => run.round === round && run.withJob === withJob)!.perSecond;
    return find(true) / find(false);
  });
  lines.push('');
  lines.push(
    `With / without, per round: ${commitRatios.map((ratio) => ratio.toFixed(2)).join(', ')} (median ${median(commitRatios).toFixed(2)}).`,
  );
  lines.push('');
  lines.push('## Raw ceiling: pg-boss fetch (batchSize 32) + complete, no HTTP, no settle');
  lines.push('');
  lines.push('| Loops | Jobs/s median | Range | Per round |');
  lines.push('|---|---:|---|---|');
  for (const loops of [1, 4]) {
    const values = rawRuns.filter((run) => run.loops === loops).map((run) => run.perSecond);
    lines.push(`| ${loops} | ${fmt(median(values))} | ${range(values)} | ${values.map(fmt).join(', ')} |`);
  }
  lines.push('');
  const best = B_VARIANTS.map((variant) => ({ variant, rate: median(rates(variant.key).map((run) => run.eventsPerSecond)) })).sort(
    (x, y) => y.rate - x.rate,
  )[0]!;
  lines.push(
    `Best pg-boss shape: ${best.variant.label}, ${fmt(best.rate)} events/s against A's ${fmt(aMedian)} (median of its per-round ratios ${median(ratioPerRound(best.variant.key)).toFixed(2)}).` +
      (bossErrors.length
        ? ` pg-boss reported ${bossErrors.length} errors: ${[...new Set(bossErrors)].slice(0, 3).join('; ')}.`
        : ' pg-boss reported no errors.'),
  );
  lines.push('');
  const report = lines.join('\n');
  writeFileSync(RESULTS, report);
  process.stdout.write(`${report}\n`);
} catch (error) {
  exitCode = 1;
  process.stderr.write(`${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
} finally {
  await receiver.close();
  await admin((client) => client.query(`DROP DATABASE IF EXISTS ${scratch} WITH (FORCE)`));
}
process.exit(exitCode);
