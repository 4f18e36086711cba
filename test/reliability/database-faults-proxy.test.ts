import type pg from 'pg';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { inject } from 'vitest';
import { startPgProxy, type PgProxy } from '../helpers/pg-proxy.js';
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

// Issue 26, item 8 (b): the TCP connection between the server and PostgreSQL cut at random points of
// the protocol (a network cut, a crashing pooler), through a loopback proxy.
const env = { ...FAULT_TIMEOUTS };
const bound = requestBound(env);
const ROUNDS = 8;
const ARMED_MS = 1_500;
const CALM_MS = 1_000;
/** Backend messages to cut right after: ParseComplete, BindComplete, RowDescription, DataRow, NoData, CommandComplete (before its ReadyForQuery), ReadyForQuery. */
const MESSAGE_TYPES = ['1', '2', 'T', 'D', 'n', 'C', 'Z'];

let fault: FaultDatabase;
let admin: pg.Client;
let proxy: PgProxy;
let server: ServerProcess | undefined;

beforeAll(async () => {
  fault = await createFaultDatabase('proxy');
  admin = await connectAdmin();
  const target = new URL(inject('adminDatabaseUrl'));
  proxy = await startPgProxy({ host: target.hostname, port: Number(target.port || 5432) });
  // The scratch database's URL (user, password), with the proxy in front.
  const viaProxy = new URL(fault.url);
  viaProxy.hostname = '127.0.0.1';
  viaProxy.port = String(proxy.port);
  server = await startServerProcess({ DATABASE_URL: viaProxy.toString(), ...env });
});

afterAll(async () => {
  await server?.stop();
  await proxy?.close();
  await admin?.end().catch(() => {});
  await fault?.drop();
});

it('when its TCP connections to PostgreSQL are cut at random points of the protocol for 20 s under load, it answers every request within the timeouts (at worst 503 database_unavailable), its pool returns to idle and it is healthy within 1 s', async () => {
  const ids = await seedCustomers(server!, fault.key, 'seed', 30);
  const load = startLoad(server!, fault.key, 8, (worker, n) => mixedRequest(ids, worker, n));
  await sleep(500);

  // Each 2.5 s round arms one kind of cut for 1.5 s, then lets the server breathe for 1 s:
  // random byte offsets (the middle of any message, either direction), right after given backend
  // messages (e.g. between CommandComplete and ReadyForQuery), or every open connection at once.
  const modes: string[] = [];
  for (let round = 0; round < ROUNDS; round += 1) {
    const mode = round % 3;
    if (mode === 0) {
      proxy.cutAfterRandomBytes(12_000);
      modes.push('random-bytes');
    } else if (mode === 1) {
      for (const type of MESSAGE_TYPES) proxy.cutAfterBackendMessage(type, 2);
      modes.push('after-message');
    } else {
      modes.push('cut-all');
      for (let cut = 0; cut < 3; cut += 1) {
        proxy.cutAll();
        await sleep(ARMED_MS / 3);
      }
    }
    if (mode !== 2) await sleep(ARMED_MS);
    proxy.disarm();
    if (round < ROUNDS - 1) await sleep(CALM_MS);
  }
  const stormEnded = Date.now();

  const draining = load.stop();
  const healthyMs = await timeToHealthy(
    server!,
    fault.key,
    { getId: ids[0]!, upsert: upsertSpec('probe-after', 'Probe After', 1) },
    stormEnded,
  );
  const outcomes = await draining;
  const loadStopped = new Date();

  await sleep(1000);
  const busy = await busyBackends(admin, fault.name, { begunBefore: loadStopped });
  const connections = await backendCount(admin, fault.name);

  const figures = printFigures('database-faults (b) TCP cuts at random protocol points for 20 s', outcomes, {
    timeToHealthyMs: healthyMs,
    boundMs: bound,
    rounds: modes.join(','),
    connectionsCut: proxy.cuts(),
    busyBackendsAfter1s: busy.length,
    connectionsAfter1s: connections,
  });

  expect(proxy.cuts()).toBeGreaterThan(0);
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
