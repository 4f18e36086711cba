import { and, asc, desc, eq, inArray, isNull, lt, or, sql, type SQL } from 'drizzle-orm';
import { wakeAfterCommit, type Executor } from '../../db/client.js';
import { outboxEvents, webhookAttempts, webhookDeliveries, webhookEndpoints } from '../../db/schema.js';
import type { DeliveryStatus } from './webhooks.schemas.js';

/**
 * Every column but the signing secrets (the current one is shown once at creation or rotation and
 * only read by the worker; the previous one is never shown). The previous secret's expiry reads as
 * null once past, by the database's clock, as the delivery claim decides.
 */
const endpointColumns = {
  id: webhookEndpoints.id,
  orgId: webhookEndpoints.orgId,
  url: webhookEndpoints.url,
  eventTypes: webhookEndpoints.eventTypes,
  description: webhookEndpoints.description,
  enabled: webhookEndpoints.enabled,
  disabledReason: webhookEndpoints.disabledReason,
  skipImportRows: webhookEndpoints.skipImportRows,
  previousSecretExpiresAt:
    sql<Date | null>`CASE WHEN ${webhookEndpoints.previousSecretExpiresAt} > clock_timestamp() THEN ${webhookEndpoints.previousSecretExpiresAt} END`.mapWith(
      webhookEndpoints.previousSecretExpiresAt,
    ),
  createdAt: webhookEndpoints.createdAt,
  updatedAt: webhookEndpoints.updatedAt,
};
export type WebhookEndpointRecord = {
  id: string;
  orgId: string;
  url: string;
  eventTypes: string[];
  description: string | null;
  enabled: boolean;
  disabledReason: string | null;
  skipImportRows: boolean;
  previousSecretExpiresAt: Date | null;
  createdAt: Date;
  updatedAt: Date;
};
/** What an update may change; the secrets change only through rotateSecret. */
export type EndpointChanges = Partial<{
  url: string;
  eventTypes: string[];
  description: string | null;
  enabled: boolean;
  disabledReason: string | null;
  failingSince: Date | null;
  skipImportRows: boolean;
}>;
/** A page position: the last row of the previous page, by (created_at, id). */
export type PagePosition = { createdAt: Date; id: string };

const deliveryColumns = {
  id: webhookDeliveries.id,
  orgId: webhookDeliveries.orgId,
  eventId: webhookDeliveries.eventId,
  eventType: outboxEvents.type,
  endpointId: webhookDeliveries.endpointId,
  endpointUrl: webhookEndpoints.url,
  status: webhookDeliveries.status,
  attempts: webhookDeliveries.attempts,
  nextAttemptAt: webhookDeliveries.nextAttemptAt,
  lockedUntil: webhookDeliveries.lockedUntil,
  lastStatusCode: webhookDeliveries.lastStatusCode,
  lastError: webhookDeliveries.lastError,
  createdAt: webhookDeliveries.createdAt,
  updatedAt: webhookDeliveries.updatedAt,
};
export type WebhookDeliveryRecord = {
  id: string;
  orgId: string;
  eventId: string;
  eventType: string;
  endpointId: string;
  endpointUrl: string;
  status: DeliveryStatus;
  attempts: number;
  nextAttemptAt: Date;
  lockedUntil: Date | null;
  lastStatusCode: number | null;
  lastError: string | null;
  createdAt: Date;
  updatedAt: Date;
};
export type WebhookAttemptRecord = typeof webhookAttempts.$inferSelect;

/** An organisation's deliveries joined to their event and endpoint, selecting deliveryColumns. */
function deliveriesOf(tx: Executor, orgId: string) {
  return tx
    .select(deliveryColumns)
    .from(webhookDeliveries)
    .innerJoin(outboxEvents, and(eq(outboxEvents.id, webhookDeliveries.eventId), eq(outboxEvents.orgId, orgId)))
    .innerJoin(webhookEndpoints, and(eq(webhookEndpoints.id, webhookDeliveries.endpointId), eq(webhookEndpoints.orgId, orgId)));
}

export function createWebhooksRepository() {
  return {
    async insertEndpoint(values: typeof webhookEndpoints.$inferInsert, tx: Executor): Promise<WebhookEndpointRecord> {
      const [row] = await tx.insert(webhookEndpoints).values(values).returning(endpointColumns);
      return row!;
    },

    async listEndpoints(orgId: string, tx: Executor): Promise<WebhookEndpointRecord[]> {
      return tx
        .select(endpointColumns)
        .from(webhookEndpoints)
        .where(eq(webhookEndpoints.orgId, orgId))
        .orderBy(asc(webhookEndpoints.createdAt), asc(webhookEndpoints.id));
    },

    /**
     * By id alone, for operator commands that name an endpoint without its organisation: a lookup not
     * routed to an organisation (under Citus, a read of every shard); what follows it is.
     */
    async findEndpointById(id: string, tx: Executor): Promise<WebhookEndpointRecord | undefined> {
      const [row] = await tx.select(endpointColumns).from(webhookEndpoints).where(eq(webhookEndpoints.id, id));
      return row;
    },

    async findEndpoint(
      orgId: string,
      id: string,
      tx: Executor,
      options: { forUpdate?: boolean } = {},
    ): Promise<WebhookEndpointRecord | undefined> {
      const query = tx
        .select(endpointColumns)
        .from(webhookEndpoints)
        .where(and(eq(webhookEndpoints.orgId, orgId), eq(webhookEndpoints.id, id)));
      const [row] = options.forUpdate ? await query.for('update') : await query;
      return row;
    },

    /** Ascending (created_at, id), after `after` when given. */
    async listEndpointsPage(orgId: string, page: { after?: PagePosition; limit: number }, tx: Executor): Promise<WebhookEndpointRecord[]> {
      const conditions: SQL[] = [eq(webhookEndpoints.orgId, orgId)];
      if (page.after) {
        conditions.push(
          sql`(${webhookEndpoints.createdAt}, ${webhookEndpoints.id}) > (${page.after.createdAt.toISOString()}::timestamptz, ${page.after.id}::uuid)`,
        );
      }
      return tx
        .select(endpointColumns)
        .from(webhookEndpoints)
        .where(and(...conditions))
        .orderBy(asc(webhookEndpoints.createdAt), asc(webhookEndpoints.id))
        .limit(page.limit);
    },

    async updateEndpoint(orgId: string, id: string, changes: EndpointChanges, tx: Executor): Promise<WebhookEndpointRecord | undefined> {
      const [row] = await tx
        .update(webhookEndpoints)
        .set({ ...changes, updatedAt: sql`clock_timestamp()` })
        .where(and(eq(webhookEndpoints.orgId, orgId), eq(webhookEndpoints.id, id)))
        .returning(endpointColumns);
      return row;
    },

    /**
     * A new signing secret; the current one becomes the previous one, used beside it until the grace
     * ends (a secret still in its grace from an earlier rotation is dropped). A grace of 0 keeps none.
     */
    async rotateSecret(
      orgId: string,
      id: string,
      secret: string,
      graceSeconds: number,
      tx: Executor,
    ): Promise<WebhookEndpointRecord | undefined> {
      const [row] = await tx
        .update(webhookEndpoints)
        .set({
          secret,
          // In SET, the column names the row's value before the update: the secret being replaced.
          previousSecret: graceSeconds > 0 ? sql`${webhookEndpoints.secret}` : null,
          previousSecretExpiresAt: graceSeconds > 0 ? sql`clock_timestamp() + make_interval(secs => ${graceSeconds})` : null,
          updatedAt: sql`clock_timestamp()`,
        })
        .where(and(eq(webhookEndpoints.orgId, orgId), eq(webhookEndpoints.id, id)))
        .returning(endpointColumns);
      return row;
    },

    /** Deletes the endpoint; its deliveries and their attempts go with it (ON DELETE CASCADE). */
    async deleteEndpoint(orgId: string, id: string, tx: Executor): Promise<boolean> {
      const rows = await tx
        .delete(webhookEndpoints)
        .where(and(eq(webhookEndpoints.orgId, orgId), eq(webhookEndpoints.id, id)))
        .returning({ id: webhookEndpoints.id });
      return rows.length > 0;
    },

    /** Newest first, (created_at, id) before `before` when given: a range of webhook_deliveries_endpoint_idx. */
    async listEndpointDeliveries(
      orgId: string,
      endpointId: string,
      page: { status?: DeliveryStatus; before?: PagePosition; limit: number },
      tx: Executor,
    ): Promise<WebhookDeliveryRecord[]> {
      const conditions: SQL[] = [eq(webhookDeliveries.orgId, orgId), eq(webhookDeliveries.endpointId, endpointId)];
      if (page.status) conditions.push(eq(webhookDeliveries.status, page.status));
      if (page.before) {
        conditions.push(
          sql`(${webhookDeliveries.createdAt}, ${webhookDeliveries.id}) < (${page.before.createdAt.toISOString()}::timestamptz, ${page.before.id}::uuid)`,
        );
      }
      return deliveriesOf(tx, orgId)
        .where(and(...conditions))
        .orderBy(desc(webhookDeliveries.createdAt), desc(webhookDeliveries.id))
        .limit(page.limit);
    },

    /** The delivery of an event to one endpoint (a test event sent to it has exactly one). */
    async findDeliveryOfEvent(
      orgId: string,
      eventId: string,
      endpointId: string,
      tx: Executor,
    ): Promise<WebhookDeliveryRecord | undefined> {
      const [row] = await deliveriesOf(tx, orgId)
        .where(
          and(eq(webhookDeliveries.orgId, orgId), eq(webhookDeliveries.eventId, eventId), eq(webhookDeliveries.endpointId, endpointId)),
        )
        .orderBy(asc(webhookDeliveries.createdAt))
        .limit(1);
      return row;
    },

    /** Holds the endpoint's row until the transaction ends, so what is read is what a change in it starts from. */
    async lockEndpoint(orgId: string, id: string, tx: Executor): Promise<WebhookEndpointRecord | undefined> {
      const [row] = await tx
        .select(endpointColumns)
        .from(webhookEndpoints)
        .where(and(eq(webhookEndpoints.orgId, orgId), eq(webhookEndpoints.id, id)))
        .for('update');
      return row;
    },

    /**
     * Disables an enabled endpoint; undefined when it is not found, already disabled, or (with
     * `failingForMs`) has not been failing for longer than that by the database's clock.
     */
    async disableEndpoint(
      orgId: string,
      id: string,
      reason: string,
      tx: Executor,
      options: { failingForMs?: number } = {},
    ): Promise<WebhookEndpointRecord | undefined> {
      const conditions: SQL[] = [eq(webhookEndpoints.orgId, orgId), eq(webhookEndpoints.id, id), eq(webhookEndpoints.enabled, true)];
      if (options.failingForMs !== undefined) {
        conditions.push(lt(webhookEndpoints.failingSince, sql`clock_timestamp() - ${options.failingForMs} * interval '1 millisecond'`));
      }
      const [row] = await tx
        .update(webhookEndpoints)
        // Cleared, so an endpoint enabled again starts afresh; the reason keeps since when it had failed.
        .set({ enabled: false, disabledReason: reason, failingSince: null, updatedAt: sql`clock_timestamp()` })
        .where(and(...conditions))
        .returning(endpointColumns);
      return row;
    },

    /** Fails the endpoint's queued deliveries that no worker holds; held ones are settled by their worker. */
    async failQueuedDeliveries(orgId: string, endpointId: string, reason: string, tx: Executor): Promise<number> {
      const rows = await tx
        .update(webhookDeliveries)
        .set({ status: 'failed', lastError: reason, updatedAt: sql`clock_timestamp()` })
        .where(
          and(
            eq(webhookDeliveries.orgId, orgId),
            eq(webhookDeliveries.endpointId, endpointId),
            eq(webhookDeliveries.status, 'pending'),
            or(isNull(webhookDeliveries.lockedUntil), lt(webhookDeliveries.lockedUntil, sql`clock_timestamp()`)),
          ),
        )
        .returning({ id: webhookDeliveries.id });
      return rows.length;
    },

    async listDeliveries(
      orgId: string,
      filters: { eventId?: string; status?: DeliveryStatus; limit: number },
      tx: Executor,
    ): Promise<WebhookDeliveryRecord[]> {
      const conditions: SQL[] = [eq(webhookDeliveries.orgId, orgId)];
      if (filters.eventId) conditions.push(eq(webhookDeliveries.eventId, filters.eventId));
      if (filters.status) conditions.push(eq(webhookDeliveries.status, filters.status));
      return deliveriesOf(tx, orgId)
        .where(and(...conditions))
        .orderBy(desc(webhookDeliveries.createdAt), desc(webhookDeliveries.id))
        .limit(filters.limit);
    },

    async findDelivery(orgId: string, id: string, tx: Executor): Promise<WebhookDeliveryRecord | undefined> {
      const [row] = await deliveriesOf(tx, orgId).where(and(eq(webhookDeliveries.orgId, orgId), eq(webhookDeliveries.id, id)));
      return row;
    },

    /** The organisation of a delivery, for operator commands that name it by id alone (not routed, as findEndpointById). */
    async findDeliveryOrg(id: string, tx: Executor): Promise<string | undefined> {
      const [row] = await tx.select({ orgId: webhookDeliveries.orgId }).from(webhookDeliveries).where(eq(webhookDeliveries.id, id));
      return row?.orgId;
    },

    async attemptsOf(orgId: string, deliveryIds: string[], tx: Executor): Promise<WebhookAttemptRecord[]> {
      if (deliveryIds.length === 0) return [];
      return (
        tx
          .select()
          .from(webhookAttempts)
          .where(and(eq(webhookAttempts.orgId, orgId), inArray(webhookAttempts.deliveryId, deliveryIds)))
          // Ties (an attempt recorded by a worker whose lease had expired) by time; the id, from a global sequence, only breaks exact ties.
          .orderBy(
            asc(webhookAttempts.deliveryId),
            asc(webhookAttempts.attemptNumber),
            asc(webhookAttempts.createdAt),
            asc(webhookAttempts.id),
          )
      );
    },

    /** Makes a queued delivery due now; a worker holding it keeps its claim and settles it as usual. */
    async makeDue(orgId: string, id: string, tx: Executor): Promise<boolean> {
      const rows = await tx
        .update(webhookDeliveries)
        .set({ nextAttemptAt: sql`clock_timestamp()`, updatedAt: sql`clock_timestamp()` })
        .where(and(eq(webhookDeliveries.orgId, orgId), eq(webhookDeliveries.id, id), eq(webhookDeliveries.status, 'pending')))
        .returning({ id: webhookDeliveries.id });
      return rows.length > 0;
    },

    async insertDelivery(orgId: string, eventId: string, endpointId: string, tx: Executor): Promise<string> {
      const [row] = await tx.insert(webhookDeliveries).values({ orgId, eventId, endpointId }).returning({ id: webhookDeliveries.id });
      return row!.id;
    },

    async findEvent(orgId: string, id: string, tx: Executor) {
      const [row] = await tx
        .select()
        .from(outboxEvents)
        .where(and(eq(outboxEvents.orgId, orgId), eq(outboxEvents.id, id)));
      return row;
    },

    /** Wakes the delivery workers once the transaction commits (wakeAfterCommit). */
    notifyWorkers(tx: Executor): void {
      wakeAfterCommit(tx, 'webhook_deliveries');
    },
  };
}
export type WebhooksRepository = ReturnType<typeof createWebhooksRepository>;
