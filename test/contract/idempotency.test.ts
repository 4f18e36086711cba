import { randomUUID } from 'node:crypto';
import { sql } from 'drizzle-orm';
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp } from '../../src/app.js';
import { createDatabase } from '../../src/db/client.js';
import { ROUTE_SCOPES } from '../../src/plugins/route-scopes.js';
import { AppError } from '../../src/shared/app-error.js';
import { createTestContext, type TestContext, type TestOrg, testServices } from '../helpers/harness.js';
import { minimalUpload } from '../helpers/multipart.js';

let ctx: TestContext;
let org: TestOrg;

beforeAll(async () => {
  ctx = await createTestContext();
  org = await ctx.createOrg();
});
afterAll(async () => ctx?.close());

function newCustomer(tag = randomUUID().slice(0, 8)) {
  return { externalId: `crm-${tag}`, fullName: `Idem Person ${tag}`, email: `idem.${tag}@example.com` };
}

async function countByExternalId(externalId: string): Promise<number> {
  const result = await ctx.database.db.execute<{ count: number }>(
    sql`SELECT count(*)::int AS count FROM customers WHERE external_id = ${externalId}`,
  );
  return result.rows[0]!.count;
}

function post(body: unknown, idempotencyKey: string, key = org.key, app = ctx.app) {
  return ctx.request('POST', '/v1/customers', { key, body, headers: { 'idempotency-key': idempotencyKey } }, app);
}

describe('replay', () => {
  it('when 20 identical requests with one Idempotency-Key arrive at once, exactly one record is created and all get the same response', async () => {
    const body = newCustomer();
    const idempotencyKey = randomUUID();
    const responses = await Promise.all(Array.from({ length: 20 }, () => post(body, idempotencyKey)));
    expect(await countByExternalId(body.externalId)).toBe(1);
    expect(new Set(responses.map((response) => response.statusCode))).toEqual(new Set([201]));
    expect(new Set(responses.map((response) => response.body)).size).toBe(1);
    expect(responses.filter((response) => response.headers['idempotent-replayed'] === 'true')).toHaveLength(19);
  });

  it('when concurrent duplicates arrive on two app instances, exactly one record is created', async () => {
    const second = await ctx.buildInstance();
    const body = newCustomer();
    const idempotencyKey = randomUUID();
    const responses = await Promise.all(
      Array.from({ length: 10 }, (_, index) => post(body, idempotencyKey, org.key, index % 2 === 0 ? ctx.app : second)),
    );
    expect(await countByExternalId(body.externalId)).toBe(1);
    expect(new Set(responses.map((response) => `${response.statusCode} ${response.body}`)).size).toBe(1);
    expect(responses.filter((response) => response.headers['idempotent-replayed'] === 'true')).toHaveLength(9);
  });

  it('when more concurrent duplicates arrive than the instance has pool connections, they all complete with one record', async () => {
    const smallPool = createDatabase(ctx.databaseUrl, { poolSize: 3 });
    const app = await buildApp({ config: ctx.config, database: smallPool, logger: false });
    await app.ready();
    try {
      const body = newCustomer();
      const idempotencyKey = randomUUID();
      const responses = await Promise.all(Array.from({ length: 12 }, () => post(body, idempotencyKey, org.key, app)));
      expect(responses.map((response) => response.statusCode)).toEqual(Array(12).fill(201));
      expect(await countByExternalId(body.externalId)).toBe(1);
    } finally {
      await app.close();
      await smallPool.close();
    }
  });

  it('when the same key and body are sent again, it replays with Idempotent-Replayed: true and the original status', async () => {
    const body = newCustomer();
    const idempotencyKey = randomUUID();
    const first = await post(body, idempotencyKey);
    expect(first.statusCode).toBe(201);
    expect(first.headers['idempotent-replayed']).toBeUndefined();
    const again = await post(body, idempotencyKey);
    expect(again.statusCode).toBe(201);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.headers['content-type']).toBe(first.headers['content-type']);
    expect(again.body).toBe(first.body);
  });

  it('when the body is the same with keys in another order, it replays (the fingerprint is canonical JSON)', async () => {
    const body = newCustomer();
    const idempotencyKey = randomUUID();
    const first = await post(body, idempotencyKey);
    const reordered = { email: body.email, fullName: body.fullName, externalId: body.externalId };
    const again = await post(reordered, idempotencyKey);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.body).toBe(first.body);
  });

  it('when a retry adds a trailing slash to the path, it is still a replay', async () => {
    const body = newCustomer();
    const idempotencyKey = randomUUID();
    const first = await post(body, idempotencyKey);
    const again = await ctx.request('POST', '/v1/customers/', { key: org.key, body, headers: { 'idempotency-key': idempotencyKey } });
    expect(again.statusCode).toBe(201);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.body).toBe(first.body);
  });

  it('when the record changed after the first request, a replay still returns the original body', async () => {
    const body = newCustomer();
    const idempotencyKey = randomUUID();
    const first = await post(body, idempotencyKey);
    const id = first.json().id;
    const patched = await ctx.request('PATCH', `/v1/customers/${id}`, { key: org.key, body: { phone: '+61 400 111 222' } });
    expect(patched.statusCode).toBe(200);
    const again = await post(body, idempotencyKey);
    expect(again.body).toBe(first.body);
    expect(again.json().phone ?? null).toBeNull();
  });

  it('when another key of the same organisation sends the same Idempotency-Key, it is not replayed (keys are per API key)', async () => {
    const other = await ctx.createKey(org.id);
    const idempotencyKey = randomUUID();
    const first = await post(newCustomer(), idempotencyKey);
    expect(first.statusCode).toBe(201);
    const otherBody = newCustomer();
    const response = await post(otherBody, idempotencyKey, other.key);
    expect(response.statusCode).toBe(201);
    expect(response.headers['idempotent-replayed']).toBeUndefined();
    expect(response.json().external_id).toBe(otherBody.externalId);
  });

  it('when PATCH is repeated with the same key, the second is a replay', async () => {
    const created = (await post(newCustomer(), randomUUID())).json();
    const idempotencyKey = randomUUID();
    const send = () =>
      ctx.request('PATCH', `/v1/customers/${created.id}`, {
        key: org.key,
        body: { phone: '+61 400 333 444' },
        headers: { 'idempotency-key': idempotencyKey },
      });
    const first = await send();
    const again = await send();
    expect(first.statusCode).toBe(200);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.body).toBe(first.body);
  });

  it('when PUT designated-services is repeated with the same key, the second is a replay', async () => {
    const created = (await post(newCustomer(), randomUUID())).json();
    const idempotencyKey = randomUUID();
    const send = (codes: string[]) =>
      ctx.request('PUT', `/v1/customers/${created.id}/designated-services`, {
        key: org.key,
        body: { service_codes: codes },
        headers: { 'idempotency-key': idempotencyKey },
      });
    const first = await send(['PRO-FORMATION']);
    expect(first.statusCode, first.body).toBe(200);
    const again = await send(['PRO-FORMATION']);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.statusCode).toBe(first.statusCode);
    expect(again.body).toBe(first.body);
    expect((await send([])).statusCode).toBe(409);
  });

  /** The smallest body each route's schema accepts, so the request reaches its handler. */
  const minimalBodies: Record<string, object> = {
    'POST /v1/entities/:id/documents': minimalUpload(),
    'PUT /v1/customers/:id/designated-services': { service_codes: [] },
    'POST /v1/entities/:id/ubos': { owners: [{ fullName: 'Idem Owner', email: 'idem.owner@example.com', roleTypes: ['DIRECTOR'] }] },
    'POST /v1/entities/:id/document-requests': { types: ['OTHER'] },
    'POST /v1/customers/:id/reviews': { outcome: 'NO_CHANGE', reviewer: 'Idem Reviewer' },
    'POST /v1/entities/:id/reviews': { outcome: 'NO_CHANGE', reviewer: 'Idem Reviewer' },
  };
  const writeRoutes = Object.keys(ROUTE_SCOPES)
    .map((key) => key.split(' ') as [string, string])
    .filter(([method, url]) => ['POST', 'PATCH', 'PUT'].includes(method) && url.includes(':id'));
  it.each(writeRoutes)(
    'when %s %s is repeated with the same key for a missing record, the stored 404 is replayed (every write route is idempotent)',
    async (method, url) => {
      if (!ctx.app.hasRoute({ method: method, url })) return;
      const path = url.replace(':id', randomUUID()).replace(':uboId', randomUUID());
      const idempotencyKey = randomUUID();
      const body = minimalBodies[`${method} ${url}`] ?? {};
      const send = () => ctx.request(method, path, { key: org.key, body, headers: { 'idempotency-key': idempotencyKey } });
      const first = await send();
      // A 422 here means the sample body no longer fits the route's schema: a schema failure is never stored.
      expect(first.statusCode, first.body).toBe(404);
      const again = await send();
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(again.body).toBe(first.body);
    },
  );

  it('when no Idempotency-Key is sent, repeats are processed each time', async () => {
    const body = { fullName: 'No Key Person', email: `nokey.${randomUUID().slice(0, 8)}@example.com` };
    const first = await ctx.request('POST', '/v1/customers', { key: org.key, body });
    const again = await ctx.request('POST', '/v1/customers', { key: org.key, body });
    expect(first.statusCode).toBe(201);
    expect(again.statusCode).toBe(200);
    expect(again.headers['idempotent-replayed']).toBeUndefined();
  });
});

describe('conflicts and validation', () => {
  it('when the same key is reused with another body, it answers 409 idempotency_conflict', async () => {
    const idempotencyKey = randomUUID();
    await post(newCustomer(), idempotencyKey);
    const other = newCustomer();
    const response = await post(other, idempotencyKey);
    expect(response.statusCode).toBe(409);
    expect(response.json()).toEqual({ error: { code: 'idempotency_conflict', message: expect.any(String) } });
    expect(await countByExternalId(other.externalId)).toBe(0);
  });

  it('when the same key is reused on another path, it answers 409 idempotency_conflict', async () => {
    const idempotencyKey = randomUUID();
    const created = (await post(newCustomer(), idempotencyKey)).json();
    const response = await ctx.request('PUT', `/v1/customers/${created.id}/designated-services`, {
      key: org.key,
      body: { service_codes: [] },
      headers: { 'idempotency-key': idempotencyKey },
    });
    expect(response.statusCode).toBe(409);
    expect(response.json().error.code).toBe('idempotency_conflict');
  });

  it('when the Idempotency-Key is 256 characters, it answers 422 naming the header', async () => {
    const body = newCustomer();
    const response = await post(body, 'k'.repeat(256));
    expect(response.statusCode).toBe(422);
    expect(response.json().error.details.issues).toEqual({ 'Idempotency-Key': [expect.any(String)] });
    expect(await countByExternalId(body.externalId)).toBe(0);
  });

  it('when the Idempotency-Key is 255 characters, it is accepted', async () => {
    const response = await post(newCustomer(), 'k'.repeat(255));
    expect(response.statusCode).toBe(201);
  });

  it('when the Idempotency-Key is empty, it answers 422', async () => {
    const response = await post(newCustomer(), '');
    expect(response.statusCode).toBe(422);
  });
});

describe('what is stored', () => {
  it('when the handler answers a 4xx (first name without last name), the replay has the same status and body', async () => {
    const idempotencyKey = randomUUID();
    const body = { ...newCustomer(), firstName: 'Only' };
    const first = await post(body, idempotencyKey);
    expect(first.statusCode).toBe(422);
    const again = await post(body, idempotencyKey);
    expect(again.statusCode).toBe(422);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.body).toBe(first.body);
  });

  it('when the handler answers 409 conflict, the replay has the same status and body', async () => {
    const existing = newCustomer();
    await post(existing, randomUUID());
    // Same email and name, a different external id: the upsert table says 409 conflict.
    const clash = { ...existing, externalId: `${existing.externalId}-other` };
    const idempotencyKey = randomUUID();
    const first = await post(clash, idempotencyKey);
    expect(first.statusCode).toBe(409);
    expect(first.json().error.code).toBe('conflict');
    const again = await post(clash, idempotencyKey);
    expect(again.statusCode).toBe(409);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.body).toBe(first.body);
  });

  it('when the body fails schema validation, nothing is stored and a corrected retry with the same key is processed', async () => {
    const idempotencyKey = randomUUID();
    const body = newCustomer();
    const invalid = await post({ ...body, email: 'not-an-email' }, idempotencyKey);
    expect(invalid.statusCode).toBe(422);
    const corrected = await post(body, idempotencyKey);
    expect(corrected.statusCode).toBe(201);
    expect(corrected.headers['idempotent-replayed']).toBeUndefined();
  });

  it('when the first attempt is refused for scope (403), a retry with a proper key is processed', async () => {
    const readOnly = await ctx.createKey(org.id, { scopes: ['customers:read'] });
    const idempotencyKey = randomUUID();
    const body = newCustomer();
    const refused = await post(body, idempotencyKey, readOnly.key);
    expect(refused.statusCode).toBe(403);
    const stored = await ctx.database.db.execute(sql`SELECT 1 FROM idempotency_keys WHERE key = ${idempotencyKey}`);
    expect(stored.rows).toHaveLength(0);
    const ok = await post(body, idempotencyKey);
    expect(ok.statusCode).toBe(201);
    expect(ok.headers['idempotent-replayed']).toBeUndefined();
  });

  it('when the first attempt is refused as unauthorized (401), nothing is stored', async () => {
    const idempotencyKey = randomUUID();
    const refused = await post(newCustomer(), idempotencyKey, `svc_live_${'Z'.repeat(40)}`);
    expect(refused.statusCode).toBe(401);
    const stored = await ctx.database.db.execute(sql`SELECT 1 FROM idempotency_keys WHERE key = ${idempotencyKey}`);
    expect(stored.rows).toHaveLength(0);
  });

  it('when a stored key is older than 24 hours, the same key is processed again as new', async () => {
    const idempotencyKey = randomUUID();
    const body = newCustomer();
    const first = await post(body, idempotencyKey);
    expect(first.statusCode).toBe(201);
    await ctx.database.db.execute(sql`UPDATE idempotency_keys SET created_at = now() - interval '25 hours' WHERE key = ${idempotencyKey}`);
    const again = await post(body, idempotencyKey);
    expect(again.headers['idempotent-replayed']).toBeUndefined();
    // Processed anew: the upsert matches the existing record by externalId and answers 200.
    expect(again.statusCode).toBe(200);
  });

  it('when a request is replayed, it still counts against the rate limits, and a 429 is not stored', async () => {
    const limited = await ctx.createKey(org.id, { dailyLimit: 2 });
    const idempotencyKey = randomUUID();
    const body = newCustomer();
    expect((await post(body, idempotencyKey, limited.key)).statusCode).toBe(201);
    expect((await post(body, idempotencyKey, limited.key)).headers['idempotent-replayed']).toBe('true');
    const refused = await post(body, idempotencyKey, limited.key);
    expect(refused.statusCode).toBe(429);
    expect(refused.headers['idempotent-replayed']).toBeUndefined();
    await ctx.database.db.execute(sql`UPDATE api_key_usage SET day_count = 0 WHERE api_key_id = ${limited.id}`);
    const later = await post(body, idempotencyKey, limited.key);
    expect(later.statusCode).toBe(201);
    expect(later.headers['idempotent-replayed']).toBe('true');
  });

  it('when the retention purge runs, it deletes records past the 24 h window only', async () => {
    const expiredKey = randomUUID();
    const liveKey = randomUUID();
    await post(newCustomer(), expiredKey);
    await post(newCustomer(), liveKey);
    await ctx.database.db.execute(sql`UPDATE idempotency_keys SET created_at = now() - interval '25 hours' WHERE key = ${expiredKey}`);
    const purged = await testServices(ctx.database, { config: ctx.config }).retention().purgeOrganisation(org.id);
    expect(purged.idempotency_keys).toBeGreaterThanOrEqual(1);
    const remaining = await ctx.database.db.execute<{ key: string }>(
      sql`SELECT key FROM idempotency_keys WHERE key IN (${expiredKey}, ${liveKey})`,
    );
    expect(remaining.rows.map((row) => row.key)).toEqual([liveKey]);
  });
});

describe('failures inside the handler', () => {
  // A test-only route (registered on a separately built app) whose handler writes an audit row
  // and then fails as told, to see what the idempotency layer keeps.
  const ROUTE = 'POST /v1/test-idempotency-probe';

  async function probeApp() {
    // The scope map is read while routes register; the entry goes again once this app is ready, since the
    // module (shared by the test files of a worker) must list only the product's routes for the others.
    const scopes = ROUTE_SCOPES as Record<string, string | null>;
    scopes[ROUTE] = 'customers:write';
    const app = await buildApp({ config: ctx.config, database: ctx.database, logger: false });
    app.post('/v1/test-idempotency-probe', async (request) => {
      const { marker, fail } = request.body as { marker: string; fail: 'crash' | 'conflict' | 'none' };
      await request.openTransaction(async (tx) => {
        await tx.execute(sql`
          INSERT INTO audit_log (org_id, actor_type, action, subject_type, request_id)
          VALUES (${request.auth.orgId}, 'system', 'probe', 'probe', ${marker})`);
      });
      if (fail === 'crash') throw new Error('probe crashed');
      if (fail === 'conflict') throw AppError.conflict('probe conflict');
      return { ok: true, marker };
    });
    try {
      await app.ready();
    } finally {
      delete scopes[ROUTE];
    }
    return app;
  }

  async function auditRows(marker: string): Promise<number> {
    const result = await ctx.database.db.execute<{ count: number }>(
      sql`SELECT count(*)::int AS count FROM audit_log WHERE request_id = ${marker}`,
    );
    return result.rows[0]!.count;
  }

  function send(app: FastifyInstance, idempotencyKey: string, body: object) {
    return ctx.request('POST', '/v1/test-idempotency-probe', { key: org.key, body, headers: { 'idempotency-key': idempotencyKey } }, app);
  }

  it('when the handler fails with a 5xx, its work is rolled back, nothing is stored, and a retry is processed anew', async () => {
    const app = await probeApp();
    try {
      const idempotencyKey = randomUUID();
      const marker = randomUUID();
      const crashed = await send(app, idempotencyKey, { marker, fail: 'crash' });
      expect(crashed.statusCode).toBe(500);
      expect(crashed.json().error.code).toBe('internal');
      expect(await auditRows(marker)).toBe(0);
      const stored = await ctx.database.db.execute(sql`SELECT 1 FROM idempotency_keys WHERE key = ${idempotencyKey}`);
      expect(stored.rows).toHaveLength(0);
      const retry = await send(app, idempotencyKey, { marker, fail: 'none' });
      expect(retry.statusCode).toBe(200);
      expect(retry.headers['idempotent-replayed']).toBeUndefined();
      expect(await auditRows(marker)).toBe(1);
    } finally {
      await app.close();
    }
  });

  it('when the handler answers a 4xx after writing, its work is rolled back but the 4xx is stored and replayed', async () => {
    const app = await probeApp();
    try {
      const idempotencyKey = randomUUID();
      const marker = randomUUID();
      const first = await send(app, idempotencyKey, { marker, fail: 'conflict' });
      expect(first.statusCode).toBe(409);
      expect(await auditRows(marker)).toBe(0);
      const again = await send(app, idempotencyKey, { marker, fail: 'conflict' });
      expect(again.statusCode).toBe(409);
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(again.body).toBe(first.body);
      expect(await auditRows(marker)).toBe(0);
    } finally {
      await app.close();
    }
  });

  it('when the handler succeeds, its work and the stored response commit together', async () => {
    const app = await probeApp();
    try {
      const idempotencyKey = randomUUID();
      const marker = randomUUID();
      const first = await send(app, idempotencyKey, { marker, fail: 'none' });
      expect(first.statusCode).toBe(200);
      const again = await send(app, idempotencyKey, { marker, fail: 'none' });
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(await auditRows(marker)).toBe(1);
    } finally {
      await app.close();
    }
  });
});

describe('no network I/O inside a transaction', () => {
  it('when POST /v1/webhook-endpoints with an Idempotency-Key waits on a slow DNS answer, it holds no database connection meanwhile, and the reply is still stored', async () => {
    let dnsAsked!: () => void;
    let answerDns!: () => void;
    const asked = new Promise<void>((resolve) => (dnsAsked = resolve));
    const answer = new Promise<void>((resolve) => (answerDns = resolve));
    // The app's own pool, so its checked-out connections are this request's alone.
    const database = createDatabase(ctx.databaseUrl, { poolSize: 3 });
    const app = await buildApp({
      config: ctx.config,
      database,
      logger: false,
      resolveHost: async () => {
        dnsAsked();
        await answer;
        return [{ address: '93.184.215.14', family: 4 }];
      },
    });
    await app.ready();
    try {
      const idempotencyKey = randomUUID();
      const send = () =>
        ctx.request(
          'POST',
          '/v1/webhook-endpoints',
          { key: org.key, body: { url: 'https://hooks.example.test/in' }, headers: { 'idempotency-key': idempotencyKey } },
          app,
        );
      const pending = send();
      await asked;
      expect(database.pool.totalCount - database.pool.idleCount).toBe(0);
      const open = await ctx.database.db.execute<{ count: number }>(sql`
        SELECT count(*)::int AS count FROM pg_stat_activity
         WHERE datname = current_database() AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()`);
      expect(open.rows[0]!.count).toBe(0);

      answerDns();
      const created = await pending;
      expect(created.statusCode).toBe(201);
      const replayed = await send();
      expect(replayed.headers['idempotent-replayed']).toBe('true');
      expect(replayed.json()).toEqual(created.json());
    } finally {
      answerDns();
      await app.close();
      await database.close();
    }
  });
});
