import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createAuditChainSealer, type AuditChainSealer } from '../../src/modules/audit/audit-chain.sealer.js';
import { createEntity } from '../entities/entity-test-helpers.js';
import { createTestContext, type TestContext, type TestOrg, testServices } from '../helpers/harness.js';

type AuditEvent = {
  id: string;
  sequence: number;
  created_at: string;
  actor: { type: string; id: string | null; key_label: string | null };
  action: string;
  subject: { type: string; id: string | null };
  changes: Record<string, { old: unknown; new: unknown }>;
  request_id: string | null;
  idempotency_key: string | null;
};
type Page = { object: 'list'; data: AuditEvent[]; has_more: boolean; next_cursor: string | null; resume_cursor: string; limit: number };

const OPERATOR = { type: 'operator', id: 'cli:auditor' } as const;

let ctx: TestContext;
let sealer: AuditChainSealer;
beforeAll(async () => {
  ctx = await createTestContext();
  // Sealed on demand: the list shows only sealed rows.
  sealer = createAuditChainSealer({ database: ctx.database, pollIntervalMs: 60_000 });
});
afterAll(async () => {
  await sealer?.stop();
  await ctx?.close();
});

async function list(org: TestOrg, query: Record<string, string> = {}, key = org.key) {
  return ctx.request('GET', '/v1/audit-events', { key, query });
}

async function page(org: TestOrg, query: Record<string, string> = {}): Promise<Page> {
  const response = await list(org, query);
  expect(response.statusCode, response.body).toBe(200);
  return response.json<Page>();
}

/** Every event (with the filters), following next_cursor page by page until it is null. */
async function walk(org: TestOrg, query: Record<string, string> = {}, limit = 100): Promise<AuditEvent[]> {
  const events: AuditEvent[] = [];
  let cursor: string | undefined;
  for (;;) {
    const body = await page(org, { ...query, limit: String(limit), ...(cursor ? { cursor } : {}) });
    events.push(...body.data);
    if (body.next_cursor === null) return events;
    cursor = body.next_cursor;
  }
}

function expectNotFound(response: { statusCode: number; body: string; json(): any }) {
  expect(response.statusCode, response.body).toBe(404);
  expect(response.json().error.code).toBe('not_found');
}

function expectInvalid(response: { statusCode: number; body: string; json(): any }, field: string) {
  expect(response.statusCode, response.body).toBe(422);
  expect(Object.keys(response.json().error.details.issues)).toContain(field);
}

describe('GET /v1/audit-events access', () => {
  it('when the key lacks audit:read, the answer is 403 forbidden_scope naming it; a key with only audit:read reads the trail', async () => {
    const org = await ctx.createOrg();
    const narrow = await ctx.createKey(org.id, { scopes: ['customers:read', 'customers:write', 'events:read'] });
    const refused = await ctx.request('GET', '/v1/audit-events', { key: narrow.key });
    expect(refused.statusCode, refused.body).toBe(403);
    expect(refused.json().error.code).toBe('forbidden_scope');
    expect(refused.json().error.details.required_scope).toBe('audit:read');
    const reader = await ctx.createKey(org.id, { scopes: ['audit:read'] });
    expect((await ctx.request('GET', '/v1/audit-events', { key: reader.key })).statusCode).toBe(200);
  });

  it("when another organisation's subject or API key is named, the answer is 404, and its events never appear in the list", async () => {
    const mine = await ctx.createOrg();
    const theirs = await ctx.createOrg();
    const theirEntity = await createEntity(ctx, theirs, { externalId: 'their-entity' });
    await sealer.sealOnce();
    const events = await walk(mine);
    expect(events.map((event) => event.action)).toEqual(['organisation.created', 'api_key.created']);
    expect(
      events.every((event) => event.subject.id !== theirs.id && event.subject.id !== theirEntity.id && event.subject.id !== theirs.keyId),
    ).toBe(true);
    for (const subject of [theirEntity.id as string, 'their-entity', theirs.keyId, theirs.id])
      expectNotFound(await list(mine, { subject_id: subject }));
    expectNotFound(await list(mine, { actor: theirs.keyId }));
    expectNotFound(await list(mine, { subject_id: '7b3c9d4e-1f2a-4b5c-8d6e-9f0a1b2c3d4e' }));
  });
});

describe('GET /v1/audit-events content', () => {
  it("when two organisations write interleaved, each one's event ids are its own numbering: they tell nothing of the other's writes", async () => {
    const createCustomer = async (org: TestOrg, n: number) => {
      const created = await ctx.request('POST', '/v1/customers', {
        key: org.key,
        body: { fullName: `Interleaved Person ${n}`, email: `interleaved.${n}.${org.id.slice(0, 8)}@example.com` },
      });
      expect(created.statusCode, created.body).toBe(201);
    };
    const busy = await ctx.createOrg();
    const quiet = await ctx.createOrg();
    // The busy organisation writes ten changes before each of the quiet one's two.
    for (const round of [1, 2]) {
      for (let n = 0; n < 10; n += 1) await createCustomer(busy, round * 100 + n);
      await createCustomer(quiet, round);
    }
    await sealer.sealOnce();
    // The same writes by an organisation alone in the world.
    const alone = await ctx.createOrg();
    for (const round of [1, 2]) await createCustomer(alone, round);
    await sealer.sealOnce();

    const quietEvents = await walk(quiet);
    const aloneEvents = await walk(alone);
    expect(quietEvents.map((event) => event.action)).toEqual(aloneEvents.map((event) => event.action));
    expect(quietEvents.map((event) => event.id)).toEqual(aloneEvents.map((event) => event.id));
    expect(quietEvents.map((event) => event.id)).toEqual(quietEvents.map((_, index) => String(index + 1)));
    for (const event of [...quietEvents, ...(await walk(busy))]) expect(event.id).toBe(String(event.sequence));
    // Not the rows' ids, which one sequence shared by every organisation draws.
    const { rows } = await ctx.database.pool.query<{ id: string }>(
      'SELECT id::text AS id FROM audit_log WHERE org_id = $1 ORDER BY sequence',
      [quiet.id],
    );
    expect(rows.map((row) => row.id)).not.toEqual(quietEvents.map((event) => event.id));
  });

  it('when a customer is created with an Idempotency-Key and then patched, each event names the actor and its key label, the subject, the changed fields old and new, the request id and the key', async () => {
    const org = await ctx.createOrg();
    const labelled = await testServices(ctx.database).apiKeys.create({
      orgId: org.id,
      scopes: ['customers:write'],
      label: 'CRM sync',
    });
    const created = await ctx.request('POST', '/v1/customers', {
      key: labelled.key,
      headers: { 'idempotency-key': 'create-ada-1', 'x-request-id': 'req-create-ada' },
      body: { externalId: 'crm-ada', fullName: 'Ada Lovelace', email: 'ada@example.com' },
    });
    expect(created.statusCode, created.body).toBe(201);
    const patched = await ctx.request('PATCH', '/v1/customers/crm-ada', { key: labelled.key, body: { email: 'ada.lovelace@example.com' } });
    expect(patched.statusCode, patched.body).toBe(200);
    await sealer.sealOnce();

    const events = await walk(org, { subject_id: 'crm-ada' });
    expect(events.map((event) => event.action)).toEqual(['customer.created', 'customer.patched']);
    const [creation, patch] = events as [AuditEvent, AuditEvent];
    expect(Object.keys(creation).sort()).toEqual(
      ['action', 'actor', 'changes', 'created_at', 'id', 'idempotency_key', 'request_id', 'sequence', 'subject'].sort(),
    );
    expect(creation).toMatchObject({
      actor: { type: 'api_key', id: labelled.id, key_label: 'CRM sync' },
      subject: { type: 'customer', id: created.json().id },
      request_id: 'req-create-ada',
      idempotency_key: 'create-ada-1',
    });
    expect(creation.id).toMatch(/^\d+$/);
    expect(Date.parse(creation.created_at)).not.toBeNaN();
    // A creation: every stored field, from null. Personal data as stored.
    expect(creation.changes.email).toEqual({ old: null, new: 'ada@example.com' });
    expect(creation.changes.name).toEqual({ old: null, new: 'Ada Lovelace' });
    expect(patch.sequence).toBeGreaterThan(creation.sequence);
    expect(patch.idempotency_key).toBeNull();
    expect(patch.request_id).toEqual(expect.any(String));
    expect(patch.changes).toEqual({ email: { old: 'ada@example.com', new: 'ada.lovelace@example.com' } });
    // The UUID names the same subject.
    expect((await walk(org, { subject_id: created.json().id })).map((event) => event.id)).toEqual(events.map((event) => event.id));
  });

  it('when a row is committed but not sealed, the list does not show it yet; the last resume_cursor then returns it once sealed', async () => {
    const org = await ctx.createOrg();
    await sealer.sealOnce();
    const first = await page(org);
    expect(first.data).toHaveLength(2);
    const created = await ctx.request('POST', '/v1/customers', {
      key: org.key,
      body: { fullName: 'Late Sealed', email: 'late@example.com' },
    });
    expect(created.statusCode).toBe(201);
    const before = await page(org, { cursor: first.resume_cursor });
    expect(before.data).toEqual([]);
    expect(before.resume_cursor).toBe(first.resume_cursor);
    await sealer.sealOnce();
    const after = await page(org, { cursor: first.resume_cursor });
    expect(after.data.map((event) => event.action)).toEqual(['customer.created']);
  });

  it('when secrets are made (an API key, a webhook signing secret, a verification link), none of them is stored in the trail or listed', async () => {
    const org = await ctx.createOrg({ credits: 10 });
    const key = await testServices(ctx.database).apiKeys.create(
      { orgId: org.id, scopes: ['customers:read'], label: 'secret check' },
      OPERATOR,
    );
    await testServices(ctx.database).apiKeys.revoke(key.id, OPERATOR);
    const endpoint = await testServices(ctx.database, { config: { webhookAllowPrivateUrls: true } }).webhooks.addEndpoint(
      { orgId: org.id, url: 'http://127.0.0.1:9/hooks' },
      OPERATOR,
    );
    const customer = await ctx.request('POST', '/v1/customers', {
      key: org.key,
      body: { externalId: 'crm-link', fullName: 'Link Person', email: 'link@example.com' },
    });
    expect(customer.statusCode).toBe(201);
    const started = await ctx.request('POST', '/v1/customers/crm-link/kyc', { key: org.key });
    expect(started.statusCode, started.body).toBe(200);
    await sealer.sealOnce();

    const { rows: hashes } = await ctx.database.pool.query('SELECT key_hash FROM api_keys WHERE org_id = $1', [org.id]);
    const tokens = [started.json<{ verification_link: string }>().verification_link.split('/').pop()!];
    const secrets = [key.key, endpoint.secret, org.key, ...hashes.map((row) => row.key_hash as string), ...tokens];
    expect(tokens.length).toBeGreaterThan(0);
    expect(secrets.every((secret) => typeof secret === 'string' && secret.length >= 16)).toBe(true);

    const { rows: stored } = await ctx.database.pool.query(
      'SELECT action, before::text AS before, after::text AS after FROM audit_log WHERE org_id = $1',
      [org.id],
    );
    expect(stored.map((row) => row.action)).toEqual(
      expect.arrayContaining(['api_key.created', 'api_key.revoked', 'webhook_endpoint.created', 'customer.kyc_started']),
    );
    const listed = JSON.stringify(await walk(org));
    for (const secret of secrets) {
      expect(stored.filter((row) => `${row.before} ${row.after}`.includes(secret))).toEqual([]);
      expect(listed.includes(secret)).toBe(false);
    }
  });
});

describe('GET /v1/audit-events filters and cursor', () => {
  /** An organisation with events by an API key, by the operator and by the system, about several subjects. */
  async function busyOrganisation() {
    const org = await ctx.createOrg();
    await ctx.request('POST', '/v1/customers', {
      key: org.key,
      body: { externalId: 'crm-1', fullName: 'One Person', email: 'one@example.com' },
    });
    await ctx.request('POST', '/v1/customers', {
      key: org.key,
      body: { externalId: 'crm-2', fullName: 'Two Person', email: 'two@example.com' },
    });
    await ctx.request('PATCH', '/v1/customers/crm-1', { key: org.key, body: { fullName: 'One M. Person' } });
    await testServices(ctx.database).organisations.update(org.id, { addCredits: 5 }, OPERATOR);
    await sealer.sealOnce();
    return org;
  }

  it('when filtering by actor, action, subject and creation time, only matching events come back', async () => {
    const org = await busyOrganisation();
    const all = await walk(org);
    expect(all.map((event) => event.action)).toEqual([
      'organisation.created',
      'api_key.created',
      'customer.created',
      'customer.created',
      'customer.patched',
      'organisation.updated',
    ]);
    expect(all.map((event) => event.sequence)).toEqual([1, 2, 3, 4, 5, 6]);

    expect((await walk(org, { actor: 'operator' })).map((event) => [event.action, event.actor.id])).toEqual([
      ['organisation.updated', 'cli:auditor'],
    ]);
    expect((await walk(org, { actor: 'system' })).map((event) => event.action)).toEqual(['organisation.created', 'api_key.created']);
    expect((await walk(org, { actor: org.keyId })).map((event) => event.action)).toEqual([
      'customer.created',
      'customer.created',
      'customer.patched',
    ]);
    expect((await walk(org, { action: 'customer.patched,organisation.updated' })).map((event) => event.sequence)).toEqual([5, 6]);
    expect((await walk(org, { subject_id: 'crm-1' })).map((event) => event.sequence)).toEqual([3, 5]);
    expect((await walk(org, { subject_id: org.keyId })).map((event) => event.action)).toEqual(['api_key.created']);
    const third = all[2]!;
    const fifth = all[4]!;
    expect(
      (await walk(org, { created_after: third.created_at })).every((event) => Date.parse(event.created_at) > Date.parse(third.created_at)),
    ).toBe(true);
    expect(
      (await walk(org, { created_before: fifth.created_at })).every((event) => Date.parse(event.created_at) < Date.parse(fifth.created_at)),
    ).toBe(true);
    expect((await walk(org, { created_before: fifth.created_at })).map((event) => event.sequence)).toContain(3);
  });

  it('when paging with limit, the cursor walks every event once in sequence order; with other filters or tampered it is refused with 422 on cursor', async () => {
    const org = await busyOrganisation();
    const first = await page(org, { limit: '4' });
    expect(first).toMatchObject({ object: 'list', has_more: true, limit: 4 });
    const second = await page(org, { limit: '4', cursor: first.next_cursor! });
    expect(second).toMatchObject({ has_more: false, next_cursor: null });
    expect([...first.data, ...second.data].map((event) => event.sequence)).toEqual([1, 2, 3, 4, 5, 6]);

    expectInvalid(await list(org, { cursor: first.resume_cursor, action: 'customer.created' }), 'cursor');
    const [payload, mac] = first.resume_cursor.split('.');
    const forged = Buffer.from(JSON.stringify({ s: 0, f: JSON.parse(Buffer.from(payload!, 'base64url').toString()).f })).toString(
      'base64url',
    );
    expectInvalid(await list(org, { cursor: `${forged}.${mac}` }), 'cursor');
    expectInvalid(await list(org, { cursor: 'not-a-cursor' }), 'cursor');
  });

  it('when the last page is read, next_cursor is null and resume_cursor is not; polling with resume_cursor later returns only the newer events', async () => {
    const org = await busyOrganisation();
    const first = await page(org, { limit: '4' });
    expect(first).toMatchObject({ has_more: true });
    // While another page exists, next_cursor fetches it, and is where a poll would resume.
    expect(first.next_cursor).toBe(first.resume_cursor);
    const last = await page(org, { limit: '4', cursor: first.next_cursor! });
    expect(last.data.map((event) => event.sequence)).toEqual([5, 6]);
    expect(last).toMatchObject({ has_more: false, next_cursor: null });
    expect(last.resume_cursor).toEqual(expect.any(String));

    // Nothing new yet: an empty page hands back the same resume_cursor, still with next_cursor null.
    const atEnd = await page(org, { cursor: last.resume_cursor });
    expect(atEnd).toMatchObject({ data: [], has_more: false, next_cursor: null, resume_cursor: last.resume_cursor });
    const created = await ctx.request('POST', '/v1/customers', {
      key: org.key,
      body: { fullName: 'Newer One', email: 'newer@example.com' },
    });
    expect(created.statusCode).toBe(201);
    await sealer.sealOnce();
    const poll = await page(org, { cursor: atEnd.resume_cursor });
    expect(poll.data.map((event) => [event.sequence, event.action])).toEqual([[7, 'customer.created']]);
    expect(poll).toMatchObject({ has_more: false, next_cursor: null });
  });

  it('when a filter value is malformed, the answer is 422 naming it', async () => {
    const org = await ctx.createOrg();
    expectInvalid(await list(org, { actor: 'somebody' }), 'actor');
    expectInvalid(await list(org, { action: 'Customer Created' }), 'action');
    expectInvalid(await list(org, { created_after: 'yesterday' }), 'created_after');
    expectInvalid(await list(org, { unknown: 'x' }), 'unknown');
  });
});
