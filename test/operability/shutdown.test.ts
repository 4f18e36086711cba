import { get as httpGet } from 'node:http';
import { createServer, type Server } from 'node:net';
import type { FastifyInstance } from 'fastify';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { apiModules } from '../../src/modules/index.js';
import { ROUTE_SCOPES, type Scope } from '../../src/plugins/route-scopes.js';
import { startServer } from '../../src/server.js';
import { createOutboxRepository } from '../../src/modules/webhooks/outbox.repository.js';
import { createWebhooksService } from '../../src/modules/webhooks/webhooks.service.js';
import { createTestContext, testConfig, type TestContext, type TestOrg } from '../helpers/harness.js';
import { startReceiver } from '../helpers/webhook-receiver.js';

/** A slow v1 route of this test only, to have a request in flight while the server closes. */
let markArrived: () => void = () => {};
/** What the abandoned probe's late database query ended with. */
let lateQuery: Promise<string> = Promise.resolve('not run');
const slowRoutes = async (app: FastifyInstance) => {
  app.get('/abandoned-probe', async () => {
    markArrived();
    await new Promise((resolve) => setTimeout(resolve, 400));
    lateQuery = app.deps.database.pool.query('SELECT 1').then(
      () => 'ok',
      (error: Error) => error.message,
    );
    return { done: await lateQuery };
  });
  app.get('/slow-probe', async () => {
    markArrived();
    await new Promise((resolve) => setTimeout(resolve, 400));
    return { done: true };
  });
};
const scopes = ROUTE_SCOPES as Record<string, Scope | null>;

let ctx: TestContext;
let org: TestOrg;
beforeAll(async () => {
  scopes['GET /v1/slow-probe'] = null;
  scopes['GET /v1/abandoned-probe'] = null;
  apiModules.push(slowRoutes);
  ctx = await createTestContext();
  org = await ctx.createOrg();
});
afterAll(async () => {
  apiModules.splice(apiModules.indexOf(slowRoutes), 1);
  delete scopes['GET /v1/slow-probe'];
  delete scopes['GET /v1/abandoned-probe'];
  await ctx?.close();
});

/** Server-side connections to this test's database other than the querying one. */
async function connectionsToDatabase(): Promise<number> {
  const client = new pg.Client({ connectionString: ctx.databaseUrl });
  await client.connect();
  try {
    const result = await client.query<{ count: number }>(
      'SELECT count(*)::int AS count FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()',
    );
    return result.rows[0]!.count;
  } finally {
    await client.end();
  }
}

/** Backends of this test's database whose last statement was a LISTEN (the webhook worker's wake-up). */
async function listeningConnections(): Promise<number> {
  const client = new pg.Client({ connectionString: ctx.databaseUrl });
  await client.connect();
  try {
    const result = await client.query<{ count: number }>(
      `SELECT count(*)::int AS count FROM pg_stat_activity
        WHERE datname = current_database() AND pid <> pg_backend_pid() AND query ILIKE 'LISTEN %'`,
    );
    return result.rows[0]!.count;
  } finally {
    await client.end();
  }
}

/** Backends leave pg_stat_activity shortly after their client disconnects. */
async function settledConnections(atMost: number): Promise<number> {
  let count = await connectionsToDatabase();
  for (let attempt = 0; attempt < 50 && count > atMost; attempt += 1) {
    await new Promise((resolve) => setTimeout(resolve, 100));
    count = await connectionsToDatabase();
  }
  return count;
}

const config = (overrides: Partial<ReturnType<typeof testConfig>> = {}) =>
  testConfig({ databaseUrl: ctx.databaseUrl, host: '127.0.0.1', port: 0, webhookWorker: false, ...overrides });

describe('graceful shutdown of svc serve', () => {
  it('when closed with a request in flight, the request completes, new connections are refused and the pool is closed', async () => {
    const baseline = await connectionsToDatabase();
    const server = await startServer(config());
    const { port } = server.app.server.address() as { port: number };
    const arrived = new Promise<void>((resolve) => (markArrived = resolve));
    const inFlight = fetch(`http://127.0.0.1:${port}/v1/slow-probe`, { headers: { authorization: `Bearer ${org.key}` } });
    // Close only once the handler runs: a request still on its way (a busy machine) would get 503.
    await arrived;

    const closed = server.close();
    const response = await inFlight;
    // Keep-alive: without `Connection: close` on this last response the socket would stay open
    // and hold the shutdown until the keep-alive timeout.
    expect(response.headers.get('connection')).toBe('close');
    expect(response.status).toBe(200);
    expect(await response.json()).toEqual({ done: true });
    await closed;

    await expect(fetch(`http://127.0.0.1:${port}/healthz`)).rejects.toThrow();
    expect(server.connection.database.pool.ending).toBe(true);
    expect(await settledConnections(baseline)).toBeLessThanOrEqual(baseline);
  });

  it('when the client of an in-flight request has gone away, closing still lets its handler use the database before the pool closes', async () => {
    const server = await startServer(config());
    const { port } = server.app.server.address() as { port: number };
    const arrived = new Promise<void>((resolve) => (markArrived = resolve));
    // node:http rather than fetch: destroying the request closes the socket at once (fetch keeps it).
    const request = httpGet(`http://127.0.0.1:${port}/v1/abandoned-probe`, { headers: { authorization: `Bearer ${org.key}` } });
    const abandoned = new Promise<string>((resolve) => request.on('error', () => resolve('aborted')).on('response', () => resolve('answered')));
    await arrived;
    request.destroy();
    expect(await abandoned).toBe('aborted');
    await new Promise((resolve) => setTimeout(resolve, 50)); // the server sees the socket close

    await server.close();
    expect(await lateQuery).toBe('ok');
    expect(server.connection.database.pool.ending).toBe(true);
  });

  it('when the port is taken, the failed start closes its database pool instead of leaking it', async () => {
    const blocker: Server = createServer();
    await new Promise<void>((resolve) => blocker.listen(0, '127.0.0.1', resolve));
    const { port } = blocker.address() as { port: number };
    const baseline = await connectionsToDatabase();
    try {
      await expect(startServer(config({ port }))).rejects.toThrow(/EADDRINUSE|address already in use/i);
    } finally {
      await new Promise((resolve) => blocker.close(resolve));
    }
    expect(await settledConnections(baseline)).toBeLessThanOrEqual(baseline);
  });
  it('when closed with the in-process webhook worker posting, the post finishes and is recorded, and no connection is left (LISTEN included)', async () => {
    const receiver = await startReceiver(() => ({ delayMs: 600 }));
    try {
      const webhooks = createWebhooksService({ database: ctx.database, allowPrivateUrls: true });
      const endpoint = await webhooks.addEndpoint({ orgId: org.id, url: receiver.url('/shutdown') });
      receiver.trust('/shutdown', endpoint.secret);
      const baseline = await connectionsToDatabase();
      const server = await startServer(config({ webhookWorker: true, webhookAllowPrivateUrls: true }));
      // The worker's LISTEN connection is its own client, outside the pool.
      for (let waited = 0; (await listeningConnections()) === 0 && waited < 10_000; waited += 50) {
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
      expect(await listeningConnections()).toBe(1);

      const eventId = await ctx.database.transaction((tx) =>
        createOutboxRepository(ctx.database.db).record({ orgId: org.id, type: 'customer.updated', customerId: null, customer: { id: 'c-1' } }, tx),
      );
      for (let waited = 0; receiver.receipts.length === 0 && waited < 10_000; waited += 25) {
        await new Promise((resolve) => setTimeout(resolve, 25));
      }
      expect(receiver.receipts.map((receipt) => receipt.webhookId)).toEqual([eventId]);

      await server.close();
      const [delivery] = await webhooks.listDeliveries({ orgId: org.id, eventId });
      expect(delivery).toMatchObject({ status: 'succeeded', attempt_count: 1 });
      expect(delivery!.attempts).toEqual([expect.objectContaining({ status_code: 200, error: null })]);
      expect(receiver.receipts[0]!.verifyError).toBeNull();
      expect(await settledConnections(baseline)).toBeLessThanOrEqual(baseline);
      expect(await listeningConnections()).toBe(0);
    } finally {
      await receiver.close();
    }
  });
});
