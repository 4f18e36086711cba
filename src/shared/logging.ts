import { createRequire } from 'node:module';
import pino, { type DestinationStream, type LoggerOptions } from 'pino';
import type { Config } from '../config/config.js';

export const REDACTED = '[redacted]';

/*
 * How personal data is kept out of the logs, without a redaction walk on every line:
 *
 * - The request line (one per request, see request-log.plugin.ts) is built here from fields that
 *   cannot hold personal data: method, route pattern, status, duration, request id, key and
 *   organisation ids. Never a URL, query string, header or body. It is written as is.
 * - Errors, wherever they sit in a line, go through serializeError: type, code, a message known
 *   not to embed values, identifiers (constraint, table, column), never a driver's bound values or
 *   a row (`params`, `detail`, `where`).
 * - Any other object logged (rare lines: warnings, failures, start-up) is copied with the values of
 *   sensitive keys replaced, at any depth: a safety net for careless code, paid only by those lines.
 */

/** Keys whose values are personal data or secrets, wherever they sit in a logged object (compared lower-cased). */
const SENSITIVE_KEYS = new Set(
  [
    'email',
    'emails',
    'kyc_email',
    'fullName',
    'full_name',
    'firstName',
    'first_name',
    'middleName',
    'middle_name',
    'lastName',
    'last_name',
    'name',
    'businessName',
    'legalName',
    'verified_legal_name',
    'phone',
    'key',
    'apiKey',
    'api_key',
    'x-api-key',
    'secret',
    'password',
    'token',
    'authorization',
    'proxy-authorization',
    'cookie',
    'set-cookie',
    'idempotency-key',
    // What a failed statement carries: the bound values and the offending row.
    'params',
    'parameters',
    'detail',
  ].map((key) => key.toLowerCase()),
);

/** Query parameters whose values never reach the logs (the path and the other parameters do). */
const SENSITIVE_QUERY = new Set(['email', 'full_name', 'fullname', 'name', 'key', 'api_key', 'token', 'phone']);

export function redactUrl(url: string): string {
  const question = url.indexOf('?');
  if (question < 0) return url;
  const params = new URLSearchParams(url.slice(question + 1));
  let changed = false;
  for (const name of [...new Set(params.keys())]) {
    if (SENSITIVE_QUERY.has(name.toLowerCase())) {
      params.set(name, REDACTED);
      changed = true;
    }
  }
  return changed ? `${url.slice(0, question)}?${params.toString()}` : url;
}

/** Fastify's request serializer (for any line that logs `req`): no headers, sensitive query values redacted. */
type LoggedRequest = { method?: string; url?: string; routeOptions?: { url?: string } };
function serializeRequest(request: LoggedRequest) {
  return { method: request.method, url: redactUrl(request.url ?? ''), route: request.routeOptions?.url };
}

// ---------------------------------------------------------------------------------------------
// Errors

/** An error as it is logged: structured fields, none of which holds a bound value or a row. */
export type LoggedError = {
  type: string;
  message?: string;
  code?: string | number;
  severity?: string;
  schema?: string;
  table?: string;
  column?: string;
  dataType?: string;
  constraint?: string;
  routine?: string;
  /** A failed statement's SQL text (never its parameters). */
  query?: string;
  statusCode?: number;
  syscall?: string;
  address?: string;
  port?: number;
  cause?: LoggedError;
  errors?: LoggedError[];
  /** Call frames only (the message lines are dropped); at LOG_LEVEL debug or trace. */
  stack?: string;
};

const SQLSTATE = /^[0-9A-Z]{5}$/;
/**
 * SQLSTATE classes whose messages quote only identifiers (constraint, relation, column, type names),
 * e.g. 23505 `duplicate key value violates unique constraint "customers_org_email_key"`. Other
 * classes may quote a value: 22P02 `invalid input syntax for type uuid: "jane@example.com"`.
 */
const IDENTIFIER_ONLY_CLASSES = new Set(['08', '0A', '23', '25', '26', '28', '3D', '3F', '40', '42', '53', '54', '55', '57', '58', 'XX']);
const QUOTED = /"(?:[^"]|"")*"/g;
const MAX_MESSAGE = 500;
const MAX_QUERY = 2000;
const MAX_CAUSES = 4;
const MAX_AGGREGATED = 5;
const STRING_FIELDS = ['severity', 'schema', 'table', 'column', 'dataType', 'constraint', 'routine', 'syscall', 'address'] as const;

type ErrorLike = Record<string, unknown> & { message?: unknown; cause?: unknown; stack?: unknown };

function truncate(text: string, max: number): string {
  return text.length > max ? `${text.slice(0, max)}…` : text;
}

/** A PostgreSQL message, with quoted values dropped where the class may quote one. */
function databaseMessage(code: string, message: string): string {
  return IDENTIFIER_ONLY_CLASSES.has(code.slice(0, 2)) ? message : message.replace(QUOTED, `"${REDACTED}"`);
}

/** Any other message: never what follows a driver's "params:" line, and bounded. */
function plainMessage(message: string): string {
  const params = message.indexOf('\nparams:');
  return truncate(params < 0 ? message : message.slice(0, params), MAX_MESSAGE);
}

/** The call frames of a stack, without its first lines (they repeat the message). */
function framesOf(stack: unknown): string | undefined {
  if (typeof stack !== 'string') return undefined;
  const first = stack.indexOf('\n    at ');
  return first < 0 ? undefined : stack.slice(first + 1);
}

/** A failed statement as drizzle-orm reports it: `Failed query: <sql>\nparams: <values>`, with `query`, `params`, `cause`. */
function isQueryError(error: ErrorLike): error is ErrorLike & { query: string } {
  return typeof error.query === 'string' && 'params' in error;
}

function typeOf(error: object): string {
  const constructorName = (error as { constructor?: { name?: unknown } }).constructor?.name;
  if (typeof constructorName === 'string' && constructorName !== 'Object' && constructorName !== '') return constructorName;
  const name = (error as { name?: unknown }).name;
  return typeof name === 'string' ? name : 'Error';
}

function toLoggedError(value: unknown, withStack: boolean, depth: number): LoggedError {
  if (value === null || typeof value !== 'object') {
    return { type: typeof value, message: typeof value === 'string' ? plainMessage(value) : undefined };
  }
  const error = value as ErrorLike;
  if (isQueryError(error)) {
    // The statement's own message embeds its parameters: log what its cause says, plus the SQL text.
    const logged =
      error.cause !== undefined && depth < MAX_CAUSES ? toLoggedError(error.cause, withStack, depth + 1) : { type: typeOf(error), message: 'Failed query' };
    logged.query = truncate(error.query, MAX_QUERY);
    return logged;
  }
  const logged: LoggedError = { type: typeOf(error) };
  const code = error.code;
  const message = typeof error.message === 'string' ? error.message : undefined;
  if (typeof code === 'string' || typeof code === 'number') logged.code = code;
  if (message !== undefined) {
    logged.message = typeof code === 'string' && SQLSTATE.test(code) && typeof error.severity === 'string' ? databaseMessage(code, message) : plainMessage(message);
  }
  for (const field of STRING_FIELDS) {
    const fieldValue = error[field];
    if (typeof fieldValue === 'string') logged[field] = fieldValue;
  }
  if (typeof error.port === 'number') logged.port = error.port;
  if (typeof error.statusCode === 'number') logged.statusCode = error.statusCode;
  if (error.cause !== undefined && depth < MAX_CAUSES) logged.cause = toLoggedError(error.cause, withStack, depth + 1);
  if (Array.isArray(error.errors) && depth < MAX_CAUSES) {
    logged.errors = error.errors.slice(0, MAX_AGGREGATED).map((inner: unknown) => toLoggedError(inner, withStack, depth + 1));
  }
  if (withStack) logged.stack = framesOf(error.stack);
  return logged;
}

/** The error serializer: structured fields that hold no bound value, row or free-form text from the data. */
export function serializeError(error: unknown, options: { stack?: boolean } = {}): LoggedError {
  return toLoggedError(error, options.stack ?? false, 0);
}

/** A message for a line that logs an error without one (pino would use the error's own message). */
function safeMessageOf(error: unknown): string {
  const logged = serializeError(error);
  return logged.message ?? logged.type;
}

// ---------------------------------------------------------------------------------------------
// Request context and the request line

const LOG_CONTEXT = Symbol('logContext');
const REQUEST_LINE = Symbol('requestLine');
const NO_CONTEXT: object = Object.freeze({});

/**
 * Names the API key and organisation on every later line of a request's logger. Kept on the logger
 * and merged in by the mixin only when a line is written: pino's setBindings would serialize the
 * bindings on every request even when nothing is logged.
 */
export function bindLogContext(log: unknown, context: { apiKeyId: string; orgId: string }): void {
  if (log && typeof log === 'object') {
    const logger = log as { [LOG_CONTEXT]?: { apiKeyId?: string; orgId?: string } };
    const bound = logger[LOG_CONTEXT];
    // A known key's request binds the same context again once its check passes: nothing to copy.
    if (bound?.apiKeyId === context.apiKeyId && bound.orgId === context.orgId) return;
    // Object.assign, not a spread: adding the two names to a spread copy of the request's bindings
    // took V8's slow path (1.2 µs per request, against 0.06 µs).
    logger[LOG_CONTEXT] = Object.assign({}, bound, { apiKeyId: context.apiKeyId, orgId: context.orgId });
  }
}

/** What bindLogContext and requestChildLogger keep on a logger, for each line it writes. */
function logContextMixin(_object: object, _level: number, logger: unknown): object {
  return (logger as { [LOG_CONTEXT]?: object })[LOG_CONTEXT] ?? NO_CONTEXT;
}

/**
 * The context first, then the line's own fields, in a new object: pino's default strategy would
 * assign the line's fields into the context kept on the logger, and so into every later line.
 */
function mergeLogContext(object: object, context: object): object {
  return context === NO_CONTEXT ? object : Object.assign({}, context, object);
}

/** Whether Fastify logger options are the service's own (whose mixin writes the request context). */
export function carriesLogContext(options: unknown): boolean {
  return typeof options === 'object' && options !== null && (options as { mixin?: unknown }).mixin === logContextMixin;
}

/**
 * Fastify's per-request child logger, carrying its bindings (the request id) through the same
 * mixin: pino serializes a child's bindings when the child is made, on every request, even when
 * the request never logs a line.
 */
export function requestChildLogger<T extends { child(bindings: object, options?: object): T }>(logger: T, bindings: object, options: object): T {
  const child = logger.child({}, options) as T & { [LOG_CONTEXT]?: object };
  child[LOG_CONTEXT] = { ...bindings };
  return child;
}

/** The fields of the one line written per request (its context, request id included, comes from the logger). */
export type RequestLine = { method: string; route?: string; status: number; durationMs: number };

function asRequestLine<T extends object>(line: T): T {
  (line as { [REQUEST_LINE]?: true })[REQUEST_LINE] = true;
  return line;
}

/**
 * The request line: only fields that cannot hold personal data. `route` is the route's pattern
 * (`/v1/customers/:id`), absent when no route matched; never the URL.
 */
export function requestLine(method: string, route: string | undefined, status: number, elapsedMs: number): RequestLine {
  return asRequestLine({ method, route, status, durationMs: Math.round(elapsedMs * 100) / 100 });
}

/** The line of a request whose client went away before its answer was sent (it gets no other). */
export function abortedRequestLine(method: string, route: string | undefined): { method: string; route?: string; aborted: true } {
  return asRequestLine({ method, route, aborted: true as const });
}

// ---------------------------------------------------------------------------------------------
// The safety net for other lines

const MAX_DEPTH = 8;

function isPlain(value: object): boolean {
  const prototype = Object.getPrototypeOf(value) as unknown;
  return prototype === Object.prototype || prototype === null;
}

/** A JSON-like copy of a logged value, with sensitive keys' values replaced and errors serialized. */
function scrub(value: unknown, withStack: boolean, depth: number): unknown {
  if (value === null || typeof value !== 'object') return value;
  if (value instanceof Error) return toLoggedError(value, withStack, 0);
  if (depth >= MAX_DEPTH) return '[too deep]';
  if (Array.isArray(value)) return value.map((item) => scrub(item, withStack, depth + 1));
  if (ArrayBuffer.isView(value) || value instanceof ArrayBuffer) return '[binary]';
  if (!isPlain(value)) {
    const toJSON = (value as { toJSON?: unknown }).toJSON;
    if (typeof toJSON === 'function') return scrub(toJSON.call(value), withStack, depth + 1);
  }
  const copy: Record<string, unknown> = {};
  for (const key in value) {
    if (!Object.prototype.hasOwnProperty.call(value, key)) continue;
    const item = (value as Record<string, unknown>)[key];
    copy[key] = SENSITIVE_KEYS.has(key.toLowerCase()) && item !== undefined && item !== null ? REDACTED : scrub(item, withStack, depth + 1);
  }
  return copy;
}

/** Keys left to their serializers (applied by pino after this formatter). */
const SERIALIZED_KEYS = new Set(['err', 'error', 'req', 'res']);

function logFormatter(withStack: boolean) {
  return function formatLogObject(object: Record<string, unknown>): Record<string, unknown> {
    if ((object as { [REQUEST_LINE]?: true })[REQUEST_LINE]) return object; // built from safe fields only
    const copy: Record<string, unknown> = {};
    for (const key in object) {
      if (!Object.prototype.hasOwnProperty.call(object, key)) continue;
      const item = object[key];
      if (SERIALIZED_KEYS.has(key)) copy[key] = item;
      else copy[key] = SENSITIVE_KEYS.has(key.toLowerCase()) && item !== undefined && item !== null ? REDACTED : scrub(item, withStack, 1);
    }
    return copy;
  };
}

type LogFn = (...args: unknown[]) => void;

/**
 * `log.error(error)` and `log.error({ err })` without a message: pino would write the error's own
 * message as `msg`, which for a failed statement holds its bound values. This gives them the safe one.
 */
function errorMessageHook(this: unknown, args: unknown[], method: LogFn): void {
  if (args.length === 1) {
    const first = args[0];
    if (first instanceof Error) return method.call(this, { err: first }, safeMessageOf(first));
    if (typeof first === 'object' && first !== null) {
      const { err, msg } = first as { err?: unknown; msg?: unknown };
      if (err !== undefined && msg === undefined) return method.call(this, first, safeMessageOf(err));
    }
  }
  method.apply(this, args);
}

// ---------------------------------------------------------------------------------------------
// Options

/** The one set of pino options of the service: JSON, `LOG_LEVEL`, serializers instead of redaction paths. */
export function loggerOptions(config: Pick<Config, 'logLevel'>): LoggerOptions & { serializers: NonNullable<LoggerOptions['serializers']> } {
  const withStack = config.logLevel === 'debug' || config.logLevel === 'trace';
  const errorSerializer = (error: unknown) => toLoggedError(error, withStack, 0);
  return {
    level: config.logLevel,
    serializers: { err: errorSerializer, error: errorSerializer, req: serializeRequest as (value: unknown) => unknown },
    mixin: logContextMixin,
    mixinMergeStrategy: mergeLogContext,
    formatters: { log: logFormatter(withStack) },
    hooks: { logMethod: errorMessageHook as NonNullable<LoggerOptions['hooks']>['logMethod'] },
  };
}

/** True when pretty output was asked for (LOG_FORMAT) or allowed (dev), stdout is a terminal and pino-pretty is installed. */
export function prettyLogsWanted(config: Pick<Config, 'logPretty'>, stream: { isTTY?: boolean } = process.stdout): boolean {
  if (!config.logPretty || !stream.isTTY) return false;
  try {
    createRequire(import.meta.url).resolve('pino-pretty');
    return true;
  } catch {
    return false; // a production install has no devDependencies
  }
}

/** A standalone logger (server start-up, workers, CLI) with the same options; JSON unless pretty applies. */
export function createLogger(config: Pick<Config, 'logLevel' | 'logPretty'>, destination: DestinationStream | 1 | 2 = 1) {
  const options = loggerOptions(config);
  const fd = typeof destination === 'number' ? destination : undefined;
  if (fd !== undefined && prettyLogsWanted(config, fd === 1 ? process.stdout : process.stderr)) {
    return pino({ ...options, transport: { target: 'pino-pretty', options: { destination: fd, translateTime: 'SYS:HH:MM:ss.l' } } });
  }
  return pino(options, fd !== undefined ? pino.destination(fd) : (destination as DestinationStream));
}
