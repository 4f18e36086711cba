import { AsyncLocalStorage } from 'node:async_hooks';
import pg from 'pg';
import { drizzle, type NodePgDatabase } from 'drizzle-orm/node-postgres';
import { DATABASE_DEFAULTS, type DatabaseOptions } from './database-options.js';

export type { DatabaseOptions };
export { DATABASE_DEFAULTS };
// No relational schema: nothing uses `db.query.<table>`.
export type Db = NodePgDatabase;
export type Tx = Parameters<Parameters<Db['transaction']>[0]>[0];
/** Anything a repository can run a query on: the pool-backed database or an open transaction. */
export type Executor = Db | Tx;
/** Isolation level and access mode of a transaction (Drizzle's PgTransactionConfig). */
export type TransactionConfig = NonNullable<Parameters<Db['transaction']>[1]>;

// Parse bigint counters as numbers; dates (`date`) stay ISO strings.
pg.types.setTypeParser(pg.types.builtins.INT8, (value) => Number(value));

/**
 * What a service or worker may do with the database: read on the pool (`db`) and open a transaction.
 * Not the pool itself, raw statements, wake subscriptions or close: those belong to the process.
 */
export type DataAccess = Pick<Database, 'db' | 'transaction'>;

export type Database = {
  /** Drizzle on the pool: each statement takes a pooled connection for itself. */
  db: Db;
  pool: pg.Pool;
  /** The connection settings its pool was made with (URL, timeouts, application name), for another pool on the same database. */
  settings: pg.ClientConfig;
  /**
   * One statement on the pool. A named statement is sent unnamed when prepared statements are off,
   * and one whose plan went stale (a schema change) is prepared again and retried once.
   */
  query<R extends pg.QueryResultRow = pg.QueryResultRow>(config: string | pg.QueryConfig, values?: unknown[]): Promise<pg.QueryResult<R>>;
  /**
   * Runs `work` in a new transaction on one pooled connection, with `config`'s isolation and access
   * mode; it never joins another. A transaction that failed on a stale prepared statement is run again
   * once, under fresh statement names.
   */
  transaction<T>(work: (tx: Tx) => Promise<T>, config?: TransactionConfig): Promise<T>;
  /** Runs `onWake` each time this process commits work for `channel`'s workers (wakeAfterCommit); returns the unsubscribe. */
  onWake(channel: string, onWake: () => void): () => void;
  close(): Promise<void>;
};

/** How the statements of one database are named (see StatementNames). */
type StatementNames = { prepared: boolean; generation: number };

/** Where an executor's statements run (the pool, or its transaction's connection), how they are named, and how a channel's workers are woken. */
type StatementTarget = {
  connection: pg.Pool | pg.PoolClient;
  names: StatementNames;
  inTransaction: boolean;
  /** Wakes a channel's workers: at once on the pool; in a transaction, after it commits. */
  wake(channel: string): void;
};

const targets = new WeakMap<object, StatementTarget>();
/** The connection of the transaction this async context runs in, for executors Drizzle made inside it (savepoints). */
const transactionTargets = new AsyncLocalStorage<StatementTarget>();

function statementTargetOf(executor: Executor): StatementTarget {
  const target = targets.get(executor) ?? transactionTargets.getStore();
  // A transaction Drizzle opened by itself (db.transaction) runs on a connection nobody told us of.
  if (!target) throw new Error("Run on a Database's pool or inside Database.transaction, not in a transaction opened with db.transaction");
  return target;
}

/**
 * Wakes this process's background workers of `channel` once what `executor` wrote is committed: at
 * its transaction's commit (nobody when it rolls back), at once on the pool. Other processes' workers
 * find the work by polling: a NOTIFY would serialise every commit that sends one behind PostgreSQL's
 * global notify lock.
 */
export function wakeAfterCommit(executor: Executor, channel: string): void {
  statementTargetOf(executor).wake(channel);
}

/** The name `name` goes by: none when prepared statements are off; a new one after a schema change made the old stale. */
function statementName(name: string | undefined, names: StatementNames): string | undefined {
  if (name === undefined || !names.prepared) return undefined;
  return names.generation === 0 ? name : `${name}_g${names.generation}`;
}

/** A Drizzle prepared query (what a query builder's `.prepare(name)` returns), run with its placeholders' values. */
type PreparedQuery<V, R> = { execute(values: V): Promise<R> };

/**
 * A hot statement as Drizzle's own prepared query, on whichever executor it is given (the pool or a
 * transaction): `prepare` builds the query on that executor and returns its `.prepare(name)`. It is
 * prepared once per connection (the pool counts as one: pg prepares it on each pooled connection),
 * so its SQL is built once there, and PostgreSQL parses and plans it once per connection. With
 * prepared statements off it is prepared unnamed (an empty name: sent unnamed on every call). When a
 * schema change made it stale, it is prepared again under a new name: run once more on the pool; in a
 * transaction, Database.transaction runs the whole transaction again.
 */
export function prepared<V extends Record<string, unknown>, R>(
  name: string,
  prepare: (executor: Executor, name: string) => PreparedQuery<V, R>,
): (executor: Executor, values: V) => Promise<R> {
  const byConnection = new WeakMap<object, { generation: number; query: PreparedQuery<V, R> }>();
  const on = (executor: Executor, target: StatementTarget) => {
    let entry = byConnection.get(target.connection);
    if (entry?.generation !== target.names.generation) {
      entry = { generation: target.names.generation, query: prepare(executor, statementName(name, target.names) ?? '') };
      byConnection.set(target.connection, entry);
    }
    return entry;
  };
  return async (executor, values) => {
    const target = statementTargetOf(executor);
    const { generation, query } = on(executor, target);
    try {
      return await query.execute(values);
    } catch (error) {
      if (target.inTransaction || !isStaleStatement(error)) throw error;
      if (target.names.generation === generation) target.names.generation += 1;
      return on(executor, target).query.execute(values);
    }
  };
}

function* causes(error: unknown): Generator<{ code?: string; message?: string }> {
  let current: unknown = error;
  for (let depth = 0; current && typeof current === 'object' && depth < 5; depth += 1) {
    yield current;
    current = (current as { cause?: unknown }).cause;
  }
}

/**
 * A prepared statement that no longer fits the schema (0A000 "cached plan must not change result
 * type") or that the server no longer has (26000, e.g. behind a pooler): preparing it again fixes it.
 */
function isStaleStatement(error: unknown): boolean {
  for (const cause of causes(error)) {
    if (cause.code === '26000') return true;
    if (cause.code === '0A000' && /cached plan must not change result type/i.test(cause.message ?? '')) return true;
  }
  return false;
}

const UNAVAILABLE_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ETIMEDOUT',
  'EPIPE',
  'ENOTFOUND',
  'EHOSTUNREACH',
  '57P01', // admin_shutdown (pg_terminate_backend)
  '57P02', // crash_shutdown
  '57P03', // cannot_connect_now
  '57P05', // idle_session_timeout
  '25P03', // idle_in_transaction_session_timeout
  '57014', // query_canceled (statement_timeout)
  '08000',
  '08001',
  '08003',
  '08004',
  '08006',
  '53300', // too_many_connections
]);
const UNAVAILABLE_MESSAGES =
  /Connection terminated|timeout exceeded when trying to connect|Query read timeout|not queryable|Connection ended|connection timeout|Client has encountered a connection error/i;

/** The database could not serve the statement (unreachable, connection lost, timed out, pool exhausted): worth a retry later. */
export function isDatabaseUnavailable(error: unknown): boolean {
  for (const cause of causes(error)) {
    if (cause.code && UNAVAILABLE_CODES.has(cause.code)) return true;
    if (typeof cause.message === 'string' && UNAVAILABLE_MESSAGES.test(cause.message)) return true;
  }
  return false;
}

/** A lock wait that reached lock_timeout (55P03): the record is held by another transaction. */
export function isLockTimeout(error: unknown): boolean {
  for (const cause of causes(error)) if (cause.code === '55P03') return true;
  return false;
}

/** pg client settings shared by the pool and dedicated connections (all documented pg Client options). */
function clientConfig(connectionString: string, options: Required<DatabaseOptions>): pg.ClientConfig {
  return {
    connectionString,
    statement_timeout: options.statementTimeoutMs,
    lock_timeout: options.lockTimeoutMs,
    idle_in_transaction_session_timeout: options.idleInTransactionTimeoutMs,
    query_timeout: options.queryTimeoutMs,
    connectionTimeoutMillis: options.connectTimeoutMs,
    application_name: options.applicationName,
    // Notice a peer that vanished without a FIN (failover, cut network) on idle connections too.
    keepAlive: true,
  };
}

export function createDatabase(connectionString: string, given: DatabaseOptions = {}): Database {
  const options: Required<DatabaseOptions> = { ...DATABASE_DEFAULTS, ...given };
  const config = clientConfig(connectionString, options);
  // pg's pipeline mode: statements a transaction sends without waiting for each other's answers
  // (independent writes) leave together instead of one round trip each; one at a time, it behaves
  // exactly like a plain connection.
  const pool = new pg.Pool({ ...config, max: options.poolSize, idleTimeoutMillis: 30_000, pipeline: true });
  // A connection that fails must not crash the process: idle ones report on the pool, checked-out ones
  // on themselves; the statement in flight rejects either way, and pg-pool drops the broken connection.
  pool.on('error', () => {});
  pool.on('connect', (client) => {
    client.on('error', () => {});
  });
  const names: StatementNames = { prepared: options.preparedStatements, generation: 0 };
  const subscribers = new Map<string, Set<() => void>>();
  const wake = (channel: string) => {
    for (const onWake of subscribers.get(channel) ?? []) onWake();
  };
  const db = drizzle({ client: pool });
  targets.set(db, { connection: pool, names, inTransaction: false, wake });
  /** One Drizzle instance per physical connection, made the first time a transaction runs on it. */
  const connectionDbs = new WeakMap<pg.PoolClient, Db>();

  async function query<R extends pg.QueryResultRow>(
    statement: string | pg.QueryConfig,
    values?: unknown[],
    retried = false,
  ): Promise<pg.QueryResult<R>> {
    const named = typeof statement === 'string' ? statement : { ...statement, name: statementName(statement.name, names) };
    try {
      return await pool.query<R>(named as pg.QueryConfig, values);
    } catch (error) {
      if (retried || typeof statement === 'string' || statement.name === undefined || !isStaleStatement(error)) throw error;
      names.generation += 1;
      return query<R>(statement, values, true);
    }
  }

  async function runTransaction<T>(work: (tx: Tx) => Promise<T>, transactionConfig: TransactionConfig | undefined): Promise<T> {
    const client = await pool.connect();
    let connectionLost: Error | undefined;
    const woken = new Set<string>();
    let result: T;
    try {
      let clientDb = connectionDbs.get(client);
      if (!clientDb) connectionDbs.set(client, (clientDb = drizzle({ client })));
      const target: StatementTarget = { connection: client, names, inTransaction: true, wake: (channel) => void woken.add(channel) };
      result = await clientDb.transaction(async (tx) => {
        targets.set(tx, target);
        return transactionTargets.run(target, () => work(tx));
      }, transactionConfig);
    } catch (error) {
      if (isDatabaseUnavailable(error)) connectionLost = error as Error;
      throw error;
    } finally {
      // Never back to the pool inside a transaction (a failed ROLLBACK) or after its connection failed.
      const status = client.getTransactionStatus();
      client.release(connectionLost ?? (status === 'T' || status === 'E' ? new Error('released inside a transaction') : undefined));
    }
    for (const channel of woken) wake(channel);
    return result;
  }

  return {
    db,
    pool,
    settings: config,
    query,
    async transaction(work, transactionConfig) {
      try {
        return await runTransaction(work, transactionConfig);
      } catch (error) {
        if (!isStaleStatement(error)) throw error;
        // Nothing of it committed; every connection may hold the stale statement, so all take new names.
        names.generation += 1;
        return runTransaction(work, transactionConfig);
      }
    },
    onWake(channel, onWake) {
      let set = subscribers.get(channel);
      if (!set) subscribers.set(channel, (set = new Set()));
      set.add(onWake);
      return () => void set.delete(onWake);
    },
    async close() {
      await pool.end();
    },
  };
}
