import { performance } from 'node:perf_hooks';

/**
 * Wakes background workers once work was committed, without a NOTIFY in the committing transaction:
 * PostgreSQL serialises every commit that notifies behind one global lock, so a NOTIFY per API write
 * would queue the writes of every instance on each other. Instead this process's workers are woken
 * in-process, and the others by one NOTIFY per channel, sent on its own (autocommit) right after the
 * first commit and then at most once per interval, however many commits asked for it meanwhile.
 * A wake is only a hint: a worker's poll finds due work without one (a process that dies before
 * sending loses nothing but latency).
 */
export type WorkerWake = {
  /** Wakes `channel`'s workers: this process's at once, other processes' by a coalesced NOTIFY. */
  wake(channel: string): void;
  /** Runs `onWake` each time `channel` is woken in this process; returns the unsubscribe. */
  subscribe(channel: string, onWake: () => void): () => void;
  /** Sends the NOTIFYs still waiting for their interval (a CLI command's wake must not be dropped), then stops. */
  close(): Promise<void>;
};

type ChannelState = { lastSentAt: number; timer: NodeJS.Timeout | undefined };

export function createWorkerWake(send: (channel: string) => Promise<unknown>, intervalMs: number): WorkerWake {
  const subscribers = new Map<string, Set<() => void>>();
  const channels = new Map<string, ChannelState>();
  const inFlight = new Set<Promise<void>>();
  let closed = false;

  function fire(channel: string, state: ChannelState): void {
    state.timer = undefined;
    state.lastSentAt = performance.now();
    // A NOTIFY that fails (database down, pool exhausted) only delays the work until the next poll.
    const sending: Promise<void> = send(channel).then(
      () => undefined,
      () => undefined,
    );
    inFlight.add(sending);
    void sending.finally(() => inFlight.delete(sending));
  }

  return {
    wake(channel) {
      for (const onWake of subscribers.get(channel) ?? []) onWake();
      if (closed) return;
      let state = channels.get(channel);
      if (!state) channels.set(channel, (state = { lastSentAt: Number.NEGATIVE_INFINITY, timer: undefined }));
      if (state.timer) return; // one is already due: it covers this commit too
      const wait = state.lastSentAt + intervalMs - performance.now();
      if (wait <= 0) {
        fire(channel, state);
        return;
      }
      const due = state;
      state.timer = setTimeout(() => fire(channel, due), wait);
      state.timer.unref();
    },

    subscribe(channel, onWake) {
      let set = subscribers.get(channel);
      if (!set) subscribers.set(channel, (set = new Set()));
      set.add(onWake);
      return () => void set.delete(onWake);
    },

    async close() {
      closed = true;
      for (const [channel, state] of channels) {
        if (state.timer) {
          clearTimeout(state.timer);
          fire(channel, state);
        }
      }
      await Promise.all([...inFlight]);
    },
  };
}
