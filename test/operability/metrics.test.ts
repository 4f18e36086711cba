import type { AddressInfo } from 'node:net';
import type { FastifyInstance } from 'fastify';
import { sql } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { buildApp } from '../../src/app.js';
import { createDatabase } from '../../src/db/client.js';
import { webhookEndpoints } from '../../src/db/schema.js';
import { apiModules } from '../../src/modules/index.js';
import { createOutboxRepository } from '../../src/shared/outbox.js';
import { ROUTE_SCOPES } from '../../src/plugins/route-scopes.js';
import { type Scope } from '../../src/shared/scopes.js';
import { startServer } from '../../src/server.js';
import { createTestContext, testConfig, type TestContext, type TestOrg } from '../helpers/harness.js';

/** An authenticated v1 route of this test only, so metrics are checked whatever routes exist. */
const probeRoutes = async (app: FastifyInstance) => {
  app.get(
    '/metrics-probe/:id',
    { schema: { params: z.object({ id: z.string() }), response: { 200: z.object({ id: z.string() }).strict() } } },
    async (request) => ({ id: (request.params as { id: string }).id }),
  );
};
const scopes = ROUTE_SCOPES as Record<string, Scope | null>;

let ctx: TestContext;
let org: TestOrg;
beforeAll(async () => {
  scopes['GET /v1/metrics-probe/:id'] = null;
  apiModules.push(probeRoutes);
  ctx = await createTestContext();
  org = await ctx.createOrg();
});
afterAll(async () => {
  apiModules.splice(apiModules.indexOf(probeRoutes), 1);
  delete scopes['GET /v1/metrics-probe/:id'];
  await ctx?.close();
});

async function scrape(app?: FastifyInstance): Promise<string> {
  const response = await ctx.request('GET', '/metrics', {}, app);
  expect(response.statusCode).toBe(200);
  expect(response.headers['content-type']).toMatch(/^text\/plain; version=0\.0\.4/);
  return response.body;
}

/** The value of one sample line, e.g. `metric{a="b"} 3`; undefined when absent. */
function sample(body: string, metric: string, labels = ''): number | undefined {
  const line = body.split('\n').find((candidate) => candidate.startsWith(`${metric}${labels} `));
  return line === undefined ? undefined : Number(line.slice(line.lastIndexOf(' ') + 1));
}

describe('GET /metrics', () => {
  it('when requests were answered, it counts them by method, route pattern (not the raw URL) and status', async () => {
    const app = await ctx.buildInstance();
    for (const id of ['a', 'b', 'c']) {
      expect((await ctx.request('GET', `/v1/metrics-probe/${id}`, { key: org.key }, app)).statusCode).toBe(200);
    }
    expect((await ctx.request('GET', '/v1/metrics-probe/x', {}, app)).statusCode).toBe(401);
    expect((await ctx.request('GET', '/no-such-page/123', {}, app)).statusCode).toBe(404);

    const body = await scrape(app);
    expect(sample(body, 'http_requests_total', '{method="GET",route="/v1/metrics-probe/:id",status_code="200"}')).toBe(3);
    expect(sample(body, 'http_requests_total', '{method="GET",route="/v1/metrics-probe/:id",status_code="401"}')).toBe(1);
    expect(sample(body, 'http_requests_total', '{method="GET",route="unmatched",status_code="404"}')).toBe(1);
    expect(body).not.toContain('/v1/metrics-probe/a');
    expect(body).not.toContain('/no-such-page');
    expect(sample(body, 'http_request_duration_seconds_count', '{method="GET",route="/v1/metrics-probe/:id",status_code="200"}')).toBe(3);
    expect(body).toContain('# TYPE http_request_duration_seconds histogram');
  });

  it('when scraped, it reports the database pool: open, idle and maximum connections and waiting clients', async () => {
    const body = await scrape();
    expect(sample(body, 'db_pool_connections', '{state="max"}')).toBe(20);
    expect(sample(body, 'db_pool_connections', '{state="total"}')).toBeGreaterThanOrEqual(1);
    expect(sample(body, 'db_pool_connections', '{state="idle"}')).toBeGreaterThanOrEqual(0);
    expect(sample(body, 'db_pool_waiting_clients')).toBe(0);
  });

  it('when webhook deliveries are pending, it reports the backlog and the age of the oldest due one', async () => {
    let body = await scrape();
    expect(sample(body, 'webhook_outbox_pending_deliveries')).toBe(0);
    expect(sample(body, 'webhook_outbox_delivery_lag_seconds')).toBe(0);

    await ctx.database.db.insert(webhookEndpoints).values({ orgId: org.id, url: 'https://hooks.example.test/in', secret: 'whsec_test' });
    const outbox = createOutboxRepository();
    await outbox.record({ orgId: org.id, type: 'webhook.test', customerId: null, customer: {} }, ctx.database.db);
    await outbox.record({ orgId: org.id, type: 'webhook.test', customerId: null, customer: {} }, ctx.database.db);
    // One became due two minutes ago; the other is scheduled for a later retry and is not late yet.
    await ctx.database.db.execute(sql`
      UPDATE webhook_deliveries SET next_attempt_at = CASE
        WHEN id = (SELECT min(id::text)::uuid FROM webhook_deliveries) THEN now() - interval '120 seconds'
        ELSE now() + interval '1 hour' END`);

    body = await scrape();
    expect(sample(body, 'webhook_outbox_pending_deliveries')).toBe(2);
    const lag = sample(body, 'webhook_outbox_delivery_lag_seconds')!;
    expect(lag).toBeGreaterThanOrEqual(120);
    expect(lag).toBeLessThan(3600);
  });

  it('when the database cannot be read, the scrape still answers and the outbox gauges say NaN, not a stale value', async () => {
    const unreachable = createDatabase('postgres://nobody@127.0.0.1:1/none');
    const app = await buildApp({ config: ctx.config, database: unreachable, logger: false });
    try {
      const response = await app.inject({ method: 'GET', url: '/metrics' });
      expect(response.statusCode).toBe(200);
      expect(sample(response.body, 'webhook_outbox_pending_deliveries')).toBeNaN();
      expect(sample(response.body, 'webhook_outbox_delivery_lag_seconds')).toBeNaN();
    } finally {
      await app.close();
      await unreachable.close();
    }
  });

  it('when a key exceeds its burst limit, the rejection is counted by window', async () => {
    const app = await ctx.buildInstance();
    const limited = await ctx.createKey(org.id, { burstLimit: 1 });
    const statuses: number[] = [];
    for (let attempt = 0; attempt < 3; attempt += 1) {
      statuses.push((await ctx.request('GET', '/v1/metrics-probe/r', { key: limited.key }, app)).statusCode);
    }
    const rejected = statuses.filter((status) => status === 429).length;
    expect(rejected).toBeGreaterThanOrEqual(1);

    const body = await scrape(app);
    expect(sample(body, 'rate_limit_rejections_total', '{window="burst"}')).toBe(rejected);
    expect(sample(body, 'http_requests_total', '{method="GET",route="/v1/metrics-probe/:id",status_code="429"}')).toBe(rejected);
  });

  it('when two app instances run in one process, each has its own counters', async () => {
    const first = await ctx.buildInstance();
    const second = await ctx.buildInstance();
    await ctx.request('GET', '/healthz', {}, first);
    await ctx.request('GET', '/healthz', {}, first);
    await ctx.request('GET', '/healthz', {}, second);
    expect(sample(await scrape(first), 'http_requests_total', '{method="GET",route="/healthz",status_code="200"}')).toBe(2);
    expect(sample(await scrape(second), 'http_requests_total', '{method="GET",route="/healthz",status_code="200"}')).toBe(1);
  });
});

describe('METRICS_PORT', () => {
  const serve = (metricsPort: number | undefined) =>
    startServer(testConfig({ databaseUrl: ctx.databaseUrl, host: '127.0.0.1', port: 0, metricsPort, webhookWorker: false }));

  it('when METRICS_PORT is set, /metrics answers only there with Prometheus text, the public port answers 404 in the envelope, and shutdown closes both', async () => {
    const server = await serve(0);
    const publicUrl = `http://127.0.0.1:${(server.app.server.address() as AddressInfo).port}`;
    const metricsUrl = `http://127.0.0.1:${server.metrics!.port}`;
    try {
      expect(metricsUrl).not.toBe(publicUrl);
      expect((await fetch(`${publicUrl}/healthz`)).status).toBe(200);

      const onPublic = await fetch(`${publicUrl}/metrics`);
      expect(onPublic.status).toBe(404);
      expect(await onPublic.json()).toMatchObject({ error: { code: 'not_found' } });

      const scraped = await fetch(`${metricsUrl}/metrics`);
      expect(scraped.status).toBe(200);
      expect(scraped.headers.get('content-type')).toMatch(/^text\/plain; version=0\.0\.4/);
      expect(scraped.headers.get('cache-control')).toBe('no-store');
      const body = await scraped.text();
      // The registry of the public app: its requests are counted, the scrape itself is not.
      expect(sample(body, 'http_requests_total', '{method="GET",route="/healthz",status_code="200"}')).toBe(1);
      expect(sample(body, 'http_requests_total', '{method="GET",route="unmatched",status_code="404"}')).toBe(1);
      expect(sample(body, 'db_pool_connections', '{state="max"}')).toBeGreaterThan(0);
      expect(sample(body, 'webhook_outbox_pending_deliveries')).toBeGreaterThanOrEqual(0);

      const elsewhere = await fetch(`${metricsUrl}/v1/customers`);
      expect(elsewhere.status).toBe(404);
      expect(await elsewhere.json()).toMatchObject({ error: { code: 'not_found' } });
    } finally {
      await server.close();
    }
    await expect(fetch(`${metricsUrl}/metrics`)).rejects.toThrow();
    await expect(fetch(`${publicUrl}/healthz`)).rejects.toThrow();
  });

  it('when METRICS_PORT is unset, /metrics is served on the public port and there is no second listener', async () => {
    const server = await serve(undefined);
    try {
      expect(server.metrics).toBeUndefined();
      const response = await fetch(`http://127.0.0.1:${(server.app.server.address() as AddressInfo).port}/metrics`);
      expect(response.status).toBe(200);
      expect(await response.text()).toContain('# TYPE http_requests_total counter');
    } finally {
      await server.close();
    }
  });
});
