import { create as contentDisposition } from 'content-disposition';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { errorEnvelopeSchema } from '../../shared/error-envelope.schema.js';
import { errorResponses } from '../../shared/error-responses.js';
import { idParams } from '../../shared/request-params.js';
import { requestContext } from '../../shared/request-context.js';
import { DOCUMENT_MEDIA_TYPES, MAX_DOCUMENT_BYTES } from './document-types.js';
import {
  documentParams,
  documentSchema,
  documentsListResponse,
  documentTypesResponse,
  DOCUMENT_TYPES_BODY,
  MAX_DESCRIPTION_LENGTH,
  uploadDocumentBody,
} from './documents.schemas.js';
import { multipartFormOf, registerMultipartIntake, type MultipartIntakeOptions } from './multipart-intake.js';

/** The upload form: one file, its type and an optional description. */
const UPLOAD_FORM: MultipartIntakeOptions = {
  fileFields: ['file'],
  maxFiles: 1,
  textFields: { type: 64, description: MAX_DESCRIPTION_LENGTH },
  maxFileBytes: MAX_DOCUMENT_BYTES,
};

/** The file name extensions of each stored type, the first the one a download gets. */
const EXTENSIONS: Record<string, readonly string[]> = { 'application/pdf': ['pdf'], 'image/png': ['png'], 'image/jpeg': ['jpg', 'jpeg'] };

/**
 * The name a download is saved under: the uploaded name, its extension following the type the content
 * was recognised as (a PDF uploaded as deed.html downloads as deed.pdf), so the saved file opens as what
 * it is; or document-<id> with that extension when the upload had no name.
 */
function downloadName(fileName: string | null, mediaType: string, documentId: string): string {
  const extensions = EXTENSIONS[mediaType] ?? ['bin'];
  if (fileName === null) return `document-${documentId}.${extensions[0]}`;
  const dot = fileName.lastIndexOf('.');
  const extension = dot > 0 ? fileName.slice(dot + 1).toLowerCase() : undefined;
  if (extension !== undefined && extensions.includes(extension)) return fileName;
  const stem = extension !== undefined && /^[a-z0-9]{1,10}$/.test(extension) ? fileName.slice(0, dot) : fileName;
  return `${stem}.${extensions[0]}`;
}

/** If-None-Match against one strong ETag, by the weak comparison RFC 9110 §13.1.2 prescribes for it. */
function matchesEtag(ifNoneMatch: string | undefined, etag: string): boolean {
  if (ifNoneMatch === undefined) return false;
  if (ifNoneMatch.trim() === '*') return true;
  return ifNoneMatch.split(',').some((candidate) => candidate.trim().replace(/^W\//, '') === etag);
}

const jsonError = (description: string) => ({ description, content: { 'application/json': { schema: errorEnvelopeSchema } } });

const binary = z.string().meta({ format: 'binary' }).describe("The document's bytes, exactly as uploaded.");

export async function documentsRoutes(fastify: FastifyInstance): Promise<void> {
  const app = fastify.withTypeProvider<ZodTypeProvider>();
  const documents = app.services.documents;
  const tags = ['Entity documents'];

  app.get(
    '/document-types',
    {
      schema: {
        operationId: 'listDocumentTypes',
        tags: ['Catalog'],
        summary: 'The entity document type catalogue',
        description: 'The read-only catalogue of document type codes that uploads and document requests name. Any valid key.',
        response: { 200: documentTypesResponse, ...errorResponses(401, 429) },
      },
    },
    async () => DOCUMENT_TYPES_BODY,
  );

  app.get(
    '/entities/:id/documents',
    {
      schema: {
        operationId: 'listEntityDocuments',
        tags,
        summary: "List an entity's documents",
        description: 'Every document of the entity (metadata only, no content), oldest first. Not paginated: an entity has few documents.',
        params: idParams,
        response: { 200: documentsListResponse, ...errorResponses(401, 403, 404, 429) },
      },
    },
    async (request) => documents.list(requestContext(request), request.params.id),
  );

  app.get(
    '/entities/:id/documents/:documentId/content',
    {
      schema: {
        operationId: 'getEntityDocumentContent',
        tags,
        summary: "Download a document's content",
        description:
          'The bytes as uploaded, streamed, with the sniffed media type, `Content-Disposition: attachment` (the file name, RFC 6266/5987 encoded), ' +
          '`ETag` (the quoted SHA-256) and `Cache-Control: private, no-cache`. `If-None-Match` with the ETag answers 304.',
        params: documentParams,
        response: {
          200: {
            description: "The document's content.",
            content: Object.fromEntries(DOCUMENT_MEDIA_TYPES.map((type) => [type, { schema: binary }])),
          },
          // type null: documented without a body.
          304: z.null().describe("Not modified: `If-None-Match` names the content's ETag; no body."),
          ...errorResponses(401, 403, 404, 429),
        },
      },
    },
    async (request, reply) => {
      const { document, open } = await documents.content(requestContext(request), request.params.id, request.params.documentId);
      const etag = `"${document.sha256}"`;
      reply.header('ETag', etag);
      // The bytes never change under an id, but they are personal data: a private cache may keep them, revalidating each time.
      reply.header('Cache-Control', 'private, no-cache');
      reply.header('X-Content-Type-Options', 'nosniff');
      if (matchesEtag(request.headers['if-none-match'], etag)) return reply.code(304).send(null);
      reply.header('Content-Type', document.mediaType);
      reply.header('Content-Length', String(document.sizeBytes));
      reply.header('Content-Disposition', contentDisposition(downloadName(document.fileName, document.mediaType, document.id)));
      // A stream is sent as it is (never serialized); the schema's binary string only documents it.
      return reply.send(open() as unknown as string);
    },
  );

  // Its own context: this route alone takes multipart/form-data (and nothing else).
  await app.register(async (uploads) => {
    registerMultipartIntake(uploads, UPLOAD_FORM);
    uploads.withTypeProvider<ZodTypeProvider>().post(
      '/entities/:id/documents',
      {
        schema: {
          operationId: 'uploadEntityDocument',
          tags,
          summary: 'Upload a document for an entity',
          description:
            `multipart/form-data with a \`file\` part (PDF, PNG or JPEG, at most ${MAX_DOCUMENT_BYTES} bytes: the type is read from the content, never from the name or the part's Content-Type), ` +
            '`type` (a code of GET /v1/document-types) and an optional `description`. Costs 1 credit, always paid by the organisation. ' +
            'With an Idempotency-Key, a retry carrying the same file replays the first answer; the same key with another file is a 409.',
          consumes: ['multipart/form-data'],
          params: idParams,
          body: uploadDocumentBody,
          response: {
            201: documentSchema,
            ...errorResponses(401, 402, 403, 404, 409, 422, 429),
            413: jsonError(
              `Payload too large: \`payload_too_large\` — the file exceeds ${MAX_DOCUMENT_BYTES} bytes (10 MiB); nothing was stored or charged.`,
            ),
            415: jsonError(
              'Unsupported media type: `unsupported_media_type` — the request is not multipart/form-data, or the file is not a PDF, PNG or JPEG by its content; nothing was stored or charged.',
            ),
          },
        },
      },
      async (request, reply) => {
        const file = multipartFormOf(request).files[0]!;
        const document = await documents.upload(requestContext(request), request.params.id, request.body, file);
        reply.code(201);
        return document;
      },
    );
  });
}
