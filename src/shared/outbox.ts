import { randomUUID } from 'node:crypto';
import { sql, type SQL } from 'drizzle-orm';
import { prepared, wakeAfterCommit, type Executor } from '../db/client.js';

/*
 * The transactional outbox: what a module calls to queue an integration event and its webhook
 * deliveries in the transaction of the change. It is shared because several modules write events
 * (customers, entities, verification, document requests, webhooks) and two read them (webhooks
 * delivers them, events serves them as a feed): kept in one of those modules, it tied that module
 * to the others in both directions.
 */

/** The channel a commit that wrote events wakes: the feed sealer (modules/events/events-feed.sealer.ts). */
export const FEED_CHANNEL = 'outbox_events';

/** The types an endpoint can subscribe to. */
export const EVENT_TYPES = [
  'customer.kyc_completed',
  'aml.review_completed',
  'customer.updated',
  'endpoint.disabled',
  'document_request.updated',
  'customer.review_due',
  'customer.review_completed',
  'import.completed',
] as const;
export type EventType = (typeof EVENT_TYPES)[number];
/** Every type the feed can hold: a `webhook.test` reaches every endpoint it is sent to, subscribed or not. */
export const FEED_EVENT_TYPES = [...EVENT_TYPES, 'webhook.test'] as const;
export type FeedEventType = (typeof FEED_EVENT_TYPES)[number];

export type OutboxEvent = {
  orgId: string;
  type: FeedEventType;
  customerId: string | null;
  /** The public DTO of the record at the moment of the change. */
  customer: unknown;
  /** The event's `data` when it is about something other than a record (`endpoint.disabled`: `{endpoint}`, `document_request.updated`: `{document_request}`); replaces `{customer}`. */
  data?: Record<string, unknown>;
  /**
   * The DTO's `updated_at` is RECORD_UPDATED_AT: the statement writing the event replaces it with
   * the record's own, as the change queued ahead of it in the transaction stamped it.
   */
  updatedAtFromRecord?: boolean;
  /** Queues the event for this endpoint only (when enabled), whatever its subscriptions: a test sent to one endpoint. */
  endpointId?: string;
  /** A bulk import's row caused it: endpoints with skip_import_rows get no delivery of it (the feed still has it). */
  fromImport?: boolean;
};

/** Stands for a customer's updated_at in an event built before the database stamped it. */
export const RECORD_UPDATED_AT = 'record.updated_at';
/** How toISOString writes a timestamp, in PostgreSQL (the same format the customers triggers use). */
const ISO_FORMAT = `'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'`;

/** The values an event's statement binds, each as given. */
type EventValues = {
  id: string;
  orgId: string;
  type: string;
  customerId: string | null;
  payload: string;
  created: string;
  endpointId?: string;
  marker?: string;
  fromImport: boolean;
};
const value = (name: keyof EventValues) => sql.placeholder(name);

/**
 * The event, one pending delivery per enabled endpoint of the organisation that subscribes to its
 * type (a `webhook.test` reaches every enabled endpoint, since it exists to check the endpoint
 * itself), or only to `endpointId`: one statement, which returns a row when something was queued.
 * `payload` is the event's JSON, as given or with the record's updated_at put in. A Drizzle prepared
 * query (see prepared): Drizzle prepares query builders only, so the two INSERTs are the WITH of a
 * select of what the second one queued.
 */
function recordEvent(name: string, payload: SQL, options: { oneEndpoint?: boolean } = {}) {
  return prepared<EventValues, unknown[]>(name, (executor, statementName) => {
    const endpointFilter = options.oneEndpoint
      ? sql`AND endpoint.id = ${value('endpointId')}::uuid`
      : sql`AND (cardinality(endpoint.event_types) = 0 OR event.type = ANY (endpoint.event_types)
              OR event.type = 'webhook.test')
            AND NOT (endpoint.skip_import_rows AND ${value('fromImport')}::boolean)`;
    const event = executor.$with('event', { id: sql`id` }).as(sql`
      INSERT INTO outbox_events (id, org_id, type, customer_id, payload, created_at)
      VALUES (${value('id')}, ${value('orgId')}, ${value('type')}, ${value('customerId')}, ${payload}, ${value('created')})
      RETURNING id, org_id, type`);
    const queued = executor.$with('queued', { one: sql`1` }).as(sql`
      INSERT INTO webhook_deliveries (org_id, event_id, endpoint_id)
      SELECT event.org_id, event.id, endpoint.id
        FROM event
        JOIN webhook_endpoints endpoint
          ON endpoint.org_id = event.org_id
         AND endpoint.enabled
         ${endpointFilter}
      RETURNING 1`);
    return executor
      .with(event, queued)
      .select({ one: sql<number>`1` })
      .from(queued)
      .limit(1)
      .prepare(statementName);
  });
}

// Every change to an integration's record writes one.
const statements = {
  asGiven: recordEvent('outbox_record', sql`${value('payload')}`),
  toOneEndpoint: recordEvent('outbox_record_one_endpoint', sql`${value('payload')}`, { oneEndpoint: true }),
  // The event's JSON with the record's updated_at, as the change queued ahead of it in the transaction stamped it, put in.
  withRecordUpdatedAt: recordEvent(
    'outbox_record_stamped',
    sql`replace(${value('payload')}, ${value('marker')},
      (SELECT '"updated_at":"' || to_char(updated_at AT TIME ZONE 'UTC', ${sql.raw(ISO_FORMAT)}) || '"' FROM customers WHERE org_id = ${value('orgId')} AND id = ${value('customerId')}))`,
  ),
};

export function createOutboxRepository() {
  return {
    /**
     * Writes the event in the caller's transaction together with its deliveries (recordEvent), and
     * after the commit wakes the feed sealer, and the delivery workers when it queued any (a
     * rolled-back change wakes nobody). Returns the event id.
     */
    async record(event: OutboxEvent, tx: Executor): Promise<string> {
      const id = randomUUID();
      const created = new Date().toISOString();
      const payload = JSON.stringify({ id, type: event.type, created, data: event.data ?? { customer: event.customer } });
      const values: EventValues = {
        id,
        orgId: event.orgId,
        type: event.type,
        customerId: event.customerId,
        payload,
        created,
        fromImport: event.fromImport === true,
      };
      const rows =
        event.endpointId !== undefined
          ? await statements.toOneEndpoint(tx, { ...values, endpointId: event.endpointId })
          : event.updatedAtFromRecord
            ? await statements.withRecordUpdatedAt(tx, { ...values, marker: `"updated_at":"${RECORD_UPDATED_AT}"` })
            : await statements.asGiven(tx, values);
      wakeAfterCommit(tx, FEED_CHANNEL);
      if (rows.length > 0) wakeAfterCommit(tx, 'webhook_deliveries');
      return id;
    },

    /**
     * Writes many events in one statement, each with its deliveries as `record` would (a background
     * batch: the review sweep, a bulk import's batch). The DTOs carry their own updated_at.
     */
    async recordMany(events: Array<Omit<OutboxEvent, 'endpointId' | 'updatedAtFromRecord'>>, tx: Executor): Promise<void> {
      if (events.length === 0) return;
      const created = new Date().toISOString();
      const ids = events.map(() => randomUUID());
      const payloads = events.map((event, index) =>
        JSON.stringify({ id: ids[index], type: event.type, created, data: event.data ?? { customer: event.customer } }),
      );
      const { rows } = await tx.execute(sql`
        WITH given AS (
          SELECT * FROM unnest(${sql.param(ids)}::uuid[], ${sql.param(events.map((event) => event.orgId))}::uuid[],
                               ${sql.param(events.map((event) => event.type))}::text[], ${sql.param(events.map((event) => event.customerId))}::uuid[],
                               ${sql.param(payloads)}::text[], ${sql.param(events.map((event) => event.fromImport === true))}::boolean[])
            AS given (id, org_id, type, customer_id, payload, from_import)
        ), event AS (
          INSERT INTO outbox_events (id, org_id, type, customer_id, payload, created_at)
          SELECT id, org_id, type, customer_id, payload, ${created}::timestamptz FROM given
          RETURNING id, org_id, type
        ), queued AS (
          INSERT INTO webhook_deliveries (org_id, event_id, endpoint_id)
          SELECT event.org_id, event.id, endpoint.id
            FROM event
            JOIN given ON given.id = event.id
            JOIN webhook_endpoints endpoint
              ON endpoint.org_id = event.org_id
             AND endpoint.enabled
             AND (cardinality(endpoint.event_types) = 0 OR event.type = ANY (endpoint.event_types))
             AND NOT (endpoint.skip_import_rows AND given.from_import)
          RETURNING 1
        )
        SELECT 1 FROM queued LIMIT 1`);
      wakeAfterCommit(tx, FEED_CHANNEL);
      if (rows.length > 0) wakeAfterCommit(tx, 'webhook_deliveries');
    },
  };
}
export type OutboxRepository = ReturnType<typeof createOutboxRepository>;
