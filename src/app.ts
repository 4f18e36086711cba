import { randomUUID } from 'node:crypto';
import pino from 'pino';
import Fastify, { type FastifyInstance, type FastifyServerOptions } from 'fastify';
import { serializerCompiler, validatorCompiler, type ZodTypeProvider } from 'fastify-type-provider-zod';
import type { Config } from './config/config.js';
import type { Database } from './db/client.js';
import { systemClock, type Clock } from './shared/clock.js';
import { errorsPlugin } from './plugins/errors.plugin.js';
import { authPlugin } from './plugins/auth.plugin.js';
import { idempotencyPlugin } from './plugins/idempotency.plugin.js';
import { healthRoutes } from './modules/health/health.routes.js';
import { apiModules } from './modules/index.js';

export type AppDeps = {
  config: Config;
  database: Database;
  clock?: Clock;
  /** Pino options, or false for silence (tests). Defaults to JSON logs at config.logLevel. */
  logger?: FastifyServerOptions['logger'];
};

export type ResolvedDeps = Required<Omit<AppDeps, 'logger'>>;

declare module 'fastify' {
  interface FastifyInstance {
    deps: ResolvedDeps;
    metrics?: { rateLimited(window: string): void };
  }
}

const REQUEST_ID_PATTERN = /^[A-Za-z0-9._:-]{1,128}$/;

export function loggerOptions(config: Config): FastifyServerOptions['logger'] {
  return {
    level: config.logLevel,
    // stdout carries only what a person or script reads (the first-start key); logs go to stderr.
    stream: pino.destination(2),
    redact: {
      paths: [
        'req.headers.authorization',
        'req.headers["idempotency-key"]',
        'req.headers.cookie',
        '*.email',
        '*.fullName',
        '*.full_name',
        '*.name',
        '*.key',
        '*.secret',
      ],
      censor: '[redacted]',
    },
  };
}

/** Builds the HTTP application on the given dependencies; it neither listens nor reads the environment. */
export async function buildApp(deps: AppDeps): Promise<FastifyInstance> {
  const app = Fastify({
    logger: deps.logger === undefined ? loggerOptions(deps.config) : deps.logger,
    bodyLimit: 1024 * 1024,
    trustProxy: deps.config.trustProxy.length > 0 ? deps.config.trustProxy : false,
    genReqId: (request) => {
      const incoming = request.headers['x-request-id'];
      return typeof incoming === 'string' && REQUEST_ID_PATTERN.test(incoming) ? incoming : randomUUID();
    },
    requestIdHeader: false,
    routerOptions: { ignoreTrailingSlash: true },
  }).withTypeProvider<ZodTypeProvider>();

  // The API speaks JSON only; without this Fastify would hand a text/plain body to the handler as a string.
  app.removeContentTypeParser('text/plain');
  app.setValidatorCompiler(validatorCompiler);
  app.setSerializerCompiler(serializerCompiler);
  app.decorate('deps', { config: deps.config, database: deps.database, clock: deps.clock ?? systemClock });
  app.addHook('onRequest', async (request, reply) => {
    reply.header('X-Request-Id', request.id);
  });

  await app.register(errorsPlugin);
  await app.register(authPlugin, { defaults: deps.config.rateLimit });
  await app.register(idempotencyPlugin);
  await app.register(healthRoutes);
  for (const module of apiModules) await app.register(module, { prefix: '/v1' });
  return app;
}
