import type { AsyncLocalStorage } from 'node:async_hooks';
import type pg from 'pg';
import type { LeadingCheck } from './leading-check.js';

/** The unit of work (a request) the statements of an async context belong to. */
export type WorkScope = { check: LeadingCheck };

/** A transaction opened by `Database.transaction`: the pool fills in the connection it runs on. */
export type TransactionScope<Tx> = { tx: Tx | undefined; connection: PipelinedConnection | undefined };

type QueryConfig = string | pg.QueryConfig;

const READ_STATEMENT = /^\s*select\b/i;
const BEGIN_STATEMENT = /^\s*begin\b/i;
const COMMIT_STATEMENT = /^\s*commit\b/i;
const ROLLBACK_STATEMENT = /^\s*rollback\b/i;
/** What Drizzle gets back for a BEGIN that is still on its way (it never reads it). */
const BEGIN_RESULT = { command: 'BEGIN', rowCount: null, oid: 0, fields: [], rows: [] } as unknown as pg.QueryResult;

type QueryWithCallback = (config: QueryConfig, values: unknown[] | undefined, callback: (error: Error | undefined, result: pg.QueryResult) => void) => void;

const textOf = (config: QueryConfig) => (typeof config === 'string' ? config : (config.text ?? ''));

/**
 * A request transaction's writes and locking reads are named prepared statements: PostgreSQL parses
 * and plans each text once per connection instead of on every call. Only these: they find their rows
 * by key, where a generic plan is as good as a custom one (a range read with a LIMIT could be stuck
 * with a worse generic plan). Distinct texts are few (an UPDATE's text depends on which columns
 * changed); past the cap, new ones simply go unnamed.
 */
const PREPARABLE_STATEMENT = /^\s*(?:insert|update|delete|with)\b|\bfor\s+update\s*$/i;
const MAX_PREPARED_TEXTS = 500;
const preparedNames = new Map<string, string>();

function prepared(config: QueryConfig, values: unknown[] | undefined): QueryConfig {
  if (typeof config === 'string' || config.name !== undefined || !(values ?? config.values)?.length) return config;
  const text = config.text ?? '';
  let name = preparedNames.get(text);
  if (name === undefined) {
    if (preparedNames.size >= MAX_PREPARED_TEXTS || !PREPARABLE_STATEMENT.test(text)) return config;
    name = `tx_${preparedNames.size + 1}`;
    preparedNames.set(text, name);
  }
  // Not `{ ...config, name }`: adding a property to a spread copy is V8's slow path (bench/README.md).
  return Object.assign({}, config, { name });
}

type Corkable = { cork(): void; uncork(): void };
const corked = new WeakSet<Corkable>();

/**
 * Holds the connection's socket writes until the current tick's statements are all queued, so they
 * leave in one write: one system call and one wake-up of the backend instead of one per statement.
 * (The socket is pg's internal `connection.stream`; without one, statements simply go one by one.)
 */
function batchWrites(client: pg.ClientBase): void {
  const stream = (client as unknown as { connection?: { stream?: Partial<Corkable> } }).connection?.stream;
  if (typeof stream?.cork !== 'function' || typeof stream.uncork !== 'function') return;
  const socket = stream as Corkable;
  if (corked.has(socket)) return;
  corked.add(socket);
  socket.cork();
  process.nextTick(() => {
    corked.delete(socket);
    socket.uncork();
  });
}

/**
 * `on.query` through its callback, not the promise pg makes: a promise pg makes inside a request's
 * async context kept that request's whole object graph alive through young-generation collections
 * (measured: ~8 KB promoted per GET, a full collection every ~3,000 requests, ~10 µs of GC per
 * request; through the callback, none). Every statement sent inside a work scope goes this way.
 */
export function queryWithCallback(
  on: pg.ClientBase | pg.Pool,
  config: QueryConfig,
  values: unknown[] | undefined,
  callback: (error: Error | undefined, result: pg.QueryResult) => void,
): void {
  // pg takes (config, values, callback) at run time; its types only list (text, values, callback).
  (on.query as unknown as QueryWithCallback).call(on, config, values, callback);
}

/** `queryWithCallback` as a promise of our own. */
export function sendQuery(on: pg.ClientBase | pg.Pool, config: QueryConfig, values?: unknown[]): Promise<pg.QueryResult> {
  return new Promise((resolve, reject) => queryWithCallback(on, config, values, (error, result) => (error ? reject(error) : resolve(result))));
}

/** `pool.connect()` through its callback (see queryWithCallback). */
function checkOut(pool: pg.Pool): Promise<pg.PoolClient> {
  return new Promise((resolve, reject) => pool.connect((error, client) => (error ? reject(error) : resolve(client!))));
}

/** Rejections of a promise that is awaited later, or deliberately dropped, must not crash the process. */
function quiet<T>(promise: Promise<T>): Promise<T> {
  promise.catch(() => {});
  return promise;
}

/**
 * What Drizzle runs on instead of the bare pool: a pg pool in pipeline mode whose statements, inside
 * a work scope (a request), carry that scope's leading check. The rules that make this safe:
 *
 * 1. No result of the work is released before the check's verdict.
 * 2. Outside a transaction, only a read may be sent ahead of the verdict; any other statement waits.
 * 3. Inside a transaction, COMMIT is sent only after the check has passed, so nothing written
 *    ahead of the verdict can outlive a denial.
 *
 * Its class name must contain "Pool": Drizzle opens transactions on pools with `connect()`.
 */
export class PipelinedPool {
  constructor(
    readonly pool: pg.Pool,
    private readonly scopes: AsyncLocalStorage<WorkScope>,
    private readonly transactions?: AsyncLocalStorage<TransactionScope<unknown>>,
  ) {}

  async query(config: QueryConfig, values?: unknown[]): Promise<pg.QueryResult> {
    const check = this.scopes.getStore()?.check;
    if (!check || check.passed) return this.pool.query(config as pg.QueryConfig, values);
    if (!READ_STATEMENT.test(textOf(config)) || !check.claim()) {
      await check.settle();
      return this.pool.query(config as pg.QueryConfig, values);
    }
    const client = await this.connectOrAbandon(check);
    try {
      batchWrites(client);
      check.sendOn(client);
    } catch (error) {
      client.release();
      throw error;
    }
    // The check's answer comes first on this connection, so its verdict is normally in when the
    // statement's answer arrives; either way no result is released before it, and a denial wins
    // over the statement's own failure.
    return sendQuery(client, config, values).then(
      (result) => {
        client.release();
        return check.passed ? result : check.verdict().then(() => result);
      },
      (error: unknown) => {
        client.release();
        return check.verdict().then(() => Promise.reject(error));
      },
    );
  }

  async connect(): Promise<PipelinedConnection> {
    const work = this.scopes.getStore();
    const check = work?.check;
    const carries = check !== undefined && check.claim();
    const client = carries ? await this.connectOrAbandon(check) : await checkOut(this.pool);
    const connection = new PipelinedConnection(client, check?.passed ? undefined : check, carries, work !== undefined);
    const transaction = this.transactions?.getStore();
    if (transaction && transaction.connection === undefined) transaction.connection = connection;
    return connection;
  }

  private async connectOrAbandon(check: LeadingCheck): Promise<pg.PoolClient> {
    try {
      return await checkOut(this.pool);
    } catch (error) {
      check.abandon(error);
      throw error;
    }
  }
}

/**
 * A checked-out connection as Drizzle's transactions see it. BEGIN is answered at once and sent with
 * the transaction's first statement; statements queued in one tick share a socket write; the first
 * statement also carries the scope's leading check when it has not been sent yet.
 */
export class PipelinedConnection {
  private begun: Promise<pg.QueryResult> | undefined;
  /** Statements still to come before the COMMIT goes out behind them (see commitAfter). */
  private commitBehind = 0;
  /** The COMMIT sent behind the transaction's last statements, which Drizzle's own COMMIT (or ROLLBACK) then waits for. */
  private committed: Promise<pg.QueryResult> | undefined;

  constructor(
    private readonly client: pg.PoolClient,
    private readonly check: LeadingCheck | undefined,
    private carriesCheck: boolean,
    /** A request's transaction: its writes are named prepared statements (see PREPARABLE_STATEMENT). */
    private readonly prepares = false,
  ) {}

  query(config: QueryConfig, values?: unknown[]): Promise<pg.QueryResult> {
    const text = textOf(config);
    if (COMMIT_STATEMENT.test(text)) return this.committed ? this.committedAhead() : this.commit(config, values);
    if (ROLLBACK_STATEMENT.test(text)) return this.committed ? this.finishedAhead() : sendQuery(this.client, config, values);
    if (this.committed) throw new Error('A statement came after the COMMIT that commitAfter sent: the count given was too low');
    batchWrites(this.client);
    if (this.carriesCheck) {
      this.carriesCheck = false;
      this.check!.sendOn(this.client);
    }
    const result = quiet(sendQuery(this.client, this.prepares ? prepared(config, values) : config, values));
    if (BEGIN_STATEMENT.test(text) && this.begun === undefined) {
      // Nothing can follow BEGIN but the transaction's statements, whose answers wait for BEGIN's.
      this.begun = result;
      return Promise.resolve(BEGIN_RESULT);
    }
    if (this.commitBehind > 0 && (this.commitBehind -= 1) === 0) this.commitNow();
    return this.after(result);
  }

  release(error?: Error | boolean): void {
    this.client.release(error);
  }

  /**
   * COMMIT goes out right behind the next `statements` statements, in their socket write, so it costs
   * no round trip of its own. Counting what is actually sent (not the caller's promises) means a
   * statement that never left, or failed to build, leaves the transaction to end as usual.
   */
  commitAfter(statements: number): void {
    if (this.committed === undefined && this.begun !== undefined && statements > 0) this.commitBehind = statements;
  }

  /** Sends the COMMIT asked for by commitAfter, unless the check has not passed: no COMMIT leaves before the verdict. */
  private commitNow(): void {
    if (this.check && !this.check.passed) return;
    this.committed = quiet(sendQuery(this.client, 'COMMIT'));
  }

  /** Drizzle's COMMIT after `commitAfter`: fails when PostgreSQL answered the COMMIT with a rollback. */
  private async committedAhead(): Promise<pg.QueryResult> {
    const result = await this.committed!;
    if (result.command === 'ROLLBACK') throw new Error('The transaction rolled back: a statement sent ahead of its COMMIT failed');
    return result;
  }

  /**
   * Drizzle rolls back when the work failed after its COMMIT was sent: that COMMIT has already ended
   * the transaction (as a rollback, when a statement failed), so there is nothing left to send.
   */
  private async finishedAhead(): Promise<pg.QueryResult> {
    return this.committed!.then(
      (result) => result,
      () => ({ command: 'ROLLBACK', rowCount: null, oid: 0, fields: [], rows: [] }) as unknown as pg.QueryResult,
    );
  }

  /** `result`, once BEGIN and the check (both ahead of it on this connection) have answered. */
  private async after(result: Promise<pg.QueryResult>): Promise<pg.QueryResult> {
    if (this.begun) await this.begun;
    if (this.check) await this.check.verdict();
    return result;
  }

  private async commit(config: QueryConfig, values?: unknown[]): Promise<pg.QueryResult> {
    // The verdict normally came back with the transaction's first statement; COMMIT never leaves
    // before it, so a denied request cannot commit anything.
    if (this.begun) await this.begun;
    if (this.check) await this.check.verdict();
    batchWrites(this.client);
    return sendQuery(this.client, config, values);
  }
}
