import type { AsyncLocalStorage } from 'node:async_hooks';
import type pg from 'pg';
import type { LeadingCheck } from './leading-check.js';
import { StatementBatch, StatementNotRun, type BatchedStatement, type StatementCallback } from './statement-batch.js';

/** The unit of work (a request) the statements of an async context belong to. */
export type WorkScope = { check: LeadingCheck };

/** A transaction opened by `Database.transaction`: the pool fills in the connection it runs on. */
export type TransactionScope<Tx> = { tx: Tx | undefined; connection: PipelinedConnection | undefined };

type QueryConfig = string | pg.QueryConfig;

const READ_STATEMENT = /^\s*select\b/i;
const BEGIN_STATEMENT = /^\s*begin\b/i;
const COMMIT_STATEMENT = /^\s*commit\b/i;
// The transaction's own ROLLBACK; `ROLLBACK TO SAVEPOINT` (a nested transaction's) is an ordinary statement.
const ROLLBACK_STATEMENT = /^\s*rollback\s*;?\s*$/i;
/** A result answered here instead of by the database (Drizzle never reads a transaction statement's). */
const localResult = (command: 'BEGIN' | 'COMMIT' | 'ROLLBACK') => ({ command, rowCount: null, oid: 0, fields: [], rows: [] }) as unknown as pg.QueryResult;
/** What Drizzle gets back for a BEGIN that is still on its way. */
const BEGIN_RESULT = localResult('BEGIN');

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
  const answer = answerOf();
  queryWithCallback(on, config, values, answer.callback);
  return answer.promise;
}

/** A statement's answer as a promise, settled by the callback pg (or a batch) calls. */
function answerOf(): { promise: Promise<pg.QueryResult>; callback: StatementCallback } {
  let callback!: StatementCallback;
  const promise = new Promise<pg.QueryResult>((resolve, reject) => {
    callback = (error, result) => (error ? reject(error) : resolve(result));
  });
  return { promise, callback };
}

const typesOf = (client: pg.ClientBase) => (client as unknown as { _types?: unknown })._types;

/** Statements in one StatementBatch (one Sync); each answers through its own callback, not a promise pg makes (see queryWithCallback). */
function sendBatch(client: pg.ClientBase, statements: BatchedStatement[]): void {
  (client.query as unknown as (query: StatementBatch) => void).call(client, new StatementBatch(statements, typesOf(client)));
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
 * 4. A check that writes (it leases rate-limit tokens) has a Sync of its own, so its writes commit
 *    whatever becomes of the work; a read-only one shares the Sync of the statements it rides with
 *    (inside a transaction, it runs in it).
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
    let answer: Promise<pg.QueryResult>;
    try {
      if (check.readOnly) {
        // A check that writes nothing shares the read's Sync: one reply, one flush.
        const read = answerOf();
        sendBatch(client, [check.batched(), { config, values, callback: read.callback }]);
        answer = read.promise;
      } else {
        batchWrites(client);
        check.sendOn(client);
        answer = sendQuery(client, config, values);
      }
    } catch (error) {
      client.release();
      throw error;
    }
    // The check's answer comes first on this connection, so its verdict is normally in when the
    // statement's answer arrives; either way no result is released before it, and a denial wins
    // over the statement's own failure.
    return answer.then(
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

/** An answer awaited later, or never when the work fails first: its rejection must not crash the process. */
function quietAnswer(): { promise: Promise<pg.QueryResult>; callback: StatementCallback } {
  const answer = answerOf();
  quiet(answer.promise);
  return answer;
}

/** pg's transaction status from the last ReadyForQuery: 'I' idle, 'T' in a transaction, 'E' in a failed one. */
const transactionStatusOf = (client: pg.ClientBase) => (client as unknown as { _txStatus?: string | null })._txStatus;

/**
 * A checked-out connection as Drizzle's transactions see it. BEGIN is answered at once and sent with
 * the transaction's first statement, and the statements a `commitAfter` announces are sent with the
 * COMMIT behind them, each group as one StatementBatch (one Sync, one reply); statements queued in one
 * tick share a socket write; the first statement also carries the scope's leading check when it has
 * not been sent yet.
 */
export class PipelinedConnection {
  /** BEGIN, held until the transaction's first statement goes out with it. */
  private beginHeld: BatchedStatement | undefined;
  private begun: Promise<pg.QueryResult> | undefined;
  /** BEGIN has been answered, and did not fail: statements after it need not wait for it. */
  private beginAnswered = false;
  /** Statements still to come before the COMMIT goes out behind them (see commitAfter). */
  private commitBehind = 0;
  /** Announced statements held until the last of them, to leave with the COMMIT in one batch. */
  private held: BatchedStatement[] = [];
  private sendHeldLater: NodeJS.Immediate | undefined;
  /** The COMMIT sent behind the transaction's last statements, which Drizzle's own COMMIT (or ROLLBACK) then waits for. */
  private committed: Promise<pg.QueryResult> | undefined;
  /** Drizzle is ending the transaction (COMMIT or ROLLBACK): a statement now would run outside it, or on a connection serving someone else. */
  private ending = false;

  constructor(
    private readonly client: pg.PoolClient,
    private readonly check: LeadingCheck | undefined,
    private carriesCheck: boolean,
    /** A request's transaction: its writes are named prepared statements (see PREPARABLE_STATEMENT). */
    private readonly prepares = false,
  ) {}

  query(config: QueryConfig, values?: unknown[]): Promise<pg.QueryResult> {
    const text = textOf(config);
    if (COMMIT_STATEMENT.test(text)) {
      this.ending = true;
      return this.committed ? this.committedAhead() : this.commit(config, values);
    }
    if (ROLLBACK_STATEMENT.test(text)) {
      this.ending = true;
      return this.committed ? this.finishedAhead() : this.rollback(config, values);
    }
    if (this.ending) return Promise.reject(new Error('A statement came after its transaction ended: it would run outside it'));
    if (this.committed) throw new Error('A statement came after the COMMIT that commitAfter sent: the count given was too low');
    if (BEGIN_STATEMENT.test(text) && this.begun === undefined) {
      // Nothing can follow BEGIN but the transaction's statements, whose answers wait for BEGIN's.
      const begin = quietAnswer();
      const callback: StatementCallback = (error, result) => {
        if (!error) this.beginAnswered = true;
        begin.callback(error, result);
      };
      this.beginHeld = { config, values, callback };
      this.begun = begin.promise;
      return Promise.resolve(BEGIN_RESULT);
    }
    const answer = quietAnswer();
    const statement = { config: this.prepares ? prepared(config, values) : config, values, callback: answer.callback };
    if (this.commitBehind > 0) this.hold(statement);
    else this.send([statement]);
    return this.after(answer.promise);
  }

  release(error?: Error | boolean): void {
    // A connection must never go back to the pool inside a transaction, even after a failure here.
    const status = transactionStatusOf(this.client);
    if (!error && (status === 'T' || status === 'E')) error = new Error('released inside a transaction');
    this.client.release(error);
  }

  /**
   * COMMIT goes out right behind the next `statements` statements, in their batch, so it costs no
   * round trip of its own. Counting what is actually sent (not the caller's promises) means a
   * statement that never left, or failed to build, leaves the transaction to end as usual.
   */
  commitAfter(statements: number): void {
    if (this.committed === undefined && this.begun !== undefined && statements > 0) this.commitBehind = statements;
  }

  /**
   * Holds an announced statement until the last of them; the ones queued in this turn of the event
   * loop are sent at its end anyway, so a caller awaiting one before sending the next never waits on
   * itself. The last one leaves with the COMMIT, unless the check has not passed: no COMMIT leaves
   * before the verdict.
   */
  private hold(statement: BatchedStatement): void {
    this.held.push(statement);
    this.commitBehind -= 1;
    if (this.commitBehind > 0) {
      this.sendHeldLater ??= setImmediate(() => this.sendHeld());
      return;
    }
    const statements = this.takeHeld();
    if (!this.check || this.check.passed) {
      const commit = quietAnswer();
      this.committed = commit.promise;
      statements.push({ config: 'COMMIT', values: undefined, callback: commit.callback });
    }
    this.send(statements);
  }

  private takeHeld(): BatchedStatement[] {
    if (this.sendHeldLater) clearImmediate(this.sendHeldLater);
    this.sendHeldLater = undefined;
    const statements = this.held;
    this.held = [];
    return statements;
  }

  private sendHeld(): void {
    const statements = this.takeHeld();
    if (statements.length > 0) this.send(statements);
  }

  /** Sends statements in one batch (with BEGIN ahead when it is still held, and the check when it rides here). */
  private send(statements: BatchedStatement[]): void {
    batchWrites(this.client);
    if (this.carriesCheck) {
      this.carriesCheck = false;
      // A check that writes nothing joins the batch, inside the transaction (behind BEGIN); one that
      // writes (a rate-limit lease) keeps a Sync of its own ahead, so its writes commit on their own.
      if (this.check!.readOnly) statements.unshift(this.check!.batched());
      else this.check!.sendOn(this.client);
    }
    if (this.beginHeld) {
      statements.unshift(this.beginHeld);
      this.beginHeld = undefined;
    }
    if (statements.length === 1) {
      const [{ config, values, callback }] = statements as [BatchedStatement];
      queryWithCallback(this.client, config, values, callback);
    } else {
      sendBatch(this.client, statements);
    }
  }

  /** Drizzle's COMMIT after `commitAfter`: fails when the COMMIT sent ahead did not commit. */
  private async committedAhead(): Promise<pg.QueryResult> {
    const result = await this.committed!;
    if (result.command === 'ROLLBACK') throw new Error('The transaction rolled back: a statement sent ahead of its COMMIT failed');
    return result;
  }

  /**
   * Drizzle rolls back when the work failed after its COMMIT was sent. When that COMMIT ran, it has
   * ended the transaction (as a rollback, when a statement failed); when a statement ahead of it in
   * its batch failed, PostgreSQL skipped it and the transaction is still open: it is rolled back here.
   */
  private async finishedAhead(): Promise<pg.QueryResult> {
    return this.committed!.then(
      (result) => result,
      (error: unknown) => (error instanceof StatementNotRun ? sendQuery(this.client, 'ROLLBACK') : localResult('ROLLBACK')),
    );
  }

  /**
   * `result`, once BEGIN and the check (both ahead of it on this connection) have answered. Once both
   * have (every statement after a transaction's first), `result` itself, with no async step between.
   */
  private after(result: Promise<pg.QueryResult>): Promise<pg.QueryResult> {
    if ((this.begun === undefined || this.beginAnswered) && (this.check === undefined || this.check.passed)) return result;
    return this.afterBeginAndCheck(result);
  }

  private async afterBeginAndCheck(result: Promise<pg.QueryResult>): Promise<pg.QueryResult> {
    if (this.begun) await this.begun;
    if (this.check) await this.check.verdict();
    return result;
  }

  private async commit(config: QueryConfig, values?: unknown[]): Promise<pg.QueryResult> {
    // Fewer statements came than announced: the ones held go now, and the COMMIT as usual behind them.
    this.sendHeld();
    // A transaction that sent nothing has nothing to commit.
    if (this.beginHeld) return this.endUnsent('COMMIT');
    // The verdict normally came back with the transaction's first statement; COMMIT never leaves
    // before it, so a denied request cannot commit anything.
    if (this.begun) await this.begun;
    if (this.check) await this.check.verdict();
    batchWrites(this.client);
    return sendQuery(this.client, config, values);
  }

  private rollback(config: QueryConfig, values?: unknown[]): Promise<pg.QueryResult> {
    // Statements held for a COMMIT batch never left: the transaction ends without them.
    for (const statement of this.takeHeld()) statement.callback(new Error('The transaction rolled back before this statement was sent'), undefined as unknown as pg.QueryResult);
    if (this.beginHeld) return this.endUnsent('ROLLBACK');
    return sendQuery(this.client, config, values);
  }

  /** Ends a transaction of which nothing was sent, BEGIN included: there is nothing to tell the database. */
  private async endUnsent(command: 'COMMIT' | 'ROLLBACK'): Promise<pg.QueryResult> {
    const begin = this.beginHeld!;
    this.beginHeld = undefined;
    begin.callback(undefined, BEGIN_RESULT);
    if (this.carriesCheck) {
      // The check was to ride with the first statement: it goes alone, and is answered before the
      // connection goes back to the pool (whoever awaits its verdict gets it).
      this.carriesCheck = false;
      this.check!.sendOn(this.client);
      await this.check!.verdict().catch(() => {});
    }
    return localResult(command);
  }
}
