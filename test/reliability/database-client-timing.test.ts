import { sql } from 'drizzle-orm';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { createDatabase, isDatabaseUnavailable, prepared, type Database, type DatabaseOptions } from '../../src/db/client.js';
import { databaseFailure } from '../helpers/database-assertions.js';
import { createTestDatabase, type TestDatabase } from '../helpers/database.js';
import { startPgProxy, type PgProxy } from '../helpers/pg-proxy.js';

/*
 * How soon the database client's limits end a call: the latency side of src/db/client.test.ts and
 * src/db/client-faults.test.ts, which assert which limit ended a call but never time it. Each limit
 * must fire no sooner than it is set to (less a little for timer granularity) and well before the
 * next limit a broken one would fall back on. The upper bounds are at least 5× the figure measured on
 * the 2-core machine the suites run on (noted at each bound), so a loaded run does not fail them;
 * a limit that did not fire would overshoot them by seconds.
 */

let testDatabase: TestDatabase;
let admin: pg.Client;
const opened: Database[] = [];
const figures: Record<string, number> = {};

function open(options: DatabaseOptions, url = testDatabase.url): Database {
  const instance = createDatabase(url, options);
  opened.push(instance);
  return instance;
}

beforeAll(async () => {
  testDatabase = await createTestDatabase();
  admin = new pg.Client({ connectionString: testDatabase.url });
  admin.on('error', () => {});
  await admin.connect();
  await admin.query(`
    CREATE TABLE timing_items (id int PRIMARY KEY, note text);
    INSERT INTO timing_items (id, note) VALUES (1000, 'locked row');`);
});

afterAll(async () => {
  for (const instance of opened) await instance.close().catch(() => {});
  await admin?.end().catch(() => {});
  await testDatabase?.drop();
  process.stderr.write(`database-client-timing figures (ms): ${JSON.stringify(figures)}\n`);
});

/** How `promise` rejected and how many ms after the call; fails the test when it resolves. */
async function timedRejection(promise: Promise<unknown>): Promise<{ error: unknown; ms: number }> {
  const started = performance.now();
  try {
    await promise;
  } catch (error) {
    return { error, ms: performance.now() - started };
  }
  throw new Error('expected a rejection, but the call resolved');
}

async function timed<T>(work: () => Promise<T>): Promise<{ value: T; ms: number }> {
  const started = performance.now();
  const value = await work();
  return { value, ms: performance.now() - started };
}

/** Records a figure for the summary line and returns it. */
function figure(name: string, ms: number): number {
  figures[name] = Math.round(ms);
  return ms;
}

const backendPid = async (instance: Database) => (await instance.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;

/** Waits until a statement carrying `marker` is active and returns its backend's pid. */
async function activeBackend(marker: string): Promise<number> {
  let pid = 0;
  await vi.waitFor(
    async () => {
      const { rows } = await admin.query<{ pid: number }>(
        `SELECT pid FROM pg_stat_activity WHERE query LIKE $1 AND state = 'active' AND pid <> pg_backend_pid()`,
        [`%${marker}%`],
      );
      expect(rows).toHaveLength(1);
      pid = rows[0]!.pid;
    },
    { timeout: 10_000, interval: 20 },
  );
  return pid;
}

describe('server-side limits', () => {
  it('when statementTimeoutMs is 200, a longer statement is cancelled no sooner than 150 ms and within 1.5 s, alone or in a transaction', async () => {
    // Measured (3 runs): 203–208 ms alone, 214–217 ms in a transaction. Bound 1.5 s: about 7× the slowest,
    // and far below the 30 s the statement would run or the 60 s client-side query timeout.
    const limited = open({ poolSize: 1, statementTimeoutMs: 200, queryTimeoutMs: 60_000 });
    await backendPid(limited);
    const alone = await timedRejection(limited.query('SELECT pg_sleep(30)'));
    expect(databaseFailure(alone.error)).toBe('statement timeout');
    expect(figure('statementTimeout200', alone.ms)).toBeGreaterThanOrEqual(150);
    expect(alone.ms).toBeLessThan(1_500);
    const inTransaction = await timedRejection(limited.transaction(async (tx) => tx.execute(sql`SELECT pg_sleep(30)`)));
    expect(databaseFailure(inTransaction.error)).toBe('statement timeout');
    expect(figure('statementTimeout200InTransaction', inTransaction.ms)).toBeGreaterThanOrEqual(150);
    expect(inTransaction.ms).toBeLessThan(1_500);
  });

  it('when lockTimeoutMs is 200, a statement waiting for a held row lock fails no sooner than 150 ms and within 1.5 s', async () => {
    // Measured (3 runs): 203 ms. Bound 1.5 s: over 7× that, far below the 60 s statement timeout.
    const limited = open({ poolSize: 2, lockTimeoutMs: 200, statementTimeoutMs: 60_000, queryTimeoutMs: 65_000 });
    await backendPid(limited);
    const holder = new pg.Client({ connectionString: testDatabase.url });
    holder.on('error', () => {});
    await holder.connect();
    try {
      await holder.query('BEGIN');
      await holder.query('SELECT 1 FROM timing_items WHERE id = 1000 FOR UPDATE');
      const { error, ms } = await timedRejection(limited.query(`UPDATE timing_items SET note = 'changed' WHERE id = 1000`));
      expect(databaseFailure(error)).toBe('lock timeout');
      expect(figure('lockTimeout200', ms)).toBeGreaterThanOrEqual(150);
      expect(ms).toBeLessThan(1_500);
    } finally {
      await holder.query('ROLLBACK').catch(() => {});
      await holder.end().catch(() => {});
    }
  });
});

describe('client-side limits', () => {
  it('when queryTimeoutMs is 300, a longer statement is given up no sooner than 250 ms and within 2 s, and the next call is served within 500 ms', async () => {
    // Measured (3 runs): 301–302 ms for the timeout, 8–12 ms for the next call (on a new connection).
    // Bounds: 2 s (over 6×) and 500 ms (over 40×): the next call must not wait out the 30 s statement left behind.
    const limited = open({ poolSize: 1, queryTimeoutMs: 300, statementTimeoutMs: 60_000, connectTimeoutMs: 5_000 });
    const before = await backendPid(limited);
    const { error, ms } = await timedRejection(limited.query('SELECT pg_sleep(30)'));
    expect(databaseFailure(error)).toBe('query timeout');
    expect(figure('queryTimeout300', ms)).toBeGreaterThanOrEqual(250);
    expect(ms).toBeLessThan(2_000);
    const next = await timed(() => backendPid(limited));
    expect(next.value).not.toBe(before);
    expect(figure('nextCallAfterQueryTimeout', next.ms)).toBeLessThan(500);
    await admin.query('SELECT pg_cancel_backend($1)', [before]);
  });

  it('when connectTimeoutMs is 500 and every pooled connection is held, a query or a transaction gives up waiting no sooner than 400 ms and within 3 s', async () => {
    // Measured (3 runs): 500–501 ms. Bound 3 s: 6×, far below the 60 s the connection stays held otherwise.
    const small = open({ poolSize: 1, connectTimeoutMs: 500, statementTimeoutMs: 60_000, idleInTransactionTimeoutMs: 60_000 });
    let release!: () => void;
    let holding!: () => void;
    const held = new Promise<void>((resolve) => (holding = resolve));
    const transaction = small.transaction(async () => {
      holding();
      await new Promise<void>((resolve) => (release = resolve));
    });
    await held;
    try {
      const query = await timedRejection(small.query('SELECT 1'));
      expect(databaseFailure(query.error)).toBe('pool timeout');
      expect(figure('poolTimeout500Query', query.ms)).toBeGreaterThanOrEqual(400);
      expect(query.ms).toBeLessThan(3_000);
      const inTransaction = await timedRejection(small.transaction(async (tx) => tx.execute(sql`SELECT 1`)));
      expect(databaseFailure(inTransaction.error)).toBe('pool timeout');
      expect(figure('poolTimeout500Transaction', inTransaction.ms)).toBeGreaterThanOrEqual(400);
      expect(inTransaction.ms).toBeLessThan(3_000);
    } finally {
      release();
    }
    await transaction;
  });
});

describe('a terminated backend is seen at once', () => {
  it('when the backend of a transaction is terminated between statements, the next statement fails within 1 s, not at the 30 s query timeout', async () => {
    // Measured (3 runs): 0–1 ms from the next statement. Bound 1 s: far over 5×, a thirtieth of the query timeout.
    const small = open({ poolSize: 1, connectTimeoutMs: 5_000, queryTimeoutMs: 30_000 });
    let failedAfter = Number.NaN;
    const { error } = await timedRejection(
      small.transaction(async (tx) => {
        const pid = (await tx.execute(sql`SELECT pg_backend_pid() AS pid`)).rows[0]!.pid as number;
        await admin.query('SELECT pg_terminate_backend($1)', [pid]);
        await vi.waitFor(async () => expect((await admin.query('SELECT 1 FROM pg_stat_activity WHERE pid = $1', [pid])).rows).toEqual([]), {
          timeout: 10_000,
          interval: 20,
        });
        const next = await timedRejection(tx.execute(sql`SELECT 1`));
        failedAfter = next.ms;
        throw next.error;
      }),
    );
    expect(databaseFailure(error)).toBe('connection lost');
    expect(figure('terminatedBetweenStatements', failedAfter)).toBeLessThan(1_000);
  });

  it('when the backend is terminated while it runs a statement, the call fails within 1 s of the termination, not at the 30 s query timeout', async () => {
    // Measured (3 runs): 1–9 ms. Bound 1 s: over 100×, a thirtieth of the query timeout.
    const small = open({ poolSize: 1, connectTimeoutMs: 5_000, queryTimeoutMs: 30_000, statementTimeoutMs: 60_000 });
    await backendPid(small);
    const marker = `timing_terminate_${Date.now()}`;
    let failedAt = 0;
    const running = small.query(`SELECT pg_sleep(30) /* ${marker} */`).then(
      () => expect.fail('the statement completed'),
      (error: unknown) => {
        failedAt = performance.now();
        return error;
      },
    );
    const pid = await activeBackend(marker);
    const terminatedAt = performance.now();
    await admin.query('SELECT pg_terminate_backend($1)', [pid]);
    const error = await running;
    expect(databaseFailure(error)).toBe('connection lost');
    expect(figure('terminatedMidStatement', failedAt - terminatedAt)).toBeLessThan(1_000);
  });
});

describe('a connection cut on the wire is seen at once (through a cutting proxy)', () => {
  const QUERY_TIMEOUT_MS = 30_000;
  let proxy: PgProxy;
  let faulty: Database;

  beforeAll(async () => {
    const target = new URL(testDatabase.url);
    proxy = await startPgProxy({ host: target.hostname, port: Number(target.port || 5432) });
    const viaProxy = new URL(testDatabase.url);
    viaProxy.hostname = '127.0.0.1';
    viaProxy.port = String(proxy.port);
    faulty = open(
      {
        poolSize: 2,
        queryTimeoutMs: QUERY_TIMEOUT_MS,
        connectTimeoutMs: 5_000,
        statementTimeoutMs: 20_000,
        idleInTransactionTimeoutMs: 20_000,
      },
      viaProxy.toString(),
    );
  });

  afterAll(async () => {
    proxy?.disarm();
    await proxy?.close();
  });

  const cutCases: Array<{ name: string; arm?: string; call: () => Promise<unknown> }> = [
    { name: 'afterRowDescription', arm: 'T', call: () => faulty.query('SELECT generate_series(1, 3) AS n') },
    { name: 'afterDataRow', arm: 'D', call: () => faulty.query('SELECT generate_series(1, $1::int) AS n', [3]) },
    { name: 'beforeReadyForQuery', arm: 'C', call: () => faulty.query('SELECT $1::int AS n', [1]) },
    {
      name: 'afterParseComplete',
      arm: '1',
      call: () => faulty.query({ name: 'timing_parse_named', text: 'SELECT $1::int + 1 AS n', values: [1] }),
    },
    {
      name: 'betweenTransactionStatements',
      call: () =>
        faulty.transaction(async (tx) => {
          await tx.execute(sql`SELECT 1`);
          proxy.cutAll();
          await tx.execute(sql`SELECT 2`);
        }),
    },
    {
      name: 'duringCommit',
      call: () =>
        faulty.transaction(async (tx) => {
          await tx.execute(sql`SELECT 1`);
          proxy.cutAfterRandomBytes(1);
        }),
    },
  ];

  it('when the connection is cut at a given point of a round trip, the call fails within 1 s, not at the 30 s query timeout', async () => {
    // Measured (3 runs): 2–12 ms per case, once 108 ms (the COMMIT cut). Bound 1 s: over 9× the slowest.
    for (const { name, arm, call } of cutCases) {
      expect((await faulty.query('SELECT 1 AS ok')).rows).toEqual([{ ok: 1 }]);
      if (arm) proxy.cutAfterBackendMessage(arm);
      const { error, ms } = await timedRejection(call());
      proxy.disarm();
      expect(databaseFailure(error), name).toBe('connection lost');
      expect(figure(`cut ${name}`, ms), name).toBeLessThan(1_000);
    }
  });

  it('when connections are cut at random points under concurrent calls, every call settles within 3 s', { timeout: 120_000 }, async () => {
    // Measured (3 runs): the slowest of the 100 calls took 61–128 ms (a call may queue for one of the two
    // connections). Bound 3 s: over 20×, a tenth of the query timeout.
    const statement = prepared('timing_random', (executor, name) =>
      executor
        .select({ n: sql<number>`${sql.placeholder('n')}::int`, filler: sql<string>`repeat('x', 200)` })
        .from(sql`(VALUES (1)) AS one (x)`)
        .prepare(name),
    );
    const calls: Array<(round: number, slot: number) => Promise<unknown>> = [
      () => faulty.query('SELECT generate_series(1, 20) AS n'),
      (round, slot) => faulty.query({ name: 'timing_random_named', text: 'SELECT $1::int AS n', values: [round * 10 + slot] }),
      (_round, slot) => statement(faulty.db, { n: slot }),
      (round, slot) =>
        faulty.transaction(async (tx) => {
          await tx.execute(sql`INSERT INTO timing_items (id) VALUES (${10_000 + round * 10 + slot})`);
        }),
    ];
    let slowest = 0;
    let failed = 0;
    for (let round = 0; round < 25; round += 1) {
      proxy.cutAfterRandomBytes(200 + ((round * 97) % 1_500));
      await Promise.all(
        calls.map(async (call, slot) => {
          const started = performance.now();
          try {
            await call(round, slot);
          } catch (error) {
            failed += 1;
            expect(isDatabaseUnavailable(error)).toBe(true);
          } finally {
            slowest = Math.max(slowest, performance.now() - started);
          }
        }),
      );
      proxy.disarm();
    }
    expect(failed).toBeGreaterThan(0);
    expect(figure('randomCutsSlowestCall', slowest)).toBeLessThan(3_000);
  });
});
