import { describe, expect, it } from 'vitest';
import { timeSlicer } from './time-slice.js';

/** Whether a callback queued with setImmediate before `step` has run once `step` resolved. */
async function turnGivenBy(step: () => Promise<void>): Promise<boolean> {
  let ran = false;
  const queued = setImmediate(() => {
    ran = true;
  });
  await step();
  clearImmediate(queued);
  return ran;
}

describe('timeSlicer', () => {
  it('when less than the budget has passed since the last turn, it does not give the event loop a turn', async () => {
    let now = 100;
    const slice = timeSlicer(4, () => now);
    now = 103.9;
    expect(await turnGivenBy(slice)).toBe(false);
  });

  it('when the budget has passed, it gives the event loop a turn and starts a new slice', async () => {
    let now = 100;
    const slice = timeSlicer(4, () => now);
    now = 104;
    expect(await turnGivenBy(slice)).toBe(true);
    // The new slice starts at the turn: the same clock reading no longer exceeds the budget.
    expect(await turnGivenBy(slice)).toBe(false);
  });
});
