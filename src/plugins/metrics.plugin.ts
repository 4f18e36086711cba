import Fastify, { type FastifyInstance } from 'fastify';
import fp from 'fastify-plugin';
import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { Database } from '../db/client.js';
import type { PageReason, PageTarget } from '../db/page-reads.js';
import { AppError } from '../shared/app-error.js';
import { clientErrorHandler, errorEnvelope } from './errors.plugin.js';

declare module 'fastify' {
  interface FastifyInstance {
    /** This app instance's Prometheus registry, served on its /metrics or on METRICS_PORT. */
    metricsRegistry: Registry;
  }
}

/** Label for requests no route matched, so unknown URLs cannot blow up the label cardinality. */
const UNMATCHED_ROUTE = 'unmatched';

export type OutboxBacklog = { pending: number; oldestDueAgeSeconds: number };

/** One cheap query per scrape: the partial index on pending deliveries serves both figures. */
async function readOutboxBacklog(database: Database): Promise<OutboxBacklog> {
  const result = await database.pool.query<{ pending: string | number; oldest_due_age: string | number | null }>(
    `SELECT count(*) AS pending,
            extract(epoch FROM (clock_timestamp() - min(next_attempt_at) FILTER (WHERE next_attempt_at <= clock_timestamp()))) AS oldest_due_age
       FROM webhook_deliveries
      WHERE status = 'pending'`,
  );
  const row = result.rows[0];
  return { pending: Number(row?.pending ?? 0), oldestDueAgeSeconds: Math.max(0, Number(row?.oldest_due_age ?? 0)) };
}

/**
 * Prometheus metrics on `GET /metrics`, in a registry of this app instance's own (several instances
 * in one process, as in tests, must not share counters): request count and latency by method, route
 * pattern and status; pool usage; webhook outbox backlog and lag (read on scrape); rate-limit
 * rejections (the auth plugin reports them through `app.metrics.rateLimited`); rows purged by the
 * retention job (`app.metrics.retentionPurged`, handed to the background jobs by the server); list
 * pages by where they were read (`app.metrics.pageRead`, from src/db/page-reads.ts).
 *
 * With METRICS_PORT set, the public port has no /metrics (404): `listenForMetrics` serves it on
 * that port alone, which the deployment keeps off the load balancer.
 */
export const metricsPlugin = fp(
  async (app: FastifyInstance, options: { retentionTables: readonly string[] }) => {
    const { database } = app.deps;
    const registry = new Registry();
    collectDefaultMetrics({ register: registry });

    const requests = new Counter({
      name: 'http_requests_total',
      help: 'HTTP requests answered, by method, route pattern and status code.',
      labelNames: ['method', 'route', 'status_code'] as const,
      registers: [registry],
    });
    const duration = new Histogram({
      name: 'http_request_duration_seconds',
      help: 'HTTP request latency in seconds, by method, route pattern and status code.',
      labelNames: ['method', 'route', 'status_code'] as const,
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
      registers: [registry],
    });
    const rateLimited = new Counter({
      name: 'rate_limit_rejections_total',
      help: 'Requests refused with 429 rate_limited, by window (burst or daily of an API key; upload_page_ip or upload_page_link).',
      labelNames: ['window'] as const,
      registers: [registry],
    });

    const retentionPurged = new Counter({
      name: 'retention_purged_rows_total',
      help: 'Rows deleted by the retention purge, by table (counted by the process that ran the batch).',
      labelNames: ['table'] as const,
      registers: [registry],
    });
    // Every table shows from the first scrape, at 0 until a purge removes something.
    for (const table of options.retentionTables) retentionPurged.inc({ table }, 0);

    const pool = database.pool;
    new Gauge({
      name: 'db_pool_connections',
      help: 'Database pool connections by state: total (open), idle, and the pool maximum.',
      labelNames: ['state'] as const,
      registers: [registry],
      collect() {
        this.set({ state: 'total' }, pool.totalCount);
        this.set({ state: 'idle' }, pool.idleCount);
        this.set({ state: 'max' }, pool.options.max ?? 0);
      },
    });
    new Gauge({
      name: 'db_pool_waiting_clients',
      help: 'Queries waiting for a free database pool connection.',
      registers: [registry],
      collect() {
        this.set(pool.waitingCount);
      },
    });

    // Both outbox gauges come from one query per scrape, shared through this promise.
    let backlog: Promise<OutboxBacklog | undefined> | undefined;
    const currentBacklog = () =>
      (backlog ??= readOutboxBacklog(database)
        .catch((error: unknown) => {
          app.log.warn({ err: error }, 'metrics: reading the outbox backlog failed');
          return undefined;
        })
        .finally(() => {
          setImmediate(() => {
            backlog = undefined;
          });
        }));
    new Gauge({
      name: 'webhook_outbox_pending_deliveries',
      help: 'Webhook deliveries waiting to be sent (status pending, due or scheduled for a retry).',
      registers: [registry],
      async collect() {
        const value = await currentBacklog();
        // NaN, not the last value: an unreadable backlog must not look like a healthy one.
        this.set(value ? value.pending : Number.NaN);
      },
    });
    new Gauge({
      name: 'webhook_outbox_delivery_lag_seconds',
      help: 'Age in seconds of the oldest pending delivery that is due now (0 when none is due).',
      registers: [registry],
      async collect() {
        const value = await currentBacklog();
        this.set(value ? value.oldestDueAgeSeconds : Number.NaN);
      },
    });

    const pageReads = new Counter({
      name: 'list_page_reads_total',
      help: 'List pages by where they were read (replica or primary) and why (replayed, no_replica, lagging, replica_error, replica_down).',
      labelNames: ['target', 'reason'] as const,
      registers: [registry],
    });

    app.decorate('metrics', {
      rateLimited(window: string) {
        rateLimited.inc({ window });
      },
      retentionPurged(table: string, rows: number) {
        retentionPurged.inc({ table }, rows);
      },
      pageRead(target: PageTarget, reason: PageReason) {
        pageReads.inc({ target, reason });
      },
    });
    app.decorate('metricsRegistry', registry);

    // One pair of labelled children per method, route and status, found by a Map lookup instead of
    // prom-client hashing the label set twice per request.
    const series = new Map<string, { requests: { inc(): void }; duration: { observe(value: number): void } }>();
    app.addHook('onResponse', (request, reply, done) => {
      const method = request.method;
      const route = request.routeOptions.url ?? UNMATCHED_ROUTE;
      const statusCode = String(reply.statusCode);
      const key = `${method} ${statusCode} ${route}`;
      let children = series.get(key);
      if (!children) {
        const labels = { method, route, status_code: statusCode };
        children = { requests: requests.labels(labels), duration: duration.labels(labels) };
        series.set(key, children);
      }
      children.requests.inc();
      children.duration.observe(reply.elapsedTime / 1000);
      done();
    });

    if (app.deps.config.metricsPort !== undefined) return;
    app.get('/metrics', { schema: { hide: true }, logLevel: 'warn' }, async (_request, reply) => {
      reply.type(registry.contentType);
      return registry.metrics();
    });
  },
  { name: 'metrics' },
);

export type MetricsListener = { port: number; close(): Promise<void> };

/**
 * METRICS_PORT: the app's /metrics on a listener of its own (a second, bare Fastify instance on the
 * same registry). Everything else there is a 404 in the error envelope.
 */
export async function listenForMetrics(app: FastifyInstance, options: { port: number; host: string }): Promise<MetricsListener> {
  const registry = app.metricsRegistry;
  // Parser errors get the envelope here too; a scrape is never cached, like every other answer.
  const listener = Fastify({ logger: false, clientErrorHandler });
  listener.addHook('onRequest', (_request, reply, done) => {
    reply.header('Cache-Control', 'no-store');
    done();
  });
  listener.get('/metrics', async (_request, reply) => {
    reply.type(registry.contentType);
    return registry.metrics();
  });
  listener.setNotFoundHandler((request, reply) => {
    const error = new AppError(
      'not_found',
      404,
      `No route for ${request.method} ${request.url.split('?')[0]}; this port serves GET /metrics only.`,
    );
    return reply.code(404).send(errorEnvelope(error));
  });
  listener.setErrorHandler((error, _request, reply) => {
    app.log.error({ err: error }, 'metrics: the scrape failed');
    return reply.code(500).send(errorEnvelope(new AppError('internal', 500, 'The metrics could not be collected.')));
  });
  await listener.listen({ port: options.port, host: options.host });
  const address = listener.server.address();
  const port = typeof address === 'object' && address ? address.port : options.port;
  const host = options.host.includes(':') ? `[${options.host}]` : options.host;
  app.log.info(`metrics listening at http://${host}:${port}/metrics`);
  return { port, close: () => listener.close() };
}
