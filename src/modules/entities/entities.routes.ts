import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { errorResponses } from '../../shared/error-responses.js';
import { amlBlockSchema, recordListEnvelope } from '../customers/customers.schemas.js';
import { idParams } from '../../shared/request-params.js';
import { requestContext } from '../../shared/request-context.js';
import { addOwnersBody, entitySchema, listEntitiesQuery, patchEntityBody, ubosResponse, upsertEntityBody } from './entities.schemas.js';

export async function entitiesRoutes(fastify: FastifyInstance): Promise<void> {
  const app = fastify.withTypeProvider<ZodTypeProvider>();
  const entities = app.services.entities;
  const tags = ['Entities'];

  app.post(
    '/entities',
    {
      schema: {
        operationId: 'upsertEntity',
        tags,
        summary: 'Create or upsert an entity',
        description:
          'Matches on externalId, then ABN, then ACN, then legal name + type (case-insensitive). 201 on create, 200 on update. No KYB is triggered, nothing is charged or emailed.',
        body: upsertEntityBody,
        response: { 200: entitySchema, 201: entitySchema, ...errorResponses(401, 403, 409, 422, 429) },
      },
    },
    async (request, reply) => {
      const result = await entities.upsert(requestContext(request), request.body);
      reply.code(result.created ? 201 : 200);
      return result.entity;
    },
  );

  app.get(
    '/entities',
    {
      schema: {
        operationId: 'listEntities',
        tags,
        summary: 'List entities',
        description: 'Same envelope, cursor and filters as GET /customers; status filters kyb_status; plus a type filter.',
        querystring: listEntitiesQuery,
        response: { 200: recordListEnvelope(entitySchema), ...errorResponses(401, 403, 422, 429) },
      },
    },
    async (request, reply) => {
      const { body, drainedAt } = await entities.list(requestContext(request), request.query);
      // A walk's first page: the time its read began (once the organisation's changes in flight had
      // committed), as the HTTP-date (whole seconds, rounded down): exact as the next updated_since.
      if (drainedAt) reply.header('date', drainedAt.toUTCString());
      return body;
    },
  );

  app.get(
    '/entities/:id',
    {
      schema: {
        operationId: 'getEntity',
        tags,
        summary: 'Get an entity',
        params: idParams,
        response: { 200: entitySchema, ...errorResponses(401, 403, 404, 429) },
      },
    },
    async (request) => entities.get(requestContext(request), request.params.id),
  );

  app.patch(
    '/entities/:id',
    {
      schema: {
        operationId: 'updateEntity',
        tags,
        summary: 'Partially update an entity',
        description:
          'Omitted fields are untouched; null clears abn, acn, address or registrationNumber; contact replaces the contact person. type and origin never change.',
        params: idParams,
        body: patchEntityBody,
        response: { 200: entitySchema, ...errorResponses(401, 403, 404, 409, 422, 429) },
      },
    },
    async (request) => entities.patch(requestContext(request), request.params.id, request.body),
  );

  app.get(
    '/entities/:id/aml',
    {
      schema: {
        operationId: 'getEntityAml',
        tags: ['AML'],
        summary: 'AML block of an entity',
        params: idParams,
        response: { 200: amlBlockSchema, ...errorResponses(401, 403, 404, 429) },
      },
    },
    async (request) => entities.getAml(requestContext(request), request.params.id),
  );

  app.get(
    '/entities/:id/ubos',
    {
      schema: {
        operationId: 'listBeneficialOwners',
        tags: ['Beneficial owners'],
        summary: 'Beneficial owners of an entity',
        params: idParams,
        response: { 200: ubosResponse, ...errorResponses(401, 403, 404, 429) },
      },
    },
    async (request) => entities.listOwners(requestContext(request), request.params.id),
  );

  app.post(
    '/entities/:id/ubos',
    {
      schema: {
        operationId: 'addBeneficialOwners',
        tags: ['Beneficial owners'],
        summary: 'Add beneficial owners',
        description:
          'Links each owner to an existing individual (exact name + email) or creates one. Nothing is emailed or charged. Returns the full owners list.',
        params: idParams,
        body: addOwnersBody,
        response: { 200: ubosResponse, ...errorResponses(401, 403, 404, 409, 422, 429) },
      },
    },
    async (request) => entities.addOwners(requestContext(request), request.params.id, request.body),
  );
}
