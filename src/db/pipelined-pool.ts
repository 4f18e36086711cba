import type { AsyncLocalStorage } from 'node:async_hooks';
import type pg from 'pg';
import type { LeadingCheck } from './leading-check.js';

/** The unit of work (a request) the statements of an async context belong to. */
export type WorkScope = { check: LeadingCheck };

type QueryConfig = string | pg.QueryConfig;

const READ_STATEMENT = /^\s*select\b/i;
const BEGIN_STATEMENT = /^\s*begin\b/i;
const COMMIT_STATEMENT = /^\s*commit\b/i;
const ROLLBACK_STATEMENT = /^\s*rollback\b/i;
/** What Drizzle gets back for a BEGIN that is still on its way (it never reads it). */
const BEGIN_RESULT = { command: 'BEGIN', rowCount: null, oid: 0, fields: [], rows: [] } as unknown as pg.QueryResult;

const textOf = (config: QueryConfig) => (typeof config === 'string' ? config : (config.text ?? ''));

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
      const result = quiet(client.query(config as pg.QueryConfig, values));
      await Promise.allSettled([check.verdict(), result]);
      await check.verdict();
      return await result;
    } finally {
      client.release();
    }
  }

  async connect(): Promise<PipelinedConnection> {
    const check = this.scopes.getStore()?.check;
    const carries = check !== undefined && check.claim();
    const client = carries ? await this.connectOrAbandon(check) : await this.pool.connect();
    return new PipelinedConnection(client, check?.passed ? undefined : check, carries);
  }

  private async connectOrAbandon(check: LeadingCheck): Promise<pg.PoolClient> {
    try {
      return await this.pool.connect();
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

  constructor(
    private readonly client: pg.PoolClient,
    private readonly check: LeadingCheck | undefined,
    private carriesCheck: boolean,
  ) {}

  query(config: QueryConfig, values?: unknown[]): Promise<pg.QueryResult> {
    const text = textOf(config);
    if (COMMIT_STATEMENT.test(text)) return this.commit(config, values);
    if (ROLLBACK_STATEMENT.test(text)) return this.client.query(config as pg.QueryConfig, values);
    batchWrites(this.client);
    if (this.carriesCheck) {
      this.carriesCheck = false;
      this.check!.sendOn(this.client);
    }
    const result = quiet(this.client.query(config as pg.QueryConfig, values));
    if (BEGIN_STATEMENT.test(text) && this.begun === undefined) {
      // Nothing can follow BEGIN but the transaction's statements, whose answers wait for BEGIN's.
      this.begun = result;
      return Promise.resolve(BEGIN_RESULT);
    }
    return this.after(result);
  }

  release(error?: Error | boolean): void {
    this.client.release(error);
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
    return this.client.query(config as pg.QueryConfig, values);
  }
}
