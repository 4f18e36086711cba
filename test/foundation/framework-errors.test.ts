import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext } from '../helpers/harness.js';

let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

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
});

describe('framework errors use the error envelope', () => {
  it('when no route matches, it answers 404 not_found in the envelope', async () => {
    const response = await ctx.request('GET', '/v1/no-such-route');
    expect(response.statusCode).toBe(404);
    expect(response.json()).toEqual({ error: { code: 'not_found', message: expect.any(String) } });
  });

  it('when every response carries a request id, it is echoed in X-Request-Id', async () => {
    const response = await ctx.request('GET', '/healthz', { headers: { 'x-request-id': 'abc-123' } });
    expect(response.headers['x-request-id']).toBe('abc-123');
  });
});
