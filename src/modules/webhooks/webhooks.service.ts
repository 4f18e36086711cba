import { randomBytes } from 'node:crypto';
import { type z } from 'zod';
import type { DataAccess, Executor, Tx } from '../../db/client.js';
import { AppError } from '../../shared/app-error.js';
import { isUuid } from '../../shared/ids.js';
import type { ListPage } from '../../shared/list-envelope.js';
import { createAuditWriter, type AuditEntry, type AuditWriter } from '../../shared/audit-writer.js';
import type { Actor } from '../../shared/actor.js';
import type { OpenTransaction } from '../../shared/request-context.js';
import { decodeCursor, encodeCursor, filterFingerprint, type CursorKey } from '../../shared/list-cursor.js';
import type { OrganisationsRepository } from '../organisations/organisations.repository.js';
import {
  assertDeliverableTarget,
  parseEndpointUrl,
  UnsafeWebhookTargetError,
  type ResolveHost,
  type WebhookTargetPolicy,
} from './endpoint-url.js';
import { createOutboxRepository, type OutboxRepository } from '../../shared/outbox.js';
import {
  createWebhooksRepository,
  type EndpointChanges,
  type WebhookAttemptRecord,
  type WebhookDeliveryRecord,
  type WebhookEndpointRecord,
  type WebhooksRepository,
} from './webhooks.repository.js';
import {
  addEndpointInput,
  DEFAULT_GRACE_PERIOD_SECONDS,
  listDeliveriesInput,
  rotateSecretBody,
  updateEndpointInput,
  type AddEndpointInput,
  type DeletedEndpointDto,
  type ListDeliveriesInput,
  type ListEndpointDeliveriesQuery,
  type ListPageQuery,
  type UpdateEndpointInput,
  type WebhookAttemptDto,
  type WebhookDeliveryDto,
  type WebhookEndpointDto,
} from './webhooks.schemas.js';

const SYSTEM_ACTOR: Actor = { type: 'system', id: null };

/** Standard Webhooks secret: `whsec_` + base64 of 32 random bytes (the HMAC key). */
function generateWebhookSecret(): string {
  return `whsec_${randomBytes(32).toString('base64')}`;
}

/** The audit row of a change to a webhook endpoint. */
function endpointChange(orgId: string, id: string, actor: Actor, action: string, before: unknown, after: unknown): AuditEntry {
  return { orgId, actor, action, subjectType: 'webhook_endpoint', subjectId: id, before, after };
}

function toEndpointDto(row: WebhookEndpointRecord): WebhookEndpointDto {
  return {
    id: row.id,
    org_id: row.orgId,
    url: row.url,
    events: row.eventTypes,
    description: row.description,
    enabled: row.enabled,
    disabled_reason: row.disabledReason,
    skip_import_rows: row.skipImportRows,
    previous_secret_expires_at: row.previousSecretExpiresAt?.toISOString() ?? null,
    created_at: row.createdAt.toISOString(),
    updated_at: row.updatedAt.toISOString(),
  };
}

export type EndpointDisable = {
  orgId: string;
  endpointId: string;
  /** Stored as disabled_reason; the queued deliveries fail with `endpoint disabled: <reason>`. */
  reason: string;
  actor: Actor;
  /** Only when every attempt has failed for longer than this (failing_since, by the database's clock). */
  failingForMs?: number;
  /** What caused it, kept in the audit row (e.g. the delivery and event of the attempt). */
  cause?: Record<string, unknown>;
};

/**
 * The one way an endpoint is disabled (a 410, failing for too long, an operator or the API), inside the
 * caller's transaction: the endpoint stops receiving, its queued deliveries fail, and an audit row and an
 * `endpoint.disabled` event commit with it. The event goes to the feed and to the organisation's other
 * enabled endpoints that subscribe, never to this one, which is already disabled when it is written.
 */
export function createEndpointDisabler() {
  const webhooks = createWebhooksRepository();
  const audit = createAuditWriter();
  const outbox = createOutboxRepository();

  return {
    /**
     * `disabled` is false when the endpoint was already disabled (or not failing long enough): nothing
     * is written then, so a disable seen twice records one event. Undefined when the endpoint is not found.
     */
    async disable(input: EndpointDisable, tx: Executor): Promise<{ endpoint: WebhookEndpointDto; disabled: boolean } | undefined> {
      const before = await webhooks.lockEndpoint(input.orgId, input.endpointId, tx);
      if (!before) return undefined;
      const row = await webhooks.disableEndpoint(input.orgId, input.endpointId, input.reason, tx, { failingForMs: input.failingForMs });
      if (!row) return { endpoint: toEndpointDto(before), disabled: false };
      await webhooks.failQueuedDeliveries(input.orgId, input.endpointId, `endpoint disabled: ${input.reason}`, tx);
      const endpoint = toEndpointDto(row);
      await audit.record(
        endpointChange(
          input.orgId,
          input.endpointId,
          input.actor,
          'webhook_endpoint.disabled',
          toEndpointDto(before),
          input.cause ? { ...endpoint, cause: input.cause } : endpoint,
        ),
        tx,
      );
      await outbox.record(
        { orgId: input.orgId, type: 'endpoint.disabled', customerId: null, customer: null, data: { endpoint, reason: input.reason } },
        tx,
      );
      return { endpoint, disabled: true };
    },
  };
}
export type EndpointDisabler = ReturnType<typeof createEndpointDisabler>;

function toAttemptDto(row: WebhookAttemptRecord): WebhookAttemptDto {
  return {
    attempt_number: row.attemptNumber,
    status_code: row.statusCode,
    latency_ms: row.latencyMs,
    error: row.error,
    worker_id: row.workerId,
    started_at: row.startedAt.toISOString(),
  };
}

function toDeliveryDto(row: WebhookDeliveryRecord, attempts: WebhookAttemptRecord[]): WebhookDeliveryDto {
  return {
    id: row.id,
    org_id: row.orgId,
    event_id: row.eventId,
    event_type: row.eventType,
    endpoint_id: row.endpointId,
    endpoint_url: row.endpointUrl,
    status: row.status,
    attempt_count: row.attempts,
    next_attempt_at: row.status === 'pending' ? row.nextAttemptAt.toISOString() : null,
    last_status_code: row.lastStatusCode,
    last_error: row.lastError,
    created_at: row.createdAt.toISOString(),
    updated_at: row.updatedAt.toISOString(),
    attempts: attempts.filter((attempt) => attempt.deliveryId === row.id).map(toAttemptDto),
  };
}

/** A page size as the lists take it: 1 to 100, default 50. */
const pageLimit = (limit: number | undefined) => Math.min(100, Math.max(1, limit ?? 50));

/** Your note, trimmed; an empty one is no note. */
const note = (description: string | null | undefined) => (description ? description : null);

const sameSet = (a: readonly string[], b: readonly string[]) => a.length === b.length && new Set([...a, ...b]).size === a.length;

function zodIssues(error: z.ZodError): Record<string, string[]> {
  const issues: Record<string, string[]> = {};
  for (const issue of error.issues) {
    const path = issue.path.filter((part) => typeof part !== 'number').join('.') || 'input';
    (issues[path] ??= []).push(issue.message);
  }
  return issues;
}

export type TestEventResult = {
  event: { id: string; type: string; created: string; data: Record<string, unknown> };
  delivery: WebhookDeliveryDto;
};

export function createWebhooksService(deps: {
  database: DataAccess;
  policy: WebhookTargetPolicy;
  resolveHost?: ResolveHost;
  cursorKey: CursorKey;
  webhooks: WebhooksRepository;
  organisations: OrganisationsRepository;
  audit: AuditWriter;
  outbox: OutboxRepository;
  disabler: EndpointDisabler;
}) {
  const { database, cursorKey, policy, webhooks, organisations, audit, outbox, disabler } = deps;

  /** A write's own transaction, for callers other than a request (the operator's CLI). */
  const ownTransaction: OpenTransaction = (work) => database.transaction(work);

  async function requireOrg(orgId: string): Promise<void> {
    if (!isUuid(orgId) || !(await organisations.findById(orgId, database.db))) throw AppError.notFound('Organisation');
  }

  /** Deliveries and their attempts read from one snapshot, so a delivery settling meanwhile is seen whole. */
  const snapshot = <T>(work: (tx: Tx) => Promise<T>) =>
    database.transaction(work, { isolationLevel: 'repeatable read', accessMode: 'read only' });

  /**
   * The URL as stored, after the same checks as at registration (scheme, port, public address). A
   * refusal based on DNS is the one generic message (NOT_A_PUBLIC_HOST) for an API key; the operator's
   * CLI, which runs on the service's own hosts and database anyway, is told what the name resolved to.
   */
  async function checkedUrl(url: string, actor: Actor): Promise<string> {
    const checked = parseEndpointUrl(url, policy);
    if ('problem' in checked) throw AppError.field('url', checked.problem);
    try {
      await assertDeliverableTarget(checked.url, policy, deps.resolveHost);
    } catch (error) {
      if (error instanceof UnsafeWebhookTargetError) throw AppError.field('url', actor.type === 'operator' ? error.detail : error.message);
      throw error;
    }
    return checked.url.toString();
  }

  /**
   * The organisation an endpoint is looked up in: the caller's (the API, or an operator naming it),
   * or for an operator who did not, the endpoint's own. Undefined when it cannot exist.
   */
  async function endpointOrg(id: string, orgId: string | undefined): Promise<string | undefined> {
    if (!isUuid(id)) return undefined;
    if (orgId !== undefined) return isUuid(orgId) ? orgId : undefined;
    return (await webhooks.findEndpointById(id, database.db))?.orgId;
  }

  /** The endpoint, locked for the rest of the transaction; another organisation's is not found. */
  async function lockEndpoint(id: string, orgId: string | undefined, tx: Tx): Promise<WebhookEndpointRecord> {
    const org = await endpointOrg(id, orgId);
    const row = org ? await webhooks.findEndpoint(org, id, tx, { forUpdate: true }) : undefined;
    if (!row) throw AppError.notFound('Webhook endpoint');
    return row;
  }

  /**
   * Disables an endpoint inside the caller's transaction through the one disabler (queued deliveries fail, an endpoint.disabled event).
   * Every way an endpoint gets disabled by a person (CLI, PATCH enabled:false) goes through here.
   */
  async function disableWithin(existing: WebhookEndpointRecord, reason: string, actor: Actor, tx: Tx): Promise<WebhookEndpointDto> {
    const outcome = await disabler.disable({ orgId: existing.orgId, endpointId: existing.id, reason, actor }, tx);
    if (!outcome) throw AppError.notFound('Webhook endpoint');
    return outcome.endpoint;
  }

  return {
    /** Registers an endpoint; its signing secret is returned here and never again. */
    async addEndpoint(
      input: AddEndpointInput,
      actor: Actor = SYSTEM_ACTOR,
      transaction: OpenTransaction = ownTransaction,
    ): Promise<WebhookEndpointDto & { secret: string }> {
      const parsed = addEndpointInput.safeParse(input);
      if (!parsed.success) throw AppError.validation(zodIssues(parsed.error));
      const checked = parseEndpointUrl(parsed.data.url, policy);
      if ('problem' in checked) throw AppError.field('url', checked.problem);
      await requireOrg(parsed.data.orgId);
      const url = await checkedUrl(parsed.data.url, actor);
      const secret = generateWebhookSecret();
      return transaction(async (tx) => {
        const row = await webhooks.insertEndpoint(
          {
            orgId: parsed.data.orgId,
            url,
            secret,
            eventTypes: [...new Set(parsed.data.events ?? [])],
            description: note(parsed.data.description),
            enabled: parsed.data.enabled ?? true,
            skipImportRows: parsed.data.skipImportRows ?? false,
          },
          tx,
        );
        const dto = toEndpointDto(row);
        await audit.record(endpointChange(row.orgId, row.id, actor, 'webhook_endpoint.created', null, dto), tx);
        return { ...dto, secret };
      });
    },

    async listEndpoints(orgId: string): Promise<WebhookEndpointDto[]> {
      await requireOrg(orgId);
      return (await webhooks.listEndpoints(orgId, database.db)).map(toEndpointDto);
    },

    /**
     * Stops deliveries to the endpoint; its queued deliveries fail with the reason and an
     * `endpoint.disabled` event is recorded. An endpoint already disabled is returned as it is.
     */
    async disableEndpoint(id: string, options: { orgId?: string; reason?: string; actor?: Actor } = {}): Promise<WebhookEndpointDto> {
      const reason = options.reason ?? 'disabled by an operator';
      return database.transaction(async (tx) =>
        disableWithin(await lockEndpoint(id, options.orgId, tx), reason, options.actor ?? SYSTEM_ACTOR, tx),
      );
    },

    /** One endpoint of the organisation, without its secret. */
    async getEndpoint(id: string, options: { orgId: string }): Promise<WebhookEndpointDto> {
      const org = await endpointOrg(id, options.orgId);
      const row = org ? await webhooks.findEndpoint(org, id, database.db) : undefined;
      if (!row) throw AppError.notFound('Webhook endpoint');
      return toEndpointDto(row);
    },

    /** The list envelope: ascending (created_at, id), with a cursor, as every list. No secrets. */
    async listEndpointsPage(orgId: string, query: ListPageQuery = {}): Promise<ListPage<WebhookEndpointDto>> {
      const limit = pageLimit(query.limit);
      const fingerprint = filterFingerprint({ list: 'webhook_endpoints' });
      const key = await cursorKey();
      const after = query.cursor ? decodeCursor(query.cursor, fingerprint, key) : undefined;
      const rows = await webhooks.listEndpointsPage(orgId, { after, limit: limit + 1 }, database.db);
      const page = rows.slice(0, limit);
      const last = page.at(-1);
      const hasMore = rows.length > limit;
      return {
        object: 'list',
        data: page.map(toEndpointDto),
        has_more: hasMore,
        next_cursor: hasMore && last ? encodeCursor(last, fingerprint, key) : null,
        limit,
      };
    },

    /**
     * Changes what is given and differs from what is stored; a request that changes nothing writes
     * nothing. `enabled: false` disables as disableEndpoint does (queued deliveries fail);
     * `enabled: true` enables again, clearing why it was disabled and how long it had been failing.
     */
    async updateEndpoint(
      id: string,
      input: UpdateEndpointInput,
      options: { orgId?: string; actor?: Actor; transaction?: OpenTransaction } = {},
    ): Promise<WebhookEndpointDto> {
      const parsed = updateEndpointInput.safeParse(input);
      if (!parsed.success) throw AppError.validation(zodIssues(parsed.error));
      const body = parsed.data;
      const actor = options.actor ?? SYSTEM_ACTOR;
      const url = body.url !== undefined ? await checkedUrl(body.url, actor) : undefined;
      return (options.transaction ?? ownTransaction)(async (tx) => {
        const existing = await lockEndpoint(id, options.orgId, tx);
        const changes: EndpointChanges = {};
        if (url !== undefined && url !== existing.url) changes.url = url;
        if (body.events !== undefined) {
          const events = [...new Set(body.events)];
          if (!sameSet(events, existing.eventTypes)) changes.eventTypes = events;
        }
        if (body.description !== undefined && note(body.description) !== existing.description) changes.description = note(body.description);
        if (body.skipImportRows !== undefined && body.skipImportRows !== existing.skipImportRows)
          changes.skipImportRows = body.skipImportRows;
        if (body.enabled === true && !existing.enabled) Object.assign(changes, { enabled: true, disabledReason: null, failingSince: null });

        let current = existing;
        if (Object.keys(changes).length > 0) {
          const row = await webhooks.updateEndpoint(existing.orgId, id, changes, tx);
          if (!row) throw AppError.notFound('Webhook endpoint');
          await audit.record(
            endpointChange(
              row.orgId,
              row.id,
              actor,
              changes.enabled ? 'webhook_endpoint.enabled' : 'webhook_endpoint.updated',
              toEndpointDto(existing),
              toEndpointDto(row),
            ),
            tx,
          );
          current = row;
        }
        if (body.enabled === false && existing.enabled) return disableWithin(current, 'disabled through the API', actor, tx);
        return toEndpointDto(current);
      });
    },

    /**
     * Deletes the endpoint with its delivery log (deliveries and attempts): its queued deliveries are
     * never sent. The events themselves stay in the organisation's feed.
     */
    async deleteEndpoint(
      id: string,
      options: { orgId?: string; actor?: Actor; transaction?: OpenTransaction } = {},
    ): Promise<DeletedEndpointDto> {
      return (options.transaction ?? ownTransaction)(async (tx) => {
        const existing = await lockEndpoint(id, options.orgId, tx);
        await webhooks.deleteEndpoint(existing.orgId, id, tx);
        await audit.record(
          endpointChange(existing.orgId, id, options.actor ?? SYSTEM_ACTOR, 'webhook_endpoint.deleted', toEndpointDto(existing), null),
          tx,
        );
        return { id, object: 'webhook_endpoint', deleted: true };
      });
    },

    /**
     * A new signing secret, returned here only. For the grace period (default 24 h) deliveries carry
     * signatures by both; rotating again within it drops the older secret at once.
     */
    async rotateSecret(
      id: string,
      options: { orgId?: string; gracePeriodSeconds?: number; actor?: Actor; transaction?: OpenTransaction } = {},
    ): Promise<WebhookEndpointDto & { secret: string }> {
      const parsed = rotateSecretBody.safeParse({ grace_period_seconds: options.gracePeriodSeconds });
      if (!parsed.success) throw AppError.validation(zodIssues(parsed.error));
      const grace = parsed.data?.grace_period_seconds ?? DEFAULT_GRACE_PERIOD_SECONDS;
      const secret = generateWebhookSecret();
      return (options.transaction ?? ownTransaction)(async (tx) => {
        const existing = await lockEndpoint(id, options.orgId, tx);
        const row = await webhooks.rotateSecret(existing.orgId, id, secret, grace, tx);
        if (!row) throw AppError.notFound('Webhook endpoint');
        const dto = toEndpointDto(row);
        await audit.record(
          endpointChange(row.orgId, row.id, options.actor ?? SYSTEM_ACTOR, 'webhook_endpoint.secret_rotated', toEndpointDto(existing), {
            ...dto,
            grace_period_seconds: grace,
          }),
          tx,
        );
        return { ...dto, secret };
      });
    },

    /**
     * Sends a `webhook.test` event to this endpoint only, subscribed to it or not, through the outbox
     * like any event. A disabled endpoint receives nothing: 409.
     */
    async sendTestEventTo(id: string, options: { orgId: string; actor?: Actor; transaction?: OpenTransaction }): Promise<TestEventResult> {
      return (options.transaction ?? ownTransaction)(async (tx) => {
        const endpoint = await lockEndpoint(id, options.orgId, tx);
        if (!endpoint.enabled)
          throw AppError.conflict('This endpoint is disabled; enable it (PATCH enabled: true) to send it a test event.');
        const eventId = await outbox.record(
          { orgId: endpoint.orgId, type: 'webhook.test', customerId: null, customer: null, data: { endpoint_id: id }, endpointId: id },
          tx,
        );
        const event = await webhooks.findEvent(endpoint.orgId, eventId, tx);
        const delivery = await webhooks.findDeliveryOfEvent(endpoint.orgId, eventId, id, tx);
        if (!event || !delivery) throw new Error(`the test event ${eventId} was not queued for endpoint ${id}`);
        await audit.record(
          endpointChange(endpoint.orgId, id, options.actor ?? SYSTEM_ACTOR, 'webhook_endpoint.test_sent', null, {
            event_id: eventId,
            delivery_id: delivery.id,
          }),
          tx,
        );
        return { event: JSON.parse(event.payload) as TestEventResult['event'], delivery: toDeliveryDto(delivery, []) };
      });
    },

    /** The endpoint's deliveries, newest first, each with its attempts; cursor paged. */
    async listEndpointDeliveries(
      id: string,
      query: ListEndpointDeliveriesQuery,
      options: { orgId: string },
    ): Promise<ListPage<WebhookDeliveryDto>> {
      const limit = pageLimit(query.limit);
      const fingerprint = filterFingerprint({ list: 'webhook_deliveries', endpoint: id, status: query.status ?? null });
      const key = await cursorKey();
      const before = query.cursor ? decodeCursor(query.cursor, fingerprint, key) : undefined;
      const org = await endpointOrg(id, options.orgId);
      return snapshot(async (tx) => {
        if (!org || !(await webhooks.findEndpoint(org, id, tx))) throw AppError.notFound('Webhook endpoint');
        const rows = await webhooks.listEndpointDeliveries(org, id, { status: query.status, before, limit: limit + 1 }, tx);
        const page = rows.slice(0, limit);
        const attempts = await webhooks.attemptsOf(
          org,
          page.map((row) => row.id),
          tx,
        );
        const last = page.at(-1);
        const hasMore = rows.length > limit;
        return {
          object: 'list' as const,
          data: page.map((row) => toDeliveryDto(row, attempts)),
          has_more: hasMore,
          next_cursor: hasMore && last ? encodeCursor(last, fingerprint, key) : null,
          limit,
        };
      });
    },

    /** Newest first, each with its attempts (status code, latency, error). */
    async listDeliveries(input: ListDeliveriesInput): Promise<WebhookDeliveryDto[]> {
      const parsed = listDeliveriesInput.safeParse(input);
      if (!parsed.success) throw AppError.validation(zodIssues(parsed.error));
      const { orgId, eventId, status, limit } = parsed.data;
      await requireOrg(orgId);
      if (eventId !== undefined && !isUuid(eventId)) throw AppError.field('eventId', 'Must be an event id (UUID).');
      return snapshot(async (tx) => {
        const rows = await webhooks.listDeliveries(orgId, { eventId, status, limit }, tx);
        const attempts = await webhooks.attemptsOf(
          orgId,
          rows.map((row) => row.id),
          tx,
        );
        return rows.map((row) => toDeliveryDto(row, attempts));
      });
    },

    /**
     * Sends a delivery again: a queued one becomes due now; a settled one (succeeded or failed) gets a
     * new pending delivery of the same event to the same endpoint, so the history stays intact. Either
     * way the receiver sees the same event id.
     */
    async resendDelivery(
      id: string,
      options: { orgId?: string; actor?: Actor; transaction?: OpenTransaction } = {},
    ): Promise<WebhookDeliveryDto & { resent_from: string | null }> {
      // The caller's organisation when known (the API); an operator naming only the delivery gets its own.
      const orgId = !isUuid(id)
        ? undefined
        : options.orgId !== undefined
          ? isUuid(options.orgId)
            ? options.orgId
            : undefined
          : await webhooks.findDeliveryOrg(id, database.db);
      if (!orgId) throw AppError.notFound('Delivery');
      // The reply is read in the transaction: under an Idempotency-Key it commits only after the reply is stored.
      const resent = await (options.transaction ?? ownTransaction)(async (tx) => {
        const delivery = await webhooks.findDelivery(orgId, id, tx);
        if (!delivery) throw AppError.notFound('Delivery');
        const endpoint = await webhooks.findEndpoint(orgId, delivery.endpointId, tx);
        if (!endpoint?.enabled) {
          throw AppError.conflict('The endpoint of this delivery is disabled; add a new endpoint to receive events again.');
        }
        let target = id;
        if (delivery.status === 'pending') {
          await webhooks.makeDue(orgId, id, tx);
        } else {
          target = await webhooks.insertDelivery(orgId, delivery.eventId, delivery.endpointId, tx);
        }
        await audit.record(
          {
            orgId,
            actor: options.actor ?? SYSTEM_ACTOR,
            action: 'webhook_delivery.resent',
            subjectType: 'webhook_delivery',
            subjectId: target,
            before: { delivery_id: id, status: delivery.status },
            after: { delivery_id: target, status: 'pending' },
          },
          tx,
        );
        webhooks.notifyWorkers(tx);
        const row = await webhooks.findDelivery(orgId, target, tx);
        return { ...toDeliveryDto(row!, await webhooks.attemptsOf(orgId, [target], tx)), resent_from: target === id ? null : id };
      });
      return resent;
    },

    /** Emits a `webhook.test` event through the outbox to every enabled endpoint of the organisation. */
    async sendTestEvent(orgId: string, actor: Actor = SYSTEM_ACTOR): Promise<{ event: unknown; deliveries: WebhookDeliveryDto[] }> {
      await requireOrg(orgId);
      const eventId = await database.transaction(async (tx) => {
        const id = await outbox.record({ orgId, type: 'webhook.test', customerId: null, customer: null }, tx);
        await audit.record(
          {
            orgId,
            actor,
            action: 'webhook.test_sent',
            subjectType: 'organisation',
            subjectId: orgId,
            before: null,
            after: { event_id: id },
          },
          tx,
        );
        return id;
      });
      const event = await webhooks.findEvent(orgId, eventId, database.db);
      const rows = await webhooks.listDeliveries(orgId, { eventId, limit: 1000 }, database.db);
      return { event: JSON.parse(event!.payload) as unknown, deliveries: rows.map((row) => toDeliveryDto(row, [])) };
    },
  };
}
