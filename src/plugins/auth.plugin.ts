import type { FastifyInstance, FastifyReply } from 'fastify';
import fp from 'fastify-plugin';
import { AppError } from '../shared/app-error.js';
import { bindLogContext } from '../shared/logging.js';
import {
  createAccessService,
  RateLimitedError,
  type AuthContext,
  type RateLimitWindow,
} from '../modules/api-keys/access.service.js';
import { ROUTE_SCOPES, routeKey } from './route-scopes.js';

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
export function setRateLimitHeaders(reply: FastifyReply, windows: RateLimitWindow[]): void {
  reply.header('RateLimit-Policy', windows.map((w) => `"${w.name}";q=${w.limit};w=${w.windowSeconds}`).join(', '));
  reply.header('RateLimit', windows.map((w) => `"${w.name}";r=${w.remaining};t=${w.resetSeconds}`).join(', '));
}

/**
 * Bearer authentication, IP allowlists and rate limits (one database round trip), then the scope
 * check, for every route under /v1. The scope of each route comes from ROUTE_SCOPES only.
 */
export const authPlugin = fp(
  async (app: FastifyInstance, options: { defaults: { burst: number; daily: number } }) => {
    const access = createAccessService({ database: app.deps.database, defaults: options.defaults });
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

    app.addHook('onRequest', async (request, reply) => {
      const config = request.routeOptions.config;
      if (!config?.authenticated) return;
      try {
        const grant = await access.authenticate(request.headers.authorization, request.ip);
        request.auth = grant.auth;
        // Every later line of this request (including "request completed") names the key and org.
        bindLogContext(request.log, grant.auth);
        setRateLimitHeaders(reply, grant.windows);
      } catch (error) {
        if (error instanceof RateLimitedError) {
          bindLogContext(request.log, error.grant.auth);
          setRateLimitHeaders(reply, error.grant.windows);
          reply.header('Retry-After', String(error.window.resetSeconds));
          app.metrics?.rateLimited(error.window.name);
        }
        throw error;
      }
      const required = config.requiredScope;
      if (required && !request.auth.scopes.has(required)) {
        throw new AppError('forbidden_scope', 403, `This API key lacks the "${required}" scope.`, {
          required_scope: required,
        });
      }
    });
  },
  { name: 'auth', dependencies: ['errors'] },
);
