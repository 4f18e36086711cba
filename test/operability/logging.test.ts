import { Writable } from 'node:stream';
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp } from '../../src/app.js';
import { loadConfig } from '../../src/config/config.js';
import { apiModules } from '../../src/modules/index.js';
import { ROUTE_SCOPES, type Scope } from '../../src/plugins/route-scopes.js';
import { loggerOptions, prettyLogsWanted, redactUrl } from '../../src/shared/logging.js';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';

const EMAIL = 'jane.citizen@example.com';
const FULL_NAME = 'Jane Quinn Citizen';

/** v1 routes of this test only: one logs personal data the way careless code would, one fails with it. */
const probeRoutes = async (app: FastifyInstance) => {
  app.get('/log-probe', async (request) => {
    request.log.info(
      { email: EMAIL, customer: { email: EMAIL, fullName: FULL_NAME, contact: { name: FULL_NAME } }, headers: request.headers },
      'probe',
    );
    return { ok: true };
  });
  app.get('/log-probe-failure', async () => {
    // What a failed insert looks like: Drizzle's error carries the bound values, PostgreSQL's the row.
    throw Object.assign(new Error('Failed query: insert into customers'), {
      params: [EMAIL, FULL_NAME],
      cause: Object.assign(new Error('duplicate key value'), { detail: `Key (email)=(${EMAIL}) already exists.` }),
    });
  });
};
const scopes = ROUTE_SCOPES as Record<string, Scope | null>;

let ctx: TestContext;
let org: TestOrg;
let lines: string[];
let app: FastifyInstance;

async function appLoggingTo(sink: string[], level: 'info' | 'warn' = 'info'): Promise<FastifyInstance> {
  const stream = new Writable({
    write(chunk, _encoding, done) {
      sink.push(...String(chunk).split('\n').filter(Boolean));
      done();
    },
  });
  const instance = await buildApp({ config: ctx.config, database: ctx.database, logger: { ...loggerOptions({ logLevel: level }), stream } });
  await instance.ready();
  return instance;
}

beforeAll(async () => {
  scopes['GET /v1/log-probe'] = null;
  scopes['GET /v1/log-probe-failure'] = null;
  apiModules.push(probeRoutes);
  ctx = await createTestContext();
  org = await ctx.createOrg();
  lines = [];
  app = await appLoggingTo(lines);
});
afterAll(async () => {
  apiModules.splice(apiModules.indexOf(probeRoutes), 1);
  delete scopes['GET /v1/log-probe'];
  delete scopes['GET /v1/log-probe-failure'];
  await app?.close();
  await ctx?.close();
});

const parsed = () => lines.map((line) => JSON.parse(line) as Record<string, unknown>);

describe('request logs', () => {
  it('when a request is authenticated, its log lines are JSON with the request id, key id and organisation', async () => {
    const response = await ctx.request('GET', '/v1/log-probe', { key: org.key, headers: { 'x-request-id': 'req-log-1' } }, app);
    expect(response.statusCode).toBe(200);
    const mine = parsed().filter((entry) => entry.reqId === 'req-log-1');
    const probe = mine.find((entry) => entry.msg === 'probe');
    expect(probe).toMatchObject({ reqId: 'req-log-1', apiKeyId: org.keyId, orgId: org.id, level: 30 });
    const completed = mine.find((entry) => entry.msg === 'request completed');
    expect(completed).toMatchObject({ apiKeyId: org.keyId, orgId: org.id, res: { statusCode: 200 } });
  });

  it('when code logs emails, names, headers or keys, they are redacted', async () => {
    await ctx.request('GET', '/v1/log-probe', { key: org.key, headers: { 'x-request-id': 'req-log-2' } }, app);
    const probe = parsed().find((entry) => entry.reqId === 'req-log-2' && entry.msg === 'probe')!;
    expect(probe.email).toBe('[redacted]');
    expect(probe.customer).toEqual({ email: '[redacted]', fullName: '[redacted]', contact: { name: '[redacted]' } });
    expect((probe.headers as Record<string, unknown>).authorization).toBe('[redacted]');
    const text = lines.join('\n');
    for (const secret of [EMAIL, FULL_NAME, org.key, 'Bearer svc_live_']) expect(text).not.toContain(secret);
  });

  it('when a sensitive value is in the query string, the logged URL has it redacted', async () => {
    const query = `?email=${encodeURIComponent(EMAIL)}&limit=5`;
    await ctx.request('GET', `/v1/log-probe${query}`, { key: org.key, headers: { 'x-request-id': 'req-log-3' } }, app);
    const incoming = parsed().find((entry) => entry.reqId === 'req-log-3' && entry.msg === 'incoming request')!;
    expect((incoming.req as { url: string }).url).toBe('/v1/log-probe?email=%5Bredacted%5D&limit=5');
    expect(lines.join('\n')).not.toContain(encodeURIComponent(EMAIL));
  });

  it('when a request fails with a database error, the logged error keeps its message but not the bound values', async () => {
    const response = await ctx.request('GET', '/v1/log-probe-failure', { key: org.key, headers: { 'x-request-id': 'req-log-4' } }, app);
    expect(response.statusCode).toBe(500);
    const failure = parsed().find((entry) => entry.reqId === 'req-log-4' && entry.level === 50)!;
    expect(failure).toMatchObject({ apiKeyId: org.keyId, err: { message: expect.stringContaining('Failed query: insert into customers'), params: '[redacted]' } });
    const text = lines.join('\n');
    expect(text).not.toContain(EMAIL);
    expect(text).not.toContain(FULL_NAME);
  });

  it('when an orchestrator probes /healthz and /readyz, nothing is logged for a healthy answer', async () => {
    await ctx.request('GET', '/healthz', { headers: { 'x-request-id': 'probe-health' } }, app);
    await ctx.request('GET', '/readyz', { headers: { 'x-request-id': 'probe-ready' } }, app);
    await ctx.request('GET', '/metrics', { headers: { 'x-request-id': 'probe-metrics' } }, app);
    const probes = parsed().filter((entry) => ['probe-health', 'probe-ready', 'probe-metrics'].includes(entry.reqId as string));
    expect(probes).toEqual([]);
  });

  it('when LOG_LEVEL is warn, request lines at info are not written', async () => {
    const quiet: string[] = [];
    const warnApp = await appLoggingTo(quiet, 'warn');
    try {
      await ctx.request('GET', '/v1/log-probe', { key: org.key }, warnApp);
      await ctx.request('GET', '/v1/log-probe-failure', { key: org.key }, warnApp);
    } finally {
      await warnApp.close();
    }
    expect(quiet.length).toBeGreaterThan(0);
    expect(quiet.map((line) => JSON.parse(line).level as number).every((level) => level >= 40)).toBe(true);
  });
});

describe('log format', () => {
  it('when stdout is not a terminal, or in production or CI, logs stay JSON', () => {
    const dev = loadConfig({});
    expect(prettyLogsWanted(dev, { isTTY: true })).toBe(true);
    expect(prettyLogsWanted(dev, { isTTY: false })).toBe(false);
    expect(prettyLogsWanted(loadConfig({ NODE_ENV: 'production' }), { isTTY: true })).toBe(false);
    expect(prettyLogsWanted(loadConfig({ CI: 'true' }), { isTTY: true })).toBe(false);
    expect(prettyLogsWanted(loadConfig({ LOG_FORMAT: 'json' }), { isTTY: true })).toBe(false);
    expect(prettyLogsWanted(loadConfig({ LOG_FORMAT: 'pretty', NODE_ENV: 'production' }), { isTTY: false })).toBe(false);
  });

  it('when a URL has no sensitive parameter, it is logged unchanged', () => {
    expect(redactUrl('/v1/customers?limit=5&updated_since=2026-01-01T00:00:00Z')).toBe('/v1/customers?limit=5&updated_since=2026-01-01T00:00:00Z');
    expect(redactUrl('/v1/customers/abc')).toBe('/v1/customers/abc');
  });
});
