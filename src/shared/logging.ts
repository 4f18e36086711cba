import { createRequire } from 'node:module';
import pino, { type DestinationStream, type LoggerOptions } from 'pino';
import type { Config } from '../config/config.js';
import { isConnectionLevelError } from './database-errors.js';

const REDACTED = '[redacted]';

/*
 * How personal data is kept out of the logs, without a redaction walk on every line:
 *
 * - The request line (one per request, see request-log.plugin.ts) is built here from fields that
 *   cannot hold personal data: method, route pattern, status, duration, request id, key and
 *   organisation ids. Never a URL, query string, header or body. It is written as is.
 * - Errors, wherever they sit in a line, go through serializeError: what kind of failure it was
 *   (type, code, SQLSTATE, identifiers such as a constraint or table) and where (call frames), never
 *   what it was about. No error message is written (bar a few constant ones of the database driver,
 *   compared whole), not even ours: a driver's message quotes bound
 *   values, a failed statement's message holds its SQL text and parameters, an engine's message can
 *   quote its input (`"jane@example.com" is not valid JSON`), and our own AppError messages name what
 *   the caller sent (a path, an address, a template code).
 * - Any other object logged (rare lines: warnings, failures, start-up) is copied with the values of
 *   sensitive keys replaced, at any depth, and any API key in a string replaced: a safety net for
 *   careless code, paid only by those lines. A message string is checked for keys and addresses.
 */

/** Keys whose values are personal data or secrets, wherever they sit in a logged object (compared lower-cased). */
const SENSITIVE_KEYS = new Set(
  [
    'email',
    'emails',
    'kyc_email',
    'recipient',
    'to',
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
    'business_name',
    'legalName',
    'legal_name',
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
    // A verification link carries its token.
    'link',
    'url',
    // What a failed statement carries: its SQL text, the bound values and the offending row.
    'query',
    'sql',
    'params',
    'parameters',
    'detail',
    'where',
    'body',
  ].map((key) => key.toLowerCase()),
);

/** Query parameters whose values never reach the logs, whatever they hold (the path and the other parameters do). */
const SENSITIVE_QUERY = new Set([
  'email',
  'full_name',
  'fullname',
  'name',
  'key',
  'api_key',
  'apikey',
  'token',
  'access_token',
  'phone',
  'to',
]);

/** An API key (see api-key-secret.ts), wherever it sits in a string; the prefix alone is enough to hide it. */
const API_KEY_IN_TEXT = /svc_live_[0-9A-Za-z]*/g;
/** An email address, wherever it sits in a string. */
const EMAIL_IN_TEXT = /[^\s"'<>()[\]{},;:/?#=&]+@[^\s"'<>()[\]{},;:/?#=&]+/g;

/** A value that holds a key or an address, which must not be logged whatever field or parameter carries it. */
function holdsSecretOrAddress(value: string): boolean {
  return value.includes('svc_live_') || value.includes('@');
}

/** Text with any API key and email address in it replaced. */
function redactText(text: string): string {
  if (!holdsSecretOrAddress(text)) return text;
  return text.replace(API_KEY_IN_TEXT, REDACTED).replace(EMAIL_IN_TEXT, REDACTED);
}

/**
 * A URL as it may be logged: a path segment holding a key or an address is replaced, and so is the
 * value of a sensitive parameter, or of any parameter holding a key or an address whatever it is
 * called (`?access_token=svc_live_…`).
 */
export function redactUrl(url: string): string {
  const question = url.indexOf('?');
  const path = redactLinkToken(question < 0 ? url : url.slice(0, question));
  const safePath = holdsSecretOrAddress(decodeSafely(path))
    ? path
        .split('/')
        .map((segment) => (holdsSecretOrAddress(decodeSafely(segment)) ? REDACTED : segment))
        .join('/')
    : path;
  if (question < 0) return safePath;
  const params = new URLSearchParams(url.slice(question + 1));
  let changed = false;
  for (const [name, value] of [...params]) {
    if (SENSITIVE_QUERY.has(name.toLowerCase()) || holdsSecretOrAddress(value) || holdsSecretOrAddress(name)) {
      changed = true;
      break;
    }
  }
  if (!changed) return `${safePath}${url.slice(question)}`;
  const safe = new URLSearchParams();
  for (const [name, value] of params) {
    const safeName = holdsSecretOrAddress(name) ? REDACTED : name;
    safe.append(safeName, SENSITIVE_QUERY.has(name.toLowerCase()) || holdsSecretOrAddress(value) ? REDACTED : value);
  }
  return `${safePath}?${safe.toString()}`;
}

/** An upload page's path carries its link token, a credential: `/documents/<token>` is logged as `/documents/[redacted]`. */
const LINK_TOKEN_PATH = /^(\/+documents\/+)[^/]+/i;

function redactLinkToken(path: string): string {
  return path.replace(LINK_TOKEN_PATH, `$1${REDACTED}`);
}

function decodeSafely(text: string): string {
  try {
    return decodeURIComponent(text);
  } catch {
    return text;
  }
}

/** Fastify's request serializer (for any line that logs `req`): no headers; the URL with keys, addresses and sensitive parameters redacted. */
type LoggedRequest = { method?: string; url?: string; routeOptions?: { url?: string } };
function serializeRequest(request: LoggedRequest) {
  return { method: request.method, url: redactUrl(request.url ?? ''), route: request.routeOptions?.url };
}

// ---------------------------------------------------------------------------------------------
// Errors

/**
 * An error as it is logged: what kind of failure and where. No field holds a message, a statement,
 * a bound value or a row.
 */
export type LoggedError = {
  /** The error's class (`DatabaseError`, `AppError`, `TypeError`). */
  type: string;
  /**
   * Only a constant driver message about a connection (CONSTANT_MESSAGES), or the server's message of a
   * connection-level error (FATAL, or SQLSTATE class 08: src/shared/database-errors.ts), which comes
   * from no statement: no other message is logged.
   */
  message?: string;
  /** The error's own code: an AppError's (`rate_limited`), Node's (`ECONNRESET`), Fastify's (`FST_ERR_…`), a library's. */
  code?: string | number;
  /** A PostgreSQL error's SQLSTATE (`23505`), in place of `code`. */
  sqlState?: string;
  severity?: string;
  schema?: string;
  table?: string;
  column?: string;
  dataType?: string;
  constraint?: string;
  routine?: string;
  statusCode?: number;
  /** An SMTP server's reply code (nodemailer), never its reply text (which may quote the recipient). */
  responseCode?: number;
  syscall?: string;
  address?: string;
  port?: number;
  /** Where an error without a code was thrown: its first call frame. */
  at?: string;
  cause?: LoggedError;
  errors?: LoggedError[];
  /** Call frames only (the message lines are dropped); at LOG_LEVEL debug or trace. */
  stack?: string;
};

/**
 * The only messages logged: constant texts of pg and pg-pool about a connection, which name no
 * value and tell the ways a connection fails apart (none of them has a code). Compared whole.
 */
const CONSTANT_MESSAGES = new Set([
  'Connection terminated',
  'Connection terminated unexpectedly',
  'Connection terminated due to connection timeout',
  'timeout exceeded when trying to connect',
  'timeout expired',
  'Query read timeout',
  'Client has encountered a connection error and is not queryable',
  'Client was closed and is not queryable',
  'Cannot use a pool after calling end on the pool',
  'Release called on client which has already been released to the pool.',
]);

const SQLSTATE = /^[0-9A-Z]{5}$/;
/** What a code looks like (`ECONNRESET`, `FST_ERR_VALIDATION`, `rate_limited`); anything else is left out. */
const CODE = /^[\w$.:-]{1,64}$/;
/** What an identifier looks like (a table, a type such as `timestamp with time zone`, an IP address); anything else (an email, a sentence) is left out. */
const TOKEN = /^[\w$.:%\- ]{1,128}$/;
const FRAME = /^\s+at \S/;
const MAX_CAUSES = 4;
const MAX_AGGREGATED = 5;
const MAX_FRAMES = 20;
const IDENTIFIER_FIELDS = ['severity', 'schema', 'table', 'column', 'dataType', 'constraint', 'routine'] as const;

type ErrorLike = Record<string, unknown> & { message?: unknown; cause?: unknown; stack?: unknown };

/** A failed statement as drizzle-orm reports it: `Failed query: <sql>\nparams: <values>`, with `query`, `params`, `cause`. */
function isQueryError(error: ErrorLike): boolean {
  return typeof error.query === 'string' && 'params' in error;
}

/** An error PostgreSQL sent (pg's DatabaseError): a SQLSTATE and a severity. */
function isDatabaseError(error: ErrorLike): boolean {
  return typeof error.code === 'string' && SQLSTATE.test(error.code) && typeof error.severity === 'string';
}

function typeOf(error: object): string {
  const constructorName = (error as { constructor?: { name?: unknown } }).constructor?.name;
  if (typeof constructorName === 'string' && constructorName !== 'Object' && constructorName !== '') return constructorName;
  const name = (error as { name?: unknown }).name;
  return typeof name === 'string' && CODE.test(name) ? name : 'Error';
}

/**
 * The call frames of a stack. A stack opens with the error's name and message, and a message may
 * span lines (a failed statement's holds its parameters, which could be made to look like frames):
 * the frames are the lines after the message, found verbatim on the first line, and only the lines
 * that are frames. A stack that no longer holds its message gives none.
 */
function framesOf(error: ErrorLike): string[] | undefined {
  const stack = error.stack;
  if (typeof stack !== 'string') return undefined;
  const message = typeof error.message === 'string' ? error.message : '';
  let rest: string;
  if (message === '') {
    const newline = stack.indexOf('\n');
    if (newline < 0) return undefined;
    rest = stack.slice(newline + 1);
  } else {
    const at = stack.indexOf(message);
    if (at < 0 || stack.lastIndexOf('\n', at) >= 0 || stack.charAt(at + message.length) !== '\n') return undefined;
    rest = stack.slice(at + message.length + 1);
  }
  const frames: string[] = [];
  for (const line of rest.split('\n', MAX_FRAMES)) {
    if (!FRAME.test(line)) break;
    frames.push(line.trim());
  }
  return frames.length > 0 ? frames : undefined;
}

function toLoggedError(value: unknown, withStack: boolean, depth: number): LoggedError {
  if (value === null || typeof value !== 'object') return { type: value === null ? 'null' : typeof value };
  const error = value as ErrorLike;
  // A failed statement's own fields are its SQL text and parameters: it is logged as what its cause says.
  if (isQueryError(error) && error.cause !== undefined && depth < MAX_CAUSES) return toLoggedError(error.cause, withStack, depth + 1);
  const logged: LoggedError = { type: typeOf(error) };
  if (typeof error.message === 'string' && (CONSTANT_MESSAGES.has(error.message) || isConnectionLevelError(error)))
    logged.message = error.message;
  const code = error.code;
  if (isDatabaseError(error)) logged.sqlState = code as string;
  else if ((typeof code === 'string' && CODE.test(code)) || (typeof code === 'number' && Number.isFinite(code))) logged.code = code;
  for (const field of IDENTIFIER_FIELDS) {
    const fieldValue = error[field];
    if (typeof fieldValue === 'string' && TOKEN.test(fieldValue)) logged[field] = fieldValue;
  }
  if (typeof error.statusCode === 'number') logged.statusCode = error.statusCode;
  if (typeof error.responseCode === 'number') logged.responseCode = error.responseCode;
  if (typeof error.syscall === 'string' && TOKEN.test(error.syscall)) logged.syscall = error.syscall;
  if (typeof error.address === 'string' && TOKEN.test(error.address)) logged.address = error.address;
  if (typeof error.port === 'number') logged.port = error.port;
  const coded = logged.code !== undefined || logged.sqlState !== undefined;
  const frames = withStack || !coded ? framesOf(error) : undefined;
  if (frames && !coded) logged.at = frames[0]!.slice('at '.length);
  if (error.cause !== undefined && depth < MAX_CAUSES) logged.cause = toLoggedError(error.cause, withStack, depth + 1);
  if (Array.isArray(error.errors) && depth < MAX_CAUSES) {
    logged.errors = error.errors.slice(0, MAX_AGGREGATED).map((inner: unknown) => toLoggedError(inner, withStack, depth + 1));
  }
  if (withStack && frames) logged.stack = frames.map((frame) => `    ${frame}`).join('\n');
  return logged;
}

/** The error serializer: what kind of failure and where, never a statement's message, SQL, bound value or row. */
export function serializeError(error: unknown, options: { stack?: boolean } = {}): LoggedError {
  return toLoggedError(error, options.stack ?? false, 0);
}

/** The message of a line that logs an error without one (pino would use the error's own message): its type and code. */
function safeMessageOf(error: unknown): string {
  const logged = serializeError(error);
  const code = logged.sqlState ?? logged.code ?? logged.message;
  return code === undefined ? logged.type : `${logged.type} ${code}`;
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
    // takes V8's slow path.
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
export function requestChildLogger<T extends { child(bindings: object, options?: object): T }>(
  logger: T,
  bindings: object,
  options: object,
): T {
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
  if (typeof value === 'string') return redactText(value);
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
 * A message is free text: a key or an address in it (Fastify's own warnings quote the raw URL) is replaced.
 */
function logMethodHook(this: unknown, args: unknown[], method: LogFn): void {
  if (args.length === 1) {
    const first = args[0];
    if (first instanceof Error) return method.call(this, { err: first }, safeMessageOf(first));
    if (typeof first === 'object' && first !== null) {
      const { err, msg } = first as { err?: unknown; msg?: unknown };
      if (err !== undefined && msg === undefined) return method.call(this, first, safeMessageOf(err));
    }
  }
  if (args.some((arg) => typeof arg === 'string' && holdsSecretOrAddress(arg))) {
    return method.apply(
      this,
      args.map((arg) => (typeof arg === 'string' ? redactText(arg) : arg)),
    );
  }
  method.apply(this, args);
}

// ---------------------------------------------------------------------------------------------
// Options

/** The one set of pino options of the service: JSON, `LOG_LEVEL`, serializers instead of redaction paths. */
export function loggerOptions(
  config: Pick<Config, 'logLevel'>,
): LoggerOptions & { serializers: NonNullable<LoggerOptions['serializers']> } {
  const withStack = config.logLevel === 'debug' || config.logLevel === 'trace';
  const errorSerializer = (error: unknown) => toLoggedError(error, withStack, 0);
  return {
    level: config.logLevel,
    serializers: { err: errorSerializer, error: errorSerializer, req: serializeRequest as (value: unknown) => unknown },
    mixin: logContextMixin,
    mixinMergeStrategy: mergeLogContext,
    formatters: { log: logFormatter(withStack) },
    hooks: { logMethod: logMethodHook },
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
