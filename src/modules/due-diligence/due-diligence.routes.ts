import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { errorResponses } from '../../shared/error-responses.js';
import { requestContext } from '../../shared/request-context.js';
import { policySchema, putPolicyBody } from './due-diligence.schemas.js';

export async function dueDiligenceRoutes(fastify: FastifyInstance): Promise<void> {
  const app = fastify.withTypeProvider<ZodTypeProvider>();
  const dueDiligence = app.services.dueDiligence;
  const tags = ['Ongoing due diligence'];

  app.get(
    '/due-diligence-policy',
    {
      schema: {
        operationId: 'getDueDiligencePolicy',
        tags,
        summary: 'Get the due diligence policy',
        description:
          "The organisation's review intervals by risk rating, whether enhanced due diligence uses the HIGH interval, its high-risk jurisdictions and when a due review becomes overdue. Until the first PUT, the defaults: LOW 36, MEDIUM 24 and HIGH 12 months, EDD at the HIGH interval, the FATF call-for-action list (IRN, MMR, PRK; June 2025), overdue after 30 days, and `updated_at` null.",
        response: { 200: policySchema, ...errorResponses(401, 403, 429) },
      },
    },
    async (request) => dueDiligence.getPolicy(requestContext(request)),
  );

  app.put(
    '/due-diligence-policy',
    {
      schema: {
        operationId: 'putDueDiligencePolicy',
        tags,
        summary: 'Set the due diligence policy',
        description:
          'Replaces the whole policy: a field left out takes its default, as in a first PUT. A higher rating must not wait longer between reviews (HIGH ≤ MEDIUM ≤ LOW). Audited (`due_diligence_policy.updated`, with the policy before and after); send an `Idempotency-Key` to retry safely.',
        body: putPolicyBody,
        response: { 200: policySchema, ...errorResponses(401, 403, 409, 422, 429) },
      },
    },
    async (request) => dueDiligence.putPolicy(requestContext(request), request.body),
  );
}
