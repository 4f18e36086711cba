import type pg from 'pg';
import { queryWithCallback } from './pipelined-pool.js';
import type { BatchedStatement } from './statement-batch.js';

/**
 * A statement whose verdict gates a unit of work (a request's access check: key, revocation, IP,
 * rate limits). It is sent on the connection of the work's first statement, in the same socket write
 * and ahead of it, so checking costs no round trip of its own; whatever the work reads is released
 * only after the verdict, and nothing it writes can commit before it (see PipelinedPool). A
 * `readOnly` check also shares the first statement's Sync, so it costs no reply of its own either.
 */
export class LeadingCheck {
  private state: 'waiting' | 'claimed' | 'sent' | 'passed' | 'denied' = 'waiting';
  private readonly outcome: Promise<void>;
  private pass!: () => void;
  private deny!: (reason: unknown) => void;

  constructor(
    readonly statement: pg.QueryConfig,
    /** Turns the statement's result into a verdict: returns (or resolves) when it passed, throws (or rejects with) the denial. */
    private readonly judge: (result: pg.QueryResult) => void | Promise<void>,
    /** Where the statement goes when no statement of the work has carried it. */
    private readonly pool: pg.Pool,
    /** The statement writes nothing: it may share its Sync (and its transaction) with the work's first statements. */
    readonly readOnly = false,
  ) {
    this.outcome = new Promise<void>((resolve, reject) => {
      this.pass = resolve;
      this.deny = reject;
    });
    // Awaited by whoever needs it; a denial nobody asked about must not crash the process.
    this.outcome.catch(() => {});
  }

  /**
   * Reserves the check for the statement about to be sent; true when the caller got it and must
   * `sendOn` its connection before that statement. Later statements await the verdict instead.
   */
  claim(): boolean {
    if (this.state !== 'waiting') return false;
    this.state = 'claimed';
    return true;
  }

  /** True once the check has passed; a denial is final. */
  get passed(): boolean {
    return this.state === 'passed';
  }

  /**
   * The statement that claimed the check could not get a connection (the database is down): the
   * check fails with that error, so nothing waits for a verdict that will never come.
   */
  abandon(error: unknown): void {
    if (this.state !== 'claimed') return;
    this.state = 'denied';
    this.deny(error);
  }

  /** Resolves when the check passed, rejects with the denial; no-ops once decided. */
  verdict(): Promise<void> {
    return this.outcome;
  }

  /**
   * Sends the claimed statement on `client`; the caller sends the work's statement right behind it.
   */
  sendOn(client: pg.ClientBase): void {
    if (this.state !== 'claimed') throw new Error('The leading check must be claimed before it is sent');
    this.send(client);
  }

  /** The claimed statement, to be sent first in the batch of the work's first statement (readOnly checks only). */
  batched(): BatchedStatement {
    if (this.state !== 'claimed') throw new Error('The leading check must be claimed before it is sent');
    this.state = 'sent';
    return { config: this.statement, values: undefined, callback: (error, result) => this.answer(error, result) };
  }

  /** The verdict, sending the statement alone if no statement of the work has carried it. */
  settle(): Promise<void> {
    if (this.state === 'waiting') this.send(this.pool);
    return this.outcome;
  }

  private send(on: pg.ClientBase | pg.Pool): void {
    this.state = 'sent';
    // Decided as its answer is read, before the answers behind it on the connection are handed out.
    queryWithCallback(on, this.statement, undefined, (error, result) => this.answer(error, result));
  }

  private answer(error: Error | undefined, result: pg.QueryResult): void {
    if (error) this.refuse(error);
    else this.decide(result);
  }

  private decide(result: pg.QueryResult): void {
    let verdict: void | Promise<void>;
    try {
      verdict = this.judge(result);
    } catch (denial) {
      return this.refuse(denial);
    }
    if (verdict instanceof Promise) verdict.then(() => this.admit(), (denial: unknown) => this.refuse(denial));
    else this.admit();
  }

  private admit(): void {
    this.state = 'passed';
    this.pass();
  }

  private refuse(denial: unknown): void {
    this.state = 'denied';
    this.deny(denial);
  }
}
