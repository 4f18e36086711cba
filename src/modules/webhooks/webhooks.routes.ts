import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { errorResponses } from '../../shared/error-responses.js';
import { listEnvelope } from '../../shared/list-envelope.js';
import { requestContext } from '../../shared/request-context.js';
import {
  createEndpointBody,
  deletedEndpointSchema,
  deliveryIdParams,
  deliverySchema,
  emptyBody,
  endpointIdParams,
  endpointSchema,
  endpointWithSecretSchema,
  listEndpointDeliveriesQuery,
  listEndpointsQuery,
  retriedDeliverySchema,
  rotateSecretBody,
  testEventResultSchema,
  updateEndpointInput,
} from './webhooks.schemas.js';

const SECRET_REPLAY =
  'A replay of this request with the same Idempotency-Key (within 24 hours, same API key) returns this same response, secret included.';

export async function webhooksRoutes(fastify: FastifyInstance): Promise<void> {
  const app = fastify.withTypeProvider<ZodTypeProvider>();
  const webhooks = app.services.webhooks;
  const tags = ['Webhooks'];

  app.post(
    '/webhook-endpoints',
    {
      schema: {
        operationId: 'createWebhookEndpoint',
        tags,
        summary: 'Register a webhook endpoint',
        description: `Registers a URL that receives your organisation's events, signed per Standard Webhooks with the returned \`secret\` (\`whsec_…\`), which is shown only here and on rotate. The URL must be https on port 443 of a public address (the same rules as the operator CLI); an unsafe one is 422 on \`url\`. \`events\` empty or absent subscribes to every type. ${SECRET_REPLAY}`,
        body: createEndpointBody,
        response: { 201: endpointWithSecretSchema, ...errorResponses(401, 403, 409, 422, 429) },
      },
    },
    async (request, reply) => {
      const ctx = requestContext(request);
      const endpoint = await webhooks.addEndpoint({ orgId: ctx.orgId, ...request.body }, ctx.actor, ctx.transaction);
      reply.code(201);
      return endpoint;
    },
  );

  app.get(
    '/webhook-endpoints',
    {
      schema: {
        operationId: 'listWebhookEndpoints',
        tags,
        summary: 'List webhook endpoints',
        description: 'Ascending by (created_at, id) with an opaque cursor. Never shows a secret.',
        querystring: listEndpointsQuery,
        response: { 200: listEnvelope(endpointSchema, 'oldest first (created_at, then id)'), ...errorResponses(401, 403, 422, 429) },
      },
    },
    async (request) => webhooks.listEndpointsPage(requestContext(request).orgId, request.query),
  );

  app.get(
    '/webhook-endpoints/:id',
    {
      schema: {
        operationId: 'getWebhookEndpoint',
        tags,
        summary: 'Get a webhook endpoint',
        description: 'Never shows a secret; `previous_secret_expires_at` says until when a rotated-out secret still signs.',
        params: endpointIdParams,
        response: { 200: endpointSchema, ...errorResponses(401, 403, 404, 429) },
      },
    },
    async (request) => webhooks.getEndpoint(request.params.id, { orgId: requestContext(request).orgId }),
  );

  app.patch(
    '/webhook-endpoints/:id',
    {
      schema: {
        operationId: 'updateWebhookEndpoint',
        tags,
        summary: 'Update a webhook endpoint',
        description:
          'Changes the fields given. `enabled: false` disables the endpoint and fails its queued deliveries; `enabled: true` enables it again (clearing `disabled_reason`; deliveries failed meanwhile are not re-sent, retry them one by one). `description: null` clears the note. A request that changes nothing writes nothing. The secret changes only through rotate-secret.',
        params: endpointIdParams,
        body: updateEndpointInput,
        response: { 200: endpointSchema, ...errorResponses(401, 403, 404, 409, 422, 429) },
      },
    },
    async (request) => webhooks.updateEndpoint(request.params.id, request.body, requestContext(request)),
  );

  app.delete(
    '/webhook-endpoints/:id',
    {
      schema: {
        operationId: 'deleteWebhookEndpoint',
        tags,
        summary: 'Delete a webhook endpoint',
        description:
          'Deletes the endpoint together with its delivery log (deliveries and their attempts); queued deliveries are never sent. The events stay in `GET /events`. To keep the log, disable the endpoint instead.',
        params: endpointIdParams,
        response: { 200: deletedEndpointSchema, ...errorResponses(401, 403, 404, 409, 429) },
      },
    },
    async (request) => webhooks.deleteEndpoint(request.params.id, requestContext(request)),
  );

  app.post(
    '/webhook-endpoints/:id/rotate-secret',
    {
      schema: {
        operationId: 'rotateWebhookEndpointSecret',
        tags,
        summary: 'Rotate the signing secret',
        description: `Returns a new \`secret\` (shown only here). Until \`previous_secret_expires_at\` (\`grace_period_seconds\` from now, default 86400) every delivery carries two signatures in \`webhook-signature\`, \`v1,<new> v1,<old>\`, so a receiver verifies with either secret while you deploy the new one; after it, only the new one signs. Rotating again during a grace replaces the older secret at once: only the two latest ever sign. ${SECRET_REPLAY}`,
        params: endpointIdParams,
        body: rotateSecretBody,
        response: { 200: endpointWithSecretSchema, ...errorResponses(401, 403, 404, 409, 422, 429) },
      },
    },
    async (request) => {
      return webhooks.rotateSecret(request.params.id, {
        ...requestContext(request),
        gracePeriodSeconds: request.body?.grace_period_seconds,
      });
    },
  );

  app.post(
    '/webhook-endpoints/:id/test',
    {
      schema: {
        operationId: 'sendWebhookEndpointTest',
        tags,
        summary: 'Send a test event to the endpoint',
        description:
          'Records a `webhook.test` event (it appears in `GET /events` too) and queues its delivery to this endpoint only, whatever its `events`. Returns the event and the delivery; follow it with `GET /webhook-endpoints/{id}/deliveries`. A disabled endpoint is 409.',
        params: endpointIdParams,
        body: emptyBody,
        response: { 201: testEventResultSchema, ...errorResponses(401, 403, 404, 409, 429) },
      },
    },
    async (request, reply) => {
      const result = await webhooks.sendTestEventTo(request.params.id, requestContext(request));
      reply.code(201);
      return result;
    },
  );

  app.get(
    '/webhook-endpoints/:id/deliveries',
    {
      schema: {
        operationId: 'listWebhookEndpointDeliveries',
        tags,
        summary: "List an endpoint's deliveries",
        description:
          'Newest first, by (created_at, id), with an opaque cursor: the delivery log of this endpoint, each delivery with every attempt (status code, duration, error, time). Filter with `status`.',
        params: endpointIdParams,
        querystring: listEndpointDeliveriesQuery,
        response: {
          200: listEnvelope(deliverySchema, 'newest first (created_at, then id, descending)'),
          ...errorResponses(401, 403, 404, 422, 429),
        },
      },
    },
    async (request) => webhooks.listEndpointDeliveries(request.params.id, request.query, { orgId: requestContext(request).orgId }),
  );

  app.post(
    '/webhook-deliveries/:id/retry',
    {
      schema: {
        operationId: 'retryWebhookDelivery',
        tags,
        summary: 'Retry a delivery',
        description:
          'Queues another attempt now. A delivery still pending becomes due at once; a settled one (succeeded or failed) gets a new delivery of the same event (`resent_from` names the original), so the log stays intact. The receiver sees the same event id. A disabled endpoint is 409.',
        params: deliveryIdParams,
        body: emptyBody,
        response: { 202: retriedDeliverySchema, ...errorResponses(401, 403, 404, 409, 429) },
      },
    },
    async (request, reply) => {
      const delivery = await webhooks.resendDelivery(request.params.id, requestContext(request));
      reply.code(202);
      return delivery;
    },
  );
}
