import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { confirmedAuth } from '../api-keys/auth.plugin.js';
import { errorResponses } from '../../shared/error-responses.js';
import { requestActor } from '../../shared/request-context.js';
import type { GroupsCaller } from './groups.service.js';
import { createGroupBodySchema, groupSchema, groupTemplateListSchema } from './groups.schemas.js';

function callerOf(request: FastifyRequest): GroupsCaller {
  return {
    orgId: request.auth.orgId,
    features: request.auth.features,
    actor: requestActor(request),
    transaction: request.openTransaction,
  };
}

export async function groupsRoutes(fastify: FastifyInstance): Promise<void> {
  const app = fastify.withTypeProvider<ZodTypeProvider>();
  const service = app.services.groups;

  // After authentication and the scope check (onRequest), before body validation and before the
  // idempotency layer opens its transaction: the feature gate, then the lazy curated-template sync.
  app.addHook('preValidation', async (request) => {
    await confirmedAuth(request);
    await service.prepare(callerOf(request));
  });

  app.post(
    '/groups',
    {
      schema: {
        summary: 'Create a group',
        description:
          'Creates a group workspace from a template (its roles become party slots) or from explicit parties, never both. When an ACTIVE group already holds `reference`, that group is returned unchanged with 200 and nothing is created. An unknown template is 404; an unknown customer is 422 naming the party. Nothing is charged and no verification is started. Needs the Groups feature.',
        tags: ['Groups'],
        body: createGroupBodySchema,
        response: { 200: groupSchema, 201: groupSchema, ...errorResponses(401, 403, 404, 422, 429) },
      },
    },
    async (request, reply) => {
      const { group, created } = await service.createGroup(callerOf(request), request.body);
      // Set the status and return the body (not reply.send): the idempotency layer stores what is returned.
      reply.code(created ? 201 : 200);
      return group;
    },
  );

  app.get(
    '/group-templates',
    {
      schema: {
        summary: 'List group templates',
        description:
          "The organisation's custom templates plus its own copies of the curated pre-built set; not paginated. Needs the Groups feature.",
        tags: ['Groups'],
        response: { 200: groupTemplateListSchema, ...errorResponses(401, 403, 429) },
      },
    },
    async (request) => ({ object: 'list' as const, data: await service.listTemplates(callerOf(request)) }),
  );
}
