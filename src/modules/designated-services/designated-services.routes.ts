import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { errorResponses } from '../../shared/error-responses.js';
import { DESIGNATED_SERVICES } from './catalog.js';

const catalogResponse = z.object({
  object: z.literal('list').describe('Always list.'),
  data: z
    .array(
      z.object({
        code: z
          .string()
          .describe('Stable code for designatedServices, preExistingServices and service_codes.')
          .meta({ example: 'PRO-REAL-ESTATE' }),
        group: z.string().describe('Catalog group.'),
        name: z.string().describe('Short name.'),
        description: z.string().describe('What the service covers.'),
      }),
    )
    .describe('Every designated service.'),
});

export async function designatedServicesRoutes(fastify: FastifyInstance): Promise<void> {
  const app = fastify.withTypeProvider<ZodTypeProvider>();
  const body = { object: 'list' as const, data: DESIGNATED_SERVICES.map((entry) => ({ ...entry })) };
  app.get(
    '/designated-services',
    {
      schema: {
        operationId: 'listDesignatedServices',
        tags: ['Catalog'],
        summary: 'The designated-service catalog',
        description:
          'The read-only catalog of stable codes used in designatedServices, preExistingServices and service_codes. Any valid key.',
        response: { 200: catalogResponse, ...errorResponses(401, 429) },
      },
    },
    async () => body,
  );
}
