import type { FastifyInstance, FastifyRequest } from 'fastify';
import fp from 'fastify-plugin';
import { AppError } from '../shared/app-error.js';

/** How long closing waits for handlers whose clients have gone away to finish. */
const DRAIN_LIMIT_MS = 10_000;

/**
 * Graceful close of the HTTP side.
 *
 * Once the app is closing, every response still being sent says `Connection: close`. Fastify
 * closes idle keep-alive sockets once, when closing starts; a socket whose request was in flight
 * then would stay open after its response until the keep-alive timeout (72 s), holding up the
 * shutdown (and the pool and embedded database behind it) past any grace period.
 *
 * A request that arrives once closing has begun (on a connection kept alive by one still in flight)
 * is refused before anything else runs, as Fastify's own closing answer would (its
 * `return503OnClosing` is off in app.ts), but in the error envelope: 503 `service_unavailable` with
 * `Retry-After`, so a client retries it on another instance like any other 503 of this API.
 *
 * Closing also waits for every request whose handling has started to reach its reply. The server
 * stops waiting for a request as soon as its client disconnects, but the handler goes on and still
 * needs the database: without this wait the pool was closed under it ("Cannot use a pool after
 * calling end on the pool", logged as an internal error).
 */
export const gracefulClosePlugin = fp(
  async (app: FastifyInstance) => {
    let closing = false;
    const inFlight = new Set<FastifyRequest>();
    let drained: (() => void) | undefined;
    const settle = (request: FastifyRequest) => {
      if (inFlight.delete(request) && inFlight.size === 0) drained?.();
    };

    app.addHook('onRequest', (request, reply, done) => {
      inFlight.add(request);
      if (closing) {
        reply.header('Retry-After', '1');
        done(new AppError('service_unavailable', 503, 'This server is shutting down; retry the request.'));
        return;
      }
      done();
    });
    app.addHook('preClose', async () => {
      closing = true;
    });
    app.addHook('onSend', (request, reply, payload, done) => {
      if (closing) reply.header('Connection', 'close');
      settle(request); // the handler is done: what remains is writing the reply
      done(null, payload);
    });
    app.addHook('onResponse', (request, _reply, done) => {
      settle(request);
      done();
    });
    app.addHook('onClose', async () => {
      if (inFlight.size === 0) return;
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        new Promise<void>((resolve) => (drained = resolve)),
        new Promise<void>((resolve) => (timer = setTimeout(resolve, DRAIN_LIMIT_MS))),
      ]);
      clearTimeout(timer);
      if (inFlight.size > 0) app.log.warn({ requests: inFlight.size }, 'closed with requests still running');
    });
  },
  { name: 'graceful-close' },
);
