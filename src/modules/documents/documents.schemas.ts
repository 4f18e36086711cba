import { z } from 'zod';
import { DOCUMENT_MEDIA_TYPES, DOCUMENT_TYPE_CODES, DOCUMENT_TYPES, MAX_DOCUMENT_BYTES } from './document-types.js';
import type { FileSummary } from './multipart-intake.js';

export const MAX_DESCRIPTION_LENGTH = 500;

const dateTime = z.string().describe('ISO 8601 date-time (UTC).').meta({ example: '2026-01-31T09:00:00.000Z' });

export const documentSchema = z
  .object({
    id: z.uuid().describe('The document id.'),
    object: z.literal('document').describe('Always document.'),
    entity_id: z.uuid().describe('The entity the document belongs to.'),
    type: z.enum(DOCUMENT_TYPE_CODES).describe('A code of GET /v1/document-types.').meta({ example: 'TRUST_DEED' }),
    description: z.string().nullable().describe('What the uploader said the document is.'),
    file_name: z.string().nullable().describe('The name the uploaded file had (display only).').meta({ example: 'trust-deed.pdf' }),
    media_type: z.enum(DOCUMENT_MEDIA_TYPES).describe('Read from the content at upload, never from the name or the declared type.'),
    size_bytes: z.number().int().describe('The size of the content in bytes.'),
    sha256: z
      .string()
      .describe("Lower-case hex SHA-256 of the content; the content's ETag.")
      .meta({ example: 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855' }),
    uploaded_by: z
      .enum(['organization', 'contact'])
      .describe("organization: uploaded through the API; contact: by the entity's contact through a document request's upload page."),
    document_request_id: z.uuid().nullable().describe('The document request the contact answered with it; null for API uploads.'),
    created_at: dateTime.describe('When the document was stored.'),
  })
  .strict()
  .describe("An entity document's metadata; the content is at GET /v1/entities/{id}/documents/{documentId}/content.");
export type DocumentDto = z.infer<typeof documentSchema>;

export const documentsListResponse = z
  .object({
    object: z.literal('list').describe('Always list.'),
    data: z.array(documentSchema).describe('Every document of the entity, oldest first (created_at, then id).'),
  })
  .strict();

export const documentTypesResponse = z
  .object({
    object: z.literal('list').describe('Always list.'),
    data: z
      .array(
        z
          .object({
            code: z
              .enum(DOCUMENT_TYPE_CODES)
              .describe('The stable code uploads and document requests name.')
              .meta({ example: 'TRUST_DEED' }),
            name: z.string().describe('Short name.'),
            description: z.string().describe('What the document is.'),
            entity_types: z
              .array(z.string())
              .describe('The entity types it usually applies to (advice; any type may be uploaded for any entity).'),
          })
          .strict(),
      )
      .describe('The whole catalogue.'),
  })
  .strict();
export const DOCUMENT_TYPES_BODY = {
  object: 'list' as const,
  data: DOCUMENT_TYPES.map((type) => ({
    code: type.code,
    name: type.name,
    description: type.description,
    entity_types: [...type.entityTypes],
  })),
};

export const documentParams = z
  .object({
    id: z.string().min(1).max(255).describe('The entity UUID or your external_id.'),
    documentId: z.string().min(1).max(255).describe('The document id.'),
  })
  .strict();

const isFileSummary = (value: unknown): value is FileSummary =>
  typeof value === 'object' && value !== null && !Array.isArray(value) && typeof (value as FileSummary).sha256 === 'string';

/**
 * The upload form. The intake (multipart-intake.ts) has already spooled the file and stands it in as
 * { name, size, sha256 } (what the idempotency fingerprint covers); the document shows the form as
 * sent, `file` a binary part.
 */
export const uploadDocumentBody = z
  .object({
    file: z
      .custom<FileSummary>(isFileSummary, { message: 'Required: the document as a file part (with a filename).' })
      .describe(`The document: PDF, PNG or JPEG (read from the content), at most ${MAX_DOCUMENT_BYTES} bytes (10 MiB).`)
      .meta({ type: 'string', format: 'binary' }),
    type: z
      .enum(DOCUMENT_TYPE_CODES, { error: 'Must be a code of GET /v1/document-types.' })
      .describe('A code of GET /v1/document-types.')
      .meta({ example: 'TRUST_DEED' }),
    description: z
      .string()
      .trim()
      .max(MAX_DESCRIPTION_LENGTH, `At most ${MAX_DESCRIPTION_LENGTH} characters.`)
      .optional()
      .describe('What the document is, for reviewers.')
      .meta({ example: 'Deed of variation, 2021' }),
  })
  .strict();
export type UploadDocumentBody = z.infer<typeof uploadDocumentBody>;
