import { get } from 'node:http';
import { connect, type AddressInfo } from 'node:net';
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
import { ROUTE_SCOPES } from '../../src/plugins/route-scopes.js';
import { type Scope } from '../../src/shared/scopes.js';
import { createEmailSender } from '../../src/modules/emails/email-sender.js';
import { sendQueuedEmails } from '../helpers/emails.js';
import { createEmailsRepository } from '../../src/modules/emails/emails.repository.js';
import { AppError } from '../../src/shared/app-error.js';
import { createLogger, loggerOptions, prettyLogsWanted, redactUrl, serializeError } from '../../src/shared/logging.js';
import { createTestContext, type TestContext, type TestOrg, testLinkSealer, testServices } from '../helpers/harness.js';
import { collectInto, recordSent } from '../helpers/log-collector.js';
import { scanLogLines } from '../helpers/log-scan.js';

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

/** A stream into `sink`, one entry per line; the lines join the run's log scan too. */
function sinkInto(sink: string[]): { write(line: string): void } {
  return collectInto(
    new Writable({
      write(chunk, _encoding, done) {
        sink.push(...String(chunk).split('\n').filter(Boolean));
        done();
      },
    }),
  );
}

async function appLoggingTo(sink: string[], level: 'debug' | 'info' | 'warn' = 'info'): Promise<FastifyInstance> {
  const instance = await buildApp({
    config: ctx.config,
    database: ctx.database,
    logger: { ...loggerOptions({ logLevel: level }), stream: sinkInto(sink) },
  });
  await instance.ready();
  return instance;
}

/** The rules of the run's log scan that `text`'s lines break (with the values this file sends as the sent ones). */
const scanned = (text: string[]) =>
  scanLogLines(
    text.map((line) => ({ line, source: 'this test' })),
    [EMAIL, FULL_NAME],
  );

beforeAll(async () => {
  scopes['GET /v1/log-probe'] = null;
  scopes['GET /v1/log-probe-failure'] = null;
  scopes['GET /v1/log-probe-slow'] = null;
  apiModules.push(probeRoutes);
  // Sent on a raw socket below, where the harness cannot record them: the run's scan looks for them too.
  recordSent({ email: EMAIL, fullName: FULL_NAME });
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
const rawLinesOf = (...reqIds: string[]) => lines.filter((line) => reqIds.includes((JSON.parse(line) as Entry).reqId as string));
/** The keys of a line besides pino's own (level, time, pid, hostname). */
const ownKeys = (entry: Entry) => Object.keys(entry).filter((key) => !['level', 'time', 'pid', 'hostname'].includes(key));

describe('request logs', () => {
  it('when a request is served, it writes one line: request id, key, organisation, method, route pattern, status, duration', async () => {
    const response = await ctx.request(
      'GET',
      `/v1/customers/${MISSING_UUID}`,
      { key: org.key, headers: { 'x-request-id': 'req-line-1' } },
      app,
    );
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
    expect(mine.find((entry) => entry.msg === 'probe')).toMatchObject({
      reqId: 'req-log-1',
      apiKeyId: org.keyId,
      orgId: org.id,
      level: 30,
    });
    expect(mine.find((entry) => entry.msg === 'request')).toMatchObject({
      apiKeyId: org.keyId,
      orgId: org.id,
      route: '/v1/log-probe',
      status: 200,
    });
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
        expect.objectContaining({
          apiKeyId: org.keyId,
          method: 'GET',
          route: '/v1/log-probe-slow',
          aborted: true,
          msg: 'request aborted by the client',
        }),
      ]);
    } finally {
      await listening.close();
    }
  });

  it('when a statement fails, the error line names the route and the error by type, SQL state and identifiers, never its message, SQL text or values', async () => {
    const response = await ctx.request('GET', '/v1/log-probe-failure', { key: org.key, headers: { 'x-request-id': 'req-log-4' } }, app);
    expect(response.statusCode).toBe(500);
    const mine = linesOf('req-log-4');
    const failure = mine.find((entry) => entry.level === 50)!;
    expect(failure).toEqual({
      level: 50,
      time: expect.any(Number),
      pid: expect.any(Number),
      hostname: expect.any(String),
      reqId: 'req-log-4',
      apiKeyId: org.keyId,
      orgId: org.id,
      method: 'GET',
      route: '/v1/log-probe-failure',
      status: 500,
      err: {
        type: 'DatabaseError',
        sqlState: '23505',
        severity: 'ERROR',
        schema: expect.any(String),
        table: 'log_probe',
        constraint: 'log_probe_email_key',
        routine: expect.any(String),
      },
      msg: 'unhandled error',
    });
    expect(mine.find((entry) => entry.msg === 'request')).toMatchObject({ status: 500, route: '/v1/log-probe-failure' });
    expect(mine).toHaveLength(2);
    expect(scanned(rawLinesOf('req-log-4'))).toEqual([]);
  });

  it('when PostgreSQL quotes a bound value in its message (a failed cast), neither the message nor the value is logged', async () => {
    await ctx.request('GET', '/v1/log-probe-failure?kind=cast', { key: org.key, headers: { 'x-request-id': 'req-log-5' } }, app);
    const failure = linesOf('req-log-5').find((entry) => entry.level === 50)!;
    expect(failure).toMatchObject({ route: '/v1/log-probe-failure', err: { type: 'DatabaseError', sqlState: '22P02' } });
    expect(failure.err).not.toHaveProperty('message');
    expect(scanned(rawLinesOf('req-log-5'))).toEqual([]);
  });

  it('when LOG_LEVEL is debug, a failed statement is logged with its call frames, and still no message, SQL text or values', async () => {
    const verbose: string[] = [];
    const debugApp = await appLoggingTo(verbose, 'debug');
    try {
      await ctx.request('GET', '/v1/log-probe-failure', { key: org.key, headers: { 'x-request-id': 'req-log-debug' } }, debugApp);
    } finally {
      await debugApp.close();
    }
    const failure = verbose
      .map((line) => JSON.parse(line) as Entry)
      .find((entry) => entry.reqId === 'req-log-debug' && entry.level === 50)!;
    expect(failure.err).toMatchObject({ type: 'DatabaseError', sqlState: '23505', stack: expect.stringMatching(/^ {4}at /) });
    expect(scanned(verbose)).toEqual([]);
  });

  it('when a key this process has seen is refused (revoked), the 401 is logged at info as a request line, with no error line or SQL', async () => {
    const key = await ctx.createKey(org.id);
    expect((await ctx.request('GET', '/v1/customers', { key: key.key, headers: { 'x-request-id': 'req-seen-1' } }, app)).statusCode).toBe(
      200,
    );
    await testServices(ctx.database).apiKeys.revoke(key.id);
    const refused = await ctx.request('GET', '/v1/customers', { key: key.key, headers: { 'x-request-id': 'req-seen-2' } }, app);
    expect(refused.statusCode).toBe(401);
    expect(linesOf('req-seen-2')).toEqual([expect.objectContaining({ level: 30, msg: 'request', status: 401, route: '/v1/customers' })]);
    expect(scanned(rawLinesOf('req-seen-1', 'req-seen-2'))).toEqual([]);
  });

  it('when a key is over its rate limit, the 429 is logged at info as a request line, with no error line or SQL', async () => {
    const key = await ctx.createKey(org.id, { burstLimit: 1 });
    const statuses: number[] = [];
    for (let attempt = 0; attempt < 5 && !statuses.includes(429); attempt += 1) {
      statuses.push(
        (await ctx.request('GET', '/v1/customers', { key: key.key, headers: { 'x-request-id': `req-limit-${attempt}` } }, app)).statusCode,
      );
    }
    const limited = statuses.indexOf(429);
    expect(limited).toBeGreaterThan(0);
    expect(linesOf(`req-limit-${limited}`)).toEqual([
      expect.objectContaining({ level: 30, msg: 'request', status: 429, route: '/v1/customers', apiKeyId: key.id }),
    ]);
    expect(scanned(rawLinesOf(...statuses.map((_status, attempt) => `req-limit-${attempt}`)))).toEqual([]);
  });

  it('when LOG_LEVEL is debug, a refused request (401, 404, 422) adds a debug line naming the error by type and code, never by its message', async () => {
    const verbose: string[] = [];
    const debugApp = await appLoggingTo(verbose, 'debug');
    try {
      await ctx.request(
        'GET',
        '/v1/customers',
        { key: 'svc_live_thisKeyIsMadeUpAndUnknownToTheServer0001', headers: { 'x-request-id': 'req-dbg-401' } },
        debugApp,
      );
      await ctx.request(
        'POST',
        '/v1/customers',
        { key: org.key, body: { fullName: FULL_NAME, email: 'not an email' }, headers: { 'x-request-id': 'req-dbg-422' } },
        debugApp,
      );
      await ctx.request(
        'GET',
        `/v1/customers/${encodeURIComponent(EMAIL)}`,
        { key: org.key, headers: { 'x-request-id': 'req-dbg-404' } },
        debugApp,
      );
    } finally {
      await debugApp.close();
    }
    const entries = verbose.map((line) => JSON.parse(line) as Entry);
    const refusal = (reqId: string) => entries.find((entry) => entry.reqId === reqId && entry.msg === 'request refused');
    expect(refusal('req-dbg-401')).toMatchObject({
      level: 20,
      route: '/v1/customers',
      status: 401,
      err: { type: 'AppError', code: 'unauthorized' },
    });
    expect(refusal('req-dbg-422')).toMatchObject({ level: 20, route: '/v1/customers', status: 422, err: { code: 'FST_ERR_VALIDATION' } });
    expect(refusal('req-dbg-404')).toMatchObject({
      level: 20,
      route: '/v1/customers/:id',
      status: 404,
      err: { type: 'AppError', code: 'not_found' },
    });
    expect(entries.filter((entry) => (entry.level as number) >= 40)).toEqual([]);
    expect(scanned(verbose)).toEqual([]);
  });

  it('when a client hangs up in the middle of its body, it is logged at info as the client aborting, not as the database being unavailable', async () => {
    const aborted: string[] = [];
    const listening = await buildApp({
      config: ctx.config,
      database: ctx.database,
      logger: { ...loggerOptions({ logLevel: 'debug' }), stream: sinkInto(aborted) },
    });
    // The hang-up must come while the body is read: after the access check, which reading it waits for.
    let bodyReading!: () => void;
    const readingBody = new Promise<void>((resolve) => (bodyReading = resolve));
    listening.addHook('preParsing', (request, _reply, payload, done) => {
      if (request.id === 'req-hangup') bodyReading();
      done(null, payload);
    });
    await listening.ready();
    try {
      await listening.listen({ host: '127.0.0.1', port: 0 });
      const { port } = listening.server.address() as AddressInfo;
      const socket = connect(port, '127.0.0.1');
      socket.on('error', () => {});
      await new Promise<void>((resolve) => socket.once('connect', () => resolve()));
      socket.write(
        'POST /v1/customers HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n' +
          `Authorization: Bearer ${org.key}\r\nX-Request-Id: req-hangup\r\n\r\n` +
          JSON.stringify({ externalId: 'hangup-1', fullName: FULL_NAME, email: EMAIL }).slice(0, -1),
      );
      await readingBody;
      socket.destroy();
      await sleep(300);
    } finally {
      await listening.close();
    }
    const mine = aborted.map((line) => JSON.parse(line) as Entry).filter((entry) => entry.reqId === 'req-hangup');
    expect(mine.filter((entry) => (entry.level as number) >= 40)).toEqual([]);
    expect(aborted.join('\n')).not.toContain('database unavailable');
    expect(mine.filter((entry) => entry.level === 30)).toEqual([
      expect.objectContaining({ msg: 'request aborted by the client', aborted: true, method: 'POST', route: '/v1/customers' }),
    ]);
    expect(mine).toContainEqual(
      expect.objectContaining({
        level: 20,
        msg: 'client aborted the request while sending its body',
        route: '/v1/customers',
        err: expect.objectContaining({ code: 'ECONNRESET' }),
      }),
    );
    expect(scanned(aborted)).toEqual([]);
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

  it('when a failed statement is serialized, only its type, SQL state and identifiers are kept: no message, SQL text, values or row', () => {
    expect(serializeError(queryError(databaseError()))).toEqual({
      type: 'Error',
      sqlState: '23505',
      severity: 'ERROR',
      table: 'customers',
      constraint: 'customers_org_email_key',
    });
  });

  it('when an error wraps a failed statement, or a message carries a params line, the values stay out', () => {
    const wrapped = Object.assign(new Error('could not save the customer'), { cause: queryError(databaseError()) });
    expect(JSON.stringify(serializeError(wrapped))).not.toContain(EMAIL);
    const flattened = new Error(`Failed query: select 1\nparams: ${EMAIL}`);
    expect(serializeError(flattened)).toEqual({ type: 'Error', at: expect.any(String) });
    const aggregate = new AggregateError([queryError(databaseError())], 'all failed');
    expect(JSON.stringify(serializeError(aggregate))).not.toContain(EMAIL);
  });

  it("when an error carries a message, no message is logged: not ours, not the engine's, not a library's", () => {
    const ours = AppError.field('allowIps', `"${EMAIL}" is not an IPv4/IPv6 address or CIDR range.`);
    expect(serializeError(ours)).toEqual({ type: 'AppError', code: 'validation_failed' });
    let engine: unknown;
    try {
      JSON.parse(EMAIL);
    } catch (error) {
      engine = error;
    }
    expect(JSON.stringify(serializeError(engine))).not.toContain(EMAIL);
    const smtp = Object.assign(new Error(`Can't send mail - all recipients were rejected: 550 <${EMAIL}>: Recipient address rejected`), {
      code: 'EENVELOPE',
      response: `550 <${EMAIL}>: Recipient address rejected`,
      responseCode: 550,
      command: 'RCPT TO',
      rejected: [EMAIL],
    });
    expect(serializeError(smtp)).toEqual({ type: 'Error', code: 'EENVELOPE', responseCode: 550 });
    const system = Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:5432'), {
      code: 'ECONNREFUSED',
      errno: -111,
      syscall: 'connect',
      address: '127.0.0.1',
      port: 5432,
    });
    expect(serializeError(system)).toEqual({ type: 'Error', code: 'ECONNREFUSED', syscall: 'connect', address: '127.0.0.1', port: 5432 });
  });

  it("when a message is one of the driver's constant connection messages, it is the one message logged, and only whole", () => {
    expect(serializeError(new Error('Connection terminated unexpectedly'))).toEqual({
      type: 'Error',
      message: 'Connection terminated unexpectedly',
      at: expect.any(String),
    });
    expect(serializeError(new Error(`Connection terminated unexpectedly for ${EMAIL}`))).not.toHaveProperty('message');
  });

  it("when the server refuses the connection itself (FATAL, or SQLSTATE class 08), its message is logged; a statement's (ERROR) never is", () => {
    const fatal = Object.assign(new Error('database "svc_missing" does not exist'), {
      severity: 'FATAL',
      code: '3D000',
      routine: 'InitPostgres',
    });
    expect(serializeError(fatal)).toEqual({
      type: 'Error',
      sqlState: '3D000',
      severity: 'FATAL',
      routine: 'InitPostgres',
      message: 'database "svc_missing" does not exist',
    });
    const pooler = Object.assign(new Error('unsupported startup parameter: statement_timeout'), { severity: 'ERROR', code: '08P01' });
    expect(serializeError(queryError(pooler))).toMatchObject({
      sqlState: '08P01',
      message: 'unsupported startup parameter: statement_timeout',
    });
    expect(serializeError(queryError(databaseError()))).not.toHaveProperty('message');
  });

  it('when a code or an identifier holds something other than a token (an address, a sentence), it is left out', () => {
    const odd = Object.assign(new Error('x'), { code: EMAIL, table: `${FULL_NAME} <${EMAIL}>`, address: EMAIL });
    expect(JSON.stringify(serializeError(odd))).not.toContain(EMAIL);
  });

  it('when a message forges call frames (a bound value holding "\\n    at …"), the stack keeps only the real frames', () => {
    const message = `Failed query: insert into customers (email) values ($1)\nparams: x\n    at ${EMAIL} (${FULL_NAME})`;
    const forged = Object.assign(new Error(message), {
      query: 'insert into customers (email) values ($1)',
      params: [`x\n    at ${EMAIL} (${FULL_NAME})`],
    });
    const stack = serializeError(forged, { stack: true }).stack!;
    expect(stack).toMatch(/^ {4}at /);
    expect(stack).not.toContain(EMAIL);
    expect(stack).not.toContain('Failed query');
  });

  it("when a logger is given a bare error or { err } without a message, the line gets the error's type and code, not its message", () => {
    const written: string[] = [];
    const logger = createLogger({ logLevel: 'info', logPretty: false }, sinkInto(written));
    logger.error(queryError(databaseError()));
    logger.warn({ err: queryError(databaseError()) });
    logger.error({ err: queryError(databaseError()) }, 'explicit message');
    logger.error(new TypeError(`Cannot read properties of undefined (reading '${EMAIL}')`));
    expect(written.map((line) => JSON.parse(line).msg)).toEqual(['Error 23505', 'Error 23505', 'explicit message', 'TypeError']);
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

  it('when a message or a logged value holds an API key or an email address, it is replaced', () => {
    const written: string[] = [];
    const logger = createLogger({ logLevel: 'info', logPretty: false }, sinkInto(written));
    logger.warn(`Reply was already sent, did you forget to "return reply" in the "/v1/x?access_token=${org.key}&to=${EMAIL}" (GET) route?`);
    logger.info({ detailText: `key ${org.key} for ${EMAIL}`, nested: { note: org.key } }, 'values');
    const text = written.join('\n');
    expect(text).not.toContain('svc_live_');
    expect(text).not.toContain(EMAIL);
    expect(scanned(written)).toEqual([]);
  });
});

describe('emails', () => {
  it('when no SMTP server is configured, an email is logged as recorded by its id, organisation and kind, never by its link, token or recipient', async () => {
    const token = 'vtok_9f8e7d6c5b4a39281706f5e4d3c2b1a0';
    const link = `https://app.example.test/verify/${token}`;
    const email = await createEmailsRepository(testLinkSealer(), ctx.app.deps.jobs).queue(
      {
        orgId: org.id,
        recipient: EMAIL,
        subject: `Verify your identity, ${FULL_NAME}`,
        body: `Start here: ${link}`,
        link,
      },
      ctx.database.db,
    );
    const written: string[] = [];
    const sender = createEmailSender({
      database: ctx.database,
      sealer: testLinkSealer(),
      smtpUrl: undefined,
      from: 'no-reply@example.test',
      logger: createLogger({ logLevel: 'debug', logPretty: false }, sinkInto(written)),
    });
    try {
      expect(await sendQueuedEmails(ctx.database, sender)).toBeGreaterThanOrEqual(1);
    } finally {
      sender.close();
    }
    const text = written.join('\n');
    for (const secret of [token, link, EMAIL, FULL_NAME]) expect(text).not.toContain(secret);
    const recorded = written.map((line) => JSON.parse(line) as Entry).find((entry) => entry.emailId === email.id);
    expect(recorded).toMatchObject({
      level: 30,
      emailId: email.id,
      orgId: org.id,
      kind: 'other',
      msg: expect.stringMatching(/^email recorded/),
    });
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

  it('when a query value is an API key, it is redacted whatever the parameter is called; so are sensitive parameters and addresses in the path', () => {
    const key = 'svc_live_sBJEkpYxohWi47R71ULZndhUlHpQK6EgOZgLmysQ';
    expect(redactUrl(`/v1/customers?access_token=${key}&limit=5`)).toBe('/v1/customers?access_token=%5Bredacted%5D&limit=5');
    expect(redactUrl(`/v1/customers?x=${key}`)).not.toContain('svc_live_');
    expect(redactUrl(`/v1/customers?apikey=abc&email=${encodeURIComponent(EMAIL)}&to=${encodeURIComponent(EMAIL)}`)).toBe(
      '/v1/customers?apikey=%5Bredacted%5D&email=%5Bredacted%5D&to=%5Bredacted%5D',
    );
    expect(redactUrl(`/v1/customers/${encodeURIComponent(EMAIL)}/aml?note=${encodeURIComponent(`for ${EMAIL}`)}`)).toBe(
      '/v1/customers/[redacted]/aml?note=%5Bredacted%5D',
    );
    expect(redactUrl(`/v1/${key}`)).toBe('/v1/[redacted]');
  });

  it('when a URL has no sensitive parameter, it is logged unchanged', () => {
    expect(redactUrl('/v1/customers?limit=5&updated_since=2026-01-01T00:00:00Z')).toBe(
      '/v1/customers?limit=5&updated_since=2026-01-01T00:00:00Z',
    );
    expect(redactUrl('/v1/customers/abc')).toBe('/v1/customers/abc');
  });
});
