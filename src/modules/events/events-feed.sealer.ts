import { createCommitOrderSealer, type CommitOrderSealer, type CommitOrderSealerOptions } from '../../shared/commit-order-sealer.js';
import { FEED_CHANNEL } from '../../shared/outbox.js';
import { createEventsRepository } from './events.repository.js';

export type EventsFeedSealer = CommitOrderSealer;

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
 * past them. The head survives retention, so positions are never reused even once every event is
 * purged. The loop around it is the audit chain's too (commit-order-sealer.ts); events written before
 * an upgrade are sealed by the same loop.
 */
export function createEventsFeedSealer(options: CommitOrderSealerOptions): EventsFeedSealer {
  const { database } = options;
  const events = createEventsRepository();
  return createCommitOrderSealer({
    ...options,
    channel: FEED_CHANNEL,
    what: 'events feed',
    organisationsWithUnsealedRows: (after, limit) => events.organisationsWithUnsealedEvents(after, limit, database.db),
    sealBatch: (orgId, batchSize) =>
      database.transaction(async (tx) => {
        await events.ensureHead(orgId, tx);
        const lastPosition = await events.lockHead(orgId, tx);
        if (lastPosition === undefined) return 0;
        return events.sealBatch(orgId, lastPosition, batchSize, tx);
      }),
  });
}
