import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp } from '../../src/app.js';
import { createDatabase } from '../../src/db/client.js';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';

let ctx: TestContext;
let org: TestOrg;

beforeAll(async () => {
  ctx = await createTestContext();
  org = await ctx.createOrg();
});
afterAll(async () => ctx?.close());

function post(body: string | object, headers: Record<string, string> = {}) {
  return ctx.app.inject({
    method: 'POST',
    url: '/v1/customers',
    headers: { authorization: `Bearer ${org.key}`, 'content-type': 'application/json', ...headers },
    payload: typeof body === 'string' ? body : JSON.stringify(body),
  });
}

describe('422 validation_failed', () => {
  it('when an array item is invalid, it names the path with an index (designatedServices[1])', async () => {
    const response = await post({ fullName: 'Ivy Index', email: 'ivy@example.com', designatedServices: ['PRO-FORMATION', 42] });
    expect(response.statusCode).toBe(422);
    const body = response.json();
    expect(body.error.code).toBe('validation_failed');
    expect(Object.keys(body.error.details.issues)).toContain('designatedServices[1]');
  });

  it('when a nested field is invalid, it names the dotted path (representative.email)', async () => {
    const response = await post({
      fullName: 'Nora Nested',
      email: 'nora@example.com',
      representative: { fullName: 'Pat Attorney', email: 'not-an-email' },
    });
    expect(response.statusCode).toBe(422);
    expect(response.json().error.details.issues['representative.email']).toEqual([expect.any(String)]);
  });

  it('when a nested boolean has the wrong type, it names risk.isNewCustomer', async () => {
    const response = await post({ fullName: 'Rita Risk', email: 'rita@example.com', risk: { isNewCustomer: 'yes' } });
    expect(response.statusCode).toBe(422);
    expect(response.json().error.details.issues['risk.isNewCustomer']).toEqual([expect.any(String)]);
  });

  it('when the body has an unknown property, it is rejected and the property is named', async () => {
    const response = await post({ fullName: 'Una Known', email: 'una@example.com', nickname: 'U' });
    expect(response.statusCode).toBe(422);
    expect(response.json().error.details.issues).toEqual({ nickname: [expect.any(String)] });
  });

  it('when a nested object has an unknown property, it names the nested path', async () => {
    const response = await post({ fullName: 'Una Nested', email: 'una2@example.com', risk: { colour: 'red' } });
    expect(response.statusCode).toBe(422);
    expect(Object.keys(response.json().error.details.issues)).toEqual(['risk.colour']);
  });

  it('when every issue is reported, the envelope holds only code, message and details', async () => {
    const response = await post({ fullName: '', email: 'x' });
    expect(response.statusCode).toBe(422);
    const body = response.json();
    expect(Object.keys(body)).toEqual(['error']);
    expect(Object.keys(body.error).sort()).toEqual(['code', 'details', 'message']);
    expect(Object.keys(body.error.details.issues).sort()).toEqual(['email', 'fullName']);
  });

  it('when a service rule fails (first name without last name), it answers 422 with the field path', async () => {
    const response = await post({ fullName: 'Fay First', email: 'fay@example.com', firstName: 'Fay' });
    expect(response.statusCode).toBe(422);
    expect(response.json().error).toMatchObject({ code: 'validation_failed', details: { issues: { lastName: [expect.any(String)] } } });
  });

  it('when a query parameter is invalid, it answers 422 naming the parameter', async () => {
    const response = await ctx.request('GET', '/v1/customers', { key: org.key, query: { limit: 'many' } });
    expect(response.statusCode).toBe(422);
    expect(Object.keys(response.json().error.details.issues)).toEqual(['limit']);
  });
});

describe('body parsing errors', () => {
  it('when the body is malformed JSON, it answers 400 invalid_json in the envelope', async () => {
    const response = await post('{"fullName": "Broken",');
    expect(response.statusCode).toBe(400);
    expect(response.json()).toEqual({ error: { code: 'invalid_json', message: expect.any(String) } });
  });

  it('when the body is shorter than its Content-Length, it answers 400 invalid_json (a client fault, not a 500)', async () => {
    const response = await post('{"fullName":"Short"}', { 'content-length': '60' });
    expect(response.statusCode).toBe(400);
    expect(response.json()).toEqual({ error: { code: 'invalid_json', message: expect.any(String) } });
  });

  it('when the body exceeds 1 MiB, it answers 413 payload_too_large in the envelope', async () => {
    const response = await post({ fullName: 'Big Body', email: 'big@example.com', padding: 'x'.repeat(1024 * 1024) });
    expect(response.statusCode).toBe(413);
    expect(response.json()).toEqual({ error: { code: 'payload_too_large', message: expect.any(String) } });
  });

  it('when the body is just under 1 MiB, it is parsed (and then validated)', async () => {
    const response = await post({ fullName: 'Big Body', email: 'big@example.com', padding: 'x'.repeat(1024 * 1024 - 200) });
    expect(response.statusCode).toBe(422);
  });

  it.each(['text/plain', 'application/x-www-form-urlencoded', 'application/xml'])(
    'when the body is sent as %s, it answers 415 unsupported_media_type',
    async (contentType) => {
      const response = await post('fullName=Plain', { 'content-type': contentType });
      expect(response.statusCode).toBe(415);
      expect(response.json()).toEqual({ error: { code: 'unsupported_media_type', message: expect.any(String) } });
    },
  );

  it('when the body is JSON with a charset, it is accepted', async () => {
    const response = await post(
      { fullName: 'Char Set', email: 'charset@example.com' },
      { 'content-type': 'application/json; charset=utf-8' },
    );
    expect(response.statusCode).toBe(201);
  });

  it('when the content type is application/json but the body is empty, it answers 422', async () => {
    const response = await post('');
    expect(response.statusCode).toBe(422);
    expect(response.json().error.code).toBe('validation_failed');
  });
});

describe('router errors', () => {
  it('when the URL has a malformed percent-encoding, it answers 404 not_found in the envelope', async () => {
    const response = await ctx.request('GET', '/v1/customers/%E0%A4%A', { key: org.key });
    expect(response.statusCode).toBe(404);
    expect(response.json()).toEqual({ error: { code: 'not_found', message: expect.any(String) } });
    expect(response.headers['x-request-id']).toBeDefined();
  });

  it('when an external_id of 255 characters is used as {id}, the route finds the record', async () => {
    const externalId = `ext-${'x'.repeat(251)}`;
    const created = await post({ externalId, fullName: 'Long External', email: 'long.external@example.com' });
    expect(created.statusCode).toBe(201);
    const response = await ctx.request('GET', `/v1/customers/${externalId}`, { key: org.key });
    expect(response.statusCode).toBe(200);
    expect(response.json().id).toBe(created.json().id);
  });

  it('when an {id} is longer than any id can be, it answers 404 not_found in the envelope', async () => {
    const response = await ctx.request('GET', `/v1/customers/${'x'.repeat(2000)}`, { key: org.key });
    expect(response.statusCode).toBe(404);
    expect(response.json()).toEqual({ error: { code: 'not_found', message: expect.any(String) } });
  });
});

describe('500 internal', () => {
  it('when a handler fails unexpectedly, it answers 500 internal with the request id and no stack or SQL', async () => {
    const logged: string[] = [];
    const app = await buildApp({
      config: ctx.config,
      database: ctx.database,
      logger: { level: 'error', stream: { write: (line: string) => logged.push(line) } },
    });
    app.get('/boom', async () => {
      const error = new Error('relation "secret_table" does not exist: SELECT * FROM secret_table');
      throw error;
    });
    await app.ready();
    try {
      const response = await app.inject({ method: 'GET', url: '/boom', headers: { 'x-request-id': 'req-boom-1' } });
      expect(response.statusCode).toBe(500);
      const body = response.json();
      expect(body).toEqual({
        error: { code: 'internal', message: expect.any(String), details: { request_id: 'req-boom-1' } },
      });
      expect(response.body).not.toMatch(/secret_table|SELECT|at .*\.ts|stack/i);
      expect(response.headers['x-request-id']).toBe('req-boom-1');
      expect(logged.some((line) => line.includes('req-boom-1') && line.includes('secret_table'))).toBe(true);
    } finally {
      await app.close();
    }
  });
});

describe('503 database_unavailable', () => {
  it('when the database cannot be reached, it answers 503 database_unavailable with Retry-After and no connection details', async () => {
    const unreachable = createDatabase('postgres://postgres@127.0.0.1:1/nowhere', { poolSize: 1 });
    const app = await buildApp({ config: ctx.config, database: unreachable, logger: false });
    await app.ready();
    try {
      const response = await app.inject({ method: 'GET', url: '/v1/customers', headers: { authorization: `Bearer ${org.key}` } });
      expect(response.statusCode).toBe(503);
      expect(response.json()).toEqual({ error: { code: 'database_unavailable', message: expect.any(String) } });
      expect(response.headers['retry-after']).toBe('1');
      expect(response.body).not.toMatch(/127\.0\.0\.1|ECONNREFUSED|nowhere/);
    } finally {
      await app.close();
      await unreachable.close();
    }
  });
});
