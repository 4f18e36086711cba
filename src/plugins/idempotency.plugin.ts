import { createHash } from 'node:crypto';
import type { FastifyInstance, FastifyReply, FastifyRequest, RouteHandlerMethod } from 'fastify';
import fp from 'fastify-plugin';
import stableStringify from 'safe-stable-stringify';
import { AppError, isAppError } from '../shared/app-error.js';
import { idempotencyKeyOf } from '../shared/request-context.js';
import { errorEnvelope } from './errors.plugin.js';
import { createIdempotencyRepository } from './idempotency.repository.js';

const IDEMPOTENT_METHODS = new Set(['POST', 'PATCH', 'PUT', 'DELETE']);
/** Handler errors that are answers about the caller's access, not about the request: never stored. */
const UNSTORED_STATUSES = new Set([401, 403, 429]);
const JSON_TYPE = 'application/json; charset=utf-8';

function requestFingerprint(method: string, path: string, body: unknown): string {
  return createHash('sha256')
    .update(`${method} ${path}\n${stableStringify(body ?? null)}`)
    .digest('hex');
}

type Outcome = { kind: 'sent'; status: number; body: string; replayed: boolean } | { kind: 'error'; error: AppError };

/**
 * `Idempotency-Key` on POST/PATCH/PUT/DELETE under /v1. The handler runs inside a transaction that first
 * locks the key; the handler's own transaction joins it, so the change, its side records and the
 * stored response (written once, last, and sealed) commit (or roll back) together. A concurrent duplicate blocks
 * on the lock until the first commits, then replays its response.
 */
export const idempotencyPlugin = fp(
  async (app: FastifyInstance) => {
    const { database, linkSealer } = app.deps;
    const records = createIdempotencyRepository();

    app.addHook('onRoute', (route) => {
      const methods = Array.isArray(route.method) ? route.method : [route.method];
      if (!route.url.startsWith('/v1/') || !methods.some((method) => IDEMPOTENT_METHODS.has(method))) return;
      const original = route.handler as RouteHandlerMethod;

      route.handler = async function idempotentHandler(this: FastifyInstance, request: FastifyRequest, reply: FastifyReply) {
        const key = idempotencyKeyOf(request);
        if (key === undefined) return original.call(this, request, reply);
        if (key.length === 0 || key.length > 255) {
          throw AppError.field('Idempotency-Key', 'Must be between 1 and 255 characters.');
        }
        const { apiKeyId, orgId } = request.auth;
        // The router ignores a trailing slash, so the fingerprint does too: a retry through a client
        // that appends one is the same request.
        const path = request.url.split('?')[0]!.replace(/(.)\/+$/, '$1');
        const fingerprint = requestFingerprint(request.method, path, request.body);

        const outcome = await database.transaction(async (tx): Promise<Outcome> => {
          const existing = await records.lockAndFind(orgId, apiKeyId, key, tx);
          if (existing) {
            if (existing.fingerprint !== fingerprint) {
              throw new AppError(
                'idempotency_conflict',
                409,
                'This Idempotency-Key was already used with a different request; use a new key for a new request.',
              );
            }
            return { kind: 'sent', status: existing.responseStatus, body: linkSealer.open(existing.responseBody), replayed: true };
          }
          // A stored reply may carry a link (upload_url, verification_link): it is kept sealed (text-sealer.ts).
          const store = (status: number, body: string) =>
            records.store({ apiKeyId, key, orgId, fingerprint, status, body: linkSealer.seal(body) }, tx);
          try {
            // A savepoint, so a handler-produced 4xx can undo its work while the stored error
            // response still commits.
            const payload = await tx.transaction(async () => original.call(this, request, reply));
            if (reply.sent || payload === reply) {
              // The response must leave only after the commit, so idempotent handlers return their payload.
              throw new Error(`${request.routeOptions.url}: handlers of idempotent routes must return the payload, not call reply.send()`);
            }
            const status = reply.statusCode;
            const body = typeof payload === 'string' ? payload : String(reply.serialize(payload));
            await store(status, body);
            return { kind: 'sent', status, body, replayed: false };
          } catch (error) {
            if (isAppError(error) && error.status < 500 && !UNSTORED_STATUSES.has(error.status)) {
              await store(error.status, JSON.stringify(errorEnvelope(error)));
              return { kind: 'error', error };
            }
            throw error;
          }
        });

        if (outcome.kind === 'error') throw outcome.error;
        if (outcome.replayed) reply.header('Idempotent-Replayed', 'true');
        return reply.code(outcome.status).type(JSON_TYPE).send(outcome.body);
      };
    });
  },
  { name: 'idempotency', dependencies: ['auth'] },
);
