import { AsyncLocalStorage } from 'node:async_hooks';
import pg from 'pg';
import { DrizzleQueryError } from 'drizzle-orm';
import { drizzle, NodePgSession, NodePgTransaction, type NodePgDatabase } from 'drizzle-orm/node-postgres';
import type { PgDialect } from 'drizzle-orm/pg-core';
import * as schema from './schema.js';
import { LeadingCheck } from './leading-check.js';
import { PipelinedPool, type TransactionScope, type WorkScope } from './pipelined-pool.js';
import { skipRowTemplateForArrayResults } from './pg-array-rows.js';
import { copyPlainQueryConfigsCheaply } from './pg-query-config.js';

export { LeadingCheck };
export type Schema = typeof schema;
// No relational schema: nothing uses `db.query.<table>`, and Drizzle builds a query builder per table
// of it for every transaction it opens.
export type Db = NodePgDatabase & { $client: PipelinedPool };
export type Tx = Parameters<Parameters<Db['transaction']>[0]>[0];
/** Anything a repository can run a query on: the pool-backed database or an open transaction. */
export type Executor = Db | Tx;

// Parse timestamptz as Date and bigint counters as numbers; dates (`date`) stay ISO strings.
pg.types.setTypeParser(pg.types.builtins.INT8, (value) => Number(value));
skipRowTemplateForArrayResults();
copyPlainQueryConfigsCheaply();

/** What `work` may ask of the transaction it runs in, besides its statements. */
export type TransactionControl = {
  /**
   * The next `statements` statements are the transaction's last: its COMMIT leaves right behind the
   * last of them, in the same socket write, instead of in a round trip of its own after their answers.
   * Call it before starting them. A failing statement aborts the transaction, so that COMMIT rolls
   * back; if fewer statements come, nothing is sent ahead and the transaction ends as usual. No-op
   * when `work` joined a transaction an outer scope opened (that scope may still write).
   */
  commitAfter(statements: number): void;
};

export type Database = {
  db: Db;
  pool: pg.Pool;
  /**
   * A small pool of its own for a statement that work needs while it holds connections of `pool`
   * (an access check asked again while the request's transaction waits for its verdict): with every
   * connection of `pool` held by such work, asking `pool` would wait for ever. Connects on first use.
   */
  sidePool: pg.Pool;
  /**
   * Runs `work` in a transaction. When one is already open in this async context (the idempotency
   * layer opens one around a handler), `work` joins it, so the change, its audit and outbox rows and
   * the stored idempotent response commit together.
   */
  transaction<T>(work: (tx: Tx, control: TransactionControl) => Promise<T>): Promise<T>;
  /** The transaction of this async context, if any, else the pool-backed database. */
  current(): Executor;
  /**
   * A check whose statement rides ahead of the first statement of the work it is given to
   * (`withLeadingCheck`); `judge` turns its result into a verdict (throwing the denial).
   */
  leadingCheck(statement: pg.QueryConfig, judge: (result: pg.QueryResult) => void | Promise<void>, readOnly?: boolean): LeadingCheck;
  /** Runs `work` so that its statements carry `check` and none of their results outruns it. */
  withLeadingCheck<T>(check: LeadingCheck, work: () => T): T;
  close(): Promise<void>;
};

/** A joined transaction commits when the scope that opened it is done. */
const JOINED: TransactionControl = { commitAfter: () => {} };

export function createDatabase(connectionString: string, options: { poolSize?: number } = {}): Database {
  const pool = new pg.Pool({
    connectionString,
    max: options.poolSize ?? 10,
    connectionTimeoutMillis: 5_000,
    idleTimeoutMillis: 30_000,
    // Statements sent without waiting for the previous answer (see PipelinedPool); used one at a
    // time, a pipelined client behaves exactly like a plain one.
    pipeline: true,
  });
  // A client losing its connection (database restart) must not crash the process: idle ones report
  // on the pool, checked-out ones on themselves, and the query in flight rejects either way.
  pool.on('error', () => {});
  pool.on('connect', (client) => {
    client.on('error', () => {});
  });
  const sidePool = new pg.Pool({ connectionString, max: 2, connectionTimeoutMillis: 5_000, idleTimeoutMillis: 10_000 });
  sidePool.on('error', () => {});
  sidePool.on('connect', (client) => {
    client.on('error', () => {});
  });
  const scopes = new AsyncLocalStorage<WorkScope>();
  const ambient = new AsyncLocalStorage<TransactionScope<Tx>>();
  const pipelined = new PipelinedPool(pool, scopes, ambient);
  const db = drizzle(pipelined as unknown as pg.Pool) as unknown as Db;
  const dialect = (db as unknown as { dialect: PgDialect }).dialect;

  /**
   * What Drizzle's `db.transaction` does, minus building the SQL of BEGIN and COMMIT and a prepared
   * query for each on every transaction: a connection, a Drizzle transaction on it, BEGIN, the work,
   * COMMIT (ROLLBACK when the work fails), the connection back. Their failures are wrapped as Drizzle wraps them.
   */
  async function inTransaction<T>(work: (tx: Tx) => Promise<T>): Promise<T> {
    const connection = await pipelined.connect();
    const tx = new NodePgTransaction(dialect, new NodePgSession(connection as never, dialect, undefined), undefined) as unknown as Tx;
    const send = (command: 'begin' | 'commit' | 'rollback') =>
      connection.query(command).catch((error: unknown) => Promise.reject(new DrizzleQueryError(command, [], error as Error)));
    try {
      await send('begin');
      const result = await work(tx);
      await send('commit');
      return result;
    } catch (error) {
      await send('rollback');
      throw error;
    } finally {
      connection.release();
    }
  }

  return {
    db,
    pool,
    sidePool,
    async transaction(work) {
      const open = ambient.getStore()?.tx;
      if (open) return work(open, JOINED);
      // The scope is entered before BEGIN, so the pool can hand it the transaction's connection.
      const scope: TransactionScope<Tx> = { tx: undefined, connection: undefined };
      const control: TransactionControl = { commitAfter: (statements) => scope.connection?.commitAfter(statements) };
      return ambient.run(scope, () =>
        inTransaction((tx) => {
          scope.tx = tx;
          return work(tx, control);
        }),
      );
    },
    current() {
      return ambient.getStore()?.tx ?? db;
    },
    leadingCheck(statement, judge, readOnly) {
      return new LeadingCheck(statement, judge, pool, readOnly);
    },
    withLeadingCheck(check, work) {
      return scopes.run({ check }, work);
    },
    async close() {
      await Promise.all([pool.end(), sidePool.end()]);
    },
  };
}
