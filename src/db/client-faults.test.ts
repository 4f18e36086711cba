import { sql } from 'drizzle-orm';
import pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../../test/helpers/database.js';
import { databaseFailure, expectPoolSettled, rejection } from '../../test/helpers/database-assertions.js';
import { startPgProxy, type PgProxy } from '../../test/helpers/pg-proxy.js';
import { createDatabase, isDatabaseUnavailable, prepared, type Database } from './client.js';

/*
 * Contract tests of the database interface (src/db/client.ts) under a connection lost at any point
 * of a round trip: a loopback proxy between the pool and PostgreSQL cuts the TCP connection right
 * after a given backend message, between two statements of a transaction, during COMMIT, or at random
 * byte offsets. Every call must settle on the loss itself (seen at once, not left to a timeout), fail
 * only as "database unavailable", leave no connection checked out, and the next call must succeed.
 * Which of those ended a call is read from its error (databaseFailure), not from a timer; how soon a
 * loss is seen is bounded in test/reliability/database-client-timing.test.ts.
 */

/** The client-side bound a loss that went unnoticed would end at: no call here may end on it. */
const QUERY_TIMEOUT_MS = 5_000;

let testDatabase: TestDatabase;
let admin: pg.Client;
let proxy: PgProxy;
/** A Database whose connections go through the proxy. */
let faulty: Database;

beforeAll(async () => {
  testDatabase = await createTestDatabase();
  admin = new pg.Client({ connectionString: testDatabase.url });
  admin.on('error', () => {});
  await admin.connect();
  await admin.query(`CREATE TABLE fault_items (id int PRIMARY KEY, note text)`);
  const target = new URL(testDatabase.url);
  proxy = await startPgProxy({ host: target.hostname, port: Number(target.port || 5432) });
  // The test database's URL (credentials and all) with the proxy's host and port.
  const viaProxy = new URL(testDatabase.url);
  viaProxy.hostname = '127.0.0.1';
  viaProxy.port = String(proxy.port);
  faulty = createDatabase(viaProxy.toString(), {
    poolSize: 2,
    queryTimeoutMs: QUERY_TIMEOUT_MS,
    connectTimeoutMs: 2_000,
    statementTimeoutMs: 4_000,
    idleInTransactionTimeoutMs: 10_000,
  });
});

afterEach(() => proxy?.disarm());

afterAll(async () => {
  await faulty?.close().catch(() => {});
  await proxy?.close();
  await admin?.end().catch(() => {});
  await testDatabase?.drop();
});

const itemIds = async (from: number, to: number) =>
  (await admin.query<{ id: number }>('SELECT id FROM fault_items WHERE id BETWEEN $1 AND $2 ORDER BY id', [from, to])).rows.map(
    (row) => row.id,
  );

/** At least one idle connection, opened before the fault is armed (so the cut hits the statement, not the connection's setup). */
async function warm(): Promise<void> {
  expect((await faulty.query('SELECT 1 AS ok')).rows).toEqual([{ ok: 1 }]);
}

/** After a fault: the pool settles, nothing is left in a transaction, and the next calls (a query and a transaction) succeed. */
async function expectRecovered(): Promise<void> {
  await expectPoolSettled(faulty);
  expect((await faulty.query<{ n: number }>('SELECT $1::int AS n', [7])).rows).toEqual([{ n: 7 }]);
  const inTx = await faulty.transaction(async (tx) => (await tx.execute(sql`SELECT 8 AS n`)).rows[0]);
  expect(inTx).toEqual({ n: 8 });
  await expectPoolSettled(faulty);
  const { rows } = await admin.query(
    `SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'`,
  );
  expect(rows[0].n).toBe(0);
}

/** Runs `call` with the fault armed by `arm`, and checks the contract for a lost connection. */
async function expectLostConnectionContract(arm: () => void, call: () => Promise<unknown>): Promise<unknown> {
  await warm();
  const cutsBefore = proxy.cuts();
  arm();
  const { error } = await rejection(call());
  proxy.disarm();
  expect(proxy.cuts()).toBeGreaterThan(cutsBefore);
  expect(
    isDatabaseUnavailable(error),
    `not reported as unavailable: ${String(error)} (cause: ${String((error as { cause?: unknown }).cause)})`,
  ).toBe(true);
  // Ended by the loss itself, not by the query, connect or statement timeout an unnoticed loss would run into.
  expect(databaseFailure(error), `${String(error)} (cause: ${String((error as { cause?: unknown }).cause)})`).toBe('connection lost');
  await expectRecovered();
  return error;
}

/** `SELECT $1::int AS n` and some filler as a Drizzle prepared query (see prepared), run on the faulty pool. */
function preparedNumber(name: string): (values: { n: number }) => Promise<unknown> {
  const statement = prepared(name, (executor, statementName) =>
    executor
      .select({ n: sql<number>`${sql.placeholder('n')}::int`, filler: sql<string>`repeat('x', 200)` })
      .from(sql`(VALUES (1)) AS one (x)`)
      .prepare(statementName),
  );
  return (values) => statement(faulty.db, values);
}

describe('a connection lost mid round trip (through a cutting proxy)', () => {
  const preparedSelect = preparedNumber('fault_prepared');
  const cases: Array<{
    when: string;
    type: string;
    call: () => Promise<unknown>;
    armsItself?: boolean;
    written?: () => Promise<number[]>;
  }> = [
    { when: 'after RowDescription', type: 'T', call: () => faulty.query('SELECT generate_series(1, 3) AS n') },
    { when: 'after the first DataRow', type: 'D', call: () => faulty.query('SELECT generate_series(1, $1::int) AS n', [3]) },
    { when: 'between CommandComplete and ReadyForQuery', type: 'C', call: () => faulty.query('SELECT $1::int AS n', [1]) },
    {
      when: 'after ParseComplete of a named statement',
      type: '1',
      call: () => faulty.query({ name: 'fault_parse_named', text: 'SELECT $1::int + 1 AS n', values: [1] }),
    },
    {
      when: 'between CommandComplete and ReadyForQuery of a Drizzle prepared statement',
      type: 'C',
      call: () => preparedSelect({ n: 1 }),
    },
    {
      when: 'between CommandComplete and ReadyForQuery of a statement in a transaction',
      type: 'C',
      armsItself: true,
      call: () =>
        faulty.transaction(async (tx) => {
          proxy.cutAfterBackendMessage('C'); // BEGIN is done: the next CommandComplete is the INSERT's
          await tx.execute(sql`INSERT INTO fault_items (id) VALUES (1)`);
        }),
      written: () => itemIds(1, 1),
    },
  ];

  for (const { when, type, call, armsItself, written } of cases) {
    it(`when the connection is cut ${when} ('${type}'), the call rejects as unavailable on the loss itself, no connection leaks${written ? ', nothing is written' : ''}, and the next call succeeds`, async () => {
      await expectLostConnectionContract(() => (armsItself ? undefined : proxy.cutAfterBackendMessage(type)), call);
      if (written) expect(await written()).toEqual([]);
    });
  }

  it('when the connection is cut mid-transaction between two statements, the transaction rejects as unavailable on the loss itself, nothing is written, and the next call succeeds', async () => {
    await expectLostConnectionContract(
      () => {},
      () =>
        faulty.transaction(async (tx) => {
          await tx.execute(sql`INSERT INTO fault_items (id) VALUES (10)`);
          proxy.cutAll();
          await new Promise((resolve) => setTimeout(resolve, 20));
          await tx.execute(sql`INSERT INTO fault_items (id) VALUES (11)`);
        }),
    );
    expect(await itemIds(10, 11)).toEqual([]);
  });

  it('when the connection is cut while the COMMIT is on its way (its first byte sent), the transaction rejects as unavailable on the loss itself, nothing is written, and the next call succeeds', async () => {
    await expectLostConnectionContract(
      () => {},
      () =>
        faulty.transaction(async (tx) => {
          await tx.execute(sql`INSERT INTO fault_items (id) VALUES (20)`);
          // The work is done: the next byte on the wire is the COMMIT's, and the cut follows it.
          proxy.cutAfterRandomBytes(1);
        }),
    );
    expect(await itemIds(20, 20)).toEqual([]);
  });

  it("when the connection is cut after the COMMIT's CommandComplete but before its ReadyForQuery, the transaction rejects as unavailable on the loss itself and the next call succeeds", async () => {
    await expectLostConnectionContract(
      () => {},
      () =>
        faulty.transaction(async (tx) => {
          await tx.execute(sql`INSERT INTO fault_items (id) VALUES (30)`);
          proxy.cutAfterBackendMessage('C'); // the next CommandComplete is the COMMIT's
        }),
    );
  });

  it('when every connection is cut while idle in the pool, the next call is served on a new connection', async () => {
    await warm();
    const cutsBefore = proxy.cuts();
    proxy.cutAll();
    expect(proxy.cuts()).toBeGreaterThan(cutsBefore);
    // The close reaches each idle client: the pool drops them all.
    await vi.waitFor(() => expect(faulty.pool.totalCount).toBe(0), { timeout: 5_000, interval: 20 });
    expect((await faulty.query('SELECT 1 AS ok')).rows).toEqual([{ ok: 1 }]);
    await expectRecovered();
  });

  it(
    'when connections are cut at random points of the protocol under concurrent calls, every call settles without running into the query timeout, fails only as unavailable, and the pool recovers',
    { timeout: 60_000 },
    async () => {
      await warm();
      const statement = preparedNumber('fault_random');
      const failures: string[] = [];
      let succeeded = 0;
      let failed = 0;
      const endedByQueryTimeout: string[] = [];
      const calls: Array<(round: number, slot: number) => Promise<unknown>> = [
        () => faulty.query('SELECT generate_series(1, 20) AS n'),
        (round, slot) => faulty.query({ name: 'fault_random_named', text: 'SELECT $1::int AS n', values: [round * 10 + slot] }),
        (_round, slot) => statement({ n: slot }),
        (round, slot) =>
          faulty.transaction(async (tx) => {
            const id = 1_000 + round * 10 + slot;
            await tx.execute(sql`INSERT INTO fault_items (id) VALUES (${id})`);
            await tx.execute(sql`UPDATE fault_items SET note = 'updated' WHERE id = ${id}`);
          }),
      ];
      for (let round = 0; round < 25; round += 1) {
        proxy.cutAfterRandomBytes(200 + ((round * 97) % 1_500));
        await Promise.all(
          calls.map(async (call, slot) => {
            try {
              await call(round, slot);
              succeeded += 1;
            } catch (error) {
              failed += 1;
              const described = `round ${round} slot ${slot}: ${String(error)} (cause: ${String((error as { cause?: unknown }).cause)})`;
              if (!isDatabaseUnavailable(error)) failures.push(described);
              if (databaseFailure(error) === 'query timeout') endedByQueryTimeout.push(described);
            }
          }),
        );
        proxy.disarm();
      }
      expect(failures).toEqual([]);
      expect(failed).toBeGreaterThan(0); // the proxy did cut
      // A loss left unnoticed ends only at the client-side query timeout; none may.
      expect(endedByQueryTimeout).toEqual([]);
      await expectRecovered();
      // Transactions are all or nothing: a row is there only with its UPDATE.
      const { rows } = await admin.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM fault_items WHERE id >= 1000 AND note IS DISTINCT FROM 'updated'`,
      );
      expect(rows[0]!.n).toBe(0);
      expect(succeeded + failed).toBe(100);
    },
  );
});
