import pino from 'pino';
import type { Database, Listener } from '../../db/client.js';
import { createOrgRotation, dueOrganisations } from '../../shared/fair-claims.js';
import { chainHash, GENESIS_HASH } from './audit-chain.js';
import { AUDIT_CHANNEL, createAuditRepository } from './audit.repository.js';

/** Rows sealed per transaction: one short transaction, its row locks held for milliseconds. */
export const DEFAULT_SEAL_BATCH = 1_000;
/** Organisations looked at per pass; a pass that found this many is followed at once by another. */
const ORGANISATIONS_PER_PASS = 100;
/**
 * The least time from one pass's start to the next's. Woken after every commit, passes would run back
 * to back and seal a row or two each: a transaction (head lock, read, update, commit) per upsert,
 * a third more CPU per upsert (bench/results/audit-sealing.md). Gathered over this long, a busy
 * organisation's rows are sealed a batch per transaction, still well within the 5 s the issue allows.
 */
export const DEFAULT_MIN_PASS_INTERVAL_MS = 250;

type SealerLogger = Pick<pino.Logger, 'warn' | 'error'>;

export type AuditChainSealer = {
  start(): Promise<void>;
  /** Ends the pass in flight (after its current batch) and closes the LISTEN. */
  stop(): Promise<void>;
  /** One pass over every organisation with unsealed rows; returns the rows sealed. */
  sealOnce(): Promise<number>;
};

/**
 * Chains audit rows after they commit: gives each its sequence and hash (audit-chain.ts), in the
 * order they became visible. A row whose transaction commits late is sealed by a later pass, behind
 * every row that committed before it, so the order, once assigned, never changes. Writers never wait
 * on the chain: they insert with sequence null and go on.
 *
 * Per organisation, one transaction per batch: its head row exists (a statement of its own), is
 * locked with SKIP LOCKED (another instance sealing the organisation makes this one skip it, so a
 * sequence is never handed out twice), and then a new statement, whose snapshot sees whatever the
 * previous holder committed, reads the oldest unsealed rows; their hashes are computed here, chained
 * from the head's hash, and written with the head's move in one statement.
 *
 * Woken after commits (this process's in-process, others' by NOTIFY) and polling as a fallback; rows
 * written before the upgrade that added the chain are sealed by the same loop.
 */
export function createAuditChainSealer(options: {
  database: Database;
  logger?: SealerLogger;
  /** The fallback when no wake arrives (a lost NOTIFY, a process without a listener). */
  pollIntervalMs?: number;
  batchSize?: number;
  /** See DEFAULT_MIN_PASS_INTERVAL_MS; 0 runs a pass as soon as a wake arrives. */
  minPassIntervalMs?: number;
  /** LISTEN for other processes' commits (default true); this process's wake it in-process either way. */
  listen?: boolean;
}): AuditChainSealer {
  const { database } = options;
  const logger: SealerLogger = options.logger ?? pino({ level: 'silent' });
  const pollIntervalMs = options.pollIntervalMs ?? 1_000;
  const batchSize = options.batchSize ?? DEFAULT_SEAL_BATCH;
  const minPassIntervalMs = options.minPassIntervalMs ?? DEFAULT_MIN_PASS_INTERVAL_MS;
  const audit = createAuditRepository(database.db);
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

  /** Seals one batch of the organisation in a transaction; 0 when another sealer holds it or nothing is due. */
  function sealBatch(orgId: string): Promise<number> {
    return database.transaction(async (tx) => {
      await audit.ensureHead(orgId, tx);
      const head = await audit.lockHead(orgId, tx);
      if (head === undefined) return 0;
      const rows = await audit.unsealedRows(orgId, batchSize, tx);
      let previous = head.lastHash ?? GENESIS_HASH;
      let sequence = head.lastSequence;
      const sealed = rows.map((row) => {
        sequence += 1;
        previous = chainHash(previous, { ...row, sequence });
        return { id: row.id as number, sequence, hash: previous };
      });
      const written = await audit.seal(orgId, sealed, tx);
      // Under the head lock nobody else seals these rows; should one have been, the batch would leave
      // a hole in the chain, so it is rolled back and read again on the next pass.
      if (written !== sealed.length) throw new Error(`audit sealer: ${sealed.length - written} of ${sealed.length} rows were sealed by someone else`);
      return written;
    });
  }

  /** Seals one organisation batch by batch; returns how many (0 when another sealer holds it). */
  async function sealOrganisation(orgId: string): Promise<number> {
    let total = 0;
    while (!stopping) {
      const taken = await sealBatch(orgId);
      total += taken;
      if (taken < batchSize) break;
    }
    return total;
  }

  async function pass(): Promise<number> {
    let total = 0;
    for (;;) {
      const orgIds = await dueOrganisations(rotation, ORGANISATIONS_PER_PASS, (after, limit) => audit.organisationsWithUnsealedRows(after, limit));
      let sealed = 0;
      for (const orgId of orgIds) {
        if (stopping) return total;
        try {
          sealed += await sealOrganisation(orgId);
        } catch (error) {
          // One organisation's failure (a lock timeout behind a purge) must not hold back the others.
          logger.warn({ err: error, orgId }, 'sealing the audit chain of an organisation failed; retrying on the next pass');
        }
      }
      total += sealed;
      // More organisations than one look takes: go on at once, unless all of them were held by other sealers.
      if (orgIds.length < ORGANISATIONS_PER_PASS || sealed === 0 || stopping) return total;
    }
  }

  /** A pass that starts after the one in flight, if any, so it sees every row committed before the call. */
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
        logger.warn({ err: error }, 'sealing the audit chain failed; retrying');
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
      unsubscribe = database.onWake(AUDIT_CHANNEL, wake);
      if (options.listen !== false) listener = await database.listen(AUDIT_CHANNEL, wake, wake);
      loop = run().catch((error: unknown) => logger.error({ err: error }, 'audit chain sealer crashed'));
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
