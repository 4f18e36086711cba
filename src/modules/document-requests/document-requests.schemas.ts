import { z } from 'zod';
import { dateTimeSchema } from '../../shared/dates.schema.js';
import { DOCUMENT_TYPE_CODES } from '../documents/document-types.js';

/** How far ahead a request may be due: a link that stays open longer is a standing credential. */
export const MAX_DUE_DAYS = 365;
/** When no dueAt is given, the contact has this long. */
export const DEFAULT_DUE_DAYS = 14;
/** The most documents one request can receive, whatever the contact sends. */
export const MAX_DOCUMENTS_PER_REQUEST = 20;

const documentType = z.enum(DOCUMENT_TYPE_CODES, { error: `Unknown document type. Valid: ${DOCUMENT_TYPE_CODES.join(', ')}.` });

export const createDocumentRequestBody = z
  .object({
    types: z
      .array(documentType)
      .min(1, 'Name at least one document type.')
      .max(DOCUMENT_TYPE_CODES.length * 4, 'Too many types.')
      .describe('Document type codes (GET /v1/document-types) the contact is asked for; duplicates count once.')
      .meta({ example: ['CERTIFICATE_OF_REGISTRATION', 'ID_OF_OFFICEHOLDER'] }),
    message: z
      .string()
      .max(2000, 'At most 2000 characters.')
      .optional()
      .describe('A note shown in the email and on the upload page.')
      .meta({ example: 'Please upload these before settlement on Friday.' }),
    dueAt: dateTimeSchema()
      .optional()
      .describe(
        `When the link stops working (ISO 8601): in the future and at most ${MAX_DUE_DAYS} days ahead. Default: ${DEFAULT_DUE_DAYS} days from now.`,
      )
      .meta({ example: '2026-02-14T09:00:00Z' }),
    payer: z
      .enum(['organization', 'customer'])
      .optional()
      .describe(
        "Who pays the request's 1 credit. Omit to follow the entity's billing default, else the organisation's. Only `organization` is accepted for now: a request that resolves to `customer` is refused with 422 on `payer`, since documents have no pay-link lane yet.",
      ),
  })
  .strict();
export type CreateDocumentRequestBody = z.output<typeof createDocumentRequestBody>;

const dateTime = z.string().describe('ISO 8601 date-time (UTC).').meta({ example: '2026-01-31T09:00:00.000Z' });

const documentRequestSchema = z
  .object({
    id: z.uuid().describe('The document request id.'),
    object: z.literal('document_request').describe('Always document_request.'),
    entity_id: z.uuid().describe('The entity whose documents are asked for.'),
    types: z
      .array(z.string())
      .describe('The requested document type codes.')
      .meta({ example: ['CERTIFICATE_OF_REGISTRATION'] }),
    message: z.string().nullable().describe('The note sent to the contact.'),
    due_at: dateTime.describe('When the link stops working; an OPEN request then becomes EXPIRED.'),
    status: z
      .enum(['OPEN', 'FULFILLED', 'EXPIRED'])
      .describe('OPEN until every requested type has a document (FULFILLED) or due_at passes (EXPIRED).'),
    payer: z.enum(['organization', 'customer']).describe('Who paid the request.'),
    received_types: z.array(z.string()).describe('The requested types that have at least one document from the contact.'),
    document_ids: z.array(z.uuid()).describe('The documents the contact uploaded for this request, in the order received.'),
    fulfilled_at: dateTime.nullable().describe('When the last outstanding type arrived.'),
    expired_at: dateTime.nullable().describe('When the request expired unanswered.'),
    created_at: dateTime.describe('When the request was made.'),
    updated_at: dateTime.describe('When the request last changed.'),
  })
  .strict()
  .describe('A request to the entity’s contact to upload documents through a secure link.');
export type DocumentRequestDto = z.infer<typeof documentRequestSchema>;

export const createdDocumentRequestSchema = documentRequestSchema.extend({
  upload_url: z.url().describe('The upload link emailed to the contact. Shown only in this response; treat it as a secret.'),
});

export const documentRequestListSchema = z
  .object({
    object: z.literal('list').describe('Always list.'),
    data: z.array(documentRequestSchema).describe('The requests, oldest first.'),
  })
  .strict()
  .describe("The entity's document requests, oldest first.");
