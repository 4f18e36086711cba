import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import fp from 'fastify-plugin';
import { AppError } from '../../shared/app-error.js';
import { bindLogContext } from '../../shared/logging.js';
import { createAccessService, RateLimitedError, type AccessGrant, type AuthContext, type RateLimitWindow } from './access.service.js';
import { ROUTE_SCOPES, routeKey } from '../../plugins/route-scopes.js';

declare module 'fastify' {
  interface FastifyRequest {
    auth: AuthContext;
  }
  interface FastifyContextConfig {
    /** Set by this plugin from ROUTE_SCOPES for every authenticated route. */
    requiredScope?: string | null;
    authenticated?: boolean;
  }
}

/** RateLimit-Policy / RateLimit headers in the IETF httpapi draft's structured-field syntax. */
function setRateLimitHeaders(reply: FastifyReply, windows: RateLimitWindow[]): void {
  reply.header('RateLimit-Policy', windows.map((w) => `"${w.name}";q=${w.limit};w=${w.windowSeconds}`).join(', '));
  reply.header('RateLimit', windows.map((w) => `"${w.name}";r=${w.remaining};t=${w.resetSeconds}`).join(', '));
}

/** Whether the raw request carries more than one Authorization line (request.headers shows only the first). */
function hasRepeatedAuthorization(request: FastifyRequest): boolean {
  const raw = request.raw.rawHeaders;
  let count = 0;
  for (let index = 0; index < raw.length; index += 2) {
    const name = raw[index]!;
    if (name.length === 13 && name.toLowerCase() === 'authorization' && ++count > 1) return true;
  }
  return false;
}

/** The caller, with its organisation's current features (the access check has passed before any handler runs). */
export async function confirmedAuth(request: FastifyRequest): Promise<AuthContext> {
  return request.auth;
}

/**
 * Bearer authentication, IP allowlists, rate limits and the scope check for every route under /v1;
 * the scope of each route comes from ROUTE_SCOPES only. Each request's access check is one statement
 * (access.service.ts), answered before anything else of the request runs: nothing is read or written
 * for a key that has not passed.
 */
export const authPlugin = fp(
  async (app: FastifyInstance, options: { defaults: { burst: number; daily: number } }) => {
    const { database, clock } = app.deps;
    const access = createAccessService({ database, defaults: options.defaults, clock });
    app.decorateRequest('auth', null as unknown as AuthContext);

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

    app.addHook('onRequest', async (request, reply) => {
      const config = request.routeOptions.config;
      if (!config?.authenticated) return;
      // Node keeps only the first of repeated Authorization lines; a request carrying two
      // credentials is ambiguous, so it is refused like a request carrying none (the same 401).
      const keyHash = access.keyHashOf(hasRepeatedAuthorization(request) ? undefined : request.headers.authorization);
      let grant: AccessGrant;
      try {
        grant = await access.authenticate(keyHash, request.ip);
      } catch (error) {
        refuse(request, reply, error);
      }
      admit(request, reply, grant);
    });

    app.addHook('onClose', async () => {
      await access.returnLeases().catch((error: unknown) => app.log.warn({ err: error }, 'could not return leased rate-limit tokens'));
    });
  },
  { name: 'auth', dependencies: ['errors'] },
);
