import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { confirmedAuth } from '../api-keys/auth.plugin.js';
import { errorResponses } from '../../shared/error-responses.js';
import { idParams } from '../../shared/request-params.js';
import { requestContext } from '../../shared/request-context.js';
import {
  entityStartResponse,
  individualStartResponse,
  ownerParams,
  ownerStartResponse,
  startKybBody,
  startKycBody,
} from './verification.schemas.js';

export async function verificationRoutes(fastify: FastifyInstance): Promise<void> {
  const app = fastify.withTypeProvider<ZodTypeProvider>();
  const verification = app.services.verification;
  const tags = ['Verification'];

  app.post(
    '/entities/:id/kyb',
    {
      schema: {
        operationId: 'startKyb',
        tags,
        summary: 'Start KYB for an entity',
        description:
          'automated and contact_led email the contact a secure link and charge credits (or bill the customer with payer=customer); manual arms the record for an officer, free and silent. The body is optional.',
        params: idParams,
        body: startKybBody,
        response: { 200: entityStartResponse, ...errorResponses(401, 402, 403, 404, 409, 422, 429) },
      },
    },
    async (request) =>
      verification.startKyb(
        { ...requestContext(request), features: (await confirmedAuth(request)).features },
        request.params.id,
        request.body,
      ),
  );

  app.post(
    '/customers/:id/kyc',
    {
      schema: {
        operationId: 'startKyc',
        tags,
        summary: 'Start KYC for an individual',
        description:
          'Emails the person (or their representative) a secure link and charges 1 credit plus EDD add-ons, or bills the customer with payer=customer. The body is optional.',
        params: idParams,
        body: startKycBody,
        response: { 200: individualStartResponse, ...errorResponses(401, 402, 403, 404, 409, 422, 429) },
      },
    },
    async (request) => verification.startKyc(requestContext(request), request.params.id, request.body),
  );

  app.post(
    '/entities/:id/ubos/:uboId/send-link',
    {
      schema: {
        operationId: 'sendBeneficialOwnerLink',
        tags: ['Beneficial owners'],
        summary: "Send a beneficial owner's verification link",
        description: "Starts the owner's KYC: emails them and charges like a KYC start.",
        params: ownerParams,
        body: startKycBody,
        response: { 200: ownerStartResponse, ...errorResponses(401, 402, 403, 404, 409, 422, 429) },
      },
    },
    async (request) => verification.sendOwnerLink(requestContext(request), request.params.id, request.params.uboId, request.body),
  );
}
