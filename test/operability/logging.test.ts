import { get } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Writable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { sql } from 'drizzle-orm';
import { drizzle } from 'drizzle-orm/node-postgres';
import type { FastifyInstance } from 'fastify';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp } from '../../src/app.js';
import { loadConfig } from '../../src/config/config.js';
import { apiModules } from '../../src/modules/index.js';
import { ROUTE_SCOPES, type Scope } from '../../src/plugins/route-scopes.js';
import { createLogger, loggerOptions, prettyLogsWanted, redactUrl, serializeError } from '../../src/shared/logging.js';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';

const EMAIL = 'jane.citizen@example.com';
const FULL_NAME = 'Jane Quinn Citizen';
const MISSING_UUID = '00000000-0000-4000-8000-000000000000';

/** What a failed statement looks like when it reaches the error handler: a real drizzle-orm + pg failure. */
async function failingStatement(kind: string): Promise<never> {
  const client = new pg.Client({ connectionString: ctx.databaseUrl });
  await client.connect();
  try {
    const db = drizzle(client);
    if (kind === 'cast') await db.execute(sql`select ${EMAIL}::uuid`);
    await db.execute(sql`create temporary table log_probe (email text constraint log_probe_email_key unique, full_name text)`);
    await db.execute(sql`insert into log_probe (email, full_name) values (${EMAIL}, ${FULL_NAME})`);
    await db.execute(sql`insert into log_probe (email, full_name) values (${EMAIL}, ${FULL_NAME})`);
    throw new Error('unreachable: the second insert violates the unique constraint');
  } finally {
    await client.end();
  }
}

/** v1 routes of this test only: one logs personal data the way careless code would, one fails with it. */
const probeRoutes = async (app: FastifyInstance) => {
  app.get('/log-probe', async (request) => {
    request.log.info(
      { email: EMAIL, customer: { email: EMAIL, fullName: FULL_NAME, contact: { name: FULL_NAME } }, headers: request.headers },
      'probe',
    );
    return { ok: true };
  });
  app.get('/log-probe-failure', async (request) => failingStatement((request.query as { kind?: string }).kind ?? 'duplicate'));
  app.get('/log-probe-slow', async () => {
    await sleep(300);
    return { ok: true };
  });
};
const scopes = ROUTE_SCOPES as Record<string, Scope | null>;

let ctx: TestContext;
let org: TestOrg;
let lines: string[];
let app: FastifyInstance;

function sinkInto(sink: string[]): Writable {
  return new Writable({
    write(chunk, _encoding, done) {
      sink.push(...String(chunk).split('\n').filter(Boolean));
      done();
    },
  });
}

async function appLoggingTo(sink: string[], level: 'info' | 'warn' = 'info'): Promise<FastifyInstance> {
  const instance = await buildApp({ config: ctx.config, database: ctx.database, logger: { ...loggerOptions({ logLevel: level }), stream: sinkInto(sink) } });
  await instance.ready();
  return instance;
}

beforeAll(async () => {
  scopes['GET /v1/log-probe'] = null;
  scopes['GET /v1/log-probe-failure'] = null;
  scopes['GET /v1/log-probe-slow'] = null;
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
  delete scopes['GET /v1/log-probe-slow'];
  await app?.close();
  await ctx?.close();
});

type Entry = Record<string, unknown>;
const parsed = () => lines.map((line) => JSON.parse(line) as Entry);
const linesOf = (reqId: string) => parsed().filter((entry) => entry.reqId === reqId);
/** The keys of a line besides pino's own (level, time, pid, hostname). */
const ownKeys = (entry: Entry) => Object.keys(entry).filter((key) => !['level', 'time', 'pid', 'hostname'].includes(key));

describe('request logs', () => {
  it('when a request is served, it writes one line: request id, key, organisation, method, route pattern, status, duration', async () => {
    const response = await ctx.request('GET', `/v1/customers/${MISSING_UUID}`, { key: org.key, headers: { 'x-request-id': 'req-line-1' } }, app);
    expect(response.statusCode).toBe(404);
    const mine = linesOf('req-line-1');
    expect(mine).toHaveLength(1);
    expect(mine[0]).toEqual({
      level: 30,
      time: expect.any(Number),
      pid: expect.any(Number),
      hostname: expect.any(String),
      reqId: 'req-line-1',
      apiKeyId: org.keyId,
      orgId: org.id,
      method: 'GET',
      route: '/v1/customers/:id',
      status: 404,
      durationMs: expect.any(Number),
      msg: 'request',
    });
  });

  it('when a request is authenticated, the lines its code writes carry the request id, key id and organisation', async () => {
    const response = await ctx.request('GET', '/v1/log-probe', { key: org.key, headers: { 'x-request-id': 'req-log-1' } }, app);
    expect(response.statusCode).toBe(200);
    const mine = linesOf('req-log-1');
    expect(mine.find((entry) => entry.msg === 'probe')).toMatchObject({ reqId: 'req-log-1', apiKeyId: org.keyId, orgId: org.id, level: 30 });
    expect(mine.find((entry) => entry.msg === 'request')).toMatchObject({ apiKeyId: org.keyId, orgId: org.id, route: '/v1/log-probe', status: 200 });
    expect(mine).toHaveLength(2);
  });

  it('when code logs emails, names, headers or keys, they are redacted, and later lines of the request do not inherit them', async () => {
    await ctx.request('GET', '/v1/log-probe', { key: org.key, headers: { 'x-request-id': 'req-log-2' } }, app);
    const probe = linesOf('req-log-2').find((entry) => entry.msg === 'probe')!;
    expect(probe.email).toBe('[redacted]');
    expect(probe.customer).toEqual({ email: '[redacted]', fullName: '[redacted]', contact: { name: '[redacted]' } });
    expect((probe.headers as Record<string, unknown>).authorization).toBe('[redacted]');
    const requestLine = linesOf('req-log-2').find((entry) => entry.msg === 'request')!;
    expect(ownKeys(requestLine).sort()).toEqual(['apiKeyId', 'durationMs', 'method', 'msg', 'orgId', 'reqId', 'route', 'status']);
    const text = lines.join('\n');
    for (const secret of [EMAIL, FULL_NAME, org.key, 'Bearer svc_live_']) expect(text).not.toContain(secret);
  });

  it('when personal data is in the path or the query string, the line names the route pattern and not the URL', async () => {
    const url = `/v1/customers/${encodeURIComponent(EMAIL)}?email=${encodeURIComponent(EMAIL)}&limit=5`;
    await ctx.request('GET', url, { key: org.key, headers: { 'x-request-id': 'req-log-3' } }, app);
    expect(linesOf('req-log-3')).toEqual([expect.objectContaining({ route: '/v1/customers/:id', status: 404 })]);
    const text = lines.join('\n');
    expect(text).not.toContain(EMAIL);
    expect(text).not.toContain(encodeURIComponent(EMAIL));
  });

  it('when no route matches, the line has no route and not the URL either', async () => {
    await ctx.request('GET', `/v1/no-such-thing/${encodeURIComponent(EMAIL)}`, { headers: { 'x-request-id': 'req-log-404' } }, app);
    const [line] = linesOf('req-log-404');
    expect(linesOf('req-log-404')).toHaveLength(1);
    expect(line).toMatchObject({ method: 'GET', status: 404, msg: 'request' });
    expect(line).not.toHaveProperty('route');
    expect(lines.join('\n')).not.toContain(encodeURIComponent(EMAIL));
  });

  it('when the client goes away before the answer, the one line says the request was aborted', async () => {
    const listening = await appLoggingTo(lines);
    try {
      await listening.listen({ host: '127.0.0.1', port: 0 });
      const { port } = listening.server.address() as AddressInfo;
      const headers = { authorization: `Bearer ${org.key}`, 'x-request-id': 'req-log-abort' };
      const request = get({ host: '127.0.0.1', port, path: '/v1/log-probe-slow', headers });
      request.on('error', () => {});
      await sleep(100);
      request.destroy();
      await sleep(400); // past the handler's end: no second line may follow
      expect(linesOf('req-log-abort')).toEqual([
        expect.objectContaining({ apiKeyId: org.keyId, method: 'GET', route: '/v1/log-probe-slow', aborted: true, msg: 'request aborted by the client' }),
      ]);
    } finally {
      await listening.close();
    }
  });

  it('when a statement fails, the error is logged as fields (code, constraint, table, SQL text), never with its bound values or row', async () => {
    const response = await ctx.request('GET', '/v1/log-probe-failure', { key: org.key, headers: { 'x-request-id': 'req-log-4' } }, app);
    expect(response.statusCode).toBe(500);
    const mine = linesOf('req-log-4');
    const failure = mine.find((entry) => entry.level === 50)!;
    expect(failure).toMatchObject({
      apiKeyId: org.keyId,
      msg: 'unhandled error',
      err: {
        type: 'DatabaseError',
        code: '23505',
        message: 'duplicate key value violates unique constraint "log_probe_email_key"',
        constraint: 'log_probe_email_key',
        table: 'log_probe',
        query: 'insert into log_probe (email, full_name) values ($1, $2)',
      },
    });
    expect(failure.err).not.toHaveProperty('params');
    expect(failure.err).not.toHaveProperty('detail');
    expect(failure.err).not.toHaveProperty('stack'); // at info; at debug the frames are added
    expect(mine.find((entry) => entry.msg === 'request')).toMatchObject({ status: 500, route: '/v1/log-probe-failure' });
    expect(mine).toHaveLength(2);
    const text = lines.join('\n');
    expect(text).not.toContain(EMAIL);
    expect(text).not.toContain(FULL_NAME);
  });

  it('when PostgreSQL quotes a bound value in its message (a failed cast), the value is left out', async () => {
    await ctx.request('GET', '/v1/log-probe-failure?kind=cast', { key: org.key, headers: { 'x-request-id': 'req-log-5' } }, app);
    const failure = linesOf('req-log-5').find((entry) => entry.level === 50)!;
    expect(failure.err).toMatchObject({ code: '22P02', message: 'invalid input syntax for type uuid: "[redacted]"', query: 'select $1::uuid' });
    expect(lines.join('\n')).not.toContain(EMAIL);
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

describe('logged errors', () => {
  const databaseError = () =>
    Object.assign(new Error('duplicate key value violates unique constraint "customers_org_email_key"'), {
      severity: 'ERROR',
      code: '23505',
      detail: `Key (org_id, email)=(1, ${EMAIL}) already exists.`,
      where: `SQL statement "insert … values ('${EMAIL}')"`,
      table: 'customers',
      constraint: 'customers_org_email_key',
    });
  const queryError = (cause: unknown) =>
    Object.assign(new Error(`Failed query: insert into customers (email) values ($1)\nparams: ${EMAIL}`), {
      query: 'insert into customers (email) values ($1)',
      params: [EMAIL],
      cause,
    });

  it('when an error is serialized, only its type, code, safe message and identifiers are kept', () => {
    const logged = serializeError(queryError(databaseError()));
    expect(logged).toEqual({
      type: 'Error',
      code: '23505',
      message: 'duplicate key value violates unique constraint "customers_org_email_key"',
      severity: 'ERROR',
      table: 'customers',
      constraint: 'customers_org_email_key',
      query: 'insert into customers (email) values ($1)',
    });
  });

  it('when an error wraps a failed statement, or a message carries a params line, the values stay out', () => {
    const wrapped = Object.assign(new Error('could not save the customer'), { cause: queryError(databaseError()) });
    expect(JSON.stringify(serializeError(wrapped))).not.toContain(EMAIL);
    const flattened = new Error(`Failed query: select 1\nparams: ${EMAIL}`);
    expect(serializeError(flattened).message).toBe('Failed query: select 1');
    const aggregate = new AggregateError([queryError(databaseError())], 'all failed');
    expect(JSON.stringify(serializeError(aggregate))).not.toContain(EMAIL);
  });

  it('when a logger is given a bare error or { err } without a message, the line gets the safe message, not the raw one', () => {
    const written: string[] = [];
    const logger = createLogger({ logLevel: 'info', logPretty: false }, sinkInto(written));
    logger.error(queryError(databaseError()));
    logger.warn({ err: queryError(databaseError()) });
    logger.error({ err: queryError(databaseError()) }, 'explicit message');
    expect(written.map((line) => JSON.parse(line).msg)).toEqual([
      'duplicate key value violates unique constraint "customers_org_email_key"',
      'duplicate key value violates unique constraint "customers_org_email_key"',
      'explicit message',
    ]);
    expect(written.join('\n')).not.toContain(EMAIL);
  });

  it('when LOG_LEVEL is debug, errors carry their call frames, without the message lines', () => {
    const written: string[] = [];
    const logger = createLogger({ logLevel: 'debug', logPretty: false }, sinkInto(written));
    logger.error({ err: queryError(new TypeError('boom')) }, 'failed');
    const { err } = JSON.parse(written[0]!) as { err: { stack: string } };
    expect(err.stack).toMatch(/^ {4}at /);
    expect(err.stack).not.toContain(EMAIL);
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
