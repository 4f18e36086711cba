import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { errorResponses } from '../../shared/error-responses.js';
import { requestContext } from '../../shared/request-context.js';
import { eventIdParams, eventListSchema, eventSchema, listEventsQuery } from './events.schemas.js';

export async function eventsRoutes(fastify: FastifyInstance): Promise<void> {
  const app = fastify.withTypeProvider<ZodTypeProvider>();
  const events = app.services.events;
  const tags = ['Events'];

  app.get(
    '/events',
    {
      schema: {
        operationId: 'listEvents',
        tags,
        summary: 'List events (the feed)',
        description:
          'Every event of the organisation, in the order the changes committed: the same envelopes webhooks carry. ' +
          'A consumer that keeps the last resume_cursor and polls with it (GET /v1/events?cursor=…) never misses an event, ' +
          'even one whose transaction committed late; resume_cursor is never null, while next_cursor, as on every list, is null on the last page. ' +
          'Events appear within about a second of ' +
          'their commit and are kept EVENT_RETENTION_DAYS (30 by default). Example: GET /v1/events?type=customer.updated&limit=100.',
        querystring: listEventsQuery,
        response: { 200: eventListSchema, ...errorResponses(401, 403, 404, 422, 429) },
      },
    },
    async (request) => events.list(requestContext(request), request.query),
  );

  app.get(
    '/events/:id',
    {
      schema: {
        operationId: 'getEvent',
        tags,
        summary: 'Get an event',
        description: 'One event by id, as soon as its change committed (also before it appears in the list). Example: GET /v1/events/9b2f…',
        params: eventIdParams,
        response: { 200: eventSchema, ...errorResponses(401, 403, 404, 429) },
      },
    },
    async (request) => events.get(requestContext(request), request.params.id),
  );
}
