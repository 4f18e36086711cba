import { STATUS_CODES, type IncomingMessage } from 'node:http';
import type { Socket } from 'node:net';
import { performance } from 'node:perf_hooks';
import type { Duplex } from 'node:stream';
import type { FastifyInstance, FastifyReply, FastifyRequest, FastifyServerOptions } from 'fastify';
import fp from 'fastify-plugin';
import type { RequestTimeouts } from '../config/config.js';
import { AppError } from '../shared/app-error.js';
import { errorEnvelope } from './errors.plugin.js';

/*
 * How long a client may take to send its request (docs/decisions.md). Fastify's default
 * `requestTimeout` of 0 also switches off Node's own, so without a bound an idle or trickling upload
 * holds its socket, file descriptor and temp file for as long as the client likes. Two bounds, both settings:
 *
 * - REQUEST_TIMEOUT_MS: the whole request, headers and body, must have arrived within it (Node's
 *   `requestTimeout`; the headers alone within at most 60 s, Node's `headersTimeout`). Node checks
 *   these every `connectionsCheckingInterval`, set here to at most 5 s (its default, 30 s, let a
 *   request run half a minute past its bound).
 * - REQUEST_BODY_IDLE_TIMEOUT_MS: while a request's body is still to come, a pause this long in the
 *   bytes arriving cuts it, whatever the route (a quarter of the bound more at most: the socket's
 *   byte count is looked at four times per bound).
 *
 * Either cut answers 408 `request_timeout` where that cannot be taken for the answer to another
 * request (nothing of a response on the connection begun, no other request in flight on it): the
 * error envelope, or what the route's `connectionErrorAnswer` gives (the upload page's own page).
 * Then the connection is closed; the request's body reader fails and what it spooled is removed as
 * for a client that went away. The request's one log line says it timed out.
 */

declare module 'fastify' {
  interface FastifyContextConfig {
    /** How this route answers an error written straight on the connection (a timeout); default the error envelope. */
    connectionErrorAnswer?: (error: AppError) => ConnectionAnswer;
  }
}

/** An answer written on the connection itself: its headers (besides Content-Length and Connection) and body. */
export type ConnectionAnswer = { headers: Readonly<Record<string, string>>; body: string };

/** Node's default: the headers of a request must have arrived within a minute. */
const HEADERS_TIMEOUT_MS = 60_000;
const MAX_CHECKING_INTERVAL_MS = 5_000;

/** The Fastify server options that put the request timeouts in force. */
export function requestTimeoutServerOptions(timeouts: RequestTimeouts): Pick<FastifyServerOptions, 'requestTimeout'> & {
  http: { requestTimeout: number; headersTimeout: number; connectionsCheckingInterval: number };
} {
  // Node refuses a headers timeout above the request timeout.
  const headersTimeout = Math.min(HEADERS_TIMEOUT_MS, timeouts.requestTimeoutMs);
  return {
    // Fastify sets the server's requestTimeout from its own option once the server exists: the same value.
    requestTimeout: timeouts.requestTimeoutMs,
    http: {
      requestTimeout: timeouts.requestTimeoutMs,
      headersTimeout,
      connectionsCheckingInterval: Math.max(10, Math.min(MAX_CHECKING_INTERVAL_MS, Math.floor(headersTimeout / 10))),
    },
  };
}

export type TimeoutKind = 'request' | 'body_idle';

type Exchange = { request: FastifyRequest; reply: FastifyReply };
/** The requests on each connection whose answer or body is not yet through (more than one only when a client pipelines). */
const inFlight = new WeakMap<Duplex, Set<Exchange>>();
/** Requests this server cut for taking too long, and which bound they broke. */
const timedOut = new WeakMap<IncomingMessage, TimeoutKind>();

/** Answered and wholly received: nothing of it is left on the connection. */
const through = ({ request, reply }: Exchange) => reply.raw.writableFinished && request.raw.complete !== false;

/** Which bound a request broke, when the server cut it for taking too long. */
export function timeoutOf(request: FastifyRequest): TimeoutKind | undefined {
  return timedOut.get(request.raw);
}

const TIMEOUT_MESSAGES: Record<TimeoutKind, string> = {
  request: 'The request was not received in time.',
  body_idle: 'The request body stopped arriving; the connection was closed.',
};

/**
 * Cuts a connection whose request took too long: answers 408 where that answer cannot be taken for
 * another request's (see above), then closes it.
 */
export function cutTimedOutConnection(socket: Duplex, kind: TimeoutKind): void {
  if (socket.destroyed) return;
  const exchanges = [...(inFlight.get(socket) ?? [])].filter((exchange) => !through(exchange));
  for (const { request } of exchanges) if (request.raw.complete === false) timedOut.set(request.raw, kind);
  const only = exchanges.length === 1 ? exchanges[0] : undefined;
  // A request answered already (refused before its whole body came) gets no second answer.
  if (socket.writable && exchanges.length <= 1 && !only?.reply.raw.headersSent) {
    const error = new AppError('request_timeout', 408, TIMEOUT_MESSAGES[kind]);
    const answer = only?.request.routeOptions.config?.connectionErrorAnswer?.(error) ?? {
      headers: { 'Content-Type': 'application/json; charset=utf-8', 'Cache-Control': 'no-store' },
      body: JSON.stringify(errorEnvelope(error)),
    };
    const headers = { ...answer.headers, ...(only ? { 'X-Request-Id': only.request.id } : {}) };
    socket.write(
      `HTTP/1.1 408 ${STATUS_CODES[408]}\r\n` +
        Object.entries(headers)
          .map(([name, value]) => `${name}: ${value}\r\n`)
          .join('') +
        `Content-Length: ${Buffer.byteLength(answer.body)}\r\nConnection: close\r\n\r\n${answer.body}`,
    );
  }
  socket.destroy();
}

/**
 * Watches a request whose body is still to come: when no byte has arrived on its connection for
 * `idleMs`, the connection is cut. Stops once the request is complete or the connection is gone.
 */
function watchBodyIdle(request: FastifyRequest, idleMs: number): void {
  const socket = request.raw.socket as Socket | null;
  if (request.raw.complete !== false || !socket || typeof socket.bytesRead !== 'number') return;
  let bytesRead = socket.bytesRead;
  let progressAt = performance.now();
  const timer = setInterval(
    () => {
      if (request.raw.complete || socket.destroyed) return clearInterval(timer);
      if (socket.bytesRead !== bytesRead) {
        bytesRead = socket.bytesRead;
        progressAt = performance.now();
      } else if (performance.now() - progressAt >= idleMs) {
        clearInterval(timer);
        cutTimedOutConnection(socket, 'body_idle');
      }
    },
    Math.max(1, Math.floor(idleMs / 4)),
  );
  timer.unref();
  request.raw.once('close', () => clearInterval(timer));
}

/** Tracks the requests in flight on each connection and watches every body still to come. */
export const requestTimeoutsPlugin = fp(
  async (app: FastifyInstance, options: { bodyIdleTimeoutMs: number }) => {
    app.addHook('onRequest', (request, reply, done) => {
      const socket = request.raw.socket as Duplex | null;
      if (socket) {
        let exchanges = inFlight.get(socket);
        if (!exchanges) inFlight.set(socket, (exchanges = new Set()));
        for (const exchange of exchanges) if (through(exchange)) exchanges.delete(exchange);
        exchanges.add({ request, reply });
      }
      watchBodyIdle(request, options.bodyIdleTimeoutMs);
      done();
    });
  },
  { name: 'request-timeouts' },
);
