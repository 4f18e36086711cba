import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { errorResponses } from '../../shared/error-responses.js';
import { listEnvelope } from '../../shared/list-envelope.js';
import { idParams } from '../../shared/request-params.js';
import { requestContext } from '../../shared/request-context.js';
import type { CustomerKind } from '../customers/customers.repository.js';
import { listReviewsQuery, recordReviewBody, reviewSchema } from './reviews.schemas.js';

const RECORD_DESCRIPTION = (what: string) =>
  `Records a completed review of the ${what}: \`review.last_completed_at\` becomes now, \`review.reasons\` clear and the next review is scheduled from now at the organisation's policy interval (\`review.status\` SCHEDULED). A review may be recorded ahead of its date. Fires \`customer.review_completed\` with the ${what}'s DTO; audited. A ${what} never verified has no review to record (409). Send an \`Idempotency-Key\` to retry safely.`;

const LIST_DESCRIPTION = (what: string) => `The reviews recorded on the ${what}, newest first by (created_at, id), with an opaque cursor.`;

export async function reviewsRoutes(fastify: FastifyInstance): Promise<void> {
  const app = fastify.withTypeProvider<ZodTypeProvider>();
  const reviews = app.services.reviews;
  const tags = ['Ongoing due diligence'];
  const paths: Array<{ kind: CustomerKind; path: string; what: string; name: string }> = [
    { kind: 'individual', path: '/customers/:id/reviews', what: 'individual', name: 'Customer' },
    { kind: 'entity', path: '/entities/:id/reviews', what: 'entity', name: 'Entity' },
  ];

  for (const { kind, path, what, name } of paths) {
    app.post(
      path,
      {
        schema: {
          operationId: `record${name}Review`,
          tags,
          summary: `Record a review of ${kind === 'entity' ? 'an entity' : 'an individual'}`,
          description: RECORD_DESCRIPTION(what),
          params: idParams,
          body: recordReviewBody,
          response: { 201: reviewSchema, ...errorResponses(401, 403, 404, 409, 422, 429) },
        },
      },
      async (request, reply) => {
        const review = await reviews.record(requestContext(request), kind, request.params.id, request.body);
        reply.code(201);
        return review;
      },
    );

    app.get(
      path,
      {
        schema: {
          operationId: `list${name}Reviews`,
          tags,
          summary: `List the reviews of ${kind === 'entity' ? 'an entity' : 'an individual'}`,
          description: LIST_DESCRIPTION(what),
          params: idParams,
          querystring: listReviewsQuery,
          response: {
            200: listEnvelope(reviewSchema, 'newest first (created_at, then id, descending)'),
            ...errorResponses(401, 403, 404, 422, 429),
          },
        },
      },
      async (request) => reviews.list(requestContext(request), kind, request.params.id, request.query),
    );
  }
}
