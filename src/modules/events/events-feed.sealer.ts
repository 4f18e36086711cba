import pino from 'pino';
import type { Database, Listener } from '../../db/client.js';
import { createOrgRotation, dueOrganisations } from '../../shared/fair-claims.js';
import { createEventsRepository } from './events.repository.js';

/** The channel outbox.repository.ts wakes after a commit that wrote events. */
export const FEED_CHANNEL = 'outbox_events';

/** Events sealed per transaction: one short transaction, its row locks held for milliseconds. */
export const DEFAULT_SEAL_BATCH = 1_000;
/** Organisations looked at per pass; a pass that found this many is followed at once by another. */
const ORGANISATIONS_PER_PASS = 100;

type SealerLogger = Pick<pino.Logger, 'warn' | 'error'>;

export type EventsFeedSealer = {
  start(): Promise<void>;
  /** Ends the pass in flight (after its current batch) and closes the LISTEN. */
  stop(): Promise<void>;
  /** One pass over every organisation with unsealed events; returns the events sealed. */
  sealOnce(): Promise<number>;
};

/**
 * Gives events their feed positions after they commit (GET /v1/events reads only sealed ones), in
 * the order they became visible: an event whose transaction commits late is sealed by a later pass,
 * behind every event that committed before it, so a consumer resuming after its last position never
 * misses it. Writers never wait on the feed and readers write nothing.
 *
 * Per organisation, one transaction per batch: its head row exists (a statement of its own), is
 * locked with SKIP LOCKED (another instance sealing the organisation makes this one skip it, so
 * positions are never handed out twice), and then a new statement, whose snapshot sees whatever the
 * previous holder committed, numbers the oldest unsealed events after the head and moves the head
 * past them. The head survives retention, so positions are never reused even once every event is purged.
 *
 * Woken after commits (this process's in-process, others' by NOTIFY) and polling as a fallback;
 * events written before an upgrade are sealed by the same loop.
 */
export function createEventsFeedSealer(options: {
  database: Database;
  logger?: SealerLogger;
  /** The fallback when no wake arrives (a lost NOTIFY, a process without a listener). */
  pollIntervalMs?: number;
  batchSize?: number;
  /** LISTEN for other processes' commits (default true); this process's wake it in-process either way. */
  listen?: boolean;
}): EventsFeedSealer {
  const { database } = options;
  const logger: SealerLogger = options.logger ?? pino({ level: 'silent' });
  const pollIntervalMs = options.pollIntervalMs ?? 1_000;
  const batchSize = options.batchSize ?? DEFAULT_SEAL_BATCH;
  const events = createEventsRepository(database.db);
  const rotation = createOrgRotation();

  let stopping = false;
  let loop: Promise<void> | undefined;
  let stopped: Promise<void> | undefined;
  let listener: Listener | undefined;
  let unsubscribe: (() => void) | undefined;
  /** One pass at a time, whoever asks (the loop or sealOnce). */
  let passing: Promise<number> | undefined;

  // A wake while a pass runs is kept, so events committed during the pass are sealed right after it.
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

  /** Seals one organisation batch by batch; returns how many (0 when another sealer holds it). */
  async function sealOrganisation(orgId: string): Promise<number> {
    let total = 0;
    while (!stopping) {
      const taken = await database.transaction(async (tx) => {
        await events.ensureHead(orgId, tx);
        const lastPosition = await events.lockHead(orgId, tx);
        if (lastPosition === undefined) return 0;
        return events.sealBatch(orgId, lastPosition, batchSize, tx);
      });
      total += taken;
      if (taken < batchSize) break;
    }
    return total;
  }

  async function pass(): Promise<number> {
    let total = 0;
    for (;;) {
      const orgIds = await dueOrganisations(rotation, ORGANISATIONS_PER_PASS, (after, limit) => events.organisationsWithUnsealedEvents(after, limit));
      let sealed = 0;
      for (const orgId of orgIds) {
        if (stopping) return total;
        try {
          sealed += await sealOrganisation(orgId);
        } catch (error) {
          // One organisation's failure (a lock timeout behind a purge) must not hold back the others.
          logger.warn({ err: error, orgId }, 'sealing the events feed of an organisation failed; retrying on the next pass');
        }
      }
      total += sealed;
      // More organisations than one look takes: go on at once, unless all of them were held by other sealers.
      if (orgIds.length < ORGANISATIONS_PER_PASS || sealed === 0 || stopping) return total;
    }
  }

  /** A pass that starts after the one in flight, if any, so it sees every event committed before the call. */
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
      pending = false;
      try {
        await sealOnce();
      } catch (error) {
        logger.warn({ err: error }, 'sealing the events feed failed; retrying');
      }
      await sleep(pollIntervalMs);
    }
  }

  return {
    sealOnce,

    async start() {
      if (loop || stopping) return;
      unsubscribe = database.onWake(FEED_CHANNEL, wake);
      if (options.listen !== false) listener = await database.listen(FEED_CHANNEL, wake, wake);
      loop = run().catch((error: unknown) => logger.error({ err: error }, 'events feed sealer crashed'));
    },

    stop() {
      stopped ??= (async () => {
        stopping = true;
        unsubscribe?.();
        wakeUp?.();
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
