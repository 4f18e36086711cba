import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { errorResponses } from '../../shared/error-responses.js';
import { idParams } from '../../shared/request-params.js';
import { requestContext } from '../../shared/request-context.js';
import { createDocumentRequestBody, createdDocumentRequestSchema, documentRequestListSchema } from './document-requests.schemas.js';

export async function documentRequestsRoutes(fastify: FastifyInstance): Promise<void> {
  const app = fastify.withTypeProvider<ZodTypeProvider>();
  const service = app.services.documentRequests;
  const tags = ['Entity documents'];

  app.post(
    '/entities/:id/document-requests',
    {
      schema: {
        operationId: 'createDocumentRequest',
        tags,
        summary: "Ask the entity's contact for documents",
        description:
          "Emails the entity's contact a secure link to an upload page and charges 1 credit (payer=organization), or bills the customer (payer=customer). The contact's uploads arrive as documents with uploaded_by=contact and cost nothing more. The request is FULFILLED once every requested type has a document, or EXPIRED at dueAt. upload_url appears only in this response.",
        params: idParams,
        body: createDocumentRequestBody,
        response: { 201: createdDocumentRequestSchema, ...errorResponses(401, 402, 403, 404, 422, 429) },
      },
    },
    async (request, reply) => {
      const created = await service.create(requestContext(request), request.params.id, request.body);
      reply.code(201);
      return created;
    },
  );

  app.get(
    '/entities/:id/document-requests',
    {
      schema: {
        operationId: 'listDocumentRequests',
        tags,
        summary: "List an entity's document requests",
        description: 'Oldest first, as every list of the API; the upload links are never shown again.',
        params: idParams,
        response: { 200: documentRequestListSchema, ...errorResponses(401, 403, 404, 429) },
      },
    },
    async (request) => service.list(requestContext(request), request.params.id),
  );
}
