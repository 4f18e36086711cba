import { randomBytes } from 'node:crypto';
import { z } from 'zod';
import type { Database, Executor, Tx } from '../../db/client.js';
import { AppError } from '../../shared/app-error.js';
import { isUuid } from '../../shared/ids.js';
import { createAuditRepository, type Actor } from '../audit/audit.repository.js';
import { createOrganisationsRepository } from '../organisations/organisations.repository.js';
import { assertDeliverableTarget, parseEndpointUrl, UnsafeWebhookTargetError, type ResolveHost, type WebhookTargetPolicy } from './endpoint-url.js';
import { createOutboxRepository } from './outbox.repository.js';
import {
  createWebhooksRepository,
  type WebhookAttemptRecord,
  type WebhookDeliveryRecord,
  type WebhookEndpointRecord,
} from './webhooks.repository.js';
import {
  addEndpointInput,
  listDeliveriesInput,
  type AddEndpointInput,
  type ListDeliveriesInput,
  type WebhookAttemptDto,
  type WebhookDeliveryDto,
  type WebhookEndpointDto,
} from './webhooks.schemas.js';

const SYSTEM_ACTOR: Actor = { type: 'system', id: null };

/** Standard Webhooks secret: `whsec_` + base64 of 32 random bytes (the HMAC key). */
export function generateWebhookSecret(): string {
  return `whsec_${randomBytes(32).toString('base64')}`;
}

export function toEndpointDto(row: WebhookEndpointRecord): WebhookEndpointDto {
  return {
    id: row.id,
    org_id: row.orgId,
    url: row.url,
    events: row.eventTypes,
    enabled: row.enabled,
    disabled_reason: row.disabledReason,
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
export function createEndpointDisabler(db: Executor) {
  const webhooks = createWebhooksRepository(db);
  const audit = createAuditRepository(db);
  const outbox = createOutboxRepository(db);

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
        {
          orgId: input.orgId,
          actor: input.actor,
          action: 'webhook_endpoint.disabled',
          subjectType: 'webhook_endpoint',
          subjectId: input.endpointId,
          before: toEndpointDto(before),
          after: input.cause ? { ...endpoint, cause: input.cause } : endpoint,
        },
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

function zodIssues(error: z.ZodError): Record<string, string[]> {
  const issues: Record<string, string[]> = {};
  for (const issue of error.issues) {
    const path = issue.path.filter((part) => typeof part !== 'number').join('.') || 'input';
    (issues[path] ??= []).push(issue.message);
  }
  return issues;
}

export function createWebhooksService(deps: { database: Database; resolveHost?: ResolveHost } & WebhookTargetPolicy) {
  const { database } = deps;
  const policy: WebhookTargetPolicy = { allowPrivateUrls: deps.allowPrivateUrls, allowedPorts: deps.allowedPorts };
  const webhooks = createWebhooksRepository(database.db);
  const organisations = createOrganisationsRepository(database.db);
  const audit = createAuditRepository(database.db);
  const outbox = createOutboxRepository(database.db);
  const disabler = createEndpointDisabler(database.db);

  async function requireOrg(orgId: string): Promise<void> {
    if (!isUuid(orgId) || !(await organisations.findById(orgId))) throw AppError.notFound('Organisation');
  }

  /** Deliveries and their attempts read from one snapshot, so a delivery settling meanwhile is seen whole. */
  const snapshot = <T>(work: (tx: Tx) => Promise<T>) =>
    database.transaction(work, { isolationLevel: 'repeatable read', accessMode: 'read only' });

  async function deliveryDto(orgId: string, id: string): Promise<WebhookDeliveryDto> {
    return snapshot(async (tx) => {
      const row = await webhooks.findDelivery(orgId, id, tx);
      if (!row) throw AppError.notFound('Delivery');
      return toDeliveryDto(row, await webhooks.attemptsOf(orgId, [id], tx));
    });
  }

  return {
    /** Registers an endpoint; its signing secret is returned here and never again. */
    async addEndpoint(input: AddEndpointInput, actor: Actor = SYSTEM_ACTOR): Promise<WebhookEndpointDto & { secret: string }> {
      const parsed = addEndpointInput.safeParse(input);
      if (!parsed.success) throw AppError.validation(zodIssues(parsed.error));
      const checked = parseEndpointUrl(parsed.data.url, policy);
      if ('problem' in checked) throw AppError.field('url', checked.problem);
      await requireOrg(parsed.data.orgId);
      try {
        await assertDeliverableTarget(checked.url, policy, deps.resolveHost);
      } catch (error) {
        if (error instanceof UnsafeWebhookTargetError) throw AppError.field('url', error.message);
        throw error;
      }
      const secret = generateWebhookSecret();
      return database.transaction(async (tx) => {
        const row = await webhooks.insertEndpoint(
          {
            orgId: parsed.data.orgId,
            url: checked.url.toString(),
            secret,
            eventTypes: [...new Set(parsed.data.events ?? [])],
            enabled: parsed.data.enabled ?? true,
          },
          tx,
        );
        const dto = toEndpointDto(row);
        await audit.record(
          { orgId: row.orgId, actor, action: 'webhook_endpoint.created', subjectType: 'webhook_endpoint', subjectId: row.id, before: null, after: dto },
          tx,
        );
        return { ...dto, secret };
      });
    },

    async listEndpoints(orgId: string): Promise<WebhookEndpointDto[]> {
      await requireOrg(orgId);
      return (await webhooks.listEndpoints(orgId)).map(toEndpointDto);
    },

    /**
     * Stops deliveries to the endpoint; its queued deliveries fail with the reason and an
     * `endpoint.disabled` event is recorded. An endpoint already disabled is returned as it is.
     */
    async disableEndpoint(
      id: string,
      options: { orgId?: string; reason?: string; actor?: Actor } = {},
    ): Promise<WebhookEndpointDto> {
      const existing = isUuid(id) ? await webhooks.findEndpointById(id) : undefined;
      if (!existing || (options.orgId !== undefined && existing.orgId !== options.orgId)) throw AppError.notFound('Webhook endpoint');
      const reason = options.reason ?? 'disabled by an operator';
      return database.transaction(async (tx) => {
        const outcome = await disabler.disable({ orgId: existing.orgId, endpointId: id, reason, actor: options.actor ?? SYSTEM_ACTOR }, tx);
        if (!outcome) throw AppError.notFound('Webhook endpoint');
        return outcome.endpoint;
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
        const attempts = await webhooks.attemptsOf(orgId, rows.map((row) => row.id), tx);
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
      options: { orgId?: string; actor?: Actor } = {},
    ): Promise<WebhookDeliveryDto & { resent_from: string | null }> {
      const orgId = isUuid(id) ? await webhooks.findDeliveryOrg(id) : undefined;
      if (!orgId || (options.orgId !== undefined && orgId !== options.orgId)) throw AppError.notFound('Delivery');
      const deliveryId = await database.transaction(async (tx) => {
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
        return target;
      });
      return { ...(await deliveryDto(orgId, deliveryId)), resent_from: deliveryId === id ? null : id };
    },

    /** Emits a `webhook.test` event through the outbox to every enabled endpoint of the organisation. */
    async sendTestEvent(orgId: string): Promise<{ event: unknown; deliveries: WebhookDeliveryDto[] }> {
      await requireOrg(orgId);
      const eventId = await database.transaction((tx) =>
        outbox.record({ orgId, type: 'webhook.test', customerId: null, customer: null }, tx),
      );
      const event = await webhooks.findEvent(orgId, eventId);
      const rows = await webhooks.listDeliveries(orgId, { eventId, limit: 1000 });
      return { event: JSON.parse(event!.payload) as unknown, deliveries: rows.map((row) => toDeliveryDto(row, [])) };
    },
  };
}
export type WebhooksService = ReturnType<typeof createWebhooksService>;
