/**
 * Webhook delivery throughput against a bare baseline.
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npx tsx bench/webhooks.bench.ts
 *
 * Options (environment): BENCH_EVENTS (2000), BENCH_CONCURRENCY (32, per worker), BENCH_WORKERS (1).
 * Seeds N events (no worker running), then measures how fast the delivery worker(s) deliver them to
 * a loopback receiver, and compares with the same number of signed POSTs sent straight from a loop
 * with the same total concurrency (no database). Runs in a scratch database that it drops after.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import pg from 'pg';
import { createDatabase } from '../src/db/client.js';
import { runMigrations } from '../src/db/migrate.js';
import { createDeliveryWorker } from '../src/modules/webhooks/delivery.worker.js';
import { createOutboxRepository } from '../src/shared/outbox.js';
import { createWebhookSender } from '../src/modules/webhooks/webhook-sender.js';
import { loadConfig } from '../src/config/config.js';
import { createServices } from '../src/services.js';
import { lazyJobQueue } from '../src/shared/job-runner.js';
import { createTextSealer } from '../src/shared/text-sealer.js';

const databaseUrl = process.env.DATABASE_URL;
if (!databaseUrl) {
  process.stderr.write('DATABASE_URL is required (the benchmark creates and drops a scratch database on that server)\n');
  process.exit(1);
}
const EVENTS = Number(process.env.BENCH_EVENTS ?? 2000);
const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 32);
const WORKERS = Number(process.env.BENCH_WORKERS ?? 1);

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

/** A receiver that answers 200 at once and counts distinct event ids. */
async function startReceiver() {
  const seen = new Set<string>();
  let target = 0;
  let onDone: (() => void) | undefined;
  const server = createServer((request, response) => {
    request.resume();
    request.on('end', () => {
      seen.add(String(request.headers['webhook-id']));
      response.writeHead(200).end();
      if (seen.size >= target) onDone?.();
    });
  });
  server.keepAliveTimeout = 60_000;
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook`,
    /** Resolves once `count` distinct ids have arrived since the last reset. */
    expect(count: number) {
      seen.clear();
      target = count;
      return new Promise<void>((resolve) => {
        onDone = resolve;
      });
    },
    async close() {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

const scratch = `svc_bench_${randomBytes(4).toString('hex')}`;
await admin(async (client) => {
  await client.query(`CREATE DATABASE ${scratch}`);
  if (process.env.BENCH_ASYNC_COMMIT) await client.query(`ALTER DATABASE ${scratch} SET synchronous_commit = off`);
});
const url = withDatabase(databaseUrl, scratch);
const receiver = await startReceiver();
try {
  await runMigrations(url);
  const database = createDatabase(url, { poolSize: 10 });
  const services = createServices({
    config: loadConfig({ WEBHOOK_ALLOW_PRIVATE_URLS: 'true' }),
    database,
    sealer: createTextSealer(randomBytes(32)),
    jobs: lazyJobQueue(database),
  });
  const org = await services.organisations.create({
    name: 'Bench',
    features: [],
    credits: 0,
    defaultPayer: 'organization',
  });
  const endpoint = await services.webhooks.addEndpoint({ orgId: org.id, url: receiver.url });

  // A payload of realistic size: an individual DTO.
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
  const outbox = createOutboxRepository();
  const seedStart = performance.now();
  for (let done = 0; done < EVENTS; done += 500) {
    await database.transaction(async (tx) => {
      for (let index = done; index < Math.min(EVENTS, done + 500); index += 1) {
        await outbox.record({ orgId: org.id, type: 'customer.updated', customerId: customer.id, customer }, tx);
      }
    });
  }
  const seedMs = performance.now() - seedStart;

  // Worker run: from start to the last distinct receipt.
  const workerPools = Array.from({ length: WORKERS }, () => createDatabase(url, { poolSize: Number(process.env.BENCH_POOL ?? 10) }));
  const workers = workerPools.map((pool) => createDeliveryWorker({ database: pool, allowPrivateUrls: true, concurrency: CONCURRENCY }));
  const delivered = receiver.expect(EVENTS);
  const workerStart = performance.now();
  await Promise.all(workers.map((worker) => worker.start()));
  await delivered;
  const workerMs = performance.now() - workerStart;
  await Promise.all(workers.map((worker) => worker.stop()));
  const workerStats = workers.map((worker) => worker.stats());
  for (const pool of workerPools) await pool.close();
  const pending = await database.pool.query(`SELECT count(*)::int AS n FROM webhook_deliveries WHERE status <> 'succeeded'`);
  const [row] = (await database.pool.query(`SELECT payload FROM outbox_events LIMIT 1`)).rows as Array<{ payload: string }>;
  await database.close();

  // Baseline: the same number of signed POSTs from a loop, same total concurrency, no database.
  const sender = createWebhookSender({ allowPrivateUrls: true });
  const payload = row!.payload;
  const ids = Array.from({ length: EVENTS }, () => randomUUID());
  const baselineDone = receiver.expect(EVENTS);
  const baselineStart = performance.now();
  let next = 0;
  await Promise.all(
    Array.from({ length: CONCURRENCY * WORKERS }, async () => {
      while (next < ids.length) {
        const id = ids[next++]!;
        const result = await sender.send({ url: receiver.url, secret: endpoint.secret, eventId: id, payload });
        if (result.statusCode !== 200) throw new Error(`baseline POST failed: ${result.error}`);
      }
    }),
  );
  await baselineDone;
  const baselineMs = performance.now() - baselineStart;
  sender.close();

  const workerRate = EVENTS / (workerMs / 1000);
  const baselineRate = EVENTS / (baselineMs / 1000);
  const report = {
    events: EVENTS,
    workers: WORKERS,
    concurrency_per_worker: CONCURRENCY,
    payload_bytes: Buffer.byteLength(payload),
    seed_events_per_second: Math.round(EVENTS / (seedMs / 1000)),
    worker: {
      seconds: +(workerMs / 1000).toFixed(2),
      events_per_second: Math.round(workerRate),
      claim_queries: workerStats.reduce((sum, stats) => sum + stats.claimQueries, 0),
      settle_batches: workerStats.reduce((sum, stats) => sum + stats.settleBatches, 0),
    },
    baseline: { seconds: +(baselineMs / 1000).toFixed(2), posts_per_second: Math.round(baselineRate) },
    worker_to_baseline_ratio: +(workerRate / baselineRate).toFixed(3),
    undelivered: (pending.rows[0] as { n: number }).n,
  };
  process.stdout.write(`${JSON.stringify(report, null, 2)}\n`);
} finally {
  await receiver.close();
  await admin((client) => client.query(`DROP DATABASE IF EXISTS ${scratch} WITH (FORCE)`));
}
