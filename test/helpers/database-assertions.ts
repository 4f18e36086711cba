import { expect, vi } from 'vitest';
import type { Database } from '../../src/db/client.js';

/** How `promise` rejected; fails the test when it resolves instead. */
export async function rejection(promise: Promise<unknown>): Promise<{ error: unknown }> {
  try {
    const value = await promise;
    throw new Error(`expected a rejection, but the call resolved with ${JSON.stringify(value)?.slice(0, 200)}`);
  } catch (error) {
    if (error instanceof Error && error.message.startsWith('expected a rejection')) throw error;
    return { error };
  }
}

/**
 * What ended a database call, read from the error and its `cause` chain (Drizzle wraps pg's errors):
 * - 'statement timeout': the server cancelled the statement at statement_timeout (57014);
 * - 'lock timeout': the server ended a lock wait at lock_timeout (55P03);
 * - 'query timeout': the client gave up on the answer at queryTimeoutMs (pg's query_timeout);
 * - 'pool timeout': no pooled connection came free within connectTimeoutMs;
 * - 'connect timeout': a new connection did not open within connectTimeoutMs;
 * - 'connection lost': the connection itself ended under the call (terminated by the server, cut on the wire);
 * - 'other': anything else (an SQL error, the work's own error).
 * Lets a test say which of them happened without timing the call: a loss seen at once is 'connection
 * lost', never one of the timeouts that would have ended the call had the loss gone unnoticed.
 */
export type DatabaseFailure =
  'statement timeout' | 'lock timeout' | 'query timeout' | 'pool timeout' | 'connect timeout' | 'connection lost' | 'other';

const CONNECTION_LOST_CODES = new Set(['57P01', '57P02', '08000', '08003', '08006', 'ECONNRESET', 'EPIPE']);

export function databaseFailure(error: unknown): DatabaseFailure {
  const causes: Array<{ code?: unknown; message?: unknown }> = [];
  for (let current = error, depth = 0; current && typeof current === 'object' && depth < 10; depth += 1) {
    causes.push(current);
    current = (current as { cause?: unknown }).cause;
  }
  const message = (cause: { message?: unknown }) => (typeof cause.message === 'string' ? cause.message : '');
  // Timeouts first: pg words a connect timeout "Connection terminated due to connection timeout".
  if (causes.some((cause) => cause.code === '57014' && /statement timeout/i.test(message(cause)))) return 'statement timeout';
  if (causes.some((cause) => cause.code === '55P03')) return 'lock timeout';
  if (causes.some((cause) => /Query read timeout/i.test(message(cause)))) return 'query timeout';
  if (causes.some((cause) => /timeout exceeded when trying to connect/i.test(message(cause)))) return 'pool timeout';
  if (causes.some((cause) => /connection timeout/i.test(message(cause)))) return 'connect timeout';
  if (
    causes.some(
      (cause) =>
        (typeof cause.code === 'string' && CONNECTION_LOST_CODES.has(cause.code)) ||
        /Connection terminated|not queryable|Connection ended|terminating connection/i.test(message(cause)),
    )
  )
    return 'connection lost';
  return 'other';
}

/** Every pooled connection is back in the pool and no caller waits for one (polled; the deadline is only a backstop). */
export async function expectPoolSettled(instance: Database, within = 5_000): Promise<void> {
  await vi.waitFor(
    () => {
      expect({ waiting: instance.pool.waitingCount, checkedOut: instance.pool.totalCount - instance.pool.idleCount }).toEqual({
        waiting: 0,
        checkedOut: 0,
      });
    },
    { timeout: within, interval: 20 },
  );
}
