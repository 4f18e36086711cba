import type { FastifyRequest } from 'fastify';
import type { Tx } from '../db/client.js';
import type { Actor } from './actor.js';

/**
 * Opens the transaction a write commits in and passes it to `work`. Each call is its own transaction
 * unless the request carries an Idempotency-Key: then every call of the request runs in the one
 * transaction that also claims the key and stores the reply (idempotency.plugin.ts). It opens when
 * first called, so what a service does before (DNS, HTTP) holds no connection.
 */
export type OpenTransaction = <T>(work: (tx: Tx) => Promise<T>) => Promise<T>;

/** Who is asking, in which organisation, and how its writes open their transaction. Every query is scoped by `orgId`. */
export type RequestContext = { orgId: string; actor: Actor; transaction: OpenTransaction };

declare module 'fastify' {
  interface FastifyRequest {
    /** How this request's writes open their transaction: given by the idempotency plugin. */
    openTransaction: OpenTransaction;
  }
}

/** The caller as the domain sees it: organisation, acting API key (for the audit log), and its writes' transaction. */
export function requestContext(request: FastifyRequest): RequestContext {
  return { orgId: request.auth.orgId, actor: requestActor(request), transaction: request.openTransaction };
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
