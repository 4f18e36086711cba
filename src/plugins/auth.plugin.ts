import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import fp from 'fastify-plugin';
import type { LeadingCheck } from '../db/client.js';
import { AppError } from '../shared/app-error.js';
import { bindLogContext } from '../shared/logging.js';
import {
  createAccessService,
  RateLimitedError,
  type AccessGrant,
  type AuthContext,
  type KeyIdentity,
  type RateLimitWindow,
} from '../modules/api-keys/access.service.js';
import { answerFor, errorAnswer } from './errors.plugin.js';
import { ROUTE_SCOPES, routeKey } from './route-scopes.js';

declare module 'fastify' {
  interface FastifyRequest {
    auth: AuthContext;
    /** The access check still riding with this request's first statement, when its key was known. */
    accessCheck: LeadingCheck | null;
  }
  interface FastifyContextConfig {
    /** Set by this plugin from ROUTE_SCOPES for every authenticated route. */
    requiredScope?: string | null;
    authenticated?: boolean;
  }
}

/** RateLimit-Policy / RateLimit headers in the IETF httpapi draft's structured-field syntax. */
export function setRateLimitHeaders(reply: FastifyReply, windows: RateLimitWindow[]): void {
  reply.header('RateLimit-Policy', windows.map((w) => `"${w.name}";q=${w.limit};w=${w.windowSeconds}`).join(', '));
  reply.header('RateLimit', windows.map((w) => `"${w.name}";r=${w.remaining};t=${w.resetSeconds}`).join(', '));
}

/**
 * Features can change at any time (`svc org update`), so they come from the access check's own
 * reading; until it has answered, asking for them is a programming error, caught loudly in tests.
 */
const UNCHECKED_FEATURES: ReadonlySet<string> = new (class extends Set<string> {
  override has(): boolean {
    throw new Error('request.auth.features is known once the access check has answered: use confirmedAuth(request)');
  }
})();

/** The caller, once the access check has passed (features included); throws the check's denial. */
export async function confirmedAuth(request: FastifyRequest): Promise<AuthContext> {
  await request.accessCheck?.settle();
  return request.auth;
}

/**
 * Bearer authentication, IP allowlists, rate limits and the scope check for every route under /v1;
 * the scope of each route comes from ROUTE_SCOPES only.
 *
 * A key this process has seen authenticate is known by its hash (its key, organisation and scopes
 * never change), so the request goes on at once and its access check (one statement, see
 * access.service.ts) rides in the same write as the request's first statement; nothing the request
 * reads is released and nothing it writes commits before the check has passed, and no answer leaves
 * before it (onSend). An unknown key is checked before anything else, in a round trip of its own.
 */
export const authPlugin = fp(
  async (app: FastifyInstance, options: { defaults: { burst: number; daily: number } }) => {
    const { database, clock } = app.deps;
    const access = createAccessService({ database, defaults: options.defaults, clock });
    app.decorateRequest('auth', null as unknown as AuthContext);
    app.decorateRequest('accessCheck', null);

    app.addHook('onRoute', (route) => {
      if (!route.url.startsWith('/v1/')) return;
      const methods = Array.isArray(route.method) ? route.method : [route.method];
      for (const method of methods) {
        if (method === 'OPTIONS') continue;
        // Fastify exposes a HEAD route for every GET; it runs the GET handler, so it needs the same
        // authentication and scope (without this it ran unauthenticated).
        const key = routeKey(method === 'HEAD' ? 'GET' : method, route.url);
        if (!(key in ROUTE_SCOPES)) throw new Error(`Route ${key} has no entry in ROUTE_SCOPES`);
        route.config = { ...(route.config ?? {}), authenticated: true, requiredScope: ROUTE_SCOPES[key] };
      }
    });

    /** Applies a passed check: the caller with its current features, the rate-limit headers, the scope. */
    function admit(request: FastifyRequest, reply: FastifyReply, grant: AccessGrant): void {
      request.auth = grant.auth;
      bindLogContext(request.log, grant.auth);
      setRateLimitHeaders(reply, grant.windows);
      const required = request.routeOptions.config?.requiredScope;
      if (required && !grant.auth.scopes.has(required)) {
        throw new AppError('forbidden_scope', 403, `This API key lacks the "${required}" scope.`, { required_scope: required });
      }
    }

    function refuse(request: FastifyRequest, reply: FastifyReply, error: unknown): never {
      if (error instanceof RateLimitedError) {
        bindLogContext(request.log, error.grant.auth);
        setRateLimitHeaders(reply, error.grant.windows);
        reply.header('Retry-After', String(error.window.resetSeconds));
        app.metrics?.rateLimited(error.window.name);
      }
      throw error;
    }

    function defer(request: FastifyRequest, reply: FastifyReply, keyHash: string, identity: KeyIdentity): LeadingCheck {
      // A literal, not `{ ...identity, features }`: V8 (Node 20) takes a slow path to add a property
      // to a spread copy (~0.6 µs per request).
      request.auth = { apiKeyId: identity.apiKeyId, orgId: identity.orgId, scopes: identity.scopes, features: UNCHECKED_FEATURES };
      bindLogContext(request.log, identity);
      const pending = access.pendingCheck(keyHash, request.ip);
      return database.leadingCheck(
        pending.statement,
        (result) => {
          let verdict: AccessGrant | Promise<AccessGrant>;
          try {
            verdict = pending.judge(result);
          } catch (error) {
            refuse(request, reply, error);
          }
          if (verdict instanceof Promise) {
            return verdict.then((grant) => admit(request, reply, grant), (error: unknown) => refuse(request, reply, error));
          }
          admit(request, reply, verdict);
        },
        pending.readOnly,
      );
    }

    // Callback hooks: a known key's request goes on without a promise or a round trip.
    app.addHook('onRequest', (request, reply, done) => {
      const config = request.routeOptions.config;
      if (!config?.authenticated) return done();
      let keyHash: string;
      try {
        keyHash = access.keyHashOf(request.headers.authorization);
      } catch (error) {
        return done(error as Error);
      }
      const identity = access.identityOf(keyHash);
      if (!identity) {
        access
          .authenticate(keyHash, request.ip)
          .then((grant) => admit(request, reply, grant), (error: unknown) => refuse(request, reply, error))
          .then(() => done(), done);
        return;
      }
      const check = (request.accessCheck = defer(request, reply, keyHash, identity));
      // A missing scope is a 403 only for a key that passes; the verdict decides between it and a 401.
      const required = config.requiredScope;
      if (required && !identity.scopes.has(required)) {
        check.settle().then(() => done(), done);
        return;
      }
      done();
    });

    // The request's statements (hooks before the handler, the idempotency layer, the handler) carry
    // the check: a callback hook, so the rest of the request runs inside the scope it opens.
    app.addHook('preHandler', (request, _reply, done) => {
      const check = request.accessCheck;
      if (!check || check.passed) return done();
      database.withLeadingCheck(check, () => done());
    });

    // No answer leaves before the check: a handler that never reached the database, or an error raised
    // before it did (validation, body size), is held until the verdict, and a denial replaces it.
    app.addHook('onSend', (request, reply, payload, done) => {
      const check = request.accessCheck;
      if (!check || check.passed) return done(null, payload);
      check.settle().then(
        () => done(null, payload),
        (error: unknown) => done(null, JSON.stringify(errorAnswer(reply, answerFor(error, request, reply)))),
      );
    });

    app.addHook('onClose', async () => {
      await access.returnLeases().catch((error: unknown) => app.log.warn({ err: error }, 'could not return leased rate-limit tokens'));
    });
  },
  { name: 'auth', dependencies: ['errors'] },
);
