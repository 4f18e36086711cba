import type { FastifyInstance } from 'fastify';
import fp from 'fastify-plugin';

/**
 * Once the app is closing, every response still being sent says `Connection: close`. Fastify
 * closes idle keep-alive sockets once, when closing starts; a socket whose request was in flight
 * then would stay open after its response until the keep-alive timeout (72 s), holding up the
 * shutdown (and the pool and embedded database behind it) past any grace period.
 */
export const gracefulClosePlugin = fp(
  async (app: FastifyInstance) => {
    let closing = false;
    app.addHook('preClose', async () => {
      closing = true;
    });
    app.addHook('onSend', async (_request, reply, payload) => {
      if (closing) reply.header('Connection', 'close');
      return payload;
    });
  },
  { name: 'graceful-close' },
);
