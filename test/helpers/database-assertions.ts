import { expect, vi } from 'vitest';
import type { Database } from '../../src/db/client.js';

/** How `promise` rejected, and after how many ms; fails the test when it resolves instead. */
export async function rejection(promise: Promise<unknown>): Promise<{ error: unknown; ms: number }> {
  const started = performance.now();
  try {
    const value = await promise;
    throw new Error(`expected a rejection, but the call resolved with ${JSON.stringify(value)?.slice(0, 200)}`);
  } catch (error) {
    if (error instanceof Error && error.message.startsWith('expected a rejection')) throw error;
    return { error, ms: performance.now() - started };
  }
}

/** Every pooled connection is back in the pool and no caller waits for one. */
export async function expectPoolSettled(instance: Database, within = 1_000): Promise<void> {
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
