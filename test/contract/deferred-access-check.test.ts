import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext, testServices } from '../helpers/harness.js';
import { withinOneSecond } from '../helpers/one-second.js';

/**
 * A key this process has already seen authenticate is "known". Its access check (revocation,
 * expiry, IP, features, rate limits) is still asked on every request: these tests pin what must hold
 * for it.
 */

let ctx: TestContext;

beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

let counter = 0;
function person(): { fullName: string; email: string } {
  counter += 1;
  const tag = `${Date.now().toString(36)}${counter}`;
  return { fullName: `Deferred Person ${tag}`, email: `deferred-${tag}@example.com` };
}

/** Makes the key known to the app's process: one request authenticated up front, answered 200. */
async function makeKnown(key: string, app: FastifyInstance = ctx.app): Promise<void> {
  const response = await ctx.request('GET', '/v1/designated-services', { key }, app);
  expect(response.statusCode).toBe(200);
}

async function revoke(keyId: string): Promise<void> {
  await testServices(ctx.database).apiKeys.revoke(keyId);
}

async function count(sqlText: string, params: unknown[]): Promise<number> {
  const { rows } = await ctx.database.pool.query<{ n: number }>(sqlText, params);
  return rows[0]!.n;
}

const customersOf = (orgId: string) => count('SELECT count(*)::int AS n FROM customers WHERE org_id = $1', [orgId]);
const customerAuditRowsOf = (orgId: string) =>
  count(`SELECT count(*)::int AS n FROM audit_log WHERE org_id = $1 AND action LIKE 'customer.%'`, [orgId]);
const idempotencyRecordsOf = (keyId: string) => count('SELECT count(*)::int AS n FROM idempotency_keys WHERE api_key_id = $1', [keyId]);

function expectUnauthorized(response: LightMyRequestResponse): void {
  expect(response.statusCode).toBe(401);
  expect(response.headers['www-authenticate']).toBe('Bearer');
  expect(response.json()).toEqual({ error: { code: 'unauthorized', message: expect.any(String) } });
}

describe('revocation of a known key', () => {
  it('when a known key is revoked, its next POST /v1/customers answers 401 with WWW-Authenticate and creates no customer and no audit row', async () => {
    const org = await ctx.createOrg();
    await makeKnown(org.key);
    await revoke(org.keyId);

    const response = await ctx.request('POST', '/v1/customers', { key: org.key, body: person() });

    expectUnauthorized(response);
    expect(await customersOf(org.id)).toBe(0);
    expect(await customerAuditRowsOf(org.id)).toBe(0);
  });

  it('when a known key is revoked, its next POST /v1/customers with an Idempotency-Key answers 401 and stores no idempotency record, customer or audit row', async () => {
    const org = await ctx.createOrg();
    await makeKnown(org.key);
    await revoke(org.keyId);

    const response = await ctx.request('POST', '/v1/customers', {
      key: org.key,
      body: person(),
      headers: { 'idempotency-key': 'deferred-revoked-1' },
    });

    expectUnauthorized(response);
    expect(await idempotencyRecordsOf(org.keyId)).toBe(0);
    expect(await customersOf(org.id)).toBe(0);
    expect(await customerAuditRowsOf(org.id)).toBe(0);
  });

  it('when a known key is revoked, its next read answers 401 and not the data', async () => {
    const org = await ctx.createOrg();
    const created = await ctx.request('POST', '/v1/customers', { key: org.key, body: person() });
    expect(created.statusCode).toBe(201);
    await revoke(org.keyId);

    const response = await ctx.request('GET', `/v1/customers/${created.json().id}`, { key: org.key });

    expectUnauthorized(response);
    expect(response.body).not.toContain(created.json().id);
  });

  it('when a known key is still valid, its POST /v1/customers with an Idempotency-Key creates the customer and stores the record (the deferred path commits)', async () => {
    const org = await ctx.createOrg();
    await makeKnown(org.key);

    const response = await ctx.request('POST', '/v1/customers', {
      key: org.key,
      body: person(),
      headers: { 'idempotency-key': 'deferred-valid-1' },
    });

    expect(response.statusCode).toBe(201);
    expect(await customersOf(org.id)).toBe(1);
    expect(await customerAuditRowsOf(org.id)).toBe(1);
    expect(await idempotencyRecordsOf(org.keyId)).toBe(1);
  });
});

describe("a known key's invalid body", () => {
  const invalid = { fullName: 'Someone', email: 'not-an-email' };

  it("when a known key's body fails validation and the key is revoked, it answers 401, not 422", async () => {
    const org = await ctx.createOrg();
    await makeKnown(org.key);
    await revoke(org.keyId);

    const response = await ctx.request('POST', '/v1/customers', { key: org.key, body: invalid });

    expectUnauthorized(response);
  });

  it("when a known key's body fails validation and the key is valid, it answers 422 and still carries the RateLimit headers", async () => {
    const org = await ctx.createOrg();
    await makeKnown(org.key);

    const response = await ctx.request('POST', '/v1/customers', { key: org.key, body: invalid });

    expect(response.statusCode).toBe(422);
    expect(response.json().error.code).toBe('validation_failed');
    expect(response.headers['ratelimit-policy']).toMatch(/^"burst";q=\d+;w=1, "daily";q=\d+;w=86400$/);
    expect(response.headers.ratelimit).toMatch(/^"burst";r=\d+;t=\d+, "daily";r=\d+;t=\d+$/);
  });
});

describe("a known key without the route's scope", () => {
  it("when a known key lacks the route's scope, it answers 403 forbidden_scope and creates nothing", async () => {
    const org = await ctx.createOrg();
    const reader = await ctx.createKey(org.id, { scopes: ['customers:read'] });
    await makeKnown(reader.key);

    const response = await ctx.request('POST', '/v1/customers', { key: reader.key, body: person() });

    expect(response.statusCode).toBe(403);
    expect(response.json()).toEqual({
      error: { code: 'forbidden_scope', message: expect.any(String), details: { required_scope: 'customers:write' } },
    });
    expect(await customersOf(org.id)).toBe(0);
  });

  it("when a known key lacks the route's scope and is also revoked, it answers 401, not 403", async () => {
    const org = await ctx.createOrg();
    const reader = await ctx.createKey(org.id, { scopes: ['customers:read'] });
    await makeKnown(reader.key);
    await revoke(reader.id);

    const response = await ctx.request('POST', '/v1/customers', { key: reader.key, body: person() });

    expectUnauthorized(response);
    expect(await customersOf(org.id)).toBe(0);
  });
});

describe("features of a known key's organisation", () => {
  it("when an organisation's features change after its key is known, the very next groups request follows the new features", async () => {
    const org = await ctx.createOrg({ features: ['groups'] });
    const organisations = testServices(ctx.database).organisations;
    expect((await ctx.request('GET', '/v1/group-templates', { key: org.key })).statusCode).toBe(200);

    await organisations.update(org.id, { features: [] });
    const disabled = await ctx.request('GET', '/v1/group-templates', { key: org.key });
    expect(disabled.statusCode).toBe(403);
    expect(disabled.json()).toEqual({ error: { code: 'feature_disabled', message: expect.any(String), details: { feature: 'groups' } } });

    await organisations.update(org.id, { features: ['groups'] });
    const restored = await ctx.request('GET', '/v1/group-templates', { key: org.key });
    expect(restored.statusCode).toBe(200);
    expect(restored.json().object).toBe('list');
  });
});

describe('a known key over its rate limit', () => {
  it('when a known key is over its burst limit, a POST /v1/customers answers 429 with Retry-After and creates nothing', async () => {
    const org = await ctx.createOrg();
    // The key becomes known and spends its one token of the second; the POST follows in the same second.
    const response = await withinOneSecond(
      () => ctx.createKey(org.id, { burstLimit: 1 }),
      async (key) => {
        await makeKnown(key.key);
        return ctx.request('POST', '/v1/customers', { key: key.key, body: person() });
      },
    );

    expect(response.statusCode).toBe(429);
    expect(response.json()).toEqual({
      error: { code: 'rate_limited', message: expect.any(String), details: { limit: 1, window_seconds: 1 } },
    });
    expect(response.headers['retry-after']).toBe('1');
    expect(response.headers.ratelimit).toMatch(/^"burst";r=0;/);
    expect(await customersOf(org.id)).toBe(0);
    expect(await customerAuditRowsOf(org.id)).toBe(0);
  });
});
