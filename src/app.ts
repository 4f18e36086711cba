import { isUtf8 } from 'node:buffer';
import { randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import Fastify, { type FastifyInstance, type FastifyRequest, type FastifyServerOptions } from 'fastify';
import { serializerCompiler, validatorCompiler, type ZodTypeProvider } from 'fastify-type-provider-zod';
import secureJson from 'secure-json-parse';
import type { Config } from './config/config.js';
import { AppError } from './shared/app-error.js';
import type { Database } from './db/client.js';
import { createPageReads, type PageReason, type PageTarget } from './db/page-reads.js';
import { systemClock, type Clock } from './shared/clock.js';
import { linkSealerFor, type TextSealer } from './shared/text-sealer.js';
import type { BusinessRegister } from './modules/customers/business-register.js';
import { carriesLogContext, loggerOptions, requestChildLogger } from './shared/logging.js';
import { clientErrorHandler, errorEnvelope, errorsPlugin, renderError } from './plugins/errors.plugin.js';
import { authPlugin } from './modules/api-keys/auth.plugin.js';
import { logAbortedRequest, RequestLogController } from './plugins/request-log.plugin.js';
import { idempotencyPlugin } from './plugins/idempotency.plugin.js';
import { cleanFlatValues, cleanJsonTree, cleanText, type TextIssues } from './plugins/text-input.js';
import { metricsPlugin } from './plugins/metrics.plugin.js';
import { lazyJobQueue, type JobQueue } from './shared/job-runner.js';
import { RETENTION_TABLES } from './modules/retention/retention.repository.js';
import { gracefulClosePlugin } from './plugins/graceful-close.plugin.js';
import { cutTimedOutConnection, requestTimeoutServerOptions, requestTimeoutsPlugin } from './plugins/request-timeouts.plugin.js';
import { openapiPlugin } from './plugins/openapi.plugin.js';
import { healthRoutes } from './modules/health/health.routes.js';
import { uploadPageRoutes } from './modules/document-requests/upload-page.routes.js';
import { apiModules } from './modules/index.js';
import type { ResolveHost } from './modules/webhooks/endpoint-url.js';
import { createServices, type Services } from './services.js';

export type AppDeps = {
  config: Config;
  database: Database;
  /**
   * A physical streaming standby of `database` (DATABASE_REPLICA_URL): list pages read there when it
   * has replayed far enough to keep them exact (src/db/page-reads.ts). Everything else stays on `database`.
   */
  replica?: Database;
  /** Tests only: false skips the replay check (the replica test's negative control). */
  exactReplicaReads?: boolean;
  clock?: Clock;
  /**
   * The business-register (ABN) lookup for sole traders. None by default: the ABN is recorded as
   * NOT_CHECKED. A miss, an error or a slow answer never blocks ingest.
   */
  businessRegister?: BusinessRegister;
  /** How a webhook URL's host name is resolved for its checks; the system resolver by default. */
  resolveHost?: ResolveHost;
  /** Pino options, or false for silence (tests). Defaults to JSON logs at config.logLevel. */
  logger?: FastifyServerOptions['logger'];
  /**
   * Check every response against its zod schema before sending (tests turn this on). In production
   * the typed DTO mappers already guarantee the shape, so responses are plain JSON.stringify.
   */
  validateResponses?: boolean;
  /** Seals link-bearing text at rest; default: the key of config (LINK_ENCRYPTION_KEY, else DATA_DIR's key file). */
  linkSealer?: TextSealer;
  /** Where requests enqueue background jobs (the process's job runner); default: a send-only one, started at the first send. */
  jobs?: JobQueue;
};

/** What the plugins read of the app's dependencies; the routes use the services built on them. */
export type ResolvedDeps = Required<Pick<AppDeps, 'config' | 'database' | 'clock' | 'linkSealer' | 'jobs'>>;

declare module 'fastify' {
  interface FastifyInstance {
    deps: ResolvedDeps;
    services: Services;
    metrics?: {
      rateLimited(window: string): void;
      retentionPurged(table: string, rows: number): void;
      pageRead(target: PageTarget, reason: PageReason): void;
    };
  }
}

export { loggerOptions };

const MAX_PATH_PARAM_LENGTH = 1024;
/** The longest id any record can have (external_id is at most 255 characters). */
const MAX_ID_LENGTH = 255;
const LONG_ID_MESSAGE = 'No resource has an id that long.';
const REQUEST_ID_PATTERN = /^[A-Za-z0-9._:-]{1,128}$/;
// Content-Encoding values that leave the body as sent: none, or identity (a list of them).
const IDENTITY_ENCODING = /^\s*(?:identity\s*(?:,\s*identity\s*)*)?$/i;
// RFC 9110 §7.2: uri-host [ ":" port ], the host an IP literal, an IPv4 address or a reg-name.
const HOST_PATTERN = /^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9\-._~%!$&'()*+,;=]*)(?::[0-9]*)?$/;

// Node's own test of an Expect value it can meet (Node answers anything else with a bare 417).
const EXPECT_CONTINUE = /(?:^|\W)100-continue(?:$|\W)/i;

/**
 * A request Node's parser lets through but HTTP/1.1 refuses (RFC 9112 §2.3, §3.2): another
 * version than 1.0 or 1.1, an HTTP/1.1 request without Host, more than one Host line (Node keeps
 * the first) or an invalid Host value.
 */
function protocolProblem(request: FastifyRequest): string | undefined {
  const { httpVersionMajor, httpVersionMinor, rawHeaders } = request.raw;
  if (httpVersionMajor !== 1 || httpVersionMinor > 1) return 'Only HTTP/1.0 and HTTP/1.1 requests are served.';
  const host = request.headers.host;
  if (host === undefined) return httpVersionMinor === 1 ? 'An HTTP/1.1 request must carry a Host header.' : undefined;
  if (!HOST_PATTERN.test(host)) return 'The Host header is not a valid host.';
  let count = 0;
  for (let index = 0; index < rawHeaders.length; index += 2) {
    const name = rawHeaders[index]!;
    if (name.length === 4 && name.toLowerCase() === 'host' && ++count > 1) return 'The request carries more than one Host header.';
  }
  return undefined;
}

/** The raw answer to a CONNECT request, which Node hands over as a bare socket (there is no reply to send through). */
function refuseConnect(request: IncomingMessage, socket: Duplex): void {
  const body = JSON.stringify(errorEnvelope(new AppError('not_found', 404, `No route for CONNECT ${request.url ?? ''}.`)));
  socket.on('error', () => {}); // a client gone already needs no answer
  socket.end(
    `HTTP/1.1 404 Not Found\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\n` +
      `Cache-Control: no-store\r\nConnection: close\r\n\r\n${body}`,
  );
}

/** A send-only job queue of the app's own, stopped with it. */
function ownJobs(app: FastifyInstance, database: Database): JobQueue {
  const jobs = lazyJobQueue(database);
  app.addHook('onClose', async () => jobs.stop());
  return jobs;
}

/** Builds the HTTP application on the given dependencies; it neither listens nor reads the environment. */
export async function buildApp(deps: AppDeps): Promise<FastifyInstance> {
  const logger = deps.logger === undefined ? loggerOptions(deps.config) : deps.logger;
  const timeouts = requestTimeoutServerOptions(deps.config.requestTimeouts);
  const app = Fastify({
    logger,
    bodyLimit: 1024 * 1024,
    // A request arriving while the server closes gets the error envelope (graceful-close.plugin.ts), not Fastify's own body.
    return503OnClosing: false,
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
    // Node answers an HTTP/1.1 request without Host itself, with a bare 400 outside the envelope;
    // the onRequest hook below refuses it instead (and a repeated or malformed Host, which Node lets by).
    http: { requireHostHeader: false, ...timeouts.http },
    requestTimeout: timeouts.requestTimeout,
    // Errors from the HTTP parser (bad request line or header, headers too large) get the envelope too;
    // a request not received in time is cut as the body-idle bound cuts one (request-timeouts.plugin.ts).
    clientErrorHandler(this: FastifyInstance, error: Error & { code?: string }, socket: Duplex) {
      if (error.code === 'ERR_HTTP_REQUEST_TIMEOUT') cutTimedOutConnection(socket, 'request');
      else clientErrorHandler.call(this, error, socket);
    },
    // Errors raised by the router before any route runs (a malformed percent-encoding, an
    // over-long path parameter) get the envelope too: no such resource can exist.
    frameworkErrors: (error, request, reply) => {
      // No onRequest hook runs before this answer, so it sets what that hook would.
      reply.header('X-Request-Id', request.id);
      reply.header('Cache-Control', 'no-store');
      const message = error.code === 'FST_ERR_MAX_PARAM_LENGTH' ? LONG_ID_MESSAGE : 'The URL is not validly percent-encoded.';
      void renderError(reply, new AppError('not_found', 404, message));
    },
  }).withTypeProvider<ZodTypeProvider>();

  // An empty body sent as application/json means "no body" (POST /kyb takes an optional body);
  // anything else must be valid JSON, parsed with prototype-poisoning protection.
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'buffer' }, (request, body, done) => {
    // A compressed body is not JSON text; the JSON parser is the only one, so this covers every body.
    if (request.headers['content-encoding'] !== undefined && !IDENTITY_ENCODING.test(request.headers['content-encoding'])) {
      return done(
        new AppError('unsupported_media_type', 415, 'Request bodies must not be content-encoded (Content-Encoding: identity only).'),
        undefined,
      );
    }
    const bytes = typeof body === 'string' ? Buffer.from(body) : body;
    // JSON text is UTF-8 (RFC 8259); decoding invalid bytes would silently store U+FFFD instead.
    if (!isUtf8(bytes)) return done(new AppError('invalid_json', 400, 'The request body is not valid UTF-8.'), undefined);
    const text = bytes.toString('utf8');
    if (text.trim() === '') return done(null, undefined);
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
  // The text rules (text-input.ts) run here, on the parsed values of every route, before the schemas.
  app.addHook('preValidation', (request, _reply, done) => {
    const params = request.params as Record<string, unknown> | undefined;
    let issues: TextIssues | undefined;
    if (params) {
      for (const name in params) {
        const value = params[name];
        // No record can have such an id, so it is missing like any other: 404, not a 422 on length.
        if (typeof value === 'string' && value.length > MAX_ID_LENGTH && value.normalize('NFC').length > MAX_ID_LENGTH) {
          return done(new AppError('not_found', 404, LONG_ID_MESSAGE));
        }
      }
      issues = cleanFlatValues(params, issues);
    }
    if (request.query) issues = cleanFlatValues(request.query as Record<string, unknown>, issues);
    const body: unknown = request.body;
    if (typeof body === 'string') {
      const cleaned = cleanText(body);
      if (typeof cleaned !== 'string') issues = { ...issues, body: cleaned.problems };
      else request.body = cleaned;
    } else if (body !== null && typeof body === 'object') {
      issues = cleanJsonTree(body as Record<string, unknown>, issues);
    }
    done(issues ? AppError.validation(issues) : undefined);
  });
  // Requests Node would otherwise answer itself, outside the envelope (a bare 417) or not at all (CONNECT).
  app.server.on('checkExpectation', (request: IncomingMessage, response: ServerResponse) => app.routing(request, response));
  app.server.on('connect', refuseConnect);
  app.setValidatorCompiler(validatorCompiler);
  app.setSerializerCompiler(deps.validateResponses ? serializerCompiler : () => (data) => JSON.stringify(data));
  app.decorate('deps', {
    config: deps.config,
    database: deps.database,
    clock: deps.clock ?? systemClock,
    linkSealer: deps.linkSealer ?? linkSealerFor(deps.config),
    jobs: deps.jobs ?? ownJobs(app, deps.database),
  });
  const pageReads = createPageReads({
    primary: deps.database,
    replica: deps.replica,
    exact: deps.exactReplicaReads ?? true,
    observe: (target, reason) => app.metrics?.pageRead(target, reason),
  });
  app.decorate('services', createServices({ ...deps, ...app.deps, sealer: app.deps.linkSealer, pageReads }));
  // First of the onRequest hooks: a body still to come is watched even when a later hook refuses the request.
  await app.register(requestTimeoutsPlugin, { bodyIdleTimeoutMs: deps.config.requestTimeouts.bodyIdleTimeoutMs });
  app.addHook('onRequest', (request, reply, done) => {
    reply.header('X-Request-Id', request.id);
    // Responses carry personal data (and a 404 is cacheable by default): no cache may keep any of
    // them, errors and replays included. Set first, so every later answer carries it.
    reply.header('Cache-Control', 'no-store');
    const problem = protocolProblem(request);
    if (problem) {
      reply.header('Connection', 'close');
      return done(new AppError('bad_request', 400, problem));
    }
    const expectation = request.headers.expect;
    if (expectation !== undefined && !EXPECT_CONTINUE.test(expectation)) {
      return done(new AppError('expectation_failed', 417, 'The only expectation this server meets is Expect: 100-continue.'));
    }
    done();
  });
  app.addHook('onRequestAbort', logAbortedRequest);

  await app.register(errorsPlugin);
  await app.register(gracefulClosePlugin);
  await app.register(metricsPlugin, { retentionTables: RETENTION_TABLES });
  await app.register(openapiPlugin);
  await app.register(authPlugin, { defaults: deps.config.rateLimit });
  await app.register(idempotencyPlugin);
  await app.register(healthRoutes);
  // The contact's document upload page: outside /v1, its link token the only credential.
  await app.register(uploadPageRoutes);
  for (const module of apiModules) await app.register(module, { prefix: '/v1' });
  return app;
}
