import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { errorResponses } from '../../shared/error-responses.js';
import {
  amlBlockSchema,
  individualSchema,
  listCustomersQuery,
  recordListEnvelope,
  patchCustomerBody,
  replaceServicesBody,
  upsertCustomerBody,
} from './customers.schemas.js';
import { idParams } from '../../shared/request-params.js';
import { requestContext } from '../../shared/request-context.js';

export async function customersRoutes(fastify: FastifyInstance): Promise<void> {
  const app = fastify.withTypeProvider<ZodTypeProvider>();
  const customers = app.services.customers;
  const tags = ['Customers'];

  app.post(
    '/customers',
    {
      schema: {
        operationId: 'upsertCustomer',
        tags,
        summary: 'Create or upsert an individual',
        description:
          'Matches on externalId, then on full name + email (case-insensitive). 201 on create, 200 on update. Never starts KYC, sends anything or charges credits.',
        body: upsertCustomerBody,
        response: { 200: individualSchema, 201: individualSchema, ...errorResponses(401, 403, 409, 422, 429) },
      },
    },
    async (request, reply) => {
      const result = await customers.upsert(requestContext(request), request.body);
      reply.code(result.created ? 201 : 200);
      return result.customer;
    },
  );

  app.get(
    '/customers',
    {
      schema: {
        operationId: 'listCustomers',
        tags,
        summary: 'List individuals',
        description:
          'Ascending by (created_at, id) with an opaque cursor. Poll with updated_since set to the time of your previous poll (see the README polling recipe).',
        querystring: listCustomersQuery,
        response: { 200: recordListEnvelope(individualSchema), ...errorResponses(401, 403, 422, 429) },
      },
    },
    async (request, reply) => {
      const { body, drainedAt } = await customers.list(requestContext(request), request.query);
      // A walk's first page: the time its read began (once the organisation's changes in flight had
      // committed), as the HTTP-date (whole seconds, rounded down): exact as the next updated_since.
      if (drainedAt) reply.header('date', drainedAt.toUTCString());
      return body;
    },
  );

  app.get(
    '/customers/:id',
    {
      schema: {
        operationId: 'getCustomer',
        tags,
        summary: 'Get an individual',
        params: idParams,
        response: { 200: individualSchema, ...errorResponses(401, 403, 404, 429) },
      },
    },
    async (request) => customers.get(requestContext(request), request.params.id),
  );

  app.patch(
    '/customers/:id',
    {
      schema: {
        operationId: 'updateCustomer',
        tags,
        summary: 'Partially update an individual',
        description: 'fullName and email are frozen once kyc_status is VERIFIED. type, external_id and statuses cannot change here.',
        params: idParams,
        body: patchCustomerBody,
        response: { 200: individualSchema, ...errorResponses(401, 403, 404, 409, 422, 429) },
      },
    },
    async (request) => customers.patch(requestContext(request), request.params.id, request.body),
  );

  app.put(
    '/customers/:id/designated-services',
    {
      schema: {
        operationId: 'replaceDesignatedServices',
        tags,
        summary: 'Replace designated services',
        description: 'Replaces the complete set, derives the designated flag and recomputes risk. Starts nothing and charges nothing.',
        params: idParams,
        body: replaceServicesBody,
        response: { 200: individualSchema, ...errorResponses(401, 403, 404, 422, 429) },
      },
    },
    async (request) => customers.replaceDesignatedServices(requestContext(request), request.params.id, request.body.service_codes),
  );

  app.get(
    '/customers/:id/aml',
    {
      schema: {
        operationId: 'getCustomerAml',
        tags: ['AML'],
        summary: 'AML block of an individual',
        params: idParams,
        response: { 200: amlBlockSchema, ...errorResponses(401, 403, 404, 429) },
      },
    },
    async (request) => customers.getAml(requestContext(request), request.params.id),
  );
}
