import { z } from 'zod';
import { feedEnvelope } from '../../shared/list-envelope.js';
import { createdBetweenParams, limitParam } from '../../shared/request-params.js';

/** `action`: a comma list of actions, as a sorted set (so `a,b` and `b,a` are the same walk). */
const actionList = z
  .string()
  .max(1024)
  .transform((value, context) => {
    const actions = [...new Set(value.split(',').map((part) => part.trim()))].sort();
    if (actions.some((action) => !/^[a-z0-9_.]{1,100}$/.test(action))) {
      context.issues.push({
        code: 'custom',
        message: 'Must be a comma-separated list of actions such as customer.created (lower case, digits, _ and .).',
        input: value,
      });
      return z.NEVER;
    }
    return actions;
  })
  .describe(
    'Only events with one of these actions, comma-separated (e.g. customer.created,api_key.revoked). An action no event has matches nothing.',
  )
  .meta({ example: 'customer.created,customer.updated' });

export const listAuditEventsQuery = z
  .object({
    limit: limitParam,
    cursor: z
      .string()
      .max(1024)
      .optional()
      .describe(
        'The resume_cursor (or next_cursor) of the previous page, with the same filters. Keep the last resume_cursor: polling with it later returns only newer events.',
      ),
    subject_id: z
      .string()
      .min(1)
      .max(255)
      .optional()
      .describe(
        'Only events about this subject: the UUID of a customer, entity, group, API key (or any subject an event names), or a customer or entity external_id. Unknown in your organisation → 404.',
      )
      .meta({ example: 'crm-10442' }),
    actor: z
      .string()
      .min(1)
      .max(255)
      .optional()
      .describe(
        "Only events by this actor: an API key id of your organisation, `operator` (the operator CLI), `system` (the service itself) or `contact` (an entity's contact on a document request's upload page). An unknown key id → 404.",
      )
      .meta({ example: 'operator' }),
    action: actionList.optional(),
    ...createdBetweenParams,
  })
  .strict();
export type ListAuditEventsQuery = z.output<typeof listAuditEventsQuery>;

const changeSchema = z
  .object({
    old: z.unknown().describe('The value before the change; null when the field was absent (e.g. on creation).'),
    new: z.unknown().describe('The value after the change; null when the field was removed.'),
  })
  .describe('One changed field.');

const auditEventSchema = z
  .object({
    id: z
      .string()
      .describe(
        "The audit event id (decimal digits): numbered within your organisation, the same number as sequence, so it tells nothing of other organisations' activity; never reused.",
      )
      .meta({ example: '1042' }),
    sequence: z
      .number()
      .int()
      .describe("The event's place in your organisation's hash chain: 1, 2, 3… in the order the changes committed, never reused.")
      .meta({ example: 1042 }),
    created_at: z.string().describe('When the change was written (ISO 8601, UTC).').meta({ example: '2026-01-31T09:00:00.000Z' }),
    actor: z
      .object({
        type: z
          .enum(['api_key', 'operator', 'system', 'contact'])
          .describe(
            "api_key: a request with one of your keys; operator: the operator CLI; system: the service itself; contact: the entity's contact, through a document request's upload link.",
          ),
        id: z
          .string()
          .nullable()
          .describe('The API key id, the operator (cli:<user>), the document request id for a contact, or null for the system.')
          .meta({ example: '0b6f2c1e-3a4d-4e5f-8a9b-1c2d3e4f5a6b' }),
        key_label: z
          .string()
          .nullable()
          .describe("The API key's label at the time of reading; null for other actors or an unlabelled key."),
      })
      .describe('Who made the change.'),
    action: z.string().describe('What happened.').meta({ example: 'customer.updated' }),
    subject: z
      .object({
        type: z
          .string()
          .describe('The kind of record changed: customer, entity, group, api_key, webhook_endpoint, organisation, …')
          .meta({ example: 'customer' }),
        id: z.string().nullable().describe('Its id.'),
      })
      .describe('What was changed.'),
    changes: z
      .record(z.string(), changeSchema)
      .describe(
        'The fields whose value changed, each with its old and new value, as stored (personal data included; secrets are never stored).',
      )
      .meta({ example: { email: { old: 'jane@example.com', new: 'jane.citizen@example.com' } } }),
    request_id: z.string().nullable().describe('The X-Request-Id of the API request that made the change; null outside the API.'),
    idempotency_key: z.string().nullable().describe('The Idempotency-Key of that request, when it had one.'),
  })
  .describe('An audit event: one recorded change, sealed into the organisation\u2019s hash chain.');
export type AuditEventDto = z.infer<typeof auditEventSchema>;

export const auditEventListSchema = feedEnvelope(auditEventSchema, 'ascending by sequence (the order the changes committed)');
export type AuditEventList = z.infer<typeof auditEventListSchema>;
