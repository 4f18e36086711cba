import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp } from '../../src/app.js';
import { createDatabase, type Database } from '../../src/db/client.js';
import { hashApiKey } from '../../src/modules/api-keys/api-key-secret.js';
import { FEATURES } from '../../src/modules/organisations/organisations.schemas.js';
import { person } from '../customers/customers-fixtures.js';
import { ALL_SCOPES, createTestContext, type TestContext, testServices } from '../helpers/harness.js';
import { startOfSecond, withinOneSecond } from '../helpers/one-second.js';

/**
 * Issue 34, item 1: reads write nothing per request. Leases are sized by the instance's demand for
 * the key (access.service.ts, burstDemand), so in steady traffic the access check writes once per
 * key, second and instance, whatever the request rate; the database still never hands out more than
 * a window's limit across instances. These tests run at the configured defaults (25 a second,
 * 100,000 a day), where every request used to lease.
 */

const DEFAULTS = { burst: 25, daily: 100_000 };

let ctx: TestContext;
let orgId: string;
let customerId: string;
/** A connection of the test's own, outside every app: it reads the statistics and the counters. */
let observer: pg.Client;

/**
 * Runs `work` on a pool of its own, closed afterwards: its backends end, which makes them report
 * their statistics, so the writes of a test's set-up are counted before its traffic starts.
 */
async function onSetupDatabase<T>(work: (database: Database) => Promise<T>): Promise<T> {
  const database = createDatabase(ctx.databaseUrl, { poolSize: 2 });
  try {
    return await work(database);
  } finally {
    await database.close();
  }
}

async function createKeys(count: number): Promise<Array<{ id: string; key: string }>> {
  return onSetupDatabase(async (database) => {
    const keys = testServices(database).apiKeys;
    const created: Array<{ id: string; key: string }> = [];
    for (let index = 0; index < count; index += 1) created.push(await keys.create({ orgId, scopes: ALL_SCOPES }));
    return created;
  });
}

beforeAll(async () => {
  ctx = await createTestContext();
  observer = new pg.Client({ connectionString: ctx.databaseUrl });
  await observer.connect();
  await onSetupDatabase(async (database) => {
    const org = await testServices(database).organisations.create({
      name: 'Demand-sized leases',
      features: [...FEATURES],
      credits: 100,
      defaultPayer: 'organization',
    });
    orgId = org.id;
    const key = await testServices(database).apiKeys.create({ orgId, scopes: ALL_SCOPES });
    const app = await buildApp({ config: ctx.config, database, logger: false });
    try {
      const created = await app.inject({
        method: 'POST',
        url: '/v1/customers',
        headers: { authorization: `Bearer ${key.key}` },
        payload: person(),
      });
      if (created.statusCode !== 201) throw new Error(`expected 201, got ${created.statusCode}: ${created.body}`);
      customerId = created.json<{ id: string }>().id;
    } finally {
      await app.close();
    }
  });
});
afterAll(async () => {
  await observer?.end();
  await ctx?.close();
});

/**
 * An app at the default limits on a pool of its own, so that closing it ends its backends (which
 * reports their statistics). It records the key hash and second of every full access check it
 * sends (the only statement of a read that may write).
 */
async function defaultLimitsInstance(): Promise<{
  app: FastifyInstance;
  fullChecks: Array<{ keyHash: string; second: number }>;
  close: () => Promise<void>;
}> {
  const database: Database = createDatabase(ctx.databaseUrl, { poolSize: 4 });
  const fullChecks: Array<{ keyHash: string; second: number }> = [];
  database.pool.on('connect', (client: pg.PoolClient) => {
    const query = client.query.bind(client) as (...args: unknown[]) => unknown;
    (client as unknown as { query: (...args: unknown[]) => unknown }).query = (...args: unknown[]) => {
      const config = args[0] as { name?: string; values?: unknown[] };
      if (config?.name === 'api_keys_access_check')
        fullChecks.push({ keyHash: String(config.values![0]), second: Math.floor(Date.now() / 1000) });
      return query(...args);
    };
  });
  const app = await buildApp({ config: { ...ctx.config, rateLimit: DEFAULTS }, database, logger: false });
  await app.ready();
  let closed = false;
  return {
    app,
    fullChecks,
    close: async () => {
      if (closed) return;
      closed = true;
      await app.close();
      await database.close();
    },
  };
}

type TupleWrites = { total: number; byTable: Record<string, number> };

/** Rows inserted, updated and deleted in this test's database, as the cumulative statistics count them. */
async function tupleWrites(): Promise<TupleWrites> {
  await observer.query('SELECT pg_stat_clear_snapshot()');
  const { rows } = await observer.query<{ relname: string; writes: string }>(
    // A partition's writes count as its table's (TEST_SCHEMA_VARIANT=partitioned).
    `SELECT coalesce(root.relname, s.relname) AS relname, s.n_tup_ins + s.n_tup_upd + s.n_tup_del AS writes
       FROM pg_stat_user_tables s
       LEFT JOIN pg_class root ON root.oid = pg_partition_root(s.relid) AND root.oid <> s.relid`,
  );
  const byTable: Record<string, number> = {};
  let total = 0;
  for (const row of rows) {
    const writes = Number(row.writes);
    total += writes;
    if (writes > 0) byTable[row.relname] = (byTable[row.relname] ?? 0) + writes;
  }
  return { total, byTable };
}

/**
 * The counts once they stopped moving: PostgreSQL 15 backends report their statistics at most once a
 * second, and an idle one shortly after going idle, so a count is taken as settled once two reads
 * 1.5 s apart agree.
 */
async function settledTupleWrites(): Promise<TupleWrites> {
  let last = await tupleWrites();
  for (let attempt = 0; attempt < 12; attempt += 1) {
    await sleep(1_500);
    const next = await tupleWrites();
    if (next.total === last.total) return next;
    last = next;
  }
  throw new Error('the statistics did not settle within 18 s');
}

function difference(after: TupleWrites, before: TupleWrites): TupleWrites {
  const byTable: Record<string, number> = {};
  for (const [table, writes] of Object.entries(after.byTable)) {
    const added = writes - (before.byTable[table] ?? 0);
    if (added > 0) byTable[table] = added;
  }
  return { total: after.total - before.total, byTable };
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, Math.max(0, ms)));

/**
 * Calls `send(index)` `count` times, each `intervalMs` after the one before was sent (or at once if
 * that has passed), after the one before has answered: a stalled machine slows the stream down
 * instead of sending the delayed requests together, so it never runs faster than one per interval.
 */
async function paced<T>(count: number, intervalMs: number, send: (index: number) => Promise<T>): Promise<T[]> {
  const results: T[] = [];
  let sentAt = -Infinity;
  for (let index = 0; index < count; index += 1) {
    await sleep(sentAt + intervalMs - Date.now());
    sentAt = Date.now();
    results.push(await send(index));
  }
  return results;
}

describe('reads at the default limits write once per key and second', () => {
  it("when 4 keys send 1,000 GETs and 100 list pages at the default limits, paced under 25 a second each, the access check writes at most once per key and second once each key's rate is known, and nothing but the rate-limit bookkeeping is written", async () => {
    const keys = await createKeys(4);
    const hashes = keys.map((key) => hashApiKey(key.key));
    const instance = await defaultLimitsInstance();
    try {
      const before = await settledTupleWrites();

      // Per key: 250 GETs by id and 25 list pages (every eleventh request), 20 a second.
      const perKey = 275;
      const secondsOfTraffic = new Map<number, Set<number>>(keys.map((_, index) => [index, new Set<number>()]));
      const started = Date.now();
      const statuses = (
        await Promise.all(
          keys.map((key, keyIndex) =>
            paced(perKey, 50, async (index) => {
              secondsOfTraffic.get(keyIndex)!.add(Math.floor(Date.now() / 1000));
              const url = index % 11 === 10 ? '/v1/customers?limit=20' : `/v1/customers/${customerId}`;
              const response = await ctx.request('GET', url, { key: key.key }, instance.app);
              if (process.env.LEASE_TEST_DEBUG && response.statusCode !== 200)
                console.log(keyIndex, Date.now() % 100_000, response.body, response.headers.ratelimit);
              return response.statusCode;
            }),
          ),
        )
      ).flat();
      const trafficSeconds = (Date.now() - started) / 1000;
      await instance.close();
      const writes = difference(await settledTupleWrites(), before);

      const keySeconds = [...secondsOfTraffic.values()].reduce((sum, seconds) => sum + seconds.size, 0);
      // Full checks per key and second; a key's first seconds ramp up from nothing known (the
      // first is partial, and the demand of a partial second is an estimate).
      const perKeySecond = new Map<string, number>();
      for (const check of instance.fullChecks) {
        const id = `${hashes.indexOf(check.keyHash)}:${check.second}`;
        perKeySecond.set(id, (perKeySecond.get(id) ?? 0) + 1);
      }
      const RAMP_SECONDS = 3;
      const firstSeconds = new Set(
        hashes.flatMap((_, index) =>
          Array.from({ length: RAMP_SECONDS }, (__, offset) => `${index}:${Math.min(...secondsOfTraffic.get(index)!) + offset}`),
        ),
      );
      const steadyOverOne = [...perKeySecond].filter(([id, count]) => !firstSeconds.has(id) && count > 1);
      const firstSecondChecks = [...perKeySecond].filter(([id]) => firstSeconds.has(id)).reduce((sum, [, count]) => sum + count, 0);
      console.log(
        `issue 34 item 1: ${statuses.length} requests (1,000 GETs, 100 list pages) by 4 keys over ${trafficSeconds.toFixed(1)} s ` +
          `(${keySeconds} key-seconds of traffic): ${writes.total} tuple writes ${JSON.stringify(writes.byTable)}; ` +
          `${instance.fullChecks.length} writing checks, ${firstSecondChecks} of them in the keys' first ${RAMP_SECONDS} seconds`,
      );

      if (process.env.LEASE_TEST_DEBUG) console.log(JSON.stringify([...perKeySecond]));
      expect(statuses.filter((status) => status !== 200)).toEqual([]);
      // After each key's first seconds, one writing check per key and second, mostly. A stall of the
      // machine (the suite runs files in parallel on 2 vCPUs) bunches the requests of every key into
      // the second after it, which is real demand above the lease and costs each key a second lease
      // then: seen up to two such seconds in a 15 s run. The budget is the total, below.
      expect(
        steadyOverOne.length,
        `key-seconds after the first with more than one writing check: ${JSON.stringify(steadyOverOne)}`,
      ).toBeLessThanOrEqual(Math.ceil((keySeconds - RAMP_SECONDS * keys.length) / 4));
      // Only the rate-limit bookkeeping writes: nothing else of a read touches a table.
      expect(Object.keys(writes.byTable).sort()).toEqual(['api_key_usage', 'api_keys']);
      // Every lease is one row write; a new key's first one also inserts its row, and closing the
      // instance gives each key's unused tokens back.
      expect(writes.byTable.api_key_usage).toBeLessThanOrEqual(instance.fullChecks.length + 2 * keys.length);
      // The budget, one row per key per second of traffic, with each key allowed its ramp
      // (at most 4 more leases: 1, 2, 4, 8, 16 tokens reach the limit of 25), its row's insert and
      // the return at close, plus the second leases of the stalled seconds bounded just above (a
      // stall's bunched requests are real demand; without this the two bounds disagreed, and a run
      // beside a heavier suite failed here by 4 writes after passing the stall bound).
      const stallLeases = steadyOverOne.reduce((sum, [, count]) => sum + count - 1, 0);
      expect(writes.byTable.api_key_usage).toBeLessThanOrEqual(keySeconds + keys.length * (4 + 2) + stallLeases);
      // last_used_at: at most once a minute per key.
      expect(writes.byTable.api_keys).toBeLessThanOrEqual(keys.length * Math.ceil(trafficSeconds / 60));
    } finally {
      await instance.close();
    }
  }, 90_000);
});

describe('two instances sharing one key', () => {
  type Admission = { second: number; status: number };

  async function admissions(app: FastifyInstance, key: string, count: number, intervalMs: number): Promise<Admission[]> {
    return paced(count, intervalMs, async () => {
      const response: LightMyRequestResponse = await ctx.request('GET', `/v1/customers/${customerId}`, { key }, app);
      return { second: Math.floor(Date.now() / 1000), status: response.statusCode };
    });
  }

  it('when steady traffic below the limit is split across two instances, none of it is refused, and each instance writes about once a second', async () => {
    const first = await defaultLimitsInstance();
    const second = await defaultLimitsInstance();
    try {
      const key = (await createKeys(1))[0]!;
      // 10 a second on each: 20 of the 25, within the documented bound (the limit less an eighth of
      // each instance's demand, rounded up: 25 - 2 - 2 = 21).
      await startOfSecond();
      const results = await Promise.all([admissions(first.app, key.key, 60, 100), admissions(second.app, key.key, 60, 100)]);
      const all = results.flat();
      if (process.env.LEASE_TEST_DEBUG)
        console.log(JSON.stringify(results.map((r) => r.map((x) => `${x.second % 100}:${x.status}`).join(' '))));
      expect(all.filter((result) => result.status !== 200)).toEqual([]);
      const { rows } = await observer.query<{ burst_count: number }>('SELECT burst_count FROM api_key_usage WHERE api_key_id = $1', [
        key.id,
      ]);
      expect(rows[0]!.burst_count).toBeLessThanOrEqual(DEFAULTS.burst);
    } finally {
      await first.close();
      await second.close();
    }
  }, 60_000);

  it('when both instances, after steady traffic has sized their leases, are sent more than the limit within one second, no more than the limit is admitted in that second', async () => {
    const first = await defaultLimitsInstance();
    const second = await defaultLimitsInstance();
    try {
      const key = (await createKeys(1))[0]!;
      // Steady traffic first, so both instances lease by their demand (12 a second each: 24 of 25).
      await startOfSecond();
      await Promise.all([admissions(first.app, key.key, 36, 83), admissions(second.app, key.key, 36, 83)]);

      // Then 40 at once on each, at the start of a second; repeated if the machine spread them over two seconds.
      const statuses = await withinOneSecond(
        async () => key,
        async () => {
          const responses = await Promise.all(
            Array.from({ length: 80 }, (_, index) =>
              ctx.request('GET', `/v1/customers/${customerId}`, { key: key.key }, index % 2 ? second.app : first.app),
            ),
          );
          return responses.map((response) => response.statusCode);
        },
      );
      expect(statuses.filter((status) => status !== 200 && status !== 429)).toEqual([]);
      expect(statuses.filter((status) => status === 200).length).toBeLessThanOrEqual(DEFAULTS.burst);
      expect(statuses.filter((status) => status === 200).length).toBeGreaterThan(0);
    } finally {
      await first.close();
      await second.close();
    }
  }, 60_000);
});
