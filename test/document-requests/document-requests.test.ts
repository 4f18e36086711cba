import { createHash } from 'node:crypto';
import { eq } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { customers } from '../../src/db/schema.js';
import { createEventsFeedSealer, type EventsFeedSealer } from '../../src/modules/events/events-feed.sealer.js';
import { createTestContext, type TestContext, type TestOrg, testServices } from '../helpers/harness.js';
import { auditOf, balanceOf, createEntity, errorOf, eventsOf, ledgerOf } from '../verification/verification-fixtures.js';
import { createRequest, emailsTo, makeOverdue, openRequest, requestRow, requestsOf, tokensOf } from './document-requests-fixtures.js';

let ctx: TestContext;
let sealer: EventsFeedSealer;
beforeAll(async () => {
  ctx = await createTestContext();
  sealer = createEventsFeedSealer({ database: ctx.database, pollIntervalMs: 60_000 });
});
afterAll(async () => {
  await sealer?.stop();
  await ctx?.close();
});

const DAY = 86_400_000;
const inDays = (days: number) => new Date(Date.now() + days * DAY).toISOString();
const LINK = /^https:\/\/app\.example\.test\/documents\/[A-Za-z0-9_-]{43}$/;

/** Nothing of a refused request exists: no request, token, ledger row, email or event; the balance as before. */
async function expectNothingWritten(org: TestOrg, credits: number) {
  expect(await requestsOf(ctx, org.id)).toEqual([]);
  expect(await tokensOf(ctx, org.id)).toEqual([]);
  expect(await ledgerOf(ctx, org.id)).toEqual([]);
  expect(await emailsTo(ctx, org.id)).toEqual([]);
  expect(await eventsOf(ctx, org.id, 'document_request.updated')).toEqual([]);
  expect(await balanceOf(ctx, org.id)).toBe(credits);
}

describe('POST /v1/entities/{id}/document-requests', () => {
  it('when the organisation pays, it charges 1 credit (ledger reason document_request), emails the contact the link, and answers 201 with upload_url', async () => {
    const org = await ctx.createOrg({ credits: 5 });
    const entity = await createEntity(ctx, org);
    const dueAt = inDays(10);
    const response = await createRequest(ctx, org, entity.id, {
      types: ['CERTIFICATE_OF_REGISTRATION', 'ID_OF_OFFICEHOLDER', 'CERTIFICATE_OF_REGISTRATION'],
      message: 'Please upload before settlement.',
      dueAt,
    });
    expect(response.statusCode, response.body).toBe(201);
    const body = response.json();
    expect(body).toMatchObject({
      object: 'document_request',
      entity_id: entity.id,
      // Duplicates count once, in the order first named.
      types: ['CERTIFICATE_OF_REGISTRATION', 'ID_OF_OFFICEHOLDER'],
      message: 'Please upload before settlement.',
      due_at: dueAt,
      status: 'OPEN',
      payer: 'organization',
      received_types: [],
      document_ids: [],
      fulfilled_at: null,
      expired_at: null,
    });
    expect(body.upload_url).toMatch(LINK);

    expect(await balanceOf(ctx, org.id)).toBe(4);
    const ledger = await ledgerOf(ctx, org.id);
    expect(ledger).toHaveLength(1);
    expect(ledger[0]).toMatchObject({ delta: -1, reason: 'document_request', documentRequestId: body.id });
    expect(await requestRow(ctx, body.id)).toMatchObject({
      cost: 1,
      payer: 'organization',
      recipientEmail: entity.contactEmail,
      apiKeyId: org.keyId,
    });

    const [email] = await emailsTo(ctx, org.id);
    expect(email!.recipient).toBe(entity.contactEmail);
    expect(email!.subject).toBe(`Documents requested for ${entity.dto.name}`);
    expect(email!.link).toBe(body.upload_url);
    expect(email!.body).toContain(body.upload_url);
    expect(email!.body).toContain('Certificate of registration');
    expect(email!.body).toContain('Identity document of an officeholder');
    expect(email!.body).toContain('Please upload before settlement.');
    expect(email!.body).toContain(new Date(dueAt).toUTCString());
  });

  it('when a request is made, the token is stored only as its SHA-256 in the directory, nowhere in the request row', async () => {
    const org = await ctx.createOrg();
    const entity = await createEntity(ctx, org);
    const { dto, token } = await openRequest(ctx, org, entity.id);
    const tokens = await tokensOf(ctx, org.id);
    expect(tokens).toEqual([{ tokenHash: createHash('sha256').update(token).digest('hex'), orgId: org.id, documentRequestId: dto.id }]);
    const { rows } = await ctx.database.pool.query('SELECT row_to_json(r)::text AS json FROM document_requests r WHERE id = $1', [dto.id]);
    expect(rows[0].json).not.toContain(token);
  });

  it('when the request is made, the audit row entity.documents_requested and the credit charge are written with the acting key', async () => {
    const org = await ctx.createOrg();
    const entity = await createEntity(ctx, org);
    const { dto } = await openRequest(ctx, org, entity.id);
    const [row] = await auditOf(ctx, org.id, entity.id, 'entity.documents_requested');
    expect(row).toMatchObject({ actorType: 'api_key', actorId: org.keyId, subjectType: 'entity' });
    expect(row!.after).toMatchObject({ id: dto.id, status: 'OPEN' });
    expect(JSON.stringify(row!.after)).not.toContain('upload_url');
    expect(await auditOf(ctx, org.id, org.id, 'organisation.credits_charged')).toHaveLength(1);
  });

  it('when the request is made, a document_request.updated event (OPEN, no upload_url) is written with customer_id the entity', async () => {
    const org = await ctx.createOrg();
    const entity = await createEntity(ctx, org);
    const { dto } = await openRequest(ctx, org, entity.id);
    const [event] = await eventsOf(ctx, org.id, 'document_request.updated');
    expect(event!.customerId).toBe(entity.id);
    const document = event!.document as unknown as { type: string; data: { document_request: Record<string, unknown> } };
    expect(document.type).toBe('document_request.updated');
    expect(document.data.document_request).toMatchObject({ id: dto.id, status: 'OPEN', entity_id: entity.id });
    expect(document.data.document_request).not.toHaveProperty('upload_url');
  });

  it('when the feed is filtered by type document_request.updated and the entity as customer_id, it shows the event', async () => {
    const org = await ctx.createOrg();
    const entity = await createEntity(ctx, org);
    const { dto } = await openRequest(ctx, org, entity.id);
    await sealer.sealOnce();
    const response = await ctx.request('GET', '/v1/events', {
      key: org.key,
      query: { type: 'document_request.updated', customer_id: entity.id },
    });
    expect(response.statusCode, response.body).toBe(200);
    const data = response.json().data as Array<{ type: string; data: { document_request: { id: string } } }>;
    expect(data.map((event) => [event.type, event.data.document_request.id])).toEqual([['document_request.updated', dto.id]]);
  });

  it('when a webhook endpoint subscribes to document_request.updated only, a request queues a delivery to it', async () => {
    const org = await ctx.createOrg();
    const response = await ctx.request('POST', '/v1/webhook-endpoints', {
      key: org.key,
      body: { url: 'https://93.184.215.14/hooks/documents', events: ['document_request.updated'] },
    });
    expect(response.statusCode, response.body).toBe(201);
    const entity = await createEntity(ctx, org);
    await openRequest(ctx, org, entity.id);
    const { rows } = await ctx.database.pool.query(
      `SELECT e.type FROM webhook_deliveries d JOIN outbox_events e ON e.org_id = d.org_id AND e.id = d.event_id WHERE d.org_id = $1`,
      [org.id],
    );
    expect(rows.map((row) => row.type)).toEqual(['document_request.updated']);
  });

  it('when the organisation has too few credits, it answers 402 and writes nothing: no request, token, ledger row, email or event', async () => {
    const org = await ctx.createOrg({ credits: 0 });
    const entity = await createEntity(ctx, org);
    const response = await createRequest(ctx, org, entity.id, { types: ['OTHER'] });
    expect(response.statusCode, response.body).toBe(402);
    expect(errorOf(response)).toMatchObject({ code: 'insufficient_credits', details: { required: 1, available: 0 } });
    await expectNothingWritten(org, 0);
  });

  it('when payer is customer, it answers 422 on payer and writes nothing: no request, token, ledger row, email or event (documents have no pay-link lane)', async () => {
    const org = await ctx.createOrg({ credits: 0 });
    const entity = await createEntity(ctx, org);
    const response = await createRequest(ctx, org, entity.id, { types: ['OTHER'], payer: 'customer' });
    expect(response.statusCode, response.body).toBe(422);
    expect(errorOf(response).details!.issues!.payer).toEqual([expect.stringMatching(/cannot be paid by the customer/)]);
    await expectNothingWritten(org, 0);
  });

  it("when payer is omitted, the entity's default payer applies, else the organisation's; a customer default is refused on payer", async () => {
    const org = await ctx.createOrg({ credits: 3, defaultPayer: 'customer' });
    const entity = await createEntity(ctx, org);
    const byOrganisationDefault = await createRequest(ctx, org, entity.id, { types: ['OTHER'] });
    expect(byOrganisationDefault.statusCode, byOrganisationDefault.body).toBe(422);
    expect(errorOf(byOrganisationDefault).details!.issues!.payer).toEqual([
      expect.stringMatching(/billing default for this entity is the customer/),
    ]);
    await expectNothingWritten(org, 3);
    await ctx.database.db.update(customers).set({ defaultPayer: 'organization' }).where(eq(customers.id, entity.id));
    const byEntityDefault = await createRequest(ctx, org, entity.id, { types: ['OTHER'] });
    expect(byEntityDefault.json().payer).toBe('organization');
    expect(await balanceOf(ctx, org.id)).toBe(2);
    await ctx.database.db.update(customers).set({ defaultPayer: 'customer' }).where(eq(customers.id, entity.id));
    const explicit = await createRequest(ctx, org, entity.id, { types: ['OTHER'], payer: 'organization' });
    expect(explicit.statusCode, explicit.body).toBe(201);
    expect(await balanceOf(ctx, org.id)).toBe(1);
  });

  it('when the entity has no contact with an email, it answers 422 on contact and writes nothing', async () => {
    const org = await ctx.createOrg({ credits: 5 });
    const entity = await createEntity(ctx, org, { contact: false });
    const response = await createRequest(ctx, org, entity.id, { types: ['OTHER'] });
    expect(response.statusCode, response.body).toBe(422);
    expect(Object.keys(errorOf(response).details!.issues!)).toEqual(['contact']);
    await expectNothingWritten(org, 5);
  });

  it("when a type is outside the catalogue's usual entity types (a trust deed of a company, as a corporate trustee holds), it is still requested", async () => {
    const org = await ctx.createOrg({ credits: 5 });
    const entity = await createEntity(ctx, org);
    const response = await createRequest(ctx, org, entity.id, { types: ['TRUST_DEED'] });
    expect(response.statusCode, response.body).toBe(201);
    expect(response.json().types).toEqual(['TRUST_DEED']);
  });

  describe('validation (422, nothing written)', () => {
    const cases: Array<[string, Record<string, unknown>, string]> = [
      ['an unknown type', { types: ['PASSPORT'] }, 'types[0]'],
      ['empty types', { types: [] }, 'types'],
      ['no types', {}, 'types'],
      ['dueAt in the past', { types: ['OTHER'], dueAt: new Date(Date.now() - DAY).toISOString() }, 'dueAt'],
      ['dueAt more than 365 days ahead', { types: ['OTHER'], dueAt: inDays(366) }, 'dueAt'],
      ['dueAt that is not ISO 8601', { types: ['OTHER'], dueAt: 'next friday' }, 'dueAt'],
      ['a message over 2000 characters', { types: ['OTHER'], message: 'x'.repeat(2001) }, 'message'],
      ['an unknown property', { types: ['OTHER'], uploadUrl: 'https://evil.example' }, 'uploadUrl'],
      ['an unknown payer', { types: ['OTHER'], payer: 'someone' }, 'payer'],
    ];
    it.each(cases)('when the body has %s, it answers 422 naming the field', async (_name, body, field) => {
      const org = await ctx.createOrg({ credits: 5 });
      const entity = await createEntity(ctx, org);
      const response = await createRequest(ctx, org, entity.id, body);
      expect(response.statusCode, response.body).toBe(422);
      expect(Object.keys(errorOf(response).details!.issues!)).toEqual([field]);
      await expectNothingWritten(org, 5);
    });

    it('when dueAt is omitted, the request is due in 14 days; when it is 364 days ahead, it is accepted', async () => {
      const org = await ctx.createOrg();
      const entity = await createEntity(ctx, org);
      const defaulted = await createRequest(ctx, org, entity.id, { types: ['OTHER'] });
      expect(Math.abs(Date.parse(defaulted.json().due_at) - (Date.now() + 14 * DAY))).toBeLessThan(60_000);
      const far = await createRequest(ctx, org, entity.id, { types: ['OTHER'], dueAt: inDays(364) });
      expect(far.statusCode, far.body).toBe(201);
    });
  });

  it('when the same Idempotency-Key is sent twice, one request is made and charged, and the replay answers the same', async () => {
    const org = await ctx.createOrg({ credits: 5 });
    const entity = await createEntity(ctx, org);
    const headers = { 'idempotency-key': `dr-${Math.random()}` };
    const first = await createRequest(ctx, org, entity.id, { types: ['OTHER'] }, headers);
    const second = await createRequest(ctx, org, entity.id, { types: ['OTHER'] }, headers);
    expect(first.statusCode).toBe(201);
    expect(second.statusCode).toBe(201);
    expect(second.headers['idempotent-replayed']).toBe('true');
    expect(second.json()).toEqual(first.json());
    expect(await requestsOf(ctx, org.id)).toHaveLength(1);
    expect(await balanceOf(ctx, org.id)).toBe(4);
  });

  it("when another organisation's key names the entity, create and list answer 404 and nothing is written", async () => {
    const owner = await ctx.createOrg();
    const other = await ctx.createOrg({ credits: 5 });
    const entity = await createEntity(ctx, owner);
    const create = await createRequest(ctx, other, entity.id, { types: ['OTHER'] });
    expect(create.statusCode).toBe(404);
    const list = await ctx.request('GET', `/v1/entities/${entity.id}/document-requests`, { key: other.key });
    expect(list.statusCode).toBe(404);
    await expectNothingWritten(other, 5);
    expect(await requestsOf(ctx, owner.id)).toEqual([]);
  });

  it('when the key lacks verification:write, it answers 403', async () => {
    const org = await ctx.createOrg();
    const entity = await createEntity(ctx, org);
    const reader = await ctx.createKey(org.id, { scopes: ['customers:read'] });
    const response = await ctx.request('POST', `/v1/entities/${entity.id}/document-requests`, {
      key: reader.key,
      body: { types: ['OTHER'] },
    });
    expect(response.statusCode).toBe(403);
  });
});

describe('GET /v1/entities/{id}/document-requests', () => {
  it('when an entity has requests, it lists them oldest first without upload_url, by UUID or external_id', async () => {
    const org = await ctx.createOrg();
    const entity = await createEntity(ctx, org);
    const first = await openRequest(ctx, org, entity.id, { types: ['OTHER'] });
    const second = await openRequest(ctx, org, entity.id, { types: ['COMPANY_EXTRACT'] });
    const reader = await ctx.createKey(org.id, { scopes: ['customers:read'] });
    const response = await ctx.request('GET', `/v1/entities/${entity.id}/document-requests`, { key: reader.key });
    expect(response.statusCode, response.body).toBe(200);
    const body = response.json();
    expect(body.object).toBe('list');
    expect(body.data.map((row: { id: string }) => row.id)).toEqual([first.dto.id, second.dto.id]);
    expect(response.body).not.toContain('upload_url');
    expect(response.body).not.toContain(first.token);

    await ctx.database.db.update(customers).set({ externalId: 'crm-doc-entity' }).where(eq(customers.id, entity.id));
    const byExternal = await ctx.request('GET', '/v1/entities/crm-doc-entity/document-requests', { key: org.key });
    expect(byExternal.json().data).toHaveLength(2);
  });

  it('when the entity has no requests, it answers an empty list; an unknown entity is 404', async () => {
    const org = await ctx.createOrg();
    const entity = await createEntity(ctx, org);
    expect((await ctx.request('GET', `/v1/entities/${entity.id}/document-requests`, { key: org.key })).json()).toEqual({
      object: 'list',
      data: [],
    });
    expect((await ctx.request('GET', `/v1/entities/${crypto.randomUUID()}/document-requests`, { key: org.key })).statusCode).toBe(404);
  });
});

describe('expiry', () => {
  it('when an OPEN request is past due, the job expires it: EXPIRED, expired_at, token deleted, audit row by the system, event', async () => {
    const org = await ctx.createOrg();
    const entity = await createEntity(ctx, org);
    const due = await openRequest(ctx, org, entity.id, { types: ['OTHER'] });
    const notDue = await openRequest(ctx, org, entity.id, { types: ['OTHER'] });
    await makeOverdue(ctx, due.dto.id);
    const service = testServices(ctx.database, { jobs: ctx.app.deps.jobs }).documentRequests;
    expect(await service.expireDue()).toBeGreaterThanOrEqual(1);

    const row = await requestRow(ctx, due.dto.id);
    expect(row.status).toBe('EXPIRED');
    expect(row.expiredAt).not.toBeNull();
    expect((await requestRow(ctx, notDue.dto.id)).status).toBe('OPEN');
    expect((await tokensOf(ctx, org.id)).map((token) => token.documentRequestId)).toEqual([notDue.dto.id]);
    const [audit] = await auditOf(ctx, org.id, due.dto.id, 'document_request.expired');
    expect(audit).toMatchObject({ actorType: 'system', subjectType: 'document_request' });
    const events = (await eventsOf(ctx, org.id, 'document_request.updated')).map((event) => (event.document as any).data.document_request);
    expect(events.filter((dto: { id: string }) => dto.id === due.dto.id).map((dto: { status: string }) => dto.status)).toEqual([
      'OPEN',
      'EXPIRED',
    ]);

    // A second pass finds nothing more to do.
    await service.expireDue();
    expect((await eventsOf(ctx, org.id, 'document_request.updated')).length).toBe(events.length);
  });

  it('when the job runs with a small batch over several organisations, every due request expires', async () => {
    const orgs = await Promise.all([ctx.createOrg(), ctx.createOrg()]);
    const ids: string[] = [];
    for (const org of orgs) {
      const entity = await createEntity(ctx, org);
      for (let index = 0; index < 3; index += 1) ids.push((await openRequest(ctx, org, entity.id, { types: ['OTHER'] })).dto.id);
    }
    for (const id of ids) await makeOverdue(ctx, id);
    const service = testServices(ctx.database, { jobs: ctx.app.deps.jobs }).documentRequests;
    await service.expireDue({ batchSize: 2 });
    for (const id of ids) expect((await requestRow(ctx, id)).status).toBe('EXPIRED');
  });

  it('when two expiry passes run at once (two instances), each request expires once', async () => {
    const org = await ctx.createOrg();
    const entity = await createEntity(ctx, org);
    const ids: string[] = [];
    for (let index = 0; index < 6; index += 1) ids.push((await openRequest(ctx, org, entity.id, { types: ['OTHER'] })).dto.id);
    for (const id of ids) await makeOverdue(ctx, id);
    const make = () => testServices(ctx.database, { jobs: ctx.app.deps.jobs }).documentRequests;
    const [a, b] = await Promise.all([make().expireDue({ batchSize: 2 }), make().expireDue({ batchSize: 2 })]);
    expect(a + b).toBeGreaterThanOrEqual(6);
    const expiredAudit = await Promise.all(ids.map((id) => auditOf(ctx, org.id, id, 'document_request.expired')));
    expect(expiredAudit.map((rows) => rows.length)).toEqual(ids.map(() => 1));
  });
});
