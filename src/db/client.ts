import { AsyncLocalStorage } from 'node:async_hooks';
import pg from 'pg';
import { drizzle, type NodePgDatabase } from 'drizzle-orm/node-postgres';
import * as schema from './schema.js';
import { LeadingCheck } from './leading-check.js';
import { PipelinedPool, type WorkScope } from './pipelined-pool.js';

export { LeadingCheck };
export type Schema = typeof schema;
export type Db = NodePgDatabase<Schema> & { $client: PipelinedPool };
export type Tx = Parameters<Parameters<Db['transaction']>[0]>[0];
/** Anything a repository can run a query on: the pool-backed database or an open transaction. */
export type Executor = Db | Tx;

// Parse timestamptz as Date and bigint counters as numbers; dates (`date`) stay ISO strings.
pg.types.setTypeParser(pg.types.builtins.INT8, (value) => Number(value));

export type Database = {
  db: Db;
  pool: pg.Pool;
  /**
   * Runs `work` in a transaction. When one is already open in this async context (the idempotency
   * layer opens one around a handler), `work` joins it, so the change, its audit and outbox rows and
   * the stored idempotent response commit together.
   */
  transaction<T>(work: (tx: Tx) => Promise<T>): Promise<T>;
  /** The transaction of this async context, if any, else the pool-backed database. */
  current(): Executor;
  /**
   * A check whose statement rides ahead of the first statement of the work it is given to
   * (`withLeadingCheck`); `judge` turns its result into a verdict (throwing the denial).
   */
  leadingCheck(statement: pg.QueryConfig, judge: (result: pg.QueryResult) => void): LeadingCheck;
  /** Runs `work` so that its statements carry `check` and none of their results outruns it. */
  withLeadingCheck<T>(check: LeadingCheck, work: () => Promise<T>): Promise<T>;
  close(): Promise<void>;
};

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
  const scopes = new AsyncLocalStorage<WorkScope>();
  const db = drizzle(new PipelinedPool(pool, scopes) as unknown as pg.Pool, { schema }) as unknown as Db;
  const ambient = new AsyncLocalStorage<Tx>();

  return {
    db,
    pool,
    async transaction(work) {
      const open = ambient.getStore();
      if (open) return work(open);
      return db.transaction((tx) => ambient.run(tx, () => work(tx)));
    },
    current() {
      return ambient.getStore() ?? db;
    },
    leadingCheck(statement, judge) {
      return new LeadingCheck(statement, judge, pool);
    },
    withLeadingCheck(check, work) {
      return scopes.run({ check }, work);
    },
    async close() {
      await pool.end();
    },
  };
}
