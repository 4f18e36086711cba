import { performance } from 'node:perf_hooks';
import { setImmediate as yieldToEventLoop } from 'node:timers/promises';

/**
 * How long background CPU work (checking import rows, judging a batch, hashing the audit chain) may
 * hold the event loop before it lets the requests this process serves run. A fixed number of rows
 * per turn would not bound it: a row's cost varies with what it carries.
 */
export const SLICE_MS = 4;

/**
 * A yield point for a loop of CPU work: `await slice()` between items gives the event loop a turn
 * once `budgetMs` have passed since the last one, and costs a clock read otherwise.
 */
export function timeSlicer(budgetMs: number = SLICE_MS, now: () => number = () => performance.now()): () => Promise<void> {
  let sliceStarted = now();
  return async () => {
    if (now() - sliceStarted < budgetMs) return;
    await yieldToEventLoop();
    sliceStarted = now();
  };
}
