import type { FastifyRequest } from 'fastify';
import type { Actor } from './actor.js';

/** Who is asking, in which organisation. Every query is scoped by `orgId`. */
export type RequestContext = { orgId: string; actor: Actor };

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

/**
 * The request's Idempotency-Key as the idempotency layer reads it (the first one when repeated), or
 * undefined without one; the audit row of the change records it. It lives here, not in the plugin,
 * so that the domain's view of a request needs no plugin.
 */
export function idempotencyKeyOf(request: FastifyRequest): string | undefined {
  const header = request.headers['idempotency-key'];
  if (header === undefined) return undefined;
  return Array.isArray(header) ? (header[0] ?? '') : header;
}
