import { randomUUID } from 'node:crypto';
import Fastify, { type FastifyInstance, type FastifyServerOptions } from 'fastify';
import { serializerCompiler, validatorCompiler, type ZodTypeProvider } from 'fastify-type-provider-zod';
import secureJson from 'secure-json-parse';
import type { Config } from './config/config.js';
import { AppError } from './shared/app-error.js';
import type { Database } from './db/client.js';
import { systemClock, type Clock } from './shared/clock.js';
import type { BusinessRegister } from './modules/customers/business-register.js';
import { carriesLogContext, loggerOptions, requestChildLogger } from './shared/logging.js';
import { clientErrorHandler, errorsPlugin, renderError } from './plugins/errors.plugin.js';
import { authPlugin } from './plugins/auth.plugin.js';
import { logAbortedRequest, RequestLogController } from './plugins/request-log.plugin.js';
import { idempotencyPlugin } from './plugins/idempotency.plugin.js';
import { metricsPlugin } from './plugins/metrics.plugin.js';
import { gracefulClosePlugin } from './plugins/graceful-close.plugin.js';
import { openapiPlugin } from './plugins/openapi.plugin.js';
import { healthRoutes } from './modules/health/health.routes.js';
import { apiModules } from './modules/index.js';

export type AppDeps = {
  config: Config;
  database: Database;
  clock?: Clock;
  /**
   * The business-register (ABN) lookup for sole traders. None by default: the ABN is recorded as
   * NOT_CHECKED. A miss, an error or a slow answer never blocks ingest.
   */
  businessRegister?: BusinessRegister;
  /** Pino options, or false for silence (tests). Defaults to JSON logs at config.logLevel. */
  logger?: FastifyServerOptions['logger'];
  /**
   * Check every response against its zod schema before sending (tests turn this on). In production
   * the typed DTO mappers already guarantee the shape, so responses are plain JSON.stringify.
   */
  validateResponses?: boolean;
};

export type ResolvedDeps = Required<Omit<AppDeps, 'logger' | 'validateResponses' | 'businessRegister'>> & Pick<AppDeps, 'businessRegister'>;

declare module 'fastify' {
  interface FastifyInstance {
    deps: ResolvedDeps;
    metrics?: { rateLimited(window: string): void };
  }
}

export { loggerOptions };

const MAX_PATH_PARAM_LENGTH = 1024;
const NUL_IN_JSON = /\\u0000|\u0000/;
const NUL_MESSAGE = 'Must not contain NUL characters (U+0000).';
const REQUEST_ID_PATTERN = /^[A-Za-z0-9._:-]{1,128}$/;

/** Builds the HTTP application on the given dependencies; it neither listens nor reads the environment. */
export async function buildApp(deps: AppDeps): Promise<FastifyInstance> {
  const logger = deps.logger === undefined ? loggerOptions(deps.config) : deps.logger;
  const app = Fastify({
    logger,
    bodyLimit: 1024 * 1024,
    trustProxy: deps.config.trustProxy.length > 0 ? deps.config.trustProxy : false,
    genReqId: (request) => {
      const incoming = request.headers['x-request-id'];
      return typeof incoming === 'string' && REQUEST_ID_PATTERN.test(incoming) ? incoming : randomUUID();
    },
    requestIdHeader: false,
    // The request id rides the service's log mixin; other logger options keep Fastify's own child.
    ...(carriesLogContext(logger) ? { childLoggerFactory: requestChildLogger } : {}),
    // One line per request, written once the response is sent (request-log.plugin.ts).
    logController: new RequestLogController(),
    // An {id} may be an external_id of up to 255 characters, up to three times as long when
    // percent-encoded; the router's default limit (100) answered such URLs with a bare 414.
    routerOptions: { ignoreTrailingSlash: true, maxParamLength: MAX_PATH_PARAM_LENGTH },
    // Errors from the HTTP parser (bad request line or header, headers too large) get the envelope too.
    clientErrorHandler,
    // Errors raised by the router before any route runs (a malformed percent-encoding, an
    // over-long path parameter) get the envelope too: no such resource can exist.
    frameworkErrors: (error, request, reply) => {
      reply.header('X-Request-Id', request.id);
      const message =
        error.code === 'FST_ERR_MAX_PARAM_LENGTH' ? 'No resource has an id that long.' : 'The URL is not validly percent-encoded.';
      return renderError(reply, new AppError('not_found', 404, message));
    },
  }).withTypeProvider<ZodTypeProvider>();

  // An empty body sent as application/json means "no body" (POST /kyb takes an optional body);
  // anything else must be valid JSON, parsed with prototype-poisoning protection.
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'string' }, (_request, body, done) => {
    const text = typeof body === 'string' ? body : body.toString('utf8');
    if (text.trim() === '') return done(null, undefined);
    // PostgreSQL text cannot hold U+0000; refuse it here rather than fail at the database.
    if (NUL_IN_JSON.test(text)) return done(AppError.validation({ body: [NUL_MESSAGE] }), undefined);
    try {
      done(null, secureJson.parse(text, undefined, { protoAction: 'error', constructorAction: 'error' }));
    } catch {
      done(new AppError('invalid_json', 400, 'The request body is not valid JSON.'), undefined);
    }
  });
  // Fastify parses text/plain bodies by default; the API takes JSON only, so anything else is a 415
  // rather than a string that fails validation with a misleading 422.
  app.removeContentTypeParser('text/plain');
  // Callback hooks where nothing is awaited: no promise and no extra microtasks per request.
  app.addHook('preValidation', (request, _reply, done) => {
    for (const values of [request.query, request.params]) {
      if (!values || typeof values !== 'object') continue;
      for (const [name, value] of Object.entries(values as Record<string, unknown>)) {
        if (typeof value === 'string' && value.includes('\u0000')) return done(AppError.validation({ [name]: [NUL_MESSAGE] }));
      }
    }
    done();
  });
  app.setValidatorCompiler(validatorCompiler);
  app.setSerializerCompiler(deps.validateResponses ? serializerCompiler : () => (data) => JSON.stringify(data));
  app.decorate('deps', { config: deps.config, database: deps.database, clock: deps.clock ?? systemClock, businessRegister: deps.businessRegister });
  app.addHook('onRequest', (request, reply, done) => {
    reply.header('X-Request-Id', request.id);
    done();
  });
  app.addHook('onRequestAbort', logAbortedRequest);

  await app.register(errorsPlugin);
  await app.register(gracefulClosePlugin);
  await app.register(metricsPlugin);
  await app.register(openapiPlugin);
  await app.register(authPlugin, { defaults: deps.config.rateLimit });
  await app.register(idempotencyPlugin);
  await app.register(healthRoutes);
  for (const module of apiModules) await app.register(module, { prefix: '/v1' });
  return app;
}
