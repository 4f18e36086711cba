import { connect } from 'node:net';
import { Writable } from 'node:stream';
import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { buildApp } from '../../src/app.js';
import { createDatabase } from '../../src/db/client.js';
import { notReady } from '../../src/modules/health/health.routes.js';
import { createEmptyDatabase } from '../helpers/database.js';
import { createTestContext, type TestContext } from '../helpers/harness.js';

let ctx: TestContext;
let app: FastifyInstance;
const logLines: Array<Record<string, unknown>> = [];

/** A pg error as the driver raises it: SQL state, detail, the failing query and a stack. */
function pgLikeError(): Error {
  return Object.assign(new Error('duplicate key value violates unique constraint "customers_org_external_id_key"'), {
    code: '23505',
    severity: 'ERROR',
    detail: 'Key (org_id, external_id)=(7c0b…, crm-42) already exists.',
    table: 'customers',
    constraint: 'customers_org_external_id_key',
    query: 'insert into "customers" ("org_id", "external_id") values ($1, $2)',
  });
}

beforeAll(async () => {
  ctx = await createTestContext();
  const logStream = new Writable({
    write(chunk: Buffer, _encoding, done) {
      for (const line of chunk.toString().split('\n').filter(Boolean)) logLines.push(JSON.parse(line) as Record<string, unknown>);
      done();
    },
  });
  app = await buildApp({ config: ctx.config, database: ctx.database, logger: { level: 'error', stream: logStream } });
  // Test-only routes outside /v1 (the auth plugin guards /v1 only), registered before ready().
  await app.register(async (instance) => {
    instance.post('/test/echo', { schema: { body: z.object({ name: z.string() }).strict() } }, async (request) => ({
      received: request.body,
    }));
    instance.get('/test/database-failure', async () => {
      throw pgLikeError();
    });
  });
  await app.ready();
});
afterAll(async () => {
  await app?.close();
  await ctx?.close();
});

describe('health routes', () => {
  it('when the process is up, GET /healthz answers 200 without a key', async () => {
    const response = await ctx.request('GET', '/healthz');
    expect(response.statusCode).toBe(200);
    expect(response.json()).toEqual({ status: 'ok' });
  });

  it('when the database is reachable and migrated, GET /readyz answers ready', async () => {
    const response = await ctx.request('GET', '/readyz');
    expect(response.statusCode).toBe(200);
    expect(response.json()).toEqual({ status: 'ready', database: 'ok' });
  });

  async function readinessOn(url: string) {
    const database = createDatabase(url, { poolSize: 1 });
    const probe = await buildApp({ config: ctx.config, database, logger: false });
    try {
      return {
        ready: await probe.inject({ method: 'GET', url: '/readyz' }),
        health: await probe.inject({ method: 'GET', url: '/healthz' }),
      };
    } finally {
      await probe.close();
      await database.close();
    }
  }

  it('when the database has not been migrated, GET /readyz answers 503 service_unavailable while /healthz stays 200', async () => {
    const empty = await createEmptyDatabase();
    try {
      const { ready, health } = await readinessOn(empty.url);
      expect(ready.statusCode).toBe(503);
      expect(ready.json()).toEqual({ error: { code: 'service_unavailable', message: expect.stringMatching(/migrations/i) } });
      expect(health.statusCode).toBe(200);
    } finally {
      await empty.drop();
    }
  });

  it("when every pooled connection is held, GET /readyz answers 503 database_unavailable without waiting out the pool's connect timeout, and 200 once one is free", async () => {
    // The pool would wait 10 minutes for a connection: only the probe's own bound can answer first.
    // How soon it answers is bounded in test/reliability/service-timing.test.ts.
    const database = createDatabase(ctx.databaseUrl, { poolSize: 1, connectTimeoutMs: 600_000 });
    const probe = await buildApp({ config: ctx.config, database, logger: false });
    let release!: () => void;
    let holding!: () => void;
    const holds = new Promise<void>((resolve) => (holding = resolve));
    const held = database.transaction(async () => {
      holding();
      await new Promise<void>((resolve) => (release = resolve));
    });
    try {
      await holds;
      let busy: LightMyRequestResponse | undefined;
      void probe.inject({ method: 'GET', url: '/readyz' }).then((response) => (busy = response));
      await vi.waitFor(() => expect(busy).toBeDefined(), { timeout: 20_000, interval: 20 });
      expect(busy!.statusCode).toBe(503);
      expect(busy!.json().error.code).toBe('database_unavailable');
      release();
      await held;
      expect((await probe.inject({ method: 'GET', url: '/readyz' })).statusCode).toBe(200);
    } finally {
      release?.();
      await held.catch(() => {});
      await probe.close();
      await database.close();
    }
  });

  it('when the database cannot be reached, GET /readyz answers 503 database_unavailable without connection details', async () => {
    const { ready, health } = await readinessOn('postgres://nobody:secret@127.0.0.1:1/none');
    expect(ready.statusCode).toBe(503);
    expect(ready.json()).toEqual({ error: { code: 'database_unavailable', message: expect.any(String) } });
    for (const leak of ['127.0.0.1', 'ECONNREFUSED', 'secret', 'nobody']) expect(ready.body).not.toContain(leak);
    expect(health.statusCode).toBe(200);
  });

  it('when the server refuses the connection itself (an unknown database), GET /readyz answers 503 naming the server message after its SQLSTATE', async () => {
    const missing = new URL(ctx.databaseUrl);
    missing.pathname = `/h43_missing_${Date.now()}`;
    const { ready, health } = await readinessOn(missing.toString());
    expect(ready.statusCode).toBe(503);
    expect(ready.json()).toEqual({
      error: {
        code: 'database_unavailable',
        message: `The database refused the connection (3D000): database "${missing.pathname.slice(1)}" does not exist`,
      },
    });
    expect(health.statusCode).toBe(200);
  });

  it('when the check fails on a statement, /readyz names its SQLSTATE only: never its message, values or SQL', () => {
    const failed = notReady(pgLikeError());
    expect(failed).toMatchObject({ code: 'database_unavailable', status: 503, message: 'The database check failed (23505).' });
    // drizzle's wrapper around the driver's error: the statement and its values in the message, the error as cause.
    const wrapped = Object.assign(new Error('Failed query: select 1 from customers where email = $1\nparams: jane@example.com'), {
      query: 'select 1 from customers where email = $1',
      params: ['jane@example.com'],
      cause: pgLikeError(),
    });
    expect(notReady(wrapped).message).toBe('The database check failed (23505).');
    // A connection-level error wrapped the same way is named with the server's message.
    const refused = Object.assign(new Error('unsupported startup parameter: statement_timeout'), { severity: 'FATAL', code: '08P01' });
    expect(notReady(Object.assign(new Error('Failed query: select 1'), { query: 'select 1', params: [], cause: refused })).message).toBe(
      'The database refused the connection (08P01): unsupported startup parameter: statement_timeout',
    );
  });
});

describe('framework errors use the error envelope', () => {
  it('when no route matches, it answers 404 not_found in the envelope', async () => {
    for (const [method, url] of [
      ['GET', '/v1/no-such-route'],
      ['POST', '/v1/no-such-route'],
      ['GET', '/nowhere?x=1'],
    ] as const) {
      const response = await app.inject({ method, url });
      expect(response.statusCode).toBe(404);
      expect(response.headers['content-type']).toMatch(/^application\/json/);
      expect(response.json()).toEqual({ error: { code: 'not_found', message: expect.stringContaining(url.split('?')[0]!) } });
    }
  });

  it('when the request carries an X-Request-Id, it is echoed; otherwise one is generated', async () => {
    const echoed = await app.inject({ method: 'GET', url: '/healthz', headers: { 'x-request-id': 'abc-123' } });
    expect(echoed.headers['x-request-id']).toBe('abc-123');
    const generated = await app.inject({ method: 'GET', url: '/healthz', headers: { 'x-request-id': 'bad id with spaces' } });
    expect(generated.headers['x-request-id']).toMatch(/^[0-9a-f-]{36}$/);
  });

  it('when the body is malformed JSON, it answers 400 invalid_json', async () => {
    const response = await app.inject({
      method: 'POST',
      url: '/test/echo',
      headers: { 'content-type': 'application/json' },
      payload: '{"name": "Ada",',
    });
    expect(response.statusCode).toBe(400);
    expect(response.json()).toEqual({ error: { code: 'invalid_json', message: expect.any(String) } });
  });

  it.each([
    ['text/plain', 'name=Ada'],
    ['application/x-www-form-urlencoded', 'name=Ada'],
    ['application/xml', '<name>Ada</name>'],
  ])('when the body is sent as %s, it answers 415 unsupported_media_type', async (contentType, payload) => {
    const response = await app.inject({ method: 'POST', url: '/test/echo', headers: { 'content-type': contentType }, payload });
    expect(response.statusCode).toBe(415);
    expect(response.json()).toEqual({ error: { code: 'unsupported_media_type', message: expect.stringContaining('application/json') } });
  });

  it('when the body is over 1 MiB, it answers 413 payload_too_large', async () => {
    const response = await app.inject({
      method: 'POST',
      url: '/test/echo',
      headers: { 'content-type': 'application/json' },
      payload: JSON.stringify({ name: 'x'.repeat(1024 * 1024) }),
    });
    expect(response.statusCode).toBe(413);
    expect(response.json()).toEqual({ error: { code: 'payload_too_large', message: expect.stringContaining('1 MiB') } });
  });

  it('when the body is just under 1 MiB, it is accepted', async () => {
    const name = 'x'.repeat(1024 * 1024 - 100);
    const response = await app.inject({
      method: 'POST',
      url: '/test/echo',
      headers: { 'content-type': 'application/json; charset=utf-8' },
      payload: JSON.stringify({ name }),
    });
    expect(response.statusCode).toBe(200);
    expect(response.json()).toEqual({ received: { name } });
  });

  it('when the body fails the schema (unknown property), it answers 422 validation_failed naming the property', async () => {
    const response = await app.inject({ method: 'POST', url: '/test/echo', payload: { name: 'Ada', role: 'admin' } });
    expect(response.statusCode).toBe(422);
    expect(response.json()).toEqual({
      error: { code: 'validation_failed', message: expect.any(String), details: { issues: { role: ['Unknown property.'] } } },
    });
  });

  it('when a handler fails with a database error, it answers 500 internal without stack or SQL, with the request id in details and in the log', async () => {
    const response = await app.inject({ method: 'GET', url: '/test/database-failure', headers: { 'x-request-id': 'req-500-check' } });
    expect(response.statusCode).toBe(500);
    expect(response.json()).toEqual({
      error: { code: 'internal', message: expect.any(String), details: { request_id: 'req-500-check' } },
    });
    for (const leak of ['duplicate key', 'insert into', 'customers_org_external_id_key', '23505', 'crm-42', 'at ', '.ts:']) {
      expect(response.body).not.toContain(leak);
    }
    const logged = logLines.find((line) => line.reqId === 'req-500-check' && line.level === 50);
    expect(logged).toBeDefined();
    expect(JSON.stringify(logged)).toContain('23505');
  });
});

/** Sends raw bytes to a listening instance and returns everything it answers before closing. */
function rawExchange(port: number, bytes: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1', () => socket.write(bytes));
    let received = '';
    socket.setEncoding('utf8');
    socket.on('data', (chunk: string) => (received += chunk));
    socket.on('error', () => {}); // the server may reset after answering; what it sent is kept
    socket.on('close', () => resolve(received));
    socket.setTimeout(10_000, () => {
      socket.destroy();
      reject(new Error(`no answer to ${JSON.stringify(bytes.slice(0, 40))}`));
    });
  });
}

function parseRawResponse(raw: string): { status: number; headers: Record<string, string>; body: unknown } {
  const [head, body = ''] = raw.split('\r\n\r\n');
  const [statusLine, ...headerLines] = head!.split('\r\n');
  const headers = Object.fromEntries(
    headerLines.map((line) => [line.slice(0, line.indexOf(':')).toLowerCase(), line.slice(line.indexOf(':') + 1).trim()]),
  );
  return { status: Number(statusLine!.split(' ')[1]), headers, body: JSON.parse(body) };
}

describe('HTTP parser errors use the error envelope', () => {
  let port = 0;
  beforeAll(async () => {
    await app.listen({ port: 0, host: '127.0.0.1' });
    port = (app.server.address() as { port: number }).port;
  });

  // Each of these Node (its parser, or its server before any handler) used to answer, or may answer, itself.
  const post = 'POST /v1/customers HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n';
  it.each([
    ['a header line without a colon', 400, 'bad_request', 'GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n'],
    ['a request line that is not HTTP', 400, 'bad_request', 'NOT HTTP AT ALL\r\n\r\n'],
    ['headers over the size limit', 431, 'headers_too_large', `GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`],
    ['a URL over the header size limit', 431, 'headers_too_large', `GET /${'a'.repeat(20_000)} HTTP/1.1\r\nHost: x\r\n\r\n`],
    ['HTTP/1.1 without Host', 400, 'bad_request', 'GET /healthz HTTP/1.1\r\n\r\n'],
    ['two Host headers', 400, 'bad_request', 'GET /healthz HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n'],
    ['an invalid Host value', 400, 'bad_request', 'GET /healthz HTTP/1.1\r\nHost: a b/c\r\n\r\n'],
    ['an HTTP/2.0 request line', 400, 'bad_request', 'GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n'],
    ['an HTTP/0.9 request line', 400, 'bad_request', 'GET /healthz\r\n\r\n'],
    ['an unknown HTTP version', 400, 'bad_request', 'GET /healthz HTTP/1.2\r\nHost: x\r\n\r\n'],
    ['the HTTP/2 connection preface', 400, 'bad_request', 'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'],
    ['an invalid method token', 400, 'bad_request', 'G@T /healthz HTTP/1.1\r\nHost: x\r\n\r\n'],
    ['a method Node does not know', 400, 'bad_request', 'FOO /healthz HTTP/1.1\r\nHost: x\r\n\r\n'],
    ['a control character in a header value', 400, 'bad_request', 'GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a\u0001b\r\n\r\n'],
    ['a space in a header name', 400, 'bad_request', 'GET /healthz HTTP/1.1\r\nHost: x\r\nX A: b\r\n\r\n'],
    ['a folded header line (obs-fold)', 400, 'bad_request', 'GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n'],
    ['bare LF line endings', 400, 'bad_request', 'GET /healthz HTTP/1.1\nHost: x\n\n'],
    ['a NUL in the URL', 400, 'bad_request', 'GET /he\u0000althz HTTP/1.1\r\nHost: x\r\n\r\n'],
    ['a space in the URL', 400, 'bad_request', 'GET /he althz HTTP/1.1\r\nHost: x\r\n\r\n'],
    [
      'Transfer-Encoding and Content-Length together',
      400,
      'bad_request',
      `${post}Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n`,
    ],
    ['two Content-Length headers', 400, 'bad_request', `${post}Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}`],
    ['a Content-Length that is not a number', 400, 'bad_request', `${post}Content-Length: abc\r\n\r\n`],
    ['a Transfer-Encoding other than chunked', 400, 'bad_request', `${post}Transfer-Encoding: gzip\r\n\r\n`],
    ['a malformed chunk size', 400, 'bad_request', `${post}Transfer-Encoding: chunked\r\n\r\nZZ\r\n{}\r\n0\r\n\r\n`],
    [
      'an Expect other than 100-continue',
      417,
      'expectation_failed',
      'GET /healthz HTTP/1.1\r\nHost: x\r\nExpect: teapot\r\nConnection: close\r\n\r\n',
    ],
    ['a CONNECT (this is no proxy)', 404, 'not_found', 'CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n'],
  ])('when the request has %s, it answers %i %s in the envelope', async (_name, status, code, bytes) => {
    const response = parseRawResponse(await rawExchange(port, bytes));
    expect(response.status).toBe(status);
    expect(response.headers['content-type']).toMatch(/^application\/json/);
    expect(response.body).toEqual({ error: { code, message: expect.any(String) } });
  });

  it('when an HTTP/1.0 request has no Host, it is served (Host is required from HTTP/1.1 on)', async () => {
    const response = parseRawResponse(await rawExchange(port, 'GET /healthz HTTP/1.0\r\n\r\n'));
    expect(response.status).toBe(200);
  });

  it('when an HTTP/1.1 request has no Host, the answer closes the connection and carries Cache-Control: no-store', async () => {
    const response = parseRawResponse(await rawExchange(port, 'GET /healthz HTTP/1.1\r\n\r\n'));
    expect(response.headers.connection).toBe('close');
    expect(response.headers['cache-control']).toBe('no-store');
  });
});
