import { sql, type SQL } from 'drizzle-orm';
import type { Executor } from '../../db/client.js';
import { organisationsWith } from '../../db/skip-scan.js';

/** A sealed event as the feed reads it: its place and the exact JSON document webhooks carry. */
export type FeedEventRow = { id: string; position: number; payload: string };

export type FeedFilters = {
  /** Only events after this position (0: the start of the feed). */
  after: number;
  types?: readonly string[];
  customerId?: string;
  createdAfter?: Date;
  createdBefore?: Date;
};

/**
 * The feed's reads (GET /v1/events) and the sealer's writes (events-feed.sealer.ts). Every statement
 * keeps to one organisation.
 */
export function createEventsRepository() {
  return {
    /**
     * Up to `limit` sealed events after `filters.after`, ascending by position: a range scan of
     * outbox_events_feed_idx (org_id, position), or of outbox_events_customer_feed_idx
     * (org_id, customer_id, position) with a customer, stopping after `limit` rows.
     */
    async list(orgId: string, filters: FeedFilters, limit: number, tx: Executor): Promise<FeedEventRow[]> {
      const conditions: SQL[] = [sql`org_id = ${orgId}`, sql`position > ${filters.after}`];
      if (filters.customerId !== undefined) conditions.push(sql`customer_id = ${filters.customerId}`);
      if (filters.types !== undefined)
        conditions.push(
          sql`type IN (${sql.join(
            filters.types.map((type) => sql`${type}`),
            sql`, `,
          )})`,
        );
      if (filters.createdAfter !== undefined) conditions.push(sql`created_at > ${filters.createdAfter.toISOString()}`);
      if (filters.createdBefore !== undefined) conditions.push(sql`created_at < ${filters.createdBefore.toISOString()}`);
      const result = await tx.execute<FeedEventRow>(sql`
        SELECT id, position, payload FROM outbox_events
         WHERE ${sql.join(conditions, sql` AND `)}
         ORDER BY position
         LIMIT ${limit}`);
      return result.rows;
    },

    /** One event of the organisation, sealed or not; undefined when there is none (or it was purged). */
    async find(orgId: string, id: string, tx: Executor): Promise<{ id: string; payload: string } | undefined> {
      const result = await tx.execute<{ id: string; payload: string }>(
        sql`SELECT id, payload FROM outbox_events WHERE org_id = ${orgId} AND id = ${id}`,
      );
      return result.rows[0];
    },

    /**
     * Organisations after `after` (org_id order) with events not sealed yet, at most `limit`: a skip
     * scan of the small partial index outbox_events_unsealed_idx, one probe per organisation.
     */
    async organisationsWithUnsealedEvents(after: string, limit: number, tx: Executor): Promise<string[]> {
      return organisationsWith(tx, { table: 'outbox_events', pending: sql`position IS NULL`, after, limit });
    },

    /** The organisation's head row, so there is always one to lock; a statement of its own (see lockHead). */
    async ensureHead(orgId: string, tx: Executor): Promise<void> {
      await tx.execute(sql`INSERT INTO event_feed_heads (org_id) VALUES (${orgId}) ON CONFLICT (org_id) DO NOTHING`);
    },

    /**
     * Locks the organisation's head and returns its last position, or undefined when another sealer
     * holds it (that one is sealing this organisation now; waiting would only queue behind it).
     */
    async lockHead(orgId: string, tx: Executor): Promise<number | undefined> {
      const result = await tx.execute<{ last_position: number }>(
        sql`SELECT last_position FROM event_feed_heads WHERE org_id = ${orgId} FOR UPDATE SKIP LOCKED`,
      );
      return result.rows[0]?.last_position;
    },

    /**
     * Gives the next `limit` unsealed events (by created_at, id) the positions after `lastPosition`
     * and moves the head past them; returns how many it took. It must be a statement after lockHead's: READ
     * COMMITTED gives it a snapshot taken once the head was locked, so it sees every position the
     * previous holder committed and takes none of those events again.
     */
    async sealBatch(orgId: string, lastPosition: number, limit: number, tx: Executor): Promise<number> {
      const result = await tx.execute<{ taken: number }>(sql`
        WITH batch AS (
          SELECT id, row_number() OVER (ORDER BY created_at, id) AS n
            FROM (SELECT id, created_at FROM outbox_events
                   WHERE org_id = ${orgId} AND position IS NULL
                   ORDER BY created_at, id
                   LIMIT ${limit}) unsealed
        ),
        sealed AS (
          UPDATE outbox_events e
             SET position = ${lastPosition}::bigint + batch.n
            FROM batch
           WHERE e.org_id = ${orgId} AND e.id = batch.id AND e.position IS NULL
          RETURNING 1
        ),
        head AS (
          UPDATE event_feed_heads
             SET last_position = ${lastPosition}::bigint + (SELECT count(*) FROM batch), updated_at = clock_timestamp()
           WHERE org_id = ${orgId} AND EXISTS (SELECT 1 FROM batch)
          RETURNING 1
        )
        SELECT (SELECT count(*) FROM batch)::int AS taken, (SELECT count(*) FROM sealed)::int AS sealed, (SELECT count(*) FROM head)::int AS head`);
      return result.rows[0]?.taken ?? 0;
    },
  };
}
export type EventsRepository = ReturnType<typeof createEventsRepository>;
