import { randomUUID } from 'node:crypto';
import { sql } from 'drizzle-orm';
import type { Executor } from '../../db/client.js';

export const EVENT_TYPES = ['customer.kyc_completed', 'aml.review_completed', 'customer.updated'] as const;
export type EventType = (typeof EVENT_TYPES)[number];

export type OutboxEvent = {
  orgId: string;
  type: EventType | 'webhook.test';
  customerId: string | null;
  /** The public DTO of the record at the moment of the change. */
  customer: unknown;
  /**
   * The DTO's `updated_at` is RECORD_UPDATED_AT: the statement writing the event replaces it with
   * the record's own, as the change queued ahead of it in the transaction stamped it.
   */
  updatedAtFromRecord?: boolean;
};

/** Stands for a customer's updated_at in an event built before the database stamped it. */
export const RECORD_UPDATED_AT = 'record.updated_at';
/** How toISOString writes a timestamp, in PostgreSQL (the same format the customers triggers use). */
const ISO_FORMAT = `'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'`;

export function createOutboxRepository(db: Executor) {
  return {
    /**
     * Writes the event in the caller's transaction together with one pending delivery per enabled
     * endpoint of the organisation that subscribes to its type (a `webhook.test` reaches every enabled
     * endpoint, since it exists to check the endpoint itself), and wakes the delivery workers at
     * commit (NOTIFY is transactional, so a rolled-back change wakes nobody). Returns the event id.
     */
    async record(event: OutboxEvent, tx: Executor = db): Promise<string> {
      const id = randomUUID();
      const created = new Date().toISOString();
      const payload = JSON.stringify({ id, type: event.type, created, data: { customer: event.customer } });
      const stampedPayload = event.updatedAtFromRecord
        ? sql`replace(${payload}, ${`"updated_at":"${RECORD_UPDATED_AT}"`},
            (SELECT '"updated_at":"' || to_char(updated_at AT TIME ZONE 'UTC', ${sql.raw(ISO_FORMAT)}) || '"' FROM customers WHERE id = ${event.customerId}))`
        : sql`${payload}`;
      // One round trip: the event, its deliveries, and a NOTIFY only when something was queued.
      await tx.execute(sql`
        WITH event AS (
          INSERT INTO outbox_events (id, org_id, type, customer_id, payload, created_at)
          VALUES (${id}, ${event.orgId}, ${event.type}, ${event.customerId}, ${stampedPayload}, ${created})
          RETURNING id, org_id, type
        ),
        queued AS (
          INSERT INTO webhook_deliveries (org_id, event_id, endpoint_id)
          SELECT event.org_id, event.id, endpoint.id
            FROM event
            JOIN webhook_endpoints endpoint
              ON endpoint.org_id = event.org_id
             AND endpoint.enabled
             AND (cardinality(endpoint.event_types) = 0 OR event.type = ANY (endpoint.event_types)
                  OR event.type = 'webhook.test')
          RETURNING 1
        )
        SELECT pg_notify('webhook_deliveries', ${event.orgId}) FROM (SELECT 1 FROM queued LIMIT 1) AS anything_queued
      `);
      return id;
    },
  };
}
export type OutboxRepository = ReturnType<typeof createOutboxRepository>;
