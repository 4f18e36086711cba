import { randomUUID } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp } from '../../src/app.js';
import { ROUTE_SCOPES } from '../../src/plugins/route-scopes.js';
import { SCOPES } from '../../src/shared/scopes.js';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { minimalUpload } from '../helpers/multipart.js';

/**
 * Table-driven over ROUTE_SCOPES: every route in the table that this build registers is covered;
 * routes still being built elsewhere are skipped until they exist.
 */
type RouteEntry = { method: string; url: string; scope: string | null };
const ROUTES: RouteEntry[] = Object.entries(ROUTE_SCOPES).map(([key, scope]) => {
  const [method, url] = key.split(' ') as [string, string];
  return { method, url, scope };
});

/** A body each route accepts, so the request reaches the handler (and its organisation check). */
const VALID_BODIES: Record<string, unknown> = {
  'POST /v1/customers': { fullName: 'Scope Probe', email: 'scope.probe@example.com' },
  'PATCH /v1/customers/:id': { phone: '+61 400 000 000' },
  'PUT /v1/customers/:id/designated-services': { service_codes: ['PRO-FORMATION'] },
  'POST /v1/customers/:id/kyc': {},
  'POST /v1/entities': { type: 'COMPANY', name: 'Scope Probe Pty Ltd' },
  'PATCH /v1/entities/:id': { address: '1 Probe Street, Sydney NSW 2000' },
  'POST /v1/entities/:id/ubos': {
    owners: [
      {
        fullName: 'Owner Probe',
        email: 'owner.probe@example.com',
        holderType: 'INDIVIDUAL',
        roleTypes: ['SHAREHOLDER'],
        percentageHeld: 30,
        kycRequired: true,
      },
    ],
  },
  'POST /v1/entities/:id/ubos/:uboId/send-link': {},
  'POST /v1/entities/:id/kyb': { method: 'manual' },
  'POST /v1/entities/:id/document-requests': { types: ['OTHER'] },
  'POST /v1/entities/:id/documents': minimalUpload(),
  'POST /v1/groups': { name: 'Scope probe group' },
  'POST /v1/webhook-endpoints': { url: 'https://93.184.215.14/hooks' },
  'PATCH /v1/webhook-endpoints/:id': { description: 'scope probe' },
  'POST /v1/customers/:id/reviews': { outcome: 'NO_CHANGE', reviewer: 'Scope Probe' },
  'POST /v1/entities/:id/reviews': { outcome: 'NO_CHANGE', reviewer: 'Scope Probe' },
};

function isRegistered(app: FastifyInstance, route: RouteEntry): boolean {
  return app.hasRoute({ method: route.method, url: route.url });
}

function fill(url: string, ids: { id: string; uboId?: string }): string {
  return url.replace(':id', encodeURIComponent(ids.id)).replace(':uboId', ids.uboId ?? randomUUID());
}

let ctx: TestContext;
let orgA: TestOrg;
let orgB: TestOrg;
let customerA: { id: string; external_id: string; full_name: string };
let entityA: { id: string; external_id: string } | undefined;
let webhooksA: { endpoint: string; delivery: string } | undefined;

beforeAll(async () => {
  ctx = await createTestContext();
  orgA = await ctx.createOrg();
  orgB = await ctx.createOrg();
  const created = await ctx.request('POST', '/v1/customers', {
    key: orgA.key,
    body: { externalId: 'crm-a-1', fullName: 'Alice Anders', email: 'alice@example.com' },
  });
  expect(created.statusCode).toBe(201);
  customerA = created.json();
  if (ctx.app.hasRoute({ method: 'POST', url: '/v1/entities' })) {
    const entity = await ctx.request('POST', '/v1/entities', {
      key: orgA.key,
      body: { externalId: 'crm-a-entity', type: 'COMPANY', name: 'Anders Holdings Pty Ltd' },
    });
    expect(entity.statusCode).toBe(201);
    entityA = entity.json();
  }
  if (ctx.app.hasRoute({ method: 'POST', url: '/v1/webhook-endpoints' })) {
    const endpoint = await ctx.request('POST', '/v1/webhook-endpoints', { key: orgA.key, body: { url: 'https://93.184.215.14/hooks' } });
    expect(endpoint.statusCode).toBe(201);
    const test = await ctx.request('POST', `/v1/webhook-endpoints/${endpoint.json().id}/test`, { key: orgA.key });
    expect(test.statusCode).toBe(201);
    webhooksA = { endpoint: endpoint.json().id, delivery: test.json().delivery.id };
  }
});
afterAll(async () => ctx?.close());

describe('scopes', () => {
  it('when a v1 route has no entry in ROUTE_SCOPES, the app refuses to start', async () => {
    const app = await buildApp({ config: ctx.config, database: ctx.database, logger: false });
    try {
      expect(() => app.get('/v1/unlisted', async () => ({}))).toThrow(/no entry in ROUTE_SCOPES/);
    } finally {
      await app.close();
    }
  });

  it('when a route exists in this build, the table-driven cases below cover it (hasRoute sees it)', () => {
    const covered = ROUTES.filter((route) => isRegistered(ctx.app, route)).map((route) => `${route.method} ${route.url}`);
    expect(covered).toEqual(
      expect.arrayContaining([
        'POST /v1/customers',
        'GET /v1/customers',
        'GET /v1/customers/:id',
        'PATCH /v1/customers/:id',
        'PUT /v1/customers/:id/designated-services',
        'GET /v1/customers/:id/aml',
        'GET /v1/designated-services',
      ]),
    );
  });

  const scoped = ROUTES.filter((route) => route.scope !== null);
  it.each(scoped.map((route) => [`${route.method} ${route.url}`, route] as const))(
    'when a key with every scope but the one %s needs calls it, it answers 403 forbidden_scope naming the scope',
    async (_name, route) => {
      if (!isRegistered(ctx.app, route)) return;
      const others = SCOPES.filter((scope) => scope !== route.scope);
      const key = await ctx.createKey(orgA.id, { scopes: others });
      const response = await ctx.request(route.method, fill(route.url, { id: customerA.id }), {
        key: key.key,
        body: VALID_BODIES[`${route.method} ${route.url}`],
      });
      expect(response.statusCode).toBe(403);
      expect(response.json()).toEqual({
        error: { code: 'forbidden_scope', message: expect.any(String), details: { required_scope: route.scope } },
      });
    },
  );

  it.each(scoped.map((route) => [`${route.method} ${route.url}`, route] as const))(
    'when a key holding only the scope %s needs calls it, it is not refused for scope',
    async (_name, route) => {
      if (!isRegistered(ctx.app, route)) return;
      const key = await ctx.createKey(orgA.id, { scopes: [route.scope!] });
      const response = await ctx.request(route.method, fill(route.url, { id: randomUUID() }), {
        key: key.key,
        body: VALID_BODIES[`${route.method} ${route.url}`],
      });
      expect(response.statusCode).not.toBe(403);
      expect(response.statusCode).not.toBe(401);
    },
  );

  it.each(ROUTES.filter((route) => route.scope === null).map((route) => [`${route.method} ${route.url}`, route] as const))(
    'when %s needs no scope, any valid key may call it',
    async (_name, route) => {
      if (!isRegistered(ctx.app, route)) return;
      for (const scope of SCOPES) {
        const key = await ctx.createKey(orgA.id, { scopes: [scope] });
        expect((await ctx.request(route.method, route.url, { key: key.key })).statusCode).toBe(200);
      }
    },
  );

  it('when a reporting-only key (customers:read, aml:read) tries to write, it answers 403', async () => {
    const key = await ctx.createKey(orgA.id, { scopes: ['customers:read', 'aml:read'] });
    const response = await ctx.request('POST', '/v1/customers', { key: key.key, body: VALID_BODIES['POST /v1/customers'] });
    expect(response.statusCode).toBe(403);
    expect(response.json().error.details).toEqual({ required_scope: 'customers:write' });
  });
});

describe('organisation scoping', () => {
  const idRoutes = ROUTES.filter((route) => route.url.includes(':id'));

  function ownerIds(route: RouteEntry): Array<[string, string]> | undefined {
    if (route.url.startsWith('/v1/webhook-endpoints/')) return webhooksA && [['uuid', webhooksA.endpoint]];
    if (route.url.startsWith('/v1/webhook-deliveries/')) return webhooksA && [['uuid', webhooksA.delivery]];
    const record = route.url.startsWith('/v1/entities/') ? entityA : customerA;
    if (!record) return undefined;
    return [
      ['uuid', record.id],
      ['external_id', record.external_id],
    ];
  }

  it.each(idRoutes.map((route) => [`${route.method} ${route.url}`, route] as const))(
    "when organisation B calls %s with organisation A's ids, it answers exactly what a missing id gets (404 not_found)",
    async (_name, route) => {
      if (!isRegistered(ctx.app, route)) return;
      const ids = ownerIds(route);
      if (!ids) return;
      const body = VALID_BODIES[`${route.method} ${route.url}`];
      const missing = await ctx.request(route.method, fill(route.url, { id: randomUUID() }), { key: orgB.key, body });
      // If this fails with 422, the sample in VALID_BODIES no longer matches the route's schema.
      expect(missing.statusCode, `${route.method} ${route.url}: ${missing.body}`).toBe(404);
      expect(missing.json().error.code).toBe('not_found');
      for (const [, id] of ids) {
        const foreign = await ctx.request(route.method, fill(route.url, { id }), { key: orgB.key, body });
        expect(foreign.statusCode).toBe(404);
        expect(foreign.body).toBe(missing.body);
      }
    },
  );

  it("when organisation B has tried to write A's records, A's record is unchanged", async () => {
    const response = await ctx.request('GET', `/v1/customers/${customerA.id}`, { key: orgA.key });
    expect(response.statusCode).toBe(200);
    const current = response.json();
    expect(current.phone ?? null).toBeNull();
    expect(current.full_name).toBe('Alice Anders');
  });

  it("when organisation B lists customers, A's records are not in it (nor findable by external_id)", async () => {
    await ctx.request('POST', '/v1/customers', { key: orgB.key, body: { fullName: 'Bob Brown', email: 'bob@example.com' } });
    const list = await ctx.request('GET', '/v1/customers', { key: orgB.key });
    expect(list.statusCode).toBe(200);
    const ids = list.json().data.map((customer: { id: string }) => customer.id);
    expect(ids.length).toBeGreaterThan(0);
    expect(ids).not.toContain(customerA.id);
    const byExternal = await ctx.request('GET', '/v1/customers', { key: orgB.key, query: { external_id: 'crm-a-1' } });
    expect(byExternal.json().data).toEqual([]);
  });

  it("when organisation B upserts with A's external_id, it creates its own record and leaves A's alone", async () => {
    const response = await ctx.request('POST', '/v1/customers', {
      key: orgB.key,
      body: { externalId: 'crm-a-1', fullName: 'Brenda Other', email: 'brenda@example.com' },
    });
    expect(response.statusCode).toBe(201);
    expect(response.json().id).not.toBe(customerA.id);
    const own = await ctx.request('GET', `/v1/customers/${customerA.id}`, { key: orgA.key });
    expect(own.json().full_name).toBe('Alice Anders');
  });

  it("when organisation B upserts with A's full name and email, it creates its own record", async () => {
    const response = await ctx.request('POST', '/v1/customers', {
      key: orgB.key,
      body: { fullName: 'Alice Anders', email: 'alice@example.com' },
    });
    expect(response.statusCode).toBe(201);
    expect(response.json().id).not.toBe(customerA.id);
  });
});
