import { expect, it } from 'vitest';
import {
  connectAdmin,
  describeOutcomes,
  FAULT_TIMEOUTS,
  getSpec,
  mixedRequest,
  ok,
  printFigures,
  seedCustomers,
  servedFaultDatabase,
  sleep,
  startLoad,
  timedCall,
  upsertSpec,
} from './database-faults.js';

// Issue 26, item 8 (c): a column-type change while serving. name_provenance_rank is in the SELECT list
// of the hot statements (GET by id, list, the upsert's lookups: they select whole customer rows) and
// is written by every upsert that sends firstName/lastName; integer -> bigint changes the result type
// of every cached plan that returns it ("cached plan must not change result type", SQLSTATE 0A000).
const env = { ...FAULT_TIMEOUTS };
const POOL_SIZE = Number(env.DATABASE_POOL_SIZE);
const WARM_UP_MS = 3_000;
const AFTER_CHANGE_MS = 5_000;

const served = servedFaultDatabase('schema', env);

it('when a column of the hot statements changes type under load, only a handful of requests fail (at most the pool size) and none that started 1 s after the change', async () => {
  const { fault, server } = served;
  const ids = await seedCustomers(server, fault.key, 'seed', 30);
  // Long enough for every pool connection to have prepared the hot statements.
  const load = startLoad(server, fault.key, 8, (worker, n) => mixedRequest(ids, worker, n));
  await sleep(WARM_UP_MS);

  const migrator = await connectAdmin(fault.name);
  let changeStarted: number;
  let changedAt: number;
  try {
    await migrator.query(`SET lock_timeout = '10s'`);
    changeStarted = Date.now();
    await migrator.query(`ALTER TABLE customers ALTER COLUMN name_provenance_rank TYPE bigint`);
    changedAt = Date.now();
    const { rows } = await migrator.query<{ data_type: string }>(
      `SELECT data_type FROM information_schema.columns WHERE table_name = 'customers' AND column_name = 'name_provenance_rank'`,
    );
    expect(rows[0]?.data_type).toBe('bigint');
  } finally {
    await migrator.end().catch(() => {});
  }

  await sleep(AFTER_CHANGE_MS);
  const outcomes = await load.stop();

  // After the load: a read and a write of a record whose name_provenance_rank is set.
  const read = await timedCall(server, fault.key, getSpec(ids[0]!));
  const write = await timedCall(server, fault.key, upsertSpec('seed-0', 'Seedseed Number0', 99));

  const failures = outcomes.filter((outcome) => !ok(outcome));
  const late = failures.filter((outcome) => outcome.startedAt >= changedAt + 1000);
  const lastFailureEnded = Math.max(changedAt, ...failures.map((outcome) => outcome.endedAt));
  printFigures('database-faults (c) ALTER COLUMN name_provenance_rank TYPE bigint under load', outcomes, {
    // The time to healthy: from the end of the ALTER to the end of the last failed request.
    timeToHealthyMs: lastFailureEnded - changedAt,
    alterMs: changedAt - changeStarted,
    requestsAfterChange: outcomes.filter((outcome) => outcome.startedAt >= changedAt).length,
    failuresStartedAfterChangePlus1s: late.length,
  });

  expect(outcomes.filter((outcome) => outcome.startedAt >= changedAt + 1000 && ok(outcome)).length).toBeGreaterThan(0);
  expect(
    failures.length,
    `more than ${POOL_SIZE} failures: ${describeOutcomes(failures, 10)}\n${server.output().slice(-4000)}`,
  ).toBeLessThanOrEqual(POOL_SIZE);
  expect(late.length, `failures that started 1 s after the change: ${describeOutcomes(late)}\n${server.output().slice(-4000)}`).toBe(0);
  expect([read.status, write.status], describeOutcomes([read, write])).toEqual([200, 200]);
}, 120_000);
