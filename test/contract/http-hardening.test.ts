import { randomUUID } from 'node:crypto';
import { brotliCompressSync, deflateSync, gzipSync } from 'node:zlib';
import type { LightMyRequestResponse } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ROUTE_SCOPES } from '../../src/plugins/route-scopes.js';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { minimalUpload } from '../helpers/multipart.js';

let ctx: TestContext;
let org: TestOrg;
let sequence = 0;
const unique = () => `${Date.now().toString(36)}-${(sequence++).toString(36)}`;
const newPerson = () => ({ fullName: `Person ${unique()}`, email: `p-${unique()}@example.test` });

beforeAll(async () => {
  ctx = await createTestContext();
  org = await ctx.createOrg();
});
afterAll(async () => ctx?.close());

describe('Cache-Control: no-store on every response', () => {
  const cases: Array<[string, number, () => Promise<LightMyRequestResponse>]> = [
    ['a read', 200, () => ctx.request('GET', '/v1/customers', { key: org.key })],
    ['a create', 201, () => ctx.request('POST', '/v1/customers', { key: org.key, body: newPerson() })],
    [
      'an idempotent replay',
      201,
      async () => {
        const options = { key: org.key, body: newPerson(), headers: { 'idempotency-key': `replay-${unique()}` } };
        expect((await ctx.request('POST', '/v1/customers', options)).statusCode).toBe(201);
        const replay = await ctx.request('POST', '/v1/customers', options);
        expect(replay.headers['idempotent-replayed']).toBe('true');
        return replay;
      },
    ],
    ['a missing key', 401, () => ctx.request('GET', '/v1/customers')],
    [
      'a missing scope',
      403,
      async () => {
        const reader = await ctx.createKey(org.id, { scopes: ['customers:read'] });
        return ctx.request('POST', '/v1/customers', { key: reader.key, body: newPerson() });
      },
    ],
    ['a missing record', 404, () => ctx.request('GET', `/v1/customers/${randomUUID()}`, { key: org.key })],
    ['no such route', 404, () => ctx.request('GET', '/v1/nowhere', { key: org.key })],
    ['a malformed percent-encoding (answered by the router)', 404, () => ctx.request('GET', '/v1/customers/%E0%A4%A', { key: org.key })],
    ['an id past the router limit', 404, () => ctx.request('GET', `/v1/customers/${'a'.repeat(2000)}`, { key: org.key })],
    [
      'malformed JSON',
      400,
      () =>
        ctx.app.inject({
          method: 'POST',
          url: '/v1/customers',
          headers: { authorization: `Bearer ${org.key}`, 'content-type': 'application/json' },
          payload: '{',
        }),
    ],
    [
      'a body that is not JSON',
      415,
      () =>
        ctx.app.inject({
          method: 'POST',
          url: '/v1/customers',
          headers: { authorization: `Bearer ${org.key}`, 'content-type': 'text/plain' },
          payload: 'x',
        }),
    ],
    ['an invalid body', 422, () => ctx.request('POST', '/v1/customers', { key: org.key, body: { fullName: 'No Email' } })],
    [
      'a spent rate limit',
      429,
      async () => {
        const limited = await ctx.createKey(org.id, { dailyLimit: 1 });
        await ctx.request('GET', '/v1/designated-services', { key: limited.key });
        return ctx.request('GET', '/v1/designated-services', { key: limited.key });
      },
    ],
    ['a health check', 200, () => ctx.request('GET', '/healthz')],
  ];

  it.each(cases)('when the answer is %s (%i), it carries Cache-Control: no-store', async (_name, status, send) => {
    const response = await send();
    expect(response.statusCode, response.body).toBe(status);
    expect(response.headers['cache-control']).toBe('no-store');
  });
});

describe('over-long ids', () => {
  // Every v1 route with a path parameter, from the one table every route must be in.
  const routes = Object.keys(ROUTE_SCOPES)
    .map((key) => key.split(' ') as [string, string])
    .filter(([, path]) => path.includes(':'));
  const cases = routes.flatMap(([method, path]) =>
    (path.match(/:\w+/g) ?? []).flatMap((param) =>
      [256, 300, 1000, 1024].map((length) => [method, path, param.slice(1), length] as [string, string, string, number]),
    ),
  );

  it('covers the routes with an id (customers, entities, ubos, kyc, kyb, send-link)', () => {
    expect(routes.length).toBeGreaterThanOrEqual(12);
  });

  it.each(cases)('when %s %s gets a %s of %i characters, it answers 404 not_found in the envelope', async (method, path, param, length) => {
    const url = path.replace(/:(\w+)/g, (_match, name: string) => (name === param ? 'a'.repeat(length) : randomUUID()));
    const body = `${method} ${path}` === 'POST /v1/entities/:id/documents' ? minimalUpload() : method === 'GET' ? undefined : {};
    const response = await ctx.request(method, url, { key: org.key, body });
    expect(response.statusCode, response.body).toBe(404);
    expect(response.json()).toEqual({ error: { code: 'not_found', message: expect.any(String) } });
    expect(response.headers['cache-control']).toBe('no-store');
  });

  it('when an id is 255 characters (the longest external_id), it is looked up like any other and is missing', async () => {
    const response = await ctx.request('GET', `/v1/customers/${'a'.repeat(255)}`, { key: org.key });
    expect(response.statusCode).toBe(404);
    expect(response.json().error.message).not.toMatch(/that long/);
  });

  it('when an external_id of 255 characters exists, it is found by it', async () => {
    const externalId = `${unique()}-`.padEnd(255, 'x');
    const created = await ctx.request('POST', '/v1/customers', { key: org.key, body: { ...newPerson(), externalId } });
    expect(created.statusCode, created.body).toBe(201);
    const response = await ctx.request('GET', `/v1/customers/${externalId}`, { key: org.key });
    expect(response.statusCode).toBe(200);
  });

  it('when the over-long id comes without a key, it answers 401 (authentication still comes first)', async () => {
    const response = await ctx.request('GET', `/v1/customers/${'a'.repeat(300)}`);
    expect(response.statusCode).toBe(401);
  });
});

describe('Content-Encoding', () => {
  const json = () => JSON.stringify(newPerson());
  const send = (encoding: string, payload: Buffer | string) =>
    ctx.app.inject({
      method: 'POST',
      url: '/v1/customers',
      headers: { authorization: `Bearer ${org.key}`, 'content-type': 'application/json', 'content-encoding': encoding },
      payload,
    });

  it.each([
    ['gzip', () => gzipSync(json())],
    ['deflate', () => deflateSync(json())],
    ['br', () => brotliCompressSync(json())],
    ['gzip, identity', () => gzipSync(json())],
    ['x-unknown', () => json()],
  ])('when the body is sent with Content-Encoding: %s, it answers 415 unsupported_media_type', async (encoding, payload) => {
    const response = await send(encoding, payload());
    expect(response.statusCode).toBe(415);
    expect(response.json()).toEqual({ error: { code: 'unsupported_media_type', message: expect.stringContaining('Content-Encoding') } });
  });

  it('when a gzip body holds NUL bytes, the answer is still 415 (no text rule runs on encoded bytes)', async () => {
    const payload = gzipSync(json());
    expect(payload.includes(0)).toBe(true);
    expect((await send('gzip', payload)).statusCode).toBe(415);
  });

  it.each(['identity', 'IDENTITY', ' identity '])('when the body is sent with Content-Encoding: "%s", it is accepted', async (encoding) => {
    const response = await send(encoding, json());
    expect(response.statusCode, response.body).toBe(201);
  });
});
