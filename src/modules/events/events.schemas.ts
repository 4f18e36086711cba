import { z } from 'zod';
import { feedEnvelope } from '../../shared/list-envelope.js';
import { createdBetweenParams, limitParam } from '../../shared/request-params.js';
import { FEED_EVENT_TYPES } from '../../shared/outbox.js';

const KNOWN_TYPES: ReadonlySet<string> = new Set(FEED_EVENT_TYPES);
const VALID_TYPES = `Valid types: ${FEED_EVENT_TYPES.join(', ')}.`;

/** `type`: a comma list of event types, as a sorted set (so `a,b` and `b,a` are the same walk). */
const typeList = z
  .string()
  .max(1024)
  .transform((value, context) => {
    const types = [...new Set(value.split(',').map((part) => part.trim()))].sort();
    const unknown = types.filter((type) => !KNOWN_TYPES.has(type));
    if (unknown.length > 0) {
      const named = unknown.map((type) => (type === '' ? '(empty)' : JSON.stringify(type))).join(', ');
      context.issues.push({ code: 'custom', message: `Unknown event type ${named}. ${VALID_TYPES}`, input: value });
      return z.NEVER;
    }
    return types;
  })
  .describe(`Only events of these types, comma-separated. ${VALID_TYPES}`)
  .meta({ example: 'customer.updated,customer.kyc_completed' });

export const listEventsQuery = z
  .object({
    limit: limitParam,
    cursor: z
      .string()
      .max(1024)
      .optional()
      .describe(
        'The resume_cursor (or next_cursor) of the previous page, with the same filters. Keep the last resume_cursor durably: it is where your next poll resumes.',
      ),
    type: typeList.optional(),
    customer_id: z
      .string()
      .min(1)
      .max(255)
      .optional()
      .describe('Only events about this customer or entity: its UUID or your external_id. Unknown → 404.')
      .meta({ example: 'crm-10442' }),
    ...createdBetweenParams,
  })
  .strict();
export type ListEventsQuery = z.output<typeof listEventsQuery>;

export const eventIdParams = z
  .object({ id: z.string().min(1).max(255).describe('The event id (the webhook-id / SVC-Event-Id of its deliveries).') })
  .strict();

export const eventSchema = z
  .object({
    id: z
      .uuid()
      .describe('The event id; the same as the webhook-id and SVC-Event-Id headers of its deliveries. Process events idempotently by it.'),
    type: z
      .string()
      .describe(`The event type: ${FEED_EVENT_TYPES.join(', ')}; later versions may add types, so ignore the ones you do not know.`)
      .meta({ example: 'customer.updated' }),
    created: z.string().describe('When the event was written (ISO 8601, UTC).').meta({ example: '2026-01-31T09:00:00.000Z' }),
    data: z
      .record(z.string(), z.unknown())
      .describe(
        'As in the webhook: {customer} (the public DTO of the record at the change) for record events, {endpoint} for endpoint.disabled, {document_request} for document_request.updated.',
      ),
  })
  .describe('An event: exactly the JSON document its webhook deliveries carry.');
export type EventDto = z.infer<typeof eventSchema>;

export const eventListSchema = feedEnvelope(eventSchema, 'in feed order (the order the events committed)');
export type EventList = z.infer<typeof eventListSchema>;
