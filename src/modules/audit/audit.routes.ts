import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { errorResponses } from '../../shared/error-responses.js';
import { requestContext } from '../../shared/request-context.js';
import { auditEventListSchema, listAuditEventsQuery } from './audit.schemas.js';

export async function auditRoutes(fastify: FastifyInstance): Promise<void> {
  const app = fastify.withTypeProvider<ZodTypeProvider>();
  const audit = app.services.audit;

  app.get(
    '/audit-events',
    {
      schema: {
        operationId: 'listAuditEvents',
        tags: ['Audit'],
        summary: 'List audit events (the compliance trail)',
        description:
          'Every recorded change of the organisation (through the API, the operator CLI or the service itself), ascending by sequence: ' +
          "the order of the organisation's tamper-evident hash chain, which is the order the changes committed. An event appears once it is " +
          'sealed into the chain, within about a second of its commit (at most 5 s). Personal data appears as stored; secrets never do. ' +
          'resume_cursor is never null: keep the last one and poll with it for newer events (next_cursor, as on every list, is null on the last page). ' +
          'Example: GET /v1/audit-events?subject_id=crm-10442&action=customer.updated&limit=100.',
        querystring: listAuditEventsQuery,
        response: { 200: auditEventListSchema, ...errorResponses(401, 403, 404, 422, 429) },
      },
    },
    async (request) => audit.list(requestContext(request), request.query),
  );
}
