import { performance } from 'node:perf_hooks';
import pino from 'pino';
import type { DataAccess, Database } from '../db/client.js';
import { createOrgRotation, dueOrganisations } from './fair-claims.js';
import { createWakeSignal } from './wake-signal.js';

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
  /** Ends the pass in flight (after its current batch). */
  stop(): Promise<void>;
  /** One pass over every organisation with unsealed rows (after the pass in flight, if any); returns the rows sealed. */
  sealOnce(): Promise<number>;
};

export type CommitOrderSealerOptions = {
  database: DataAccess & Pick<Database, 'onWake'>;
  logger?: SealerLogger;
  /** How often it looks without being woken: what finds rows another process committed. */
  pollIntervalMs?: number;
  batchSize?: number;
  /** See DEFAULT_MIN_PASS_INTERVAL_MS; 0 runs a pass as soon as a wake arrives. */
  minPassIntervalMs?: number;
};

/**
 * The loop shared by the sealers that put an organisation's rows in the order their transactions
 * committed (the events feed, the audit chain): rows are written unsealed, and a pass, per
 * organisation with unsealed rows (fair-claims.ts), seals them batch by batch with `sealBatch`, which
 * locks the organisation's head row with SKIP LOCKED (so instances racing for one organisation skip
 * each other) and returns how many it sealed. Woken after this process's commits, and polling for
 * the rows of other processes; passes start at least minPassIntervalMs apart.
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
  let unsubscribe: (() => void) | undefined;
  /** One pass at a time, whoever asks (the loop or sealOnce). */
  let passing: Promise<number> | undefined;

  // A wake while a pass runs is kept, so rows committed during the pass are sealed right after it;
  // the pause between passes lets the rows of the commits meanwhile gather instead.
  const wake = createWakeSignal();

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
      try {
        await sealOnce();
      } catch (error) {
        logger.warn({ err: error }, `sealing the ${what} failed; retrying`);
      }
      const rest = minPassIntervalMs - (performance.now() - started);
      if (rest > 0) await wake.pause(rest);
      await wake.wait(pollIntervalMs);
    }
  }

  return {
    sealOnce,

    async start() {
      if (loop || stopping) return;
      unsubscribe = database.onWake(channel, () => wake.notify());
      loop = run().catch((error: unknown) => logger.error({ err: error }, `the ${what} sealer crashed`));
    },

    stop() {
      stopped ??= (async () => {
        stopping = true;
        unsubscribe?.();
        wake.close();
        await loop;
        await passing?.catch(() => undefined);
      })();
      return stopped;
    },
  };
}
