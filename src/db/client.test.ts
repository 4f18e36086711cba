import { eq, sql } from 'drizzle-orm';
import { integer, pgTable } from 'drizzle-orm/pg-core';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../../test/helpers/database.js';
import { databaseFailure, expectPoolSettled, rejection } from '../../test/helpers/database-assertions.js';
import { createDatabase, isDatabaseUnavailable, prepared, type Database, type DatabaseOptions } from './client.js';

/*
 * Contract tests of the database interface (src/db/client.ts) against the real PostgreSQL: a
 * database of this file's own, scratch tables, and Database instances with small limits.
 * Faults on the wire (a connection cut mid round trip) are in client-faults.test.ts. These tests
 * say which limit ended a call (databaseFailure), never how long it took: how soon each limit
 * fires is bounded in test/reliability/database-client-timing.test.ts.
 */

let testDatabase: TestDatabase;
/** A plain client of its own: it terminates backends, changes the schema and reads what was written. */
let admin: pg.Client;
/** The instance most tests use. */
let database: Database;
const extra: Database[] = [];

/** A Database of its own with the given limits; closed after the file. */
function open(options: DatabaseOptions): Database {
  const instance = createDatabase(testDatabase.url, options);
  extra.push(instance);
  return instance;
}

beforeAll(async () => {
  testDatabase = await createTestDatabase();
  admin = new pg.Client({ connectionString: testDatabase.url });
  admin.on('error', () => {});
  await admin.connect();
  await admin.query(`
    CREATE TABLE contract_items (id int PRIMARY KEY, note text);
    CREATE TABLE tx_parents (id int PRIMARY KEY);
    CREATE TABLE tx_children (id int PRIMARY KEY, parent_id int REFERENCES tx_parents (id) DEFERRABLE INITIALLY DEFERRED);
    INSERT INTO tx_parents (id) VALUES (1);
    INSERT INTO contract_items (id, note) VALUES (1000, 'locked row');`);
  database = createDatabase(testDatabase.url, { poolSize: 4 });
});

afterAll(async () => {
  for (const instance of extra) await instance.close().catch(() => {});
  await database?.close();
  await admin?.end().catch(() => {});
  await testDatabase?.drop();
});

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** The SQLSTATE of an error or of the first error in its `cause` chain that has one. */
function sqlState(error: unknown): string | undefined {
  for (let current = error, depth = 0; current && depth < 10; current = (current as { cause?: unknown }).cause, depth += 1) {
    const code = (current as { code?: unknown }).code;
    if (typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code)) return code;
  }
  return undefined;
}

const openTransactions = async () =>
  (
    await admin.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'`,
    )
  ).rows[0]!.n;

const itemIds = async (from: number, to: number) =>
  (await admin.query<{ id: number }>('SELECT id FROM contract_items WHERE id BETWEEN $1 AND $2 ORDER BY id', [from, to])).rows.map(
    (row) => row.id,
  );

const childIds = async () => (await admin.query<{ id: number }>('SELECT id FROM tx_children ORDER BY id')).rows.map((row) => row.id);

const backendPid = async (instance: Database) => (await instance.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;

/** Waits until the backend `pid` is gone from pg_stat_activity. */
async function backendGone(pid: number, timeout = 5_000): Promise<void> {
  await vi.waitFor(
    async () => {
      const { rows } = await admin.query('SELECT 1 FROM pg_stat_activity WHERE pid = $1', [pid]);
      expect(rows).toHaveLength(0);
    },
    { timeout, interval: 20 },
  );
}

/** Terminates a backend and waits until it is gone from pg_stat_activity. */
async function terminate(pid: number): Promise<void> {
  await admin.query('SELECT pg_terminate_backend($1)', [pid]);
  await backendGone(pid);
}

describe('Database.transaction', () => {
  it('when the work succeeds, its statements commit together and the connection goes back to the pool outside any transaction', async () => {
    await database.transaction(async (tx) => {
      await tx.execute(sql`INSERT INTO tx_children (id, parent_id) VALUES (10, 1)`);
      await tx.execute(sql`INSERT INTO contract_items (id) VALUES (10)`);
    });
    expect(await childIds()).toContain(10);
    expect(await itemIds(10, 10)).toEqual([10]);
    expect(await openTransactions()).toBe(0);
    await expectPoolSettled(database);
  });

  it("when a statement fails mid-transaction, nothing of the transaction is written, the caller gets the statement's error, and the connection goes back clean", async () => {
    const { error } = await rejection(
      database.transaction(async (tx) => {
        await tx.execute(sql`INSERT INTO contract_items (id) VALUES (20)`);
        await tx.execute(sql`SELECT 1 / 0`);
        await tx.execute(sql`INSERT INTO contract_items (id) VALUES (21)`);
      }),
    );
    expect(sqlState(error)).toBe('22012');
    expect(isDatabaseUnavailable(error)).toBe(false);
    expect(await itemIds(20, 21)).toEqual([]);
    await expectPoolSettled(database);
    expect(await openTransactions()).toBe(0);
    // The connection it ran on is usable, outside any transaction.
    const { rows } = await database.query<{ ok: number }>('SELECT 1 AS ok');
    expect(rows).toEqual([{ ok: 1 }]);
  });

  it("when the work throws after writing, nothing of it is written and the work's own error is what the caller gets", async () => {
    const failure = new Error('work failed');
    const { error } = await rejection(
      database.transaction(async (tx) => {
        await tx.execute(sql`INSERT INTO tx_children (id, parent_id) VALUES (20, 1)`);
        throw failure;
      }),
    );
    expect(error).toBe(failure);
    expect(await childIds()).not.toContain(20);
    await expectPoolSettled(database);
    expect(await openTransactions()).toBe(0);
  });

  it("when the COMMIT itself fails (a deferred constraint), the caller gets PostgreSQL's error, nothing is written, and the connection goes back clean", async () => {
    const { error } = await rejection(
      database.transaction(async (tx) => {
        await tx.execute(sql`INSERT INTO tx_children (id, parent_id) VALUES (30, 999)`);
      }),
    );
    expect(sqlState(error)).toBe('23503');
    expect(await childIds()).not.toContain(30);
    await expectPoolSettled(database);
    expect(await openTransactions()).toBe(0);
  });

  it('when a nested Drizzle transaction fails, only its savepoint rolls back and the outer work commits', async () => {
    await database.transaction(async (tx) => {
      await tx.execute(sql`INSERT INTO tx_children (id, parent_id) VALUES (40, 1)`);
      await tx
        .transaction(async (inner) => {
          await inner.execute(sql`INSERT INTO tx_children (id, parent_id) VALUES (41, 1)`);
          throw new Error('inner failed');
        })
        .catch(() => {});
    });
    const ids = await childIds();
    expect(ids).toContain(40);
    expect(ids).not.toContain(41);
  });

  it('when database.transaction is called inside another transaction, it opens its own on another connection and never joins', async () => {
    const seen = await database.transaction(async (outer) => {
      const outerIds = (await outer.execute(sql`SELECT pg_backend_pid() AS pid, txid_current()::text AS txid`)).rows[0];
      const innerIds = await database.transaction(async (inner) => {
        expect(inner).not.toBe(outer);
        return (await inner.execute(sql`SELECT pg_backend_pid() AS pid, txid_current()::text AS txid`)).rows[0];
      });
      return { outerIds, innerIds };
    });
    expect(seen.innerIds!.pid).not.toEqual(seen.outerIds!.pid);
    expect(seen.innerIds!.txid).not.toEqual(seen.outerIds!.txid);
  });

  it('when a read-only transaction is opened inside a read-write one, it keeps its own access mode: a write in it fails', async () => {
    const { error } = await rejection(
      database.transaction(async () =>
        database.transaction(
          async (inner) => {
            await inner.execute(sql`INSERT INTO contract_items (id) VALUES (50)`);
          },
          { accessMode: 'read only' },
        ),
      ),
    );
    expect((error as { cause?: { code?: string } }).cause?.code).toBe('25006');
    expect(await itemIds(50, 50)).toEqual([]);
  });

  it('when transactions run in parallel, each gets its own transaction', async () => {
    const [one, two] = await Promise.all(
      [60, 61].map((id) =>
        database.transaction(async (tx) => {
          await sleep(10);
          await tx.execute(sql`INSERT INTO contract_items (id) VALUES (${id})`);
          return (await tx.execute(sql`SELECT txid_current()::text AS txid`)).rows[0]!.txid as string;
        }),
      ),
    );
    expect(one).not.toBe(two);
    expect(await itemIds(60, 61)).toEqual([60, 61]);
  });
});

describe('Database.query', () => {
  it("when given text and values, or a named config, it runs one statement and returns pg's result", async () => {
    const plain = await database.query<{ n: number }>('SELECT $1::int + 1 AS n', [41]);
    expect(plain.rows).toEqual([{ n: 42 }]);
    const named = await database.query<{ n: number }>({ name: 'contract_named_add', text: 'SELECT $1::int + 2 AS n', values: [40] });
    expect(named.rows).toEqual([{ n: 42 }]);
    const again = await database.query<{ n: number }>({ name: 'contract_named_add', text: 'SELECT $1::int + 2 AS n', values: [1] });
    expect(again.rows).toEqual([{ n: 3 }]);
  });

  it('when the statement fails with an ordinary SQL error, the error reaches the caller and is not an unavailable database', async () => {
    const syntax = await rejection(database.query('SELEC 1'));
    expect(sqlState(syntax.error)).toBe('42601');
    expect(isDatabaseUnavailable(syntax.error)).toBe(false);
    const duplicate = await rejection(database.query('INSERT INTO contract_items (id) VALUES (1000)'));
    expect(sqlState(duplicate.error)).toBe('23505');
    expect(isDatabaseUnavailable(duplicate.error)).toBe(false);
    expect(isDatabaseUnavailable(new Error('something else'))).toBe(false);
    await expectPoolSettled(database);
  });
});

describe('timeouts', () => {
  it('when timeouts and an application name are configured, every session runs with them', async () => {
    const configured = open({
      poolSize: 2,
      statementTimeoutMs: 1_500,
      lockTimeoutMs: 2_500,
      idleInTransactionTimeoutMs: 3_500,
      applicationName: 'contract-test',
    });
    const read = () =>
      configured.query<Record<string, string>>(
        `SELECT current_setting('statement_timeout') AS statement, current_setting('lock_timeout') AS lock,
                current_setting('idle_in_transaction_session_timeout') AS idle, current_setting('application_name') AS app`,
      );
    const expected = { statement: '1500ms', lock: '2500ms', idle: '3500ms', app: 'contract-test' };
    // Two sessions at once, so both pooled connections are asked.
    const [one, two] = await Promise.all([read(), read()]);
    expect(one.rows[0]).toEqual(expected);
    expect(two.rows[0]).toEqual(expected);
    // And inside a transaction.
    const inside = await configured.transaction(
      async (tx) => (await tx.execute(sql`SELECT current_setting('statement_timeout') AS statement`)).rows[0],
    );
    expect(inside).toEqual({ statement: '1500ms' });
  });

  it('when a statement runs longer than statementTimeoutMs, the server cancels it (SQLSTATE 57014, the statement timeout), and the database stays usable', async () => {
    // The client-side queryTimeoutMs is far longer: only the server's statement_timeout can end the call first.
    const limited = open({ poolSize: 1, statementTimeoutMs: 200, queryTimeoutMs: 20_000 });
    await backendPid(limited);
    const { error } = await rejection(limited.query('SELECT pg_sleep(10)'));
    expect(sqlState(error)).toBe('57014');
    expect(databaseFailure(error)).toBe('statement timeout');
    await expectPoolSettled(limited);
    expect((await limited.query('SELECT 1 AS ok')).rows).toEqual([{ ok: 1 }]);
    // Inside a transaction too: nothing of it is written, and no connection is left in a transaction.
    const inTx = await rejection(
      limited.transaction(async (tx) => {
        await tx.execute(sql`INSERT INTO contract_items (id) VALUES (65)`);
        await tx.execute(sql`SELECT pg_sleep(10)`);
      }),
    );
    expect(sqlState(inTx.error)).toBe('57014');
    expect(databaseFailure(inTx.error)).toBe('statement timeout');
    await expectPoolSettled(limited);
    expect(await openTransactions()).toBe(0);
    expect(await itemIds(65, 65)).toEqual([]);
    await limited.transaction(async (tx) => tx.execute(sql`INSERT INTO contract_items (id) VALUES (66)`));
    expect(await itemIds(66, 66)).toEqual([66]);
  });

  it('when a row stays locked longer than lockTimeoutMs, a statement waiting for it rejects with SQLSTATE 55P03 (the lock timeout) and others are served', async () => {
    // statementTimeoutMs is far longer: only lock_timeout can end the wait first.
    const limited = open({ poolSize: 2, lockTimeoutMs: 200, statementTimeoutMs: 20_000, queryTimeoutMs: 25_000 });
    const holder = new pg.Client({ connectionString: testDatabase.url });
    holder.on('error', () => {});
    await holder.connect();
    try {
      await holder.query('BEGIN');
      await holder.query('SELECT 1 FROM contract_items WHERE id = 1000 FOR UPDATE');
      const { error } = await rejection(limited.query(`UPDATE contract_items SET note = 'changed' WHERE id = 1000`));
      expect(sqlState(error)).toBe('55P03');
      expect(databaseFailure(error)).toBe('lock timeout');
      expect((await limited.query('SELECT count(*)::int AS n FROM contract_items')).rows[0]!.n).toBeGreaterThan(0);
    } finally {
      await holder.query('ROLLBACK').catch(() => {});
      await holder.end().catch(() => {});
    }
    await expectPoolSettled(limited);
  });

  it('when a statement outlasts the client-side queryTimeoutMs, it rejects as unavailable (the query timeout), its connection is not reused, and the next call is served on a new one while the old statement still runs', async () => {
    const limited = open({ poolSize: 1, queryTimeoutMs: 300, statementTimeoutMs: 20_000, connectTimeoutMs: 2_000 });
    const before = await backendPid(limited);
    const marker = `contract_query_timeout_${Date.now()}`;
    const { error } = await rejection(limited.query(`SELECT pg_sleep(10) /* ${marker} */`));
    expect(isDatabaseUnavailable(error)).toBe(true);
    expect(databaseFailure(error)).toBe('query timeout');
    await expectPoolSettled(limited);
    const next = await limited.query<{ pid: number; ok: number }>('SELECT pg_backend_pid() AS pid, 1 AS ok');
    expect(next.rows[0]!.ok).toBe(1);
    // Served on a new connection: the one that timed out is dropped, not queued behind its statement.
    expect(next.rows[0]!.pid).not.toBe(before);
    // The abandoned statement still runs on the old backend (the client only stopped waiting for it):
    // the call above did not wait for it to end.
    const { rows: still } = await admin.query(
      `SELECT pid FROM pg_stat_activity WHERE query LIKE $1 AND state = 'active' AND pid <> pg_backend_pid()`,
      [`%${marker}%`],
    );
    expect(still.map((row) => row.pid)).toEqual([before]);
    await admin.query('SELECT pg_cancel_backend($1)', [before]);
  });

  it('when a transaction sits idle longer than idleInTransactionTimeoutMs, the server ends it: nothing is written, the call rejects as unavailable, and the pool recovers', async () => {
    const limited = open({ poolSize: 1, idleInTransactionTimeoutMs: 300, statementTimeoutMs: 5_000 });
    const { error } = await rejection(
      limited.transaction(async (tx) => {
        await tx.execute(sql`INSERT INTO contract_items (id) VALUES (70)`);
        const pid = (await tx.execute(sql`SELECT pg_backend_pid() AS pid`)).rows[0]!.pid as number;
        // Idle until the server has ended the session (nothing else ends it here).
        await backendGone(pid, 20_000);
        await tx.execute(sql`INSERT INTO contract_items (id) VALUES (71)`);
      }),
    );
    expect(isDatabaseUnavailable(error)).toBe(true);
    expect(databaseFailure(error)).toBe('connection lost');
    expect(await itemIds(70, 71)).toEqual([]);
    await expectPoolSettled(limited);
    expect((await limited.query('SELECT 1 AS ok')).rows).toEqual([{ ok: 1 }]);
  });
});

describe('an exhausted pool', () => {
  it('when every connection is held by an open transaction, another call rejects as unavailable when connectTimeoutMs runs out, and is served once the connection is released', async () => {
    const small = open({ poolSize: 1, connectTimeoutMs: 500, statementTimeoutMs: 10_000, idleInTransactionTimeoutMs: 10_000 });
    let release!: () => void;
    let started!: () => void;
    const holding = new Promise<void>((resolve) => (started = resolve));
    const held = small.transaction(async (tx) => {
      await tx.execute(sql`SELECT 1`);
      started();
      await new Promise<void>((resolve) => (release = resolve));
      await tx.execute(sql`INSERT INTO contract_items (id) VALUES (80)`);
    });
    await holding;
    try {
      const query = await rejection(small.query('SELECT 1'));
      expect(isDatabaseUnavailable(query.error)).toBe(true);
      expect(databaseFailure(query.error)).toBe('pool timeout');
      const transaction = await rejection(small.transaction(async (tx) => tx.execute(sql`SELECT 1`)));
      expect(isDatabaseUnavailable(transaction.error)).toBe(true);
      expect(databaseFailure(transaction.error)).toBe('pool timeout');
      expect(small.pool.waitingCount).toBe(0);
    } finally {
      release();
    }
    await held;
    expect(await itemIds(80, 80)).toEqual([80]);
    expect((await small.query('SELECT 1 AS ok')).rows).toEqual([{ ok: 1 }]);
    await expectPoolSettled(small);
  });
});

describe('a terminated backend', () => {
  it('when the backend of an idle pooled connection is terminated, the pool drops that connection: the next call is served by a new backend', async () => {
    const small = open({ poolSize: 1, connectTimeoutMs: 2_000, queryTimeoutMs: 5_000 });
    const pid = await backendPid(small);
    await terminate(pid);
    // The FATAL message and the close reach the idle client: the pool drops it.
    await vi.waitFor(() => expect(small.pool.totalCount).toBe(0), { timeout: 5_000, interval: 20 });
    const next = await backendPid(small);
    expect(next).not.toBe(pid);
    await expectPoolSettled(small);
  });

  it('when the backend of a connection held by a transaction is terminated between statements, the next statement rejects as unavailable (the connection lost, not a timeout), nothing is written, and the next call succeeds', async () => {
    const small = open({ poolSize: 1, connectTimeoutMs: 2_000, queryTimeoutMs: 5_000 });
    const { error } = await rejection(
      small.transaction(async (tx) => {
        await tx.execute(sql`INSERT INTO contract_items (id) VALUES (90)`);
        const pid = (await tx.execute(sql`SELECT pg_backend_pid() AS pid`)).rows[0]!.pid as number;
        await terminate(pid);
        await tx.execute(sql`INSERT INTO contract_items (id) VALUES (91)`);
      }),
    );
    expect(isDatabaseUnavailable(error)).toBe(true);
    expect(databaseFailure(error)).toBe('connection lost');
    expect(await itemIds(90, 91)).toEqual([]);
    await expectPoolSettled(small);
    expect((await small.query('SELECT 1 AS ok')).rows).toEqual([{ ok: 1 }]);
  });

  it('when the backend is terminated while it runs a statement, the call rejects as unavailable with the termination (57P01), not a timeout, and the next call succeeds', async () => {
    const small = open({ poolSize: 1, connectTimeoutMs: 2_000, queryTimeoutMs: 10_000, statementTimeoutMs: 20_000 });
    await backendPid(small);
    const marker = `contract_terminate_${Date.now()}`;
    const running = rejection(small.query(`SELECT pg_sleep(8) /* ${marker} */`));
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
      { timeout: 5_000, interval: 20 },
    );
    await admin.query('SELECT pg_terminate_backend($1)', [pid]);
    const { error } = await running;
    expect(isDatabaseUnavailable(error)).toBe(true);
    expect(sqlState(error)).toBe('57P01');
    expect(databaseFailure(error)).toBe('connection lost');
    await expectPoolSettled(small);
    expect((await small.query('SELECT 1 AS ok')).rows).toEqual([{ ok: 1 }]);
  });

  it('when the backend is terminated while a transaction runs a statement, the transaction rejects as unavailable, nothing is written, and the next one commits', async () => {
    const small = open({ poolSize: 1, connectTimeoutMs: 2_000, queryTimeoutMs: 10_000, statementTimeoutMs: 20_000 });
    const marker = `contract_terminate_tx_${Date.now()}`;
    const running = rejection(
      small.transaction(async (tx) => {
        await tx.execute(sql`INSERT INTO contract_items (id) VALUES (95)`);
        await tx.execute(sql.raw(`SELECT pg_sleep(8) /* ${marker} */`));
      }),
    );
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
      { timeout: 5_000, interval: 20 },
    );
    await admin.query('SELECT pg_terminate_backend($1)', [pid]);
    const { error } = await running;
    expect(isDatabaseUnavailable(error)).toBe(true);
    expect(databaseFailure(error)).toBe('connection lost');
    expect(await itemIds(95, 95)).toEqual([]);
    await expectPoolSettled(small);
    await small.transaction(async (tx) => tx.execute(sql`INSERT INTO contract_items (id) VALUES (96)`));
    expect(await itemIds(95, 96)).toEqual([96]);
  });
});

describe('a schema change under prepared statements', () => {
  it("when a column's type changes under named statements already prepared on the pooled connections, the same statements succeed again", async () => {
    await admin.query(`CREATE TABLE schema_outside (id int PRIMARY KEY, amount int); INSERT INTO schema_outside VALUES (1, 7), (2, 8)`);
    const pooled = open({ poolSize: 2, connectTimeoutMs: 2_000 });
    const schemaOutside = pgTable('schema_outside', { id: integer('id').primaryKey(), amount: integer('amount') });
    const statement = prepared('contract_schema_outside', (executor, name) =>
      executor
        .select({ amount: schemaOutside.amount, pid: sql<number>`pg_backend_pid()`, slept: sql`pg_sleep(0.05)` })
        .from(schemaOutside)
        .where(eq(schemaOutside.id, sql.placeholder('id')))
        .prepare(name),
    );
    const named = {
      name: 'contract_schema_outside_q',
      text: 'SELECT amount, pg_backend_pid() AS pid, pg_sleep(0.05) FROM schema_outside WHERE id = $1',
    };
    const runBoth = async () => {
      // Two at once, each holding its connection ~50 ms: both pooled connections prepare (and later reuse) them.
      const read = await Promise.all([statement(pooled.db, { id: 1 }), statement(pooled.db, { id: 2 })]);
      const queried = await Promise.all([pooled.query({ ...named, values: [1] }), pooled.query({ ...named, values: [2] })]);
      return {
        amounts: [...read.map((rows) => Number(rows[0]!.amount)), ...queried.map((result) => Number(result.rows[0]!.amount))],
        pids: new Set([...read.map((rows) => Number(rows[0]!.pid)), ...queried.map((result) => Number(result.rows[0]!.pid))]),
      };
    };
    const before = await runBoth();
    expect(before.amounts).toEqual([7, 8, 7, 8]);
    expect(before.pids.size).toBe(2);

    await admin.query('ALTER TABLE schema_outside ALTER COLUMN amount TYPE bigint');

    const after = await runBoth();
    expect(after.amounts).toEqual([7, 8, 7, 8]);
    await expectPoolSettled(pooled);
    // And it stays fixed.
    expect((await runBoth()).amounts).toEqual([7, 8, 7, 8]);
  });

  it("when a column's type changes under a named statement prepared on a transaction's connection, the transaction is retried once as a whole and commits exactly once", async () => {
    await admin.query(`
      CREATE TABLE schema_inside (id int PRIMARY KEY, amount int); INSERT INTO schema_inside VALUES (1, 5);
      CREATE TABLE schema_inside_log (n serial PRIMARY KEY, note text)`);
    const single = open({ poolSize: 1, connectTimeoutMs: 2_000 });
    const schemaInside = pgTable('schema_inside', { id: integer('id').primaryKey(), amount: integer('amount') });
    const statement = prepared('contract_schema_inside', (executor, name) =>
      executor
        .select({ amount: schemaInside.amount, pid: sql<number>`pg_backend_pid()` })
        .from(schemaInside)
        .where(eq(schemaInside.id, sql.placeholder('id')))
        .prepare(name),
    );
    let attempts = 0;
    const work = (note: string) =>
      single.transaction(async (tx) => {
        attempts += 1;
        await tx.execute(sql`INSERT INTO schema_inside_log (note) VALUES (${note})`);
        const [row] = await statement(tx, { id: 1 });
        return { amount: Number(row!.amount), pid: Number(row!.pid) };
      });
    const before = await work('before');
    expect(before.amount).toBe(5);
    expect(attempts).toBe(1);

    await admin.query('ALTER TABLE schema_inside ALTER COLUMN amount TYPE bigint');

    // (poolSize 1: the transaction runs on the connection that prepared the statement.)
    expect(await backendPid(single)).toBe(before.pid);
    const after = await work('after');
    expect(after.amount).toBe(5);
    expect(attempts).toBeLessThanOrEqual(3);
    const { rows } = await admin.query<{ note: string }>('SELECT note FROM schema_inside_log ORDER BY n');
    expect(rows.map((row) => row.note)).toEqual(['before', 'after']);
    await expectPoolSettled(single);
    expect(await openTransactions()).toBe(0);
  });

  it('when a named statement no longer exists on its connection (DEALLOCATE ALL, as a pooler would), it is prepared again and succeeds', async () => {
    const single = open({ poolSize: 1, connectTimeoutMs: 2_000 });
    const statement = prepared('contract_deallocated', (executor, name) =>
      executor
        .select({ doubled: sql<number>`${sql.placeholder('n')}::int * 2`, pid: sql<number>`pg_backend_pid()` })
        .from(sql`(VALUES (1)) AS one (x)`)
        .prepare(name),
    );
    const named = { name: 'contract_deallocated_q', text: 'SELECT $1::int * 3 AS tripled, pg_backend_pid() AS pid' };
    const [first] = await statement(single.db, { n: 2 });
    const firstQuery = await single.query({ ...named, values: [2] });
    expect([first!.doubled, firstQuery.rows[0]!.tripled]).toEqual([4, 6]);

    await single.query('DEALLOCATE ALL');

    const [again] = await statement(single.db, { n: 5 });
    const againQuery = await single.query({ ...named, values: [5] });
    expect([again!.doubled, againQuery.rows[0]!.tripled]).toEqual([10, 15]);
    // Inside a transaction as well (poolSize 1: on the connection whose statements were deallocated).
    await statement(single.db, { n: 1 });
    await single.query('DEALLOCATE ALL');
    const inTx = await single.transaction(async (tx) => (await statement(tx, { n: 7 }))[0]!.doubled);
    expect(inTx).toBe(14);
    await expectPoolSettled(single);
  });
});
