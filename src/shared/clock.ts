import { performance } from 'node:perf_hooks';

export type Clock = { now(): Date };

export const systemClock: Clock = { now: () => new Date() };

/** `1.2 s`: how long a start-up step took, for the progress lines. */
export function secondsSince(start: number): string {
  return `${((performance.now() - start) / 1000).toFixed(1)} s`;
}
