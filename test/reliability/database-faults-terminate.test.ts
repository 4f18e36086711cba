import type pg from 'pg';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { startServerProcess, type ServerProcess } from './processes.js';
import {
  backendCount,
  busyBackends,
  connectAdmin,
  createFaultDatabase,
  describeOutcomes,
  FAULT_TIMEOUTS,
  isDatabaseUnavailable,
  mixedRequest,
  ok,
  printFigures,
  requestBound,
  seedCustomers,
  sleep,
  startLoad,
  timeToHealthy,
  upsertSpec,
  type FaultDatabase,
} from './database-faults.js';

// Issue 26, item 8 (a): every backend of the server's database terminated every 2.5 s for 20 s, as a
// failover, an OOM-killed backend or an operator's pg_terminate_backend would do.
const env = { ...FAULT_TIMEOUTS };
const bound = requestBound(env);
const STORM_MS = 20_000;
const ROUND_MS = 2_500;

let fault: FaultDatabase;
let admin: pg.Client;
let server: ServerProcess | undefined;

beforeAll(async () => {
  fault = await createFaultDatabase('terminate');
  admin = await connectAdmin();
  server = await startServerProcess({ DATABASE_URL: fault.url, ...env });
});

afterAll(async () => {
  await server?.stop();
  await admin?.end().catch(() => {});
  await fault?.drop();
});

it('when every backend of its database is terminated every 2.5 s for 20 s under load, it answers every request within the timeouts (at worst 503 database_unavailable), its pool returns to idle and it is healthy within 1 s', async () => {
  const ids = await seedCustomers(server!, fault.key, 'seed', 30);
  const load = startLoad(server!, fault.key, 8, (worker, n) => mixedRequest(ids, worker, n));
  await sleep(500); // the pool is in use before the first round

  const stormStarted = Date.now();
  let rounds = 0;
  let terminated = 0;
  let stormEnded: number;
  for (;;) {
    const { rows } = await admin.query<{ count: number }>(
      `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))::int AS count
         FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`,
      [fault.name],
    );
    terminated += rows[0]!.count;
    rounds += 1;
    stormEnded = Date.now();
    if (stormEnded - stormStarted >= STORM_MS - 100) break;
    await sleep(stormStarted + rounds * ROUND_MS - Date.now());
  }

  // Healthy again right after the last round, while the load drains.
  const draining = load.stop();
  const healthyMs = await timeToHealthy(
    server!,
    fault.key,
    { getId: ids[0]!, upsert: upsertSpec('probe-after', 'Probe After', 1) },
    stormEnded,
  );
  const outcomes = await draining;
  const loadStopped = new Date();

  // From outside: ~1 s after the load stopped, no backend of the server is still in a transaction begun before it stopped
  // (its job runner polls meanwhile).
  await sleep(1000);
  const busy = await busyBackends(admin, fault.name, { begunBefore: loadStopped });
  const connections = await backendCount(admin, fault.name);

  const figures = printFigures('database-faults (a) terminate every backend every 2.5 s for 20 s', outcomes, {
    timeToHealthyMs: healthyMs,
    boundMs: bound,
    rounds,
    backendsTerminated: terminated,
    busyBackendsAfter1s: busy.length,
    connectionsAfter1s: connections,
  });

  expect(rounds).toBeGreaterThanOrEqual(8);
  expect(terminated).toBeGreaterThan(0);
  expect(figures.succeeded).toBeGreaterThan(0);
  const unexpected = outcomes.filter((outcome) => !ok(outcome) && !isDatabaseUnavailable(outcome));
  expect(
    unexpected.length,
    `failures other than 503 database_unavailable: ${describeOutcomes(unexpected)}\n${server!.output().slice(-4000)}`,
  ).toBe(0);
  const slow = outcomes.filter((outcome) => outcome.ms > bound).sort((a, b) => b.ms - a.ms);
  expect(slow.length, `requests longer than ${bound} ms: ${describeOutcomes(slow)}`).toBe(0);
  expect(healthyMs, 'not healthy within 15 s after the storm').not.toBeNull();
  expect(healthyMs!).toBeLessThanOrEqual(1000);
  expect(busy, 'backends still busy 1 s after the load stopped').toEqual([]);
}, 120_000);
