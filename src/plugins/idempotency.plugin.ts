import { createHash } from 'node:crypto';
import { sql } from 'drizzle-orm';
import type { FastifyInstance, FastifyReply, FastifyRequest, RouteHandlerMethod } from 'fastify';
import fp from 'fastify-plugin';
import stableStringify from 'safe-stable-stringify';
import type { Database, Tx } from '../db/client.js';
import { AppError, isAppError } from '../shared/app-error.js';
import { idempotencyKeyOf, type OpenTransaction } from '../shared/request-context.js';
import { errorEnvelope } from './errors.plugin.js';
import { createIdempotencyRepository, type StoredReply } from './idempotency.repository.js';

const IDEMPOTENT_METHODS = new Set(['POST', 'PATCH', 'PUT', 'DELETE']);
/** Handler errors that are answers about the caller's access, not about the request: never stored. */
const UNSTORED_STATUSES = new Set([401, 403, 429]);
const JSON_TYPE = 'application/json; charset=utf-8';

function requestFingerprint(method: string, path: string, body: unknown): string {
  return createHash('sha256')
    .update(`${method} ${path}\n${stableStringify(body ?? null)}`)
    .digest('hex');
}

/** Thrown out of the request's transaction when the key already has a reply: the request replays it. */
class KeyAlreadyAnswered extends Error {
  constructor(readonly stored: StoredReply) {
    super('this Idempotency-Key already has a stored reply');
  }
}

/**
 * The one transaction of a request with an Idempotency-Key. It opens at the handler's first write
 * (`transaction`), locks the key there, and stays open until the handler has its reply: `end` then
 * runs last in it (storing the reply) and commits. So the change, its side records and the stored
 * reply commit or roll back together, while anything the handler did before its first write (a DNS
 * lookup) held no connection.
 */
function keyedTransaction(database: Database, claim: (tx: Tx) => Promise<void>) {
  let opened: Promise<Tx> | undefined;
  let committed: Promise<void> | undefined;
  let settle: ((last: (tx: Tx) => Promise<void>) => void) | undefined;
  let ended = false;

  const transaction: OpenTransaction = async (work) => {
    if (ended) throw new Error('the request has ended: its transaction is closed');
    opened ??= new Promise<Tx>((resolve, reject) => {
      const last = new Promise<(tx: Tx) => Promise<void>>((resolveLast) => (settle = resolveLast));
      committed = database.transaction(async (tx) => {
        await claim(tx);
        // A handler's 4xx undoes its writes while its stored error reply still commits.
        await tx.execute(sql`SAVEPOINT handler_writes`);
        resolve(tx);
        await (
          await last
        )(tx);
      });
      committed.catch(reject);
    });
    return work(await opened);
  };

  return {
    transaction,
    /**
     * Runs `last` at the end of the request's transaction (opening one when the handler wrote nothing)
     * and commits; with `undoWrites`, the handler's writes are rolled back first.
     */
    async end(last: (tx: Tx) => Promise<void>, options: { undoWrites?: boolean } = {}): Promise<void> {
      if (ended) throw new Error('the request transaction was already ended');
      ended = true;
      if (!opened) {
        await database.transaction(async (tx) => {
          await claim(tx);
          await last(tx);
        });
        return;
      }
      // Settled only once the transaction opened: a claim that failed never waits for it.
      const lastInOpened = options.undoWrites
        ? async (tx: Tx) => {
            await tx.execute(sql`ROLLBACK TO SAVEPOINT handler_writes`);
            await last(tx);
          }
        : last;
      await opened.then(
        () => settle!(lastInOpened),
        () => {},
      );
      await committed;
    },
  };
}

/**
 * `Idempotency-Key` on POST/PATCH/PUT/DELETE under /v1. A key with a reply replays it. Otherwise the
 * handler's writes run in one transaction that first locks the key (keyedTransaction), and the reply
 * is stored last in it; a concurrent duplicate waits on the lock until the first commits, then replays
 * its reply. Every handler finds `request.openTransaction`: a plain transaction per call without a key.
 */
export const idempotencyPlugin = fp(
  async (app: FastifyInstance) => {
    const { database, linkSealer } = app.deps;
    const records = createIdempotencyRepository();
    // Every request starts with a plain transaction per call; a request with a key gets its own.
    const plainTransaction: OpenTransaction = (work) => database.transaction(work);
    app.decorateRequest('openTransaction', plainTransaction);

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

        const replay = (stored: StoredReply) => {
          if (stored.fingerprint !== fingerprint) {
            throw new AppError(
              'idempotency_conflict',
              409,
              'This Idempotency-Key was already used with a different request; use a new key for a new request.',
            );
          }
          return reply
            .code(stored.responseStatus)
            .header('Idempotent-Replayed', 'true')
            .type(JSON_TYPE)
            .send(linkSealer.open(stored.responseBody));
        };
        // A stored reply is final: a retry replays it without opening a transaction.
        const earlier = await records.find(orgId, apiKeyId, key, database.db);
        if (earlier) return replay(earlier);

        const write = keyedTransaction(database, async (tx) => {
          const stored = await records.lockAndFind(orgId, apiKeyId, key, tx);
          if (stored) throw new KeyAlreadyAnswered(stored);
        });
        // A stored reply may carry a link (upload_url, verification_link): it is kept sealed (text-sealer.ts).
        const store = (status: number, body: string, tx: Tx) =>
          records.store({ apiKeyId, key, orgId, fingerprint, status, body: linkSealer.seal(body) }, tx);
        request.openTransaction = write.transaction;

        let payload: unknown;
        try {
          payload = await original.call(this, request, reply);
        } catch (error) {
          if (error instanceof KeyAlreadyAnswered) return replay(error.stored);
          if (isAppError(error) && error.status < 500 && !UNSTORED_STATUSES.has(error.status)) {
            try {
              await write.end((tx) => store(error.status, JSON.stringify(errorEnvelope(error)), tx), { undoWrites: true });
            } catch (ending) {
              if (ending instanceof KeyAlreadyAnswered) return replay(ending.stored);
              throw ending;
            }
            throw error;
          }
          await write
            .end(async () => {
              throw error;
            })
            .catch(() => {});
          throw error;
        }
        if (reply.sent || payload === reply) {
          await write
            .end(async () => {
              throw new Error('not stored');
            })
            .catch(() => {});
          // The response must leave only after the commit, so idempotent handlers return their payload.
          throw new Error(`${request.routeOptions.url}: handlers of idempotent routes must return the payload, not call reply.send()`);
        }
        const status = reply.statusCode;
        const body = typeof payload === 'string' ? payload : String(reply.serialize(payload));
        try {
          await write.end((tx) => store(status, body, tx));
        } catch (error) {
          if (error instanceof KeyAlreadyAnswered) return replay(error.stored);
          throw error;
        }
        return reply.code(status).type(JSON_TYPE).send(body);
      };
    });
  },
  { name: 'idempotency', dependencies: ['auth'] },
);
