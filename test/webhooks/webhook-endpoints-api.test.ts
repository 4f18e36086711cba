import { randomUUID } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import { and, eq, sql } from 'drizzle-orm';
import { Webhook } from 'standardwebhooks';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { auditLog, webhookDeliveries, webhookEndpoints } from '../../src/db/schema.js';
import { createDeliveryRepository } from '../../src/modules/webhooks/delivery.repository.js';
import { createDeliveryWorker, type DeliveryWorker } from '../../src/modules/webhooks/delivery.worker.js';
import { NOT_A_PUBLIC_HOST } from '../../src/modules/webhooks/endpoint-url.js';
import { createOutboxRepository, type EventType } from '../../src/shared/outbox.js';
import { SCOPES } from '../../src/shared/scopes.js';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { startReceiver, waitFor, type Receipt, type Receiver } from '../helpers/webhook-receiver.js';

let ctx: TestContext;
let strictApp: FastifyInstance;
let receiver: Receiver;
const workers: DeliveryWorker[] = [];

beforeAll(async () => {
  // The main app accepts the loopback receiver; strictApp applies the production URL rules.
  ctx = await createTestContext({ webhookAllowPrivateUrls: true });
  strictApp = await ctx.buildInstance({ webhookAllowPrivateUrls: false, webhookAllowedPorts: [] });
  receiver = await startReceiver();
});
afterEach(async () => {
  await Promise.all(workers.splice(0).map((worker) => worker.stop()));
  receiver.setReply(() => ({}));
});
afterAll(async () => {
  await receiver?.close();
  await ctx?.close();
});

type Endpoint = {
  id: string;
  url: string;
  events: string[];
  description: string | null;
  enabled: boolean;
  disabled_reason: string | null;
  previous_secret_expires_at: string | null;
  updated_at: string;
  secret?: string;
};

let pathCounter = 0;
const nextPath = () => `/api-hook-${(pathCounter += 1)}`;

async function createEndpoint(org: TestOrg, body: Record<string, unknown> = {}): Promise<Endpoint & { secret: string; path: string }> {
  const path = nextPath();
  const response = await ctx.request('POST', '/v1/webhook-endpoints', { key: org.key, body: { url: receiver.url(path), ...body } });
  expect(response.statusCode, response.body).toBe(201);
  const endpoint = response.json<Endpoint & { secret: string }>();
  receiver.trust(path, endpoint.secret);
  return { ...endpoint, path };
}

async function emit(orgId: string, type: EventType = 'customer.updated') {
  return ctx.database.transaction((tx) => createOutboxRepository().record({ orgId, type, customerId: null, customer: { id: 'c-1' } }, tx));
}

async function startWorker(retrySchedule = [50, 50, 50, 50]) {
  const worker = createDeliveryWorker({
    database: ctx.database,
    allowPrivateUrls: true,
    requestTimeoutMs: 2_000,
    retrySchedule,
    jitter: 0,
    pollIntervalMs: 50,
    stopTimeoutMs: 2_000,
  });
  workers.push(worker);
  await worker.start();
  return worker;
}

const receiptsFor = (path: string) => receiver.receipts.filter((receipt) => receipt.path === path);
const receiptOf = (path: string, eventId: string) =>
  waitFor(() => receiptsFor(path).find((receipt) => receipt.webhookId === eventId), 20_000, `delivery of ${eventId} to ${path}`);

function verifies(secret: string, receipt: Receipt): boolean {
  try {
    new Webhook(secret).verify(receipt.body, receipt.headers as Record<string, string>);
    return true;
  } catch {
    return false;
  }
}

async function auditRows(orgId: string, subjectId: string) {
  return ctx.database.db
    .select()
    .from(auditLog)
    .where(and(eq(auditLog.orgId, orgId), eq(auditLog.subjectId, subjectId)))
    .orderBy(auditLog.createdAt);
}

async function deliveryRows(orgId: string, endpointId: string) {
  return ctx.database.db
    .select()
    .from(webhookDeliveries)
    .where(and(eq(webhookDeliveries.orgId, orgId), eq(webhookDeliveries.endpointId, endpointId)));
}

/** Every route of this module, with a request each accepts (filled with real ids by the caller). */
const ROUTES: Array<{ method: string; url: string; body?: unknown }> = [
  { method: 'POST', url: '/v1/webhook-endpoints', body: { url: 'https://93.184.215.14/hooks' } },
  { method: 'GET', url: '/v1/webhook-endpoints' },
  { method: 'GET', url: '/v1/webhook-endpoints/:endpoint' },
  { method: 'PATCH', url: '/v1/webhook-endpoints/:endpoint', body: { description: 'probe' } },
  { method: 'DELETE', url: '/v1/webhook-endpoints/:endpoint' },
  { method: 'POST', url: '/v1/webhook-endpoints/:endpoint/rotate-secret', body: {} },
  { method: 'POST', url: '/v1/webhook-endpoints/:endpoint/test' },
  { method: 'GET', url: '/v1/webhook-endpoints/:endpoint/deliveries' },
  { method: 'POST', url: '/v1/webhook-deliveries/:delivery/retry' },
];
const fill = (url: string, ids: { endpoint: string; delivery: string }) =>
  url.replace(':endpoint', ids.endpoint).replace(':delivery', ids.delivery);

describe('webhook endpoints API: scopes and organisations', () => {
  it.each(ROUTES.map((route) => [`${route.method} ${route.url}`, route] as const))(
    'when a key without webhooks:write calls %s, it answers 403 forbidden_scope and changes nothing',
    async (_name, route) => {
      const org = await ctx.createOrg();
      const endpoint = await createEndpoint(org);
      const eventId = await emit(org.id);
      const [delivery] = await deliveryRows(org.id, endpoint.id);
      const key = await ctx.createKey(org.id, { scopes: SCOPES.filter((scope) => scope !== 'webhooks:write') });
      const before = await auditRows(org.id, endpoint.id);

      const response = await ctx.request(route.method, fill(route.url, { endpoint: endpoint.id, delivery: delivery!.id }), {
        key: key.key,
        body: route.body,
      });
      expect(response.statusCode).toBe(403);
      expect(response.json()).toEqual({
        error: { code: 'forbidden_scope', message: expect.any(String), details: { required_scope: 'webhooks:write' } },
      });
      expect(await auditRows(org.id, endpoint.id)).toHaveLength(before.length);
      expect(eventId).toBeDefined();
    },
  );

  it.each(ROUTES.filter((route) => route.url.includes(':')).map((route) => [`${route.method} ${route.url}`, route] as const))(
    "when organisation B calls %s with organisation A's ids, it answers exactly what a missing id gets (404) and A's endpoint is untouched",
    async (_name, route) => {
      const orgA = await ctx.createOrg();
      const orgB = await ctx.createOrg();
      const endpoint = await createEndpoint(orgA);
      await emit(orgA.id);
      const [delivery] = await deliveryRows(orgA.id, endpoint.id);

      const missing = await ctx.request(route.method, fill(route.url, { endpoint: randomUUID(), delivery: randomUUID() }), {
        key: orgB.key,
        body: route.body,
      });
      expect(missing.statusCode, missing.body).toBe(404);
      expect(missing.json().error.code).toBe('not_found');
      const foreign = await ctx.request(route.method, fill(route.url, { endpoint: endpoint.id, delivery: delivery!.id }), {
        key: orgB.key,
        body: route.body,
      });
      expect(foreign.statusCode).toBe(404);
      expect(foreign.body).toBe(missing.body);

      const own = await ctx.request('GET', `/v1/webhook-endpoints/${endpoint.id}`, { key: orgA.key });
      expect(own.statusCode).toBe(200);
      expect(own.json()).toMatchObject({ enabled: true, description: null, previous_secret_expires_at: null });
      expect(await deliveryRows(orgA.id, endpoint.id)).toHaveLength(1);
    },
  );

  it("when organisation B lists endpoints, A's are not in it", async () => {
    const orgA = await ctx.createOrg();
    const orgB = await ctx.createOrg();
    await createEndpoint(orgA);
    const own = await createEndpoint(orgB);
    const list = await ctx.request('GET', '/v1/webhook-endpoints', { key: orgB.key });
    expect(list.json().data.map((endpoint: Endpoint) => endpoint.id)).toEqual([own.id]);
  });

  it('when an id is not a UUID, it answers 404 not_found', async () => {
    const org = await ctx.createOrg();
    const response = await ctx.request('GET', '/v1/webhook-endpoints/not-an-id', { key: org.key });
    expect(response.statusCode).toBe(404);
    const retry = await ctx.request('POST', '/v1/webhook-deliveries/not-an-id/retry', { key: org.key });
    expect(retry.statusCode).toBe(404);
  });
});

describe('webhook endpoints API: create, read, list', () => {
  it('when an endpoint is created, the secret is returned once (201) and never by GET, list, PATCH or in the audit log', async () => {
    const org = await ctx.createOrg();
    const created = await createEndpoint(org, { events: ['customer.updated', 'customer.updated'], description: '  CRM production  ' });
    expect(created).toMatchObject({
      events: ['customer.updated'],
      description: 'CRM production',
      enabled: true,
      disabled_reason: null,
      previous_secret_expires_at: null,
    });
    expect(created.secret).toMatch(/^whsec_[A-Za-z0-9+/]+=*$/);
    const [stored] = await ctx.database.db.select().from(webhookEndpoints).where(eq(webhookEndpoints.id, created.id));
    expect(stored!.secret).toBe(created.secret);

    const got = await ctx.request('GET', `/v1/webhook-endpoints/${created.id}`, { key: org.key });
    const list = await ctx.request('GET', '/v1/webhook-endpoints', { key: org.key });
    const patched = await ctx.request('PATCH', `/v1/webhook-endpoints/${created.id}`, { key: org.key, body: { description: 'renamed' } });
    for (const response of [got, list, patched]) {
      expect(response.statusCode).toBe(200);
      expect(response.body).not.toContain(created.secret);
      expect(response.body).not.toContain('"secret"');
    }
    const { secret: _secret, path: _path, ...withoutSecret } = created;
    expect(got.json()).toEqual(withoutSecret);
    const audit = await auditRows(org.id, created.id);
    expect(audit.map((row) => row.action)).toEqual(['webhook_endpoint.created', 'webhook_endpoint.updated']);
    expect(JSON.stringify(audit)).not.toContain(created.secret);
  });

  it.each([
    ['http://93.184.215.14/hook', /https/],
    ['https://127.0.0.1/hook', /not a public address/],
    ['https://169.254.169.254/latest/meta-data', /not a public address/],
    ['https://93.184.215.14:8443/hook', /port/],
    ['not a url', /absolute URL/],
  ])('when the URL is %s under the production rules, create and PATCH answer 422 on url and store nothing', async (url, message) => {
    const org = await ctx.createOrg();
    const created = await ctx.request('POST', '/v1/webhook-endpoints', { key: org.key, body: { url } }, strictApp);
    expect(created.statusCode).toBe(422);
    expect(created.json().error).toMatchObject({
      code: 'validation_failed',
      details: { issues: { url: [expect.stringMatching(message)] } },
    });

    const good = await ctx.request(
      'POST',
      '/v1/webhook-endpoints',
      { key: org.key, body: { url: 'https://93.184.215.14/hook' } },
      strictApp,
    );
    expect(good.statusCode).toBe(201);
    const patched = await ctx.request('PATCH', `/v1/webhook-endpoints/${good.json().id}`, { key: org.key, body: { url } }, strictApp);
    expect(patched.statusCode).toBe(422);
    expect(patched.json().error.details.issues.url).toEqual([expect.stringMatching(message)]);
    const list = await ctx.request('GET', '/v1/webhook-endpoints', { key: org.key });
    expect(list.json().data.map((endpoint: Endpoint) => endpoint.url)).toEqual(['https://93.184.215.14/hook']);
  });

  it('when a name that resolves to a private address and a name that does not resolve are registered, create and PATCH give the same answer, telling neither', async () => {
    const org = await ctx.createOrg();
    // localhost resolves (to loopback) on every machine; .invalid never does (RFC 6761).
    const names = ['https://localhost/hook', 'https://no-such-host.invalid/hook'];
    const created = await Promise.all(
      names.map((url) => ctx.request('POST', '/v1/webhook-endpoints', { key: org.key, body: { url } }, strictApp)),
    );
    const good = await ctx.request(
      'POST',
      '/v1/webhook-endpoints',
      { key: org.key, body: { url: 'https://93.184.215.14/hook' } },
      strictApp,
    );
    expect(good.statusCode).toBe(201);
    const patched = await Promise.all(
      names.map((url) => ctx.request('PATCH', `/v1/webhook-endpoints/${good.json().id}`, { key: org.key, body: { url } }, strictApp)),
    );
    const answers = [...created, ...patched];
    for (const answer of answers) {
      expect(answer.statusCode).toBe(422);
      expect(answer.json().error).toEqual({
        code: 'validation_failed',
        message: expect.any(String),
        details: { issues: { url: [NOT_A_PUBLIC_HOST] } },
      });
      expect(answer.body).not.toMatch(/127\.0\.0\.1|::1|ENOTFOUND|EAI_AGAIN|resolves to|could not be resolved|localhost|no-such-host/);
    }
    expect(new Set(answers.map((answer) => answer.body)).size).toBe(1);
  });

  it.each([
    ['an unknown event type', { url: 'https://93.184.215.14/h', events: ['customer.deleted'] }, 'events', /Unknown event type/],
    ['an unknown property', { url: 'https://93.184.215.14/h', secret: 'whsec_mine' }, null, /secret/],
    ['no url', { events: ['customer.updated'] }, 'url', /./],
    ['a description over 500 characters', { url: 'https://93.184.215.14/h', description: 'x'.repeat(501) }, 'description', /500/],
  ])('when create gets %s, it answers 422 in the error envelope', async (_name, body, field, message) => {
    const org = await ctx.createOrg();
    const response = await ctx.request('POST', '/v1/webhook-endpoints', { key: org.key, body });
    expect(response.statusCode).toBe(422);
    const error = response.json().error;
    expect(error.code).toBe('validation_failed');
    if (field) expect(error.details.issues[field] ?? error.details.issues[`${field}[0]`]).toEqual([expect.stringMatching(message)]);
    else expect(JSON.stringify(error.details)).toMatch(message);
    expect((await ctx.request('GET', '/v1/webhook-endpoints', { key: org.key })).json().data).toEqual([]);
  });

  it('when endpoints are listed page by page, the cursor walks them oldest first without repeats, and refuses a cursor of another list', async () => {
    const org = await ctx.createOrg();
    const ids = [];
    for (let index = 0; index < 5; index += 1) ids.push((await createEndpoint(org)).id);
    const seen: string[] = [];
    let cursor: string | undefined;
    let pages = 0;
    do {
      const response = await ctx.request('GET', '/v1/webhook-endpoints', {
        key: org.key,
        query: { limit: '2', ...(cursor ? { cursor } : {}) },
      });
      expect(response.statusCode).toBe(200);
      const page = response.json();
      expect(page).toMatchObject({ object: 'list', limit: 2 });
      seen.push(...page.data.map((endpoint: Endpoint) => endpoint.id));
      cursor = page.next_cursor ?? undefined;
      expect(page.has_more).toBe(cursor !== undefined);
      pages += 1;
    } while (cursor);
    expect(pages).toBe(3);
    expect(seen).toEqual(ids);

    const first = (await ctx.request('GET', '/v1/webhook-endpoints', { key: org.key, query: { limit: '1' } })).json();
    const elsewhere = await ctx.request('GET', `/v1/webhook-endpoints/${ids[0]}/deliveries`, {
      key: org.key,
      query: { cursor: first.next_cursor },
    });
    expect(elsewhere.statusCode).toBe(422);
    expect(elsewhere.json().error.details.issues.cursor).toBeDefined();
  });
});

describe('webhook endpoints API: update and delete', () => {
  it('when PATCH changes url, events and description, it stores them and audits before and after; description null clears it', async () => {
    const org = await ctx.createOrg();
    const endpoint = await createEndpoint(org, { description: 'old' });
    const url = receiver.url('/moved');
    const response = await ctx.request('PATCH', `/v1/webhook-endpoints/${endpoint.id}`, {
      key: org.key,
      body: { url, events: ['customer.kyc_completed'], description: null },
    });
    expect(response.statusCode, response.body).toBe(200);
    expect(response.json()).toMatchObject({ url, events: ['customer.kyc_completed'], description: null });
    const [, updated] = await auditRows(org.id, endpoint.id);
    expect(updated).toMatchObject({
      action: 'webhook_endpoint.updated',
      before: expect.objectContaining({ url: endpoint.url, description: 'old' }),
      after: expect.objectContaining({ url, description: null }),
    });
  });

  it('when PATCH changes nothing (same values, events in another order), it writes nothing: no audit row, updated_at unchanged', async () => {
    const org = await ctx.createOrg();
    const endpoint = await createEndpoint(org, { events: ['customer.updated', 'aml.review_completed'], description: 'same' });
    const response = await ctx.request('PATCH', `/v1/webhook-endpoints/${endpoint.id}`, {
      key: org.key,
      body: { url: endpoint.url, events: ['aml.review_completed', 'customer.updated'], description: 'same', enabled: true },
    });
    expect(response.statusCode).toBe(200);
    expect(response.json().updated_at).toBe(endpoint.updated_at);
    expect((await auditRows(org.id, endpoint.id)).map((row) => row.action)).toEqual(['webhook_endpoint.created']);
    const empty = await ctx.request('PATCH', `/v1/webhook-endpoints/${endpoint.id}`, { key: org.key, body: {} });
    expect(empty.statusCode).toBe(200);
    expect(await auditRows(org.id, endpoint.id)).toHaveLength(1);
  });

  it('when PATCH gets an unknown property or event type, it answers 422 naming it', async () => {
    const org = await ctx.createOrg();
    const endpoint = await createEndpoint(org);
    const unknown = await ctx.request('PATCH', `/v1/webhook-endpoints/${endpoint.id}`, { key: org.key, body: { secret: 'whsec_x' } });
    expect(unknown.statusCode).toBe(422);
    expect(JSON.stringify(unknown.json().error.details)).toContain('secret');
    const badType = await ctx.request('PATCH', `/v1/webhook-endpoints/${endpoint.id}`, { key: org.key, body: { events: ['nope'] } });
    expect(badType.statusCode).toBe(422);
    expect(badType.json().error.details.issues['events[0]']).toEqual([expect.stringMatching(/Unknown event type/)]);
  });

  it('when PATCH sets enabled false, queued deliveries fail and it is audited as disabled; enabled true clears disabled_reason and failing_since', async () => {
    const org = await ctx.createOrg();
    const endpoint = await createEndpoint(org);
    await emit(org.id);
    const disabled = await ctx.request('PATCH', `/v1/webhook-endpoints/${endpoint.id}`, { key: org.key, body: { enabled: false } });
    expect(disabled.statusCode).toBe(200);
    expect(disabled.json()).toMatchObject({ enabled: false, disabled_reason: 'disabled through the API' });
    expect((await deliveryRows(org.id, endpoint.id)).map((row) => [row.status, row.lastError])).toEqual([
      ['failed', 'endpoint disabled: disabled through the API'],
    ]);
    expect((await auditRows(org.id, endpoint.id)).map((row) => row.action)).toEqual([
      'webhook_endpoint.created',
      'webhook_endpoint.disabled',
    ]);

    // A test of its own cannot reach a disabled endpoint.
    const test = await ctx.request('POST', `/v1/webhook-endpoints/${endpoint.id}/test`, { key: org.key });
    expect(test.statusCode).toBe(409);
    expect(test.json().error.code).toBe('conflict');

    await ctx.database.db
      .update(webhookEndpoints)
      .set({ failingSince: new Date(Date.now() - 3_600_000) })
      .where(eq(webhookEndpoints.id, endpoint.id));
    const enabled = await ctx.request('PATCH', `/v1/webhook-endpoints/${endpoint.id}`, { key: org.key, body: { enabled: true } });
    expect(enabled.json()).toMatchObject({ enabled: true, disabled_reason: null });
    const [stored] = await ctx.database.db.select().from(webhookEndpoints).where(eq(webhookEndpoints.id, endpoint.id));
    expect(stored).toMatchObject({ enabled: true, disabledReason: null, failingSince: null });
    const audit = await auditRows(org.id, endpoint.id);
    expect(audit.at(-1)).toMatchObject({
      action: 'webhook_endpoint.enabled',
      before: expect.objectContaining({ enabled: false }),
      after: expect.objectContaining({ enabled: true }),
    });
    expect(JSON.stringify(audit)).not.toContain(endpoint.secret);
  });

  it('when an endpoint is deleted, it answers {id, object, deleted}, its queued deliveries are never sent, and it is gone', async () => {
    const org = await ctx.createOrg();
    const endpoint = await createEndpoint(org);
    await emit(org.id);
    expect(await deliveryRows(org.id, endpoint.id)).toHaveLength(1);

    const response = await ctx.request('DELETE', `/v1/webhook-endpoints/${endpoint.id}`, { key: org.key });
    expect(response.statusCode).toBe(200);
    expect(response.json()).toEqual({ id: endpoint.id, object: 'webhook_endpoint', deleted: true });
    expect(await deliveryRows(org.id, endpoint.id)).toEqual([]);
    expect((await ctx.request('GET', `/v1/webhook-endpoints/${endpoint.id}`, { key: org.key })).statusCode).toBe(404);
    expect((await ctx.request('DELETE', `/v1/webhook-endpoints/${endpoint.id}`, { key: org.key })).statusCode).toBe(404);
    const audit = await auditRows(org.id, endpoint.id);
    expect(audit.at(-1)).toMatchObject({
      action: 'webhook_endpoint.deleted',
      after: null,
      before: expect.objectContaining({ id: endpoint.id }),
    });

    await startWorker();
    const later = await emit(org.id);
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(receiptsFor(endpoint.path)).toEqual([]);
    expect(later).toBeDefined();
  });

  it('when an endpoint is deleted while a worker is posting to it, the worker settles without an error and the attempt is dropped', async () => {
    const org = await ctx.createOrg();
    const endpoint = await createEndpoint(org);
    await emit(org.id);
    const deliveries = createDeliveryRepository();
    const claimed = await waitFor(
      async () => {
        const claims = await deliveries.claim('test-worker', 10, 60_000, ctx.database.db);
        return claims.find((claim) => claim.endpointId === endpoint.id);
      },
      5_000,
      'the claim',
    );
    expect((await ctx.request('DELETE', `/v1/webhook-endpoints/${endpoint.id}`, { key: org.key })).statusCode).toBe(200);
    const applied = await deliveries.settleMany(
      [
        {
          claim: claimed,
          settlement: { status: 'succeeded', attempt: { statusCode: 200, latencyMs: 5, error: null, startedAt: new Date() } },
        },
      ],
      'test-worker',
      ctx.database.db,
    );
    expect(applied.size).toBe(0);
  });
});

describe('webhook endpoints API: secret rotation', () => {
  it('when the secret is rotated, deliveries during the grace verify with both secrets; after it, only with the new one', async () => {
    const org = await ctx.createOrg();
    const endpoint = await createEndpoint(org);
    const oldSecret = endpoint.secret;
    const rotated = await ctx.request('POST', `/v1/webhook-endpoints/${endpoint.id}/rotate-secret`, {
      key: org.key,
      body: { grace_period_seconds: 3600 },
    });
    expect(rotated.statusCode, rotated.body).toBe(200);
    const body = rotated.json();
    const newSecret: string = body.secret;
    expect(newSecret).toMatch(/^whsec_/);
    expect(newSecret).not.toBe(oldSecret);
    const expiresAt = Date.parse(body.previous_secret_expires_at);
    expect(Math.abs(expiresAt - (Date.now() + 3_600_000))).toBeLessThan(60_000);
    const got = (await ctx.request('GET', `/v1/webhook-endpoints/${endpoint.id}`, { key: org.key })).json();
    expect(got.previous_secret_expires_at).toBe(body.previous_secret_expires_at);
    expect(JSON.stringify(got)).not.toContain(oldSecret);
    expect(JSON.stringify(got)).not.toContain(newSecret);

    await startWorker();
    const during = await receiptOf(endpoint.path, await emit(org.id));
    expect(String(during.headers['webhook-signature']).split(' ')).toHaveLength(2);
    expect(verifies(newSecret, during)).toBe(true);
    expect(verifies(oldSecret, during)).toBe(true);

    await ctx.database.db
      .update(webhookEndpoints)
      .set({ previousSecretExpiresAt: sql`clock_timestamp() - interval '1 second'` })
      .where(eq(webhookEndpoints.id, endpoint.id));
    const after = await receiptOf(endpoint.path, await emit(org.id));
    expect(String(after.headers['webhook-signature']).split(' ')).toHaveLength(1);
    expect(verifies(newSecret, after)).toBe(true);
    expect(verifies(oldSecret, after)).toBe(false);
    expect(
      (await ctx.request('GET', `/v1/webhook-endpoints/${endpoint.id}`, { key: org.key })).json().previous_secret_expires_at,
    ).toBeNull();

    const audit = await auditRows(org.id, endpoint.id);
    expect(audit.at(-1)).toMatchObject({
      action: 'webhook_endpoint.secret_rotated',
      after: expect.objectContaining({ grace_period_seconds: 3600 }),
    });
    expect(JSON.stringify(audit)).not.toContain(oldSecret);
    expect(JSON.stringify(audit)).not.toContain(newSecret);
  });

  it('when rotated again during a grace, the oldest secret stops signing at once; grace 0 keeps no previous secret', async () => {
    const org = await ctx.createOrg();
    const endpoint = await createEndpoint(org);
    const rotate = async (body: unknown) => {
      const response = await ctx.request('POST', `/v1/webhook-endpoints/${endpoint.id}/rotate-secret`, { key: org.key, body });
      expect(response.statusCode, response.body).toBe(200);
      return response.json<Endpoint & { secret: string }>();
    };
    const second = await rotate({});
    expect(Math.abs(Date.parse(second.previous_secret_expires_at!) - (Date.now() + 86_400_000))).toBeLessThan(60_000);
    const third = await rotate({ grace_period_seconds: 600 });

    await startWorker();
    const receipt = await receiptOf(endpoint.path, await emit(org.id));
    expect(verifies(third.secret, receipt)).toBe(true);
    expect(verifies(second.secret, receipt)).toBe(true);
    expect(verifies(endpoint.secret, receipt)).toBe(false);

    const fourth = await rotate({ grace_period_seconds: 0 });
    expect(fourth.previous_secret_expires_at).toBeNull();
    const now = await receiptOf(endpoint.path, await emit(org.id));
    expect(verifies(fourth.secret, now)).toBe(true);
    expect(verifies(third.secret, now)).toBe(false);
  });

  it.each([[-1], [604_801], [1.5], ['60']])(
    'when grace_period_seconds is %s, it answers 422 on grace_period_seconds and keeps the secret',
    async (grace) => {
      const org = await ctx.createOrg();
      const endpoint = await createEndpoint(org);
      const response = await ctx.request('POST', `/v1/webhook-endpoints/${endpoint.id}/rotate-secret`, {
        key: org.key,
        body: { grace_period_seconds: grace },
      });
      expect(response.statusCode).toBe(422);
      expect(response.json().error.details.issues.grace_period_seconds).toBeDefined();
      const [stored] = await ctx.database.db.select().from(webhookEndpoints).where(eq(webhookEndpoints.id, endpoint.id));
      expect(stored!.secret).toBe(endpoint.secret);
    },
  );
});

describe('webhook endpoints API: test events, deliveries, retry', () => {
  it('when a test is sent to one endpoint, only that endpoint receives the webhook.test event, subscribed to it or not', async () => {
    const org = await ctx.createOrg();
    const target = await createEndpoint(org, { events: ['customer.kyc_completed'] });
    const other = await createEndpoint(org);
    const response = await ctx.request('POST', `/v1/webhook-endpoints/${target.id}/test`, { key: org.key });
    expect(response.statusCode, response.body).toBe(201);
    const { event, delivery } = response.json();
    expect(event).toMatchObject({ type: 'webhook.test', data: { endpoint_id: target.id } });
    expect(delivery).toMatchObject({ event_id: event.id, endpoint_id: target.id, status: 'pending', attempts: [] });

    await startWorker();
    const receipt = await receiptOf(target.path, event.id);
    expect(receipt.verifyError).toBeNull();
    expect(JSON.parse(receipt.body)).toEqual(event);
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(receiptsFor(other.path)).toEqual([]);
    expect(await deliveryRows(org.id, other.id)).toEqual([]);
    expect((await auditRows(org.id, target.id)).at(-1)).toMatchObject({
      action: 'webhook_endpoint.test_sent',
      after: { event_id: event.id, delivery_id: delivery.id },
    });
  });

  it('when deliveries are listed, each shows its attempts with status code, duration, error and time, newest first, filtered by status', async () => {
    const org = await ctx.createOrg();
    const endpoint = await createEndpoint(org);
    receiver.setReply((receipt) => (receiptsFor(receipt.path).length === 1 && receipt.path === endpoint.path ? { status: 503 } : {}));
    const first = await emit(org.id);
    await startWorker([50]);
    await waitFor(
      async () => {
        const [row] = await deliveryRows(org.id, endpoint.id);
        return row?.status === 'succeeded';
      },
      20_000,
      'the retried delivery',
    );
    const second = await emit(org.id, 'customer.kyc_completed');
    await receiptOf(endpoint.path, second);
    await waitFor(
      async () => (await deliveryRows(org.id, endpoint.id)).every((row) => row.status === 'succeeded'),
      20_000,
      'both delivered',
    );

    const response = await ctx.request('GET', `/v1/webhook-endpoints/${endpoint.id}/deliveries`, { key: org.key });
    expect(response.statusCode, response.body).toBe(200);
    const page = response.json();
    expect(page).toMatchObject({ object: 'list', has_more: false, next_cursor: null, limit: 50 });
    expect(page.data.map((delivery: { event_id: string }) => delivery.event_id)).toEqual([second, first]);
    const retried = page.data[1];
    expect(retried).toMatchObject({ status: 'succeeded', attempt_count: 2, last_status_code: 200 });
    expect(retried.attempts).toEqual([
      {
        attempt_number: 1,
        status_code: 503,
        latency_ms: expect.any(Number),
        error: 'HTTP 503',
        worker_id: expect.any(String),
        started_at: expect.any(String),
      },
      {
        attempt_number: 2,
        status_code: 200,
        latency_ms: expect.any(Number),
        error: null,
        worker_id: expect.any(String),
        started_at: expect.any(String),
      },
    ]);
    expect(Date.parse(retried.attempts[1].started_at)).toBeGreaterThanOrEqual(Date.parse(retried.attempts[0].started_at));

    const paged = (
      await ctx.request('GET', `/v1/webhook-endpoints/${endpoint.id}/deliveries`, { key: org.key, query: { limit: '1' } })
    ).json();
    expect(paged.data.map((delivery: { event_id: string }) => delivery.event_id)).toEqual([second]);
    const next = (
      await ctx.request('GET', `/v1/webhook-endpoints/${endpoint.id}/deliveries`, {
        key: org.key,
        query: { limit: '1', cursor: paged.next_cursor },
      })
    ).json();
    expect(next.data.map((delivery: { event_id: string }) => delivery.event_id)).toEqual([first]);
    expect(next.has_more).toBe(false);

    const failed = await ctx.request('GET', `/v1/webhook-endpoints/${endpoint.id}/deliveries`, {
      key: org.key,
      query: { status: 'failed' },
    });
    expect(failed.json().data).toEqual([]);
    const badStatus = await ctx.request('GET', `/v1/webhook-endpoints/${endpoint.id}/deliveries`, {
      key: org.key,
      query: { status: 'lost' },
    });
    expect(badStatus.statusCode).toBe(422);
    const otherFilter = await ctx.request('GET', `/v1/webhook-endpoints/${endpoint.id}/deliveries`, {
      key: org.key,
      query: { limit: '1', status: 'succeeded', cursor: paged.next_cursor },
    });
    expect(otherFilter.statusCode).toBe(422);
  });

  it('when a settled delivery is retried, it answers 202 with a new pending delivery and the receiver gets the same event again', async () => {
    const org = await ctx.createOrg();
    const endpoint = await createEndpoint(org);
    const eventId = await emit(org.id);
    await startWorker();
    await receiptOf(endpoint.path, eventId);
    const [settled] = await waitFor(
      async () => {
        const rows = await deliveryRows(org.id, endpoint.id);
        return rows.every((row) => row.status === 'succeeded') ? rows : undefined;
      },
      20_000,
      'the first delivery',
    );

    const response = await ctx.request('POST', `/v1/webhook-deliveries/${settled!.id}/retry`, { key: org.key });
    expect(response.statusCode, response.body).toBe(202);
    expect(response.json()).toMatchObject({ event_id: eventId, endpoint_id: endpoint.id, status: 'pending', resent_from: settled!.id });
    await waitFor(
      () => receiptsFor(endpoint.path).filter((receipt) => receipt.webhookId === eventId).length === 2,
      20_000,
      'the second receipt',
    );
    expect((await auditRows(org.id, response.json().id)).map((row) => row.action)).toEqual(['webhook_delivery.resent']);
  });

  it('when the delivery belongs to a disabled endpoint, retry answers 409 conflict', async () => {
    const org = await ctx.createOrg();
    const endpoint = await createEndpoint(org);
    await emit(org.id);
    const [delivery] = await deliveryRows(org.id, endpoint.id);
    await ctx.request('PATCH', `/v1/webhook-endpoints/${endpoint.id}`, { key: org.key, body: { enabled: false } });
    const response = await ctx.request('POST', `/v1/webhook-deliveries/${delivery!.id}/retry`, { key: org.key });
    expect(response.statusCode).toBe(409);
    expect(response.json().error.code).toBe('conflict');
  });

  it('when test or retry get a body with a property, it answers 422', async () => {
    const org = await ctx.createOrg();
    const endpoint = await createEndpoint(org);
    const response = await ctx.request('POST', `/v1/webhook-endpoints/${endpoint.id}/test`, {
      key: org.key,
      body: { type: 'customer.updated' },
    });
    expect(response.statusCode).toBe(422);
  });
});

describe('webhook endpoints API: idempotency', () => {
  it('when create is replayed with its Idempotency-Key, the same response (secret included) comes back marked replayed, and one endpoint exists', async () => {
    const org = await ctx.createOrg();
    const body = { url: receiver.url(nextPath()), description: 'idempotent' };
    const headers = { 'idempotency-key': `create-${randomUUID()}` };
    const first = await ctx.request('POST', '/v1/webhook-endpoints', { key: org.key, body, headers });
    const replay = await ctx.request('POST', '/v1/webhook-endpoints', { key: org.key, body, headers });
    expect(first.statusCode).toBe(201);
    expect(replay.statusCode).toBe(201);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(first.headers['idempotent-replayed']).toBeUndefined();
    expect(replay.body).toBe(first.body);
    expect((await ctx.request('GET', '/v1/webhook-endpoints', { key: org.key })).json().data).toHaveLength(1);
  });

  it('when rotate, PATCH, DELETE, test and retry are replayed, each returns its first response and changes nothing more', async () => {
    const org = await ctx.createOrg();
    const endpoint = await createEndpoint(org);
    const eventId = await emit(org.id);
    const [delivery] = await deliveryRows(org.id, endpoint.id);
    const calls: Array<[string, string, unknown]> = [
      ['POST', `/v1/webhook-endpoints/${endpoint.id}/rotate-secret`, { grace_period_seconds: 60 }],
      ['PATCH', `/v1/webhook-endpoints/${endpoint.id}`, { description: 'replayed' }],
      ['POST', `/v1/webhook-endpoints/${endpoint.id}/test`, undefined],
      ['POST', `/v1/webhook-deliveries/${delivery!.id}/retry`, undefined],
      ['DELETE', `/v1/webhook-endpoints/${endpoint.id}`, undefined],
    ];
    for (const [method, url, body] of calls) {
      const headers = { 'idempotency-key': randomUUID() };
      const first = await ctx.request(method, url, { key: org.key, body, headers });
      expect(first.statusCode, `${method} ${url}: ${first.body}`).toBeLessThan(300);
      const auditCount = (await ctx.database.db.select().from(auditLog).where(eq(auditLog.orgId, org.id))).length;
      const replay = await ctx.request(method, url, { key: org.key, body, headers });
      expect(replay.statusCode).toBe(first.statusCode);
      expect(replay.headers['idempotent-replayed'], `${method} ${url}`).toBe('true');
      expect(replay.body).toBe(first.body);
      expect((await ctx.database.db.select().from(auditLog).where(eq(auditLog.orgId, org.id))).length).toBe(auditCount);
    }
    expect(eventId).toBeDefined();
  });
});
