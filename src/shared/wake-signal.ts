/**
 * The one way a background loop waits: until its poll interval passes or it is woken, whichever comes
 * first. Work is woken in-process after the commit that made it (Database.onWake); polling alone
 * guarantees it is found (work committed by another process, or before the loop started).
 */
export type WakeSignal = {
  /** Ends the current wait at once; with nobody waiting, the next wait returns at once (a wake is never lost). */
  notify(): void;
  /** Waits `ms`, or less when notified or closed. */
  wait(ms: number): Promise<void>;
  /** Waits `ms` whether notified or not (a notify meanwhile is kept for the next wait); only close ends it early. */
  pause(ms: number): Promise<void>;
  /** Ends every wait at once, now and later: the loop is stopping. */
  close(): void;
};

export function createWakeSignal(): WakeSignal {
  let pending = false;
  let closed = false;
  let wake: (() => void) | undefined;
  const waiting = new Set<() => void>();

  /** Resolves after `ms`, or when close (or, if `wakeable`, a notify) ends it. */
  function delay(ms: number, wakeable: boolean): Promise<void> {
    return new Promise((resolve) => {
      const end = () => {
        clearTimeout(timer);
        waiting.delete(end);
        if (wake === end) wake = undefined;
        resolve();
      };
      const timer = setTimeout(end, ms);
      waiting.add(end);
      if (wakeable) wake = end;
    });
  }

  return {
    notify() {
      if (wake) wake();
      else pending = true;
    },
    wait(ms) {
      if (pending || closed) {
        pending = false;
        return Promise.resolve();
      }
      return delay(ms, true);
    },
    pause: (ms) => (closed ? Promise.resolve() : delay(ms, false)),
    close() {
      closed = true;
      for (const end of [...waiting]) end();
    },
  };
}
