import type { FastifyRequest } from 'fastify';
import type { RequestContext } from './customers.service.js';

/** The caller as the domain sees it: organisation and acting API key (for the audit log). */
export function requestContext(request: FastifyRequest): RequestContext {
  return { orgId: request.auth.orgId, actor: { type: 'api_key', id: request.auth.apiKeyId, requestId: request.id } };
}
