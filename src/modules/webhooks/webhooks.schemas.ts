import { z } from 'zod';
import { limitParam } from '../../shared/request-params.js';
import { EVENT_TYPES } from '../../shared/outbox.js';

export const DELIVERY_STATUSES = ['pending', 'succeeded', 'failed'] as const;
export type DeliveryStatus = (typeof DELIVERY_STATUSES)[number];

export const addEndpointInput = z
  .object({
    orgId: z.string(),
    url: z.string(),
    /** Event types the endpoint receives; empty or absent means every type. */
    events: z.array(z.enum(EVENT_TYPES, { error: `Unknown event type. Valid: ${EVENT_TYPES.join(', ')}.` })).optional(),
    enabled: z.boolean().optional(),
    description: z.string().trim().max(500, 'At most 500 characters.').optional(),
    /** No deliveries of the events a bulk import's rows cause. */
    skipImportRows: z.boolean().optional(),
  })
  .strict();
export type AddEndpointInput = z.input<typeof addEndpointInput>;

export const listDeliveriesInput = z
  .object({
    orgId: z.string(),
    eventId: z.string().optional(),
    status: z.enum(DELIVERY_STATUSES, { error: `Must be one of ${DELIVERY_STATUSES.join(', ')}.` }).optional(),
    limit: z.number().int().min(1).max(1000).default(100),
  })
  .strict();
export type ListDeliveriesInput = z.input<typeof listDeliveriesInput>;

export type WebhookEndpointDto = {
  id: string;
  org_id: string;
  url: string;
  /** Empty means every event type. */
  events: string[];
  description: string | null;
  enabled: boolean;
  disabled_reason: string | null;
  /** No deliveries of the events a bulk import's rows cause (the feed keeps them). */
  skip_import_rows: boolean;
  /** Until when deliveries also carry the previous secret's signature (after a rotation); never the secret itself. */
  previous_secret_expires_at: string | null;
  created_at: string;
  updated_at: string;
};

export type WebhookAttemptDto = {
  attempt_number: number;
  status_code: number | null;
  latency_ms: number | null;
  error: string | null;
  worker_id: string | null;
  started_at: string;
};

export type WebhookDeliveryDto = {
  id: string;
  org_id: string;
  event_id: string;
  event_type: string;
  endpoint_id: string;
  endpoint_url: string;
  status: DeliveryStatus;
  attempt_count: number;
  next_attempt_at: string | null;
  last_status_code: number | null;
  last_error: string | null;
  created_at: string;
  updated_at: string;
  attempts: WebhookAttemptDto[];
};

// ------------------------------------------------------------------------------------------------
// API: /v1/webhook-endpoints, /v1/webhook-deliveries (the CLI takes the same rules through the service)
// ------------------------------------------------------------------------------------------------

export const MAX_DESCRIPTION_LENGTH = 500;
/** Seven days: long enough for a weekly deploy to pick up the new secret. */
const MAX_GRACE_PERIOD_SECONDS = 604_800;
export const DEFAULT_GRACE_PERIOD_SECONDS = 86_400;

const eventTypeList = z
  .array(z.enum(EVENT_TYPES, { error: `Unknown event type. Valid: ${EVENT_TYPES.join(', ')}.` }))
  .max(EVENT_TYPES.length * 4, 'Too many event types.');
const descriptionField = z.string().trim().max(MAX_DESCRIPTION_LENGTH, `At most ${MAX_DESCRIPTION_LENGTH} characters.`);
const urlField = z.string().min(1, 'Must not be empty.').max(2048, 'At most 2048 characters.');

export const createEndpointBody = z
  .object({
    url: urlField
      .describe('Where events are POSTed: https on port 443 (or a port the service allows) of a public address.')
      .meta({ example: 'https://crm.example.com/hooks/svc' }),
    events: eventTypeList
      .optional()
      .describe(`Event types the endpoint receives (${EVENT_TYPES.join(', ')}); empty or absent means every type.`)
      .meta({ example: ['customer.kyc_completed', 'customer.updated'] }),
    description: descriptionField.optional().describe('Your note about the endpoint.').meta({ example: 'CRM production' }),
    enabled: z.boolean().optional().describe('Default true; false registers it without receiving events yet.'),
    skipImportRows: z
      .boolean()
      .optional()
      .describe(
        "true: events caused by a bulk import's rows (customer.updated, …) are not delivered to this endpoint (import.completed still is); the events feed still has them. Default false.",
      ),
  })
  .strict();
export const updateEndpointInput = z
  .object({
    url: urlField.optional().describe('A new URL, checked as on create.').meta({ example: 'https://crm.example.com/hooks/v2' }),
    events: eventTypeList
      .optional()
      .describe('Replaces the event types; an empty list means every type.')
      .meta({ example: ['customer.updated'] }),
    enabled: z
      .boolean()
      .optional()
      .describe('false disables the endpoint (its queued deliveries fail); true enables it again and clears disabled_reason.'),
    description: descriptionField.nullable().optional().describe('Your note; null clears it.').meta({ example: 'CRM staging' }),
    skipImportRows: z
      .boolean()
      .optional()
      .describe(
        "true: events caused by a bulk import's rows (customer.updated, …) are not delivered to this endpoint (import.completed still is); the events feed still has them. Default false.",
      ),
  })
  .strict();
export type UpdateEndpointInput = z.infer<typeof updateEndpointInput>;

export const rotateSecretBody = z
  .object({
    grace_period_seconds: z
      .int({ error: 'Must be a whole number.' })
      .min(0, 'Must be 0 or more.')
      .max(MAX_GRACE_PERIOD_SECONDS, `At most ${MAX_GRACE_PERIOD_SECONDS} (7 days).`)
      .optional()
      .describe(
        `How long deliveries stay signed with the old secret too (default ${DEFAULT_GRACE_PERIOD_SECONDS}, 24 h; 0 stops it at once; at most ${MAX_GRACE_PERIOD_SECONDS}).`,
      )
      .meta({ example: 3600 }),
  })
  .strict()
  .nullish();
/** Nothing to send; a body, if any, must be empty (`{}`). */
export const emptyBody = z.object({}).strict().nullish().describe('No fields; send no body or {}.').meta({ example: {} });

export const endpointIdParams = z
  .object({ id: z.string().min(1).max(255).describe('The webhook endpoint id.').meta({ example: '7a1e2c44-0b5e-4f0e-9a53-2f6b1c9d8e10' }) })
  .strict();
export const deliveryIdParams = z
  .object({ id: z.string().min(1).max(255).describe('The delivery id.').meta({ example: '5c44e0d2-7b1a-4c8e-a1f2-3d4e5f60718a' }) })
  .strict();

const cursorParam = z.string().max(1024).optional().describe('Opaque next_cursor of the previous page.');

export const listEndpointsQuery = z.object({ limit: limitParam, cursor: cursorParam }).strict();
export type ListPageQuery = { limit?: number; cursor?: string };

export const listEndpointDeliveriesQuery = z
  .object({
    limit: limitParam,
    cursor: cursorParam,
    status: z
      .enum(DELIVERY_STATUSES, { error: `Must be one of ${DELIVERY_STATUSES.join(', ')}.` })
      .optional()
      .describe('Only deliveries in this status: pending (queued or retrying), succeeded, failed.'),
  })
  .strict();
export type ListEndpointDeliveriesQuery = z.infer<typeof listEndpointDeliveriesQuery>;

const dateTime = z.string().describe('ISO 8601 date-time (UTC).').meta({ example: '2026-01-31T09:00:00.000Z' });

export const endpointSchema = z
  .object({
    id: z.uuid().describe('The endpoint id.'),
    org_id: z.uuid().describe('Your organisation.'),
    url: z.string().describe('Where events are POSTed.').meta({ example: 'https://crm.example.com/hooks/svc' }),
    events: z
      .array(z.string())
      .describe('Subscribed event types; empty means every type.')
      .meta({ example: ['customer.updated'] }),
    description: z.string().nullable().describe('Your note about the endpoint.').meta({ example: 'CRM production' }),
    enabled: z.boolean().describe('Whether events are delivered to it.'),
    disabled_reason: z.string().nullable().describe('Why it was disabled (by you, an operator, a 410 answer or 3 days of failures).'),
    skip_import_rows: z
      .boolean()
      .describe(
        "true: no deliveries of the events a bulk import's rows cause (import.completed still comes); the events feed still has them.",
      ),
    previous_secret_expires_at: dateTime
      .nullable()
      .describe(
        'After a rotation: until when deliveries also carry a signature made with the previous secret; null when only the current secret signs.',
      ),
    created_at: dateTime.describe('When the endpoint was registered.'),
    updated_at: dateTime.describe('When it last changed.'),
  })
  .describe('A webhook endpoint. Its signing secret is never shown here.')
  .meta({
    example: {
      id: '7a1e2c44-0b5e-4f0e-9a53-2f6b1c9d8e10',
      org_id: '3f0c9a1e-5b7d-4c2e-8f10-2a3b4c5d6e7f',
      url: 'https://crm.example.com/hooks/svc',
      events: ['customer.updated'],
      description: 'CRM production',
      enabled: true,
      disabled_reason: null,
      skip_import_rows: false,
      previous_secret_expires_at: null,
      created_at: '2026-01-31T09:00:00.000Z',
      updated_at: '2026-01-31T09:00:00.000Z',
    },
  });

export const endpointWithSecretSchema = endpointSchema
  .extend({
    secret: z
      .string()
      .describe('The Standard Webhooks signing secret (whsec_…). Shown only in this response: store it now.')
      .meta({ example: 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw' }),
  })
  .describe('A webhook endpoint with its signing secret, shown on create and on rotate only.')
  .meta({
    example: {
      id: '7a1e2c44-0b5e-4f0e-9a53-2f6b1c9d8e10',
      org_id: '3f0c9a1e-5b7d-4c2e-8f10-2a3b4c5d6e7f',
      url: 'https://crm.example.com/hooks/svc',
      events: ['customer.updated'],
      description: 'CRM production',
      enabled: true,
      disabled_reason: null,
      previous_secret_expires_at: '2026-02-01T09:00:00.000Z',
      created_at: '2026-01-31T09:00:00.000Z',
      updated_at: '2026-01-31T09:00:00.000Z',
      secret: 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw',
    },
  });

export const deletedEndpointSchema = z
  .object({
    id: z.uuid().describe('The deleted endpoint.'),
    object: z.literal('webhook_endpoint').describe('Always webhook_endpoint.'),
    deleted: z.literal(true).describe('Always true.'),
  })
  .describe('The endpoint is gone, with its delivery log; its events stay in GET /events.')
  .meta({ example: { id: '7a1e2c44-0b5e-4f0e-9a53-2f6b1c9d8e10', object: 'webhook_endpoint', deleted: true } });
export type DeletedEndpointDto = z.infer<typeof deletedEndpointSchema>;

const attemptSchema = z
  .object({
    attempt_number: z.int().describe('1 for the first attempt of the delivery.'),
    status_code: z
      .int()
      .nullable()
      .describe('The HTTP status your endpoint answered; null when none arrived (timeout, connection refused).'),
    latency_ms: z
      .int()
      .nullable()
      .describe('How long the attempt took, from sending the request to the end of the answer, in milliseconds.'),
    error: z.string().nullable().describe('Why the attempt failed; null on success.').meta({ example: 'HTTP 503' }),
    worker_id: z.string().nullable().describe('Which delivery worker made the attempt (for support).'),
    started_at: dateTime.describe('When the attempt started.'),
  })
  .describe('One HTTP attempt of a delivery.');

export const deliverySchema = z
  .object({
    id: z.uuid().describe('The delivery id.'),
    org_id: z.uuid().describe('Your organisation.'),
    event_id: z.uuid().describe('The event delivered (the SVC-Event-Id and webhook-id headers).'),
    event_type: z.string().describe('The event type.').meta({ example: 'customer.updated' }),
    endpoint_id: z.uuid().describe('The endpoint it goes to.'),
    endpoint_url: z.string().describe('The endpoint URL now.'),
    status: z
      .enum(DELIVERY_STATUSES)
      .describe('pending (queued or waiting for a retry), succeeded or failed (gave up, or the endpoint was disabled).'),
    attempt_count: z.int().describe('Attempts made so far.'),
    next_attempt_at: dateTime.nullable().describe('When the next attempt is due; null once settled.'),
    last_status_code: z.int().nullable().describe('Status code of the latest attempt that got an answer.'),
    last_error: z.string().nullable().describe('Error of the latest attempt, or why the delivery failed.'),
    created_at: dateTime.describe('When the delivery was queued.'),
    updated_at: dateTime.describe('When it last changed.'),
    attempts: z.array(attemptSchema).describe('Every attempt, oldest first.'),
  })
  .describe('A delivery of one event to one endpoint, with its attempts.')
  .meta({
    example: {
      id: '5c44e0d2-7b1a-4c8e-a1f2-3d4e5f60718a',
      org_id: '3f0c9a1e-5b7d-4c2e-8f10-2a3b4c5d6e7f',
      event_id: '1d7a5e3c-2b4f-4a6e-9c8d-0e1f2a3b4c5d',
      event_type: 'customer.updated',
      endpoint_id: '7a1e2c44-0b5e-4f0e-9a53-2f6b1c9d8e10',
      endpoint_url: 'https://crm.example.com/hooks/svc',
      status: 'succeeded',
      attempt_count: 2,
      next_attempt_at: null,
      last_status_code: 200,
      last_error: null,
      created_at: '2026-01-31T09:00:00.000Z',
      updated_at: '2026-01-31T09:00:31.000Z',
      attempts: [
        {
          attempt_number: 1,
          status_code: 503,
          latency_ms: 120,
          error: 'HTTP 503',
          worker_id: 'api-1:41:ab12cd34',
          started_at: '2026-01-31T09:00:00.100Z',
        },
        {
          attempt_number: 2,
          status_code: 200,
          latency_ms: 85,
          error: null,
          worker_id: 'api-1:41:ab12cd34',
          started_at: '2026-01-31T09:00:30.900Z',
        },
      ],
    },
  });

export const retriedDeliverySchema = deliverySchema
  .extend({
    resent_from: z
      .uuid()
      .nullable()
      .describe(
        'The settled delivery this one repeats (a new delivery of the same event); null when the queued delivery itself was made due now.',
      ),
  })
  .describe('The delivery that will make the next attempt.');

const webhookEventSchema = z
  .object({
    id: z.uuid().describe('The event id, the same in every delivery of it.'),
    type: z.string().describe('The event type.').meta({ example: 'webhook.test' }),
    created: dateTime.describe('When the event was recorded.'),
    data: z.record(z.string(), z.unknown()).describe('The event data: for webhook.test sent to one endpoint, {endpoint_id}.'),
  })
  .describe('The event envelope exactly as delivered.');

export const testEventResultSchema = z
  .object({
    event: webhookEventSchema,
    delivery: deliverySchema,
  })
  .describe('The webhook.test event and its delivery, queued for this endpoint only.')
  .meta({
    example: {
      event: {
        id: '1d7a5e3c-2b4f-4a6e-9c8d-0e1f2a3b4c5d',
        type: 'webhook.test',
        created: '2026-01-31T09:00:00.000Z',
        data: { endpoint_id: '7a1e2c44-0b5e-4f0e-9a53-2f6b1c9d8e10' },
      },
      delivery: {
        id: '5c44e0d2-7b1a-4c8e-a1f2-3d4e5f60718a',
        org_id: '3f0c9a1e-5b7d-4c2e-8f10-2a3b4c5d6e7f',
        event_id: '1d7a5e3c-2b4f-4a6e-9c8d-0e1f2a3b4c5d',
        event_type: 'webhook.test',
        endpoint_id: '7a1e2c44-0b5e-4f0e-9a53-2f6b1c9d8e10',
        endpoint_url: 'https://crm.example.com/hooks/svc',
        status: 'pending',
        attempt_count: 0,
        next_attempt_at: '2026-01-31T09:00:00.000Z',
        last_status_code: null,
        last_error: null,
        created_at: '2026-01-31T09:00:00.000Z',
        updated_at: '2026-01-31T09:00:00.000Z',
        attempts: [],
      },
    },
  });
