import type { FastifyRequest } from 'fastify';
import { idempotencyKeyOf } from '../../plugins/idempotency.plugin.js';
import type { Actor } from '../audit/audit.repository.js';
import type { RequestContext } from './customers.service.js';

/** The caller as the domain sees it: organisation and acting API key (for the audit log). */
export function requestContext(request: FastifyRequest): RequestContext {
  return { orgId: request.auth.orgId, actor: requestActor(request) };
}

/** The acting API key, with the request id and Idempotency-Key its audit rows keep. */
export function requestActor(request: FastifyRequest): Actor {
  const idempotencyKey = idempotencyKeyOf(request);
  return idempotencyKey === undefined
    ? { type: 'api_key', id: request.auth.apiKeyId, requestId: request.id }
    : { type: 'api_key', id: request.auth.apiKeyId, requestId: request.id, idempotencyKey };
}
