import { performance } from 'node:perf_hooks';
import pino from 'pino';
import type { Database, Listener } from '../db/client.js';
import { createOrgRotation, dueOrganisations } from './fair-claims.js';

/** Rows sealed per transaction: one short transaction, its row locks held for milliseconds. */
const DEFAULT_SEAL_BATCH = 1_000;
/** Organisations looked at per pass; a pass that found this many is followed at once by another. */
const ORGANISATIONS_PER_PASS = 100;
/**
 * The least time from one pass's start to the next's. Woken after every commit, passes would run back
 * to back and seal a row or two each: a transaction (head lock, read, update, commit) per write,
 * which costs every upsert a large share of CPU (bench/results/audit-sealing.md). Gathered over this long, a busy
 * organisation's rows are sealed a batch per transaction, still well within a second of their commit.
 */
const DEFAULT_MIN_PASS_INTERVAL_MS = 250;

export type SealerLogger = Pick<pino.Logger, 'warn' | 'error'>;

export type CommitOrderSealer = {
  start(): Promise<void>;
  /** Ends the pass in flight (after its current batch) and closes the LISTEN. */
  stop(): Promise<void>;
  /** One pass over every organisation with unsealed rows (after the pass in flight, if any); returns the rows sealed. */
  sealOnce(): Promise<number>;
};

export type CommitOrderSealerOptions = {
  database: Database;
  logger?: SealerLogger;
  /** The fallback when no wake arrives (a lost NOTIFY, a process without a listener). */
  pollIntervalMs?: number;
  batchSize?: number;
  /** See DEFAULT_MIN_PASS_INTERVAL_MS; 0 runs a pass as soon as a wake arrives. */
  minPassIntervalMs?: number;
  /** LISTEN for other processes' commits (default true); this process's wake it in-process either way. */
  listen?: boolean;
};

/**
 * The loop shared by the sealers that put an organisation's rows in the order their transactions
 * committed (the events feed, the audit chain): rows are written unsealed, and a pass, per
 * organisation with unsealed rows (fair-claims.ts), seals them batch by batch with `sealBatch`, which
 * locks the organisation's head row with SKIP LOCKED (so instances racing for one organisation skip
 * each other) and returns how many it sealed. Woken after commits (this process's in-process, others'
 * by NOTIFY on `channel`) and polling as a fallback; passes start at least minPassIntervalMs apart.
 */
export function createCommitOrderSealer(
  options: CommitOrderSealerOptions & {
    /** The wake channel of the writes (wakeAfterCommit), and what the logs call the sealed rows. */
    channel: string;
    what: string;
    organisationsWithUnsealedRows(after: string, limit: number): Promise<string[]>;
    sealBatch(orgId: string, batchSize: number): Promise<number>;
  },
): CommitOrderSealer {
  const { database, channel, what } = options;
  const logger: SealerLogger = options.logger ?? pino({ level: 'silent' });
  const pollIntervalMs = options.pollIntervalMs ?? 1_000;
  const batchSize = options.batchSize ?? DEFAULT_SEAL_BATCH;
  const minPassIntervalMs = options.minPassIntervalMs ?? DEFAULT_MIN_PASS_INTERVAL_MS;
  const rotation = createOrgRotation();

  let stopping = false;
  let loop: Promise<void> | undefined;
  let stopped: Promise<void> | undefined;
  let listener: Listener | undefined;
  let unsubscribe: (() => void) | undefined;
  /** One pass at a time, whoever asks (the loop or sealOnce). */
  let passing: Promise<number> | undefined;

  // A wake while a pass runs is kept, so rows committed during the pass are sealed right after it.
  let pending = false;
  let wakeUp: (() => void) | undefined;
  const wake = () => {
    pending = true;
    wakeUp?.();
  };
  const sleep = (ms: number) =>
    new Promise<void>((resolve) => {
      if (pending || stopping) return resolve();
      const timer = setTimeout(done, ms);
      function done() {
        clearTimeout(timer);
        wakeUp = undefined;
        resolve();
      }
      wakeUp = done;
    });
  // Unlike sleep, a wake does not end it (only stop does): the rows of the commits meanwhile gather.
  let endPause: (() => void) | undefined;
  const pause = (ms: number) =>
    new Promise<void>((resolve) => {
      if (stopping) return resolve();
      const timer = setTimeout(done, ms);
      function done() {
        clearTimeout(timer);
        endPause = undefined;
        resolve();
      }
      endPause = done;
    });

  /** Seals one organisation batch by batch; returns how many (0 when another sealer holds it). */
  async function sealOrganisation(orgId: string): Promise<number> {
    let total = 0;
    while (!stopping) {
      const taken = await options.sealBatch(orgId, batchSize);
      total += taken;
      if (taken < batchSize) break;
    }
    return total;
  }

  async function pass(): Promise<number> {
    let total = 0;
    for (;;) {
      const orgIds = await dueOrganisations(rotation, ORGANISATIONS_PER_PASS, options.organisationsWithUnsealedRows);
      let sealed = 0;
      for (const orgId of orgIds) {
        if (stopping) return total;
        try {
          sealed += await sealOrganisation(orgId);
        } catch (error) {
          // One organisation's failure (a lock timeout behind a purge) must not hold back the others.
          logger.warn({ err: error, orgId }, `sealing the ${what} of an organisation failed; retrying on the next pass`);
        }
      }
      total += sealed;
      // More organisations than one look takes: go on at once, unless all of them were held by other sealers.
      if (orgIds.length < ORGANISATIONS_PER_PASS || sealed === 0 || stopping) return total;
    }
  }

  async function sealOnce(): Promise<number> {
    while (passing) await passing.catch(() => undefined);
    const current = pass().finally(() => {
      if (passing === current) passing = undefined;
    });
    passing = current;
    return current;
  }

  async function run(): Promise<void> {
    while (!stopping) {
      const started = performance.now();
      pending = false;
      try {
        await sealOnce();
      } catch (error) {
        logger.warn({ err: error }, `sealing the ${what} failed; retrying`);
      }
      const rest = minPassIntervalMs - (performance.now() - started);
      if (rest > 0) await pause(rest);
      await sleep(pollIntervalMs);
    }
  }

  return {
    sealOnce,

    async start() {
      if (loop || stopping) return;
      unsubscribe = database.onWake(channel, wake);
      if (options.listen !== false) listener = await database.listen(channel, wake, wake);
      loop = run().catch((error: unknown) => logger.error({ err: error }, `the ${what} sealer crashed`));
    },

    stop() {
      stopped ??= (async () => {
        stopping = true;
        unsubscribe?.();
        wakeUp?.();
        endPause?.();
        const listening = listener;
        listener = undefined;
        await listening?.close();
        await loop;
        await passing?.catch(() => undefined);
      })();
      return stopped;
    },
  };
}
