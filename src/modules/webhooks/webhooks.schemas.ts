import { z } from 'zod';
import { EVENT_TYPES } from './outbox.repository.js';

export const DELIVERY_STATUSES = ['pending', 'succeeded', 'failed'] as const;
export type DeliveryStatus = (typeof DELIVERY_STATUSES)[number];

export const addEndpointInput = z
  .object({
    orgId: z.string(),
    url: z.string(),
    /** Event types the endpoint receives; empty or absent means every type. */
    events: z
      .array(z.enum(EVENT_TYPES, { error: `Unknown event type. Valid: ${EVENT_TYPES.join(', ')}.` }))
      .optional(),
    enabled: z.boolean().optional(),
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
  enabled: boolean;
  disabled_reason: string | null;
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
