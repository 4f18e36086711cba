import { STATUS_CODES } from 'node:http';
import type { Duplex } from 'node:stream';
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import fp from 'fastify-plugin';
import { hasZodFastifySchemaValidationErrors } from 'fastify-type-provider-zod';
import { AppError, isAppError } from '../shared/app-error.js';
import { isDatabaseUnavailable, isLockTimeout } from '../db/client.js';

export type ErrorEnvelope = { error: { code: string; message: string; details?: Record<string, unknown> } };

/** `['contact', 'email']` → `contact.email`; `['designatedServices', 1]` → `designatedServices[1]`. */
export function formatFieldPath(segments: ReadonlyArray<PropertyKey>): string {
  let path = '';
  for (const segment of segments) {
    if (typeof segment === 'number') path += `[${segment}]`;
    else path += path === '' ? String(segment) : `.${String(segment)}`;
  }
  return path;
}

export type ValidationItem = { instancePath: string; message?: string; keyword?: string; params?: Record<string, unknown> };

export function issuesFromValidation(items: ValidationItem[], context: string | undefined): Record<string, string[]> {
  // No prototype: a field named like an Object method ("constructor") must not collide with it.
  const issues: Record<string, string[]> = Object.create(null);
  const add = (path: string, message: string) => {
    (issues[path] ??= []).push(message);
  };
  for (const item of items) {
    const segments = item.instancePath
      .split('/')
      .filter((part) => part !== '')
      .map((part) => (/^\d+$/.test(part) ? Number(part) : part));
    const base = formatFieldPath(segments);
    if (item.keyword === 'unrecognized_keys' && Array.isArray(item.params?.keys)) {
      for (const key of item.params.keys as string[]) add(base ? `${base}.${key}` : key, 'Unknown property.');
      continue;
    }
    add(base || context || 'body', item.message ?? 'Invalid value.');
  }
  return issues;
}

function toAppError(error: FastifyError): AppError | undefined {
  if (isAppError(error)) return error;
  if (hasZodFastifySchemaValidationErrors(error)) {
    const context = (error as FastifyError & { validationContext?: string }).validationContext;
    return AppError.validation(issuesFromValidation(error.validation, context));
  }
  switch (error.code) {
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return new AppError('payload_too_large', 413, 'The request body exceeds the 1 MiB limit.');
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return new AppError('unsupported_media_type', 415, 'Request bodies must be sent as application/json.');
    case 'FST_ERR_CTP_EMPTY_JSON_BODY':
      return AppError.validation({ body: ['The body is empty but the content type is application/json.'] });
    case 'FST_ERR_CTP_INVALID_JSON_BODY':
      return new AppError('invalid_json', 400, 'The request body is not valid JSON.');
    case 'FST_ERR_CTP_INVALID_CONTENT_LENGTH':
      // A client fault (truncated or mislabelled body), not an internal failure.
      return new AppError('invalid_json', 400, 'The request body does not match its Content-Length header.');
    default:
      break;
  }
  if (error instanceof SyntaxError && error.statusCode === 400) {
    return new AppError('invalid_json', 400, 'The request body is not valid JSON.');
  }
  if (error.validation) {
    return AppError.validation(issuesFromValidation(error.validation, error.validationContext));
  }
  if (error.statusCode === 404) return AppError.notFound('Route');
  return undefined;
}

export function errorEnvelope(error: AppError): ErrorEnvelope {
  const body: ErrorEnvelope = { error: { code: error.code, message: error.message } };
  if (error.details !== undefined) body.error.details = error.details;
  return body;
}

/** Sets an error answer's status and headers on `reply` and returns its body. */
function errorAnswer(reply: FastifyReply, error: AppError): ErrorEnvelope {
  if (error.status === 401) reply.header('WWW-Authenticate', 'Bearer');
  reply.code(error.status).type('application/json; charset=utf-8');
  return errorEnvelope(error);
}

export function renderError(reply: FastifyReply, error: AppError): FastifyReply {
  return reply.send(errorAnswer(reply, error));
}

/**
 * Errors Node's HTTP parser raises before Fastify sees a request (a malformed request line or
 * header, headers over the size limit, a request that is not complete in time). Fastify's default
 * answers these with its own JSON shape; this writes the spec's envelope instead, then closes the
 * connection as Node and Fastify do (its framing can no longer be trusted).
 */
export function clientErrorHandler(this: FastifyInstance, error: Error & { code?: string }, socket: Duplex): void {
  // A reset connection is gone already; nothing can or need be written.
  if (error.code === 'ECONNRESET' || socket.destroyed) return;
  const appError =
    error.code === 'ERR_HTTP_REQUEST_TIMEOUT'
      ? new AppError('request_timeout', 408, 'The request was not received in time.')
      : error.code === 'HPE_HEADER_OVERFLOW'
        ? new AppError('headers_too_large', 431, 'The request headers exceed the size limit.')
        : new AppError('bad_request', 400, 'The request is not valid HTTP.');
  this.log.debug({ err: error }, 'client error');
  if (socket.writable) {
    const body = JSON.stringify(errorEnvelope(appError));
    socket.write(
      `HTTP/1.1 ${appError.status} ${STATUS_CODES[appError.status]}\r\n` +
        `Content-Type: application/json; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
    );
  }
  socket.destroy(error);
}

/** Codes of a connection the client closed or reset under us. */
export const CLIENT_GONE_CODES: ReadonlySet<string> = new Set(['ECONNRESET', 'ECONNABORTED', 'EPIPE', 'ERR_STREAM_PREMATURE_CLOSE']);

/**
 * The client went away while its body was being read: Node's request stream failed ("aborted",
 * ECONNRESET). That failure is recognised by where it comes from, never by its code alone, since a
 * database connection fails with the same codes: it is the request stream's own error (the stream's
 * `errored`, however a body reader passed it on: as it is, as a cause, or with a 4xx status Fastify's
 * reader adds), or a reader's own report of it, which carries a 4xx status (no database error does),
 * while this request's connection is gone.
 */
export function isClientAbort(error: unknown, request: FastifyRequest): boolean {
  const streamError = request.raw.errored;
  if (streamError !== null && streamError !== undefined) {
    let current: unknown = error;
    for (let depth = 0; current !== null && typeof current === 'object' && depth < 5; depth += 1) {
      if (current === streamError) return true;
      current = (current as { cause?: unknown }).cause;
    }
  }
  const { code, message, statusCode } = (error ?? {}) as { code?: unknown; message?: unknown; statusCode?: unknown };
  const gone = (typeof code === 'string' && CLIENT_GONE_CODES.has(code)) || message === 'aborted';
  return gone && typeof statusCode === 'number' && statusCode < 500 && (request.raw.destroyed || request.raw.socket?.destroyed === true);
}

/** What every error line says of its request besides the error: the route's pattern, never the URL. */
function whereOf(request: FastifyRequest): { method: string; route?: string } {
  return { method: request.method, route: request.routeOptions.url };
}

/**
 * The AppError a failure is answered with, and its log line. A client's fault (4xx), and a client
 * that hung up mid-body, are logged at debug (the request line, or the aborted-request line, at info
 * says the rest); a database that cannot be reached is a 503 with Retry-After; anything unexpected is
 * a 500 naming the request id. Every line names the route, and the error only through the error serializer.
 */
export function answerFor(error: unknown, request: FastifyRequest, reply: FastifyReply): AppError {
  if (isClientAbort(error, request)) {
    // Its info line comes from the onRequestAbort hook (logAbortedRequest), as for any request the client leaves.
    request.log.debug({ ...whereOf(request), err: error }, 'client aborted the request while sending its body');
    return new AppError('bad_request', 400, 'The connection closed before the whole request body arrived.');
  }
  const appError = toAppError(error as FastifyError);
  if (appError) {
    if (appError.status >= 500) request.log.error({ ...whereOf(request), status: appError.status, err: error }, 'request failed');
    else request.log.debug({ ...whereOf(request), status: appError.status, err: error }, 'request refused');
    if (appError.code === 'database_unavailable' || appError.code === 'record_locked') reply.header('Retry-After', '1');
    return appError;
  }
  if (isLockTimeout(error)) {
    // Contention another request causes, answered 409 for the client to retry: not a fault of the service.
    request.log.info({ ...whereOf(request), status: 409, err: error }, 'record locked');
    reply.header('Retry-After', '1');
    return new AppError('record_locked', 409, 'The record is being changed by another request; retry shortly.');
  }
  if (isDatabaseUnavailable(error)) {
    request.log.error({ ...whereOf(request), status: 503, err: error }, 'database unavailable');
    reply.header('Retry-After', '1');
    return new AppError('database_unavailable', 503, 'The database is temporarily unavailable; retry shortly.');
  }
  request.log.error({ ...whereOf(request), status: 500, err: error }, 'unhandled error');
  return new AppError('internal', 500, 'An internal error occurred. Quote the request id to support.', { request_id: request.id });
}

/** One handler renders every error, including Fastify's own, as the spec's envelope. */
export const errorsPlugin = fp(
  async (app: FastifyInstance) => {
    app.setErrorHandler((error: FastifyError, request: FastifyRequest, reply: FastifyReply) =>
      renderError(reply, answerFor(error, request, reply)),
    );

    app.setNotFoundHandler((request, reply) => {
      renderError(reply, new AppError('not_found', 404, `No route for ${request.method} ${request.url.split('?')[0]}.`));
    });
  },
  { name: 'errors' },
);
