import type { Tx } from '../../db/client.js';
import { and, eq } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  auditLog,
  creditLedger,
  customers,
  emails,
  groupParties,
  groups,
  groupTemplates,
  organisations,
  outboxEvents,
  verifications,
} from '../../db/schema.js';
import { createTestContext, type TestContext, type TestOrg, testServices } from '../../../test/helpers/harness.js';
import { CURATED_TEMPLATES } from './curated-templates.js';

const CURATED_CODES = CURATED_TEMPLATES.map((template) => template.code);

let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

async function insertCustomer(
  orgId: string,
  values: { kind: 'individual' | 'entity'; name: string; externalId?: string },
): Promise<string> {
  const [row] = await ctx.database.db
    .insert(customers)
    .values({
      orgId,
      kind: values.kind,
      type: values.kind === 'individual' ? 'INDIVIDUAL' : 'COMPANY',
      name: values.name,
      externalId: values.externalId,
      kycStatus: 'NOT_REQUIRED',
      addedVia: 'INTEGRATION',
    })
    .returning({ id: customers.id });
  return row!.id;
}

async function templatesOf(org: TestOrg) {
  const response = await ctx.request('GET', '/v1/group-templates', { key: org.key });
  expect(response.statusCode).toBe(200);
  return response.json<{ data: Array<{ id: string; code: string; roles: unknown[]; industry: string }> }>().data;
}

async function groupCount(orgId: string): Promise<number> {
  return ctx.database.db.$count(groups, eq(groups.orgId, orgId));
}

describe('GET /v1/group-templates', () => {
  it('when two organisations list templates, each gets its own copies: same codes, different ids', async () => {
    const first = await ctx.createOrg({ features: ['groups'] });
    const second = await ctx.createOrg({ features: ['groups'] });
    const a = await templatesOf(first);
    const b = await templatesOf(second);

    expect(a.map((template) => template.code)).toEqual([...CURATED_CODES].sort());
    expect(b.map((template) => template.code)).toEqual(a.map((template) => template.code));
    const idsOfB = new Set(b.map((template) => template.id));
    for (const template of a) expect(idsOfB.has(template.id)).toBe(false);
  });

  it('when the curated set is listed, it covers the designated-service deals with the documented shape', async () => {
    const org = await ctx.createOrg({ features: ['groups'] });
    const response = await ctx.request('GET', '/v1/group-templates', { key: org.key });
    const body = response.json<{ object: string; data: Array<Record<string, unknown>> }>();
    expect(body.object).toBe('list');
    for (const code of [
      'PB-PROPERTY-SALE',
      'PB-PROPERTY-PURCHASE',
      'PB-CONVEYANCING-SALE',
      'PB-COMPANY-FORMATION',
      'PB-TRUST-ESTABLISHMENT',
      'PB-LENDING-DEAL',
    ]) {
      expect(body.data.map((template) => template.code)).toContain(code);
    }
    const sale = body.data.find((template) => template.code === 'PB-PROPERTY-SALE')!;
    expect(sale).toEqual({
      id: expect.stringMatching(UUID),
      code: 'PB-PROPERTY-SALE',
      name: expect.any(String),
      description: expect.any(String),
      industry: 'REAL_ESTATE',
      source: 'PRE_BUILT',
      is_verified: true,
      roles: expect.arrayContaining([{ role_label: 'Vendor', party_type: 'EITHER', required: true, check_trigger: 'ON_ADD' }]),
    });
    for (const template of body.data) {
      expect(template.source).toBe('PRE_BUILT');
      expect(template.is_verified).toBe(true);
      for (const role of template.roles as Array<Record<string, unknown>>) {
        expect(['INDIVIDUAL', 'ENTITY', 'EITHER']).toContain(role.party_type);
        expect(['ON_ADD', 'BEFORE_SETTLEMENT', 'MANUAL']).toContain(role.check_trigger);
      }
    }
  });

  it('when an organisation lists again, the sync adds nothing and the ids stay the same', async () => {
    const org = await ctx.createOrg({ features: ['groups'] });
    const before = await templatesOf(org);
    const again = await ctx.request('GET', '/v1/group-templates', { key: org.key }, await ctx.buildInstance());
    expect(again.json<{ data: Array<{ id: string }> }>().data.map((template) => template.id)).toEqual(
      before.map((template) => template.id),
    );
    expect(await ctx.database.db.$count(groupTemplates, eq(groupTemplates.orgId, org.id))).toBe(CURATED_CODES.length);
  });

  it('when custom templates exist, they follow the curated ones in creation order and stay in their organisation', async () => {
    const org = await ctx.createOrg({ features: ['groups'] });
    const other = await ctx.createOrg({ features: ['groups'] });
    const service = testServices(ctx.database).groups;
    const operator = { type: 'operator' as const, id: 'cli:test' };
    const role = { roleLabel: 'Client', partyType: 'INDIVIDUAL' };
    await service.createCustomTemplate(org.id, { code: 'zz-first', name: 'First', industry: 'LEGAL', roles: [role] }, operator);
    await service.createCustomTemplate(org.id, { code: 'aa-second', name: 'Second', industry: 'LEGAL', roles: [role] }, operator);

    const listed = await templatesOf(org);
    expect(listed.map((template) => template.code)).toEqual([...[...CURATED_CODES].sort(), 'zz-first', 'aa-second']);
    expect(listed.at(-1)).toMatchObject({
      source: 'CUSTOM',
      is_verified: false,
      description: '',
      roles: [{ role_label: 'Client', party_type: 'INDIVIDUAL', required: true, check_trigger: 'ON_ADD' }],
    });
    expect((await templatesOf(other)).map((template) => template.code)).not.toContain('zz-first');
  });

  it('when the curated content changes, existing organisations get the new content and unchanged copies are not rewritten', async () => {
    const org = await ctx.createOrg({ features: ['groups'] });
    const original = await templatesOf(org);
    const stamp = async (code: string) =>
      (
        await ctx.database.db
          .select()
          .from(groupTemplates)
          .where(and(eq(groupTemplates.orgId, org.id), eq(groupTemplates.code, code)))
      )[0]!;
    const untouchedBefore = await stamp('PB-LENDING-DEAL');

    // A deploy that edits one template, adds one and retires one.
    const edited = CURATED_TEMPLATES.filter((template) => template.code !== 'PB-SMSF-ESTABLISHMENT').map((template) =>
      template.code === 'PB-PROPERTY-SALE' ? { ...template, name: 'Property sale (agency, v2)' } : template,
    );
    edited.push({ ...CURATED_TEMPLATES[0]!, code: 'PB-NEW-ONE', name: 'New one' });
    const deployed = testServices(ctx.database, { curatedTemplates: edited }).groups;
    const caller = {
      orgId: org.id,
      features: new Set(['groups']),
      actor: { type: 'system' as const, id: null },
      transaction: <T>(work: (tx: Tx) => Promise<T>) => ctx.database.transaction(work),
    };
    const listed = await deployed.listTemplates(caller);

    expect(listed.find((template) => template.code === 'PB-PROPERTY-SALE')).toMatchObject({
      id: original.find((template) => template.code === 'PB-PROPERTY-SALE')!.id,
      name: 'Property sale (agency, v2)',
    });
    expect(listed.map((template) => template.code)).toContain('PB-NEW-ONE');
    expect(listed.map((template) => template.code)).not.toContain('PB-SMSF-ESTABLISHMENT');
    expect((await stamp('PB-LENDING-DEAL')).updatedAt).toEqual(untouchedBefore.updatedAt);

    const retired = original.find((template) => template.code === 'PB-SMSF-ESTABLISHMENT')!;
    await expect(deployed.createGroup(caller, { name: 'Fund', templateId: retired.id })).rejects.toMatchObject({ code: 'not_found' });
  });

  it('when a curated copy was altered behind a running process, that process keeps its memo and a newly started instance restores it', async () => {
    const org = await ctx.createOrg({ features: ['groups'] });
    await templatesOf(org);
    await ctx.database.db
      .update(groupTemplates)
      .set({ name: 'stale', roles: [] })
      .where(and(eq(groupTemplates.orgId, org.id), eq(groupTemplates.code, 'PB-TRUST-ESTABLISHMENT')));
    // The running instance does not re-sync on every request.
    expect((await templatesOf(org)).find((template) => template.code === 'PB-TRUST-ESTABLISHMENT')).toMatchObject({ name: 'stale' });

    const restarted = await ctx.buildInstance();
    const response = await ctx.request('GET', '/v1/group-templates', { key: org.key }, restarted);
    const trust = response
      .json<{ data: Array<{ code: string; name: string; roles: unknown[] }> }>()
      .data.find((template) => template.code === 'PB-TRUST-ESTABLISHMENT')!;
    expect(trust.name).toBe('Trust establishment');
    expect(trust.roles.length).toBeGreaterThan(0);
  });
});

describe('POST /v1/groups', () => {
  let org: TestOrg;
  beforeAll(async () => {
    org = await ctx.createOrg({ features: ['groups'], credits: 7 });
  });

  it('when created from a template, its roles become empty party slots and the template industry is copied', async () => {
    const template = (await templatesOf(org)).find((candidate) => candidate.code === 'PB-PROPERTY-SALE')!;
    const response = await ctx.request('POST', '/v1/groups', {
      key: org.key,
      body: { name: '12 Harbour St, Sydney', reference: 'LISTING-1', templateId: template.id },
    });
    expect(response.statusCode).toBe(201);
    const group = response.json();
    expect(group).toEqual({
      id: expect.stringMatching(UUID),
      name: '12 Harbour St, Sydney',
      reference: 'LISTING-1',
      status: 'ACTIVE',
      template_id: template.id,
      industry: 'REAL_ESTATE',
      parties: (template.roles as Array<{ role_label: string; party_type: string; required: boolean }>).map((role) => ({
        id: expect.stringMatching(UUID),
        role_label: role.role_label,
        party_type: role.party_type,
        required: role.required,
        customer_id: null,
      })),
      url: `https://app.example.test/groups/${group.id}`,
      created_at: expect.any(String),
      updated_at: expect.any(String),
    });
    const stored = await ctx.database.db.select().from(groupParties).where(eq(groupParties.groupId, group.id));
    expect(stored.map((party) => party.checkTrigger).sort()).toEqual(
      (template.roles as Array<{ check_trigger: string }>).map((role) => role.check_trigger).sort(),
    );
  });

  it('when parties are given, customers are attached by customerId and by customerExternalId, in order', async () => {
    const person = await insertCustomer(org.id, { kind: 'individual', name: 'Jane Citizen' });
    const company = await insertCustomer(org.id, { kind: 'entity', name: 'Acme Pty Ltd', externalId: 'crm-acme' });
    const response = await ctx.request('POST', '/v1/groups', {
      key: org.key,
      body: {
        name: 'Acme loan',
        parties: [
          { roleLabel: 'Borrower', partyType: 'ENTITY', customerExternalId: 'crm-acme' },
          { roleLabel: 'Guarantor', partyType: 'INDIVIDUAL', required: false, customerId: person },
          { roleLabel: 'Security provider' },
        ],
      },
    });
    expect(response.statusCode).toBe(201);
    const group = response.json();
    expect(group).toMatchObject({ reference: null, template_id: null, industry: null, status: 'ACTIVE' });
    expect(group.parties).toEqual([
      { id: expect.stringMatching(UUID), role_label: 'Borrower', party_type: 'ENTITY', required: true, customer_id: company },
      { id: expect.stringMatching(UUID), role_label: 'Guarantor', party_type: 'INDIVIDUAL', required: false, customer_id: person },
      { id: expect.stringMatching(UUID), role_label: 'Security provider', party_type: 'EITHER', required: true, customer_id: null },
    ]);
  });

  it('when neither templateId nor parties is given, the group has no parties', async () => {
    const response = await ctx.request('POST', '/v1/groups', { key: org.key, body: { name: 'Bare matter' } });
    expect(response.statusCode).toBe(201);
    expect(response.json()).toMatchObject({ parties: [], template_id: null, industry: null, reference: null });
  });

  it('when a party names an unknown customer, it answers 422 keyed by the item and creates nothing', async () => {
    const known = await insertCustomer(org.id, { kind: 'individual', name: 'Known Person' });
    const before = await groupCount(org.id);
    const response = await ctx.request('POST', '/v1/groups', {
      key: org.key,
      body: {
        name: 'Broken',
        parties: [
          { roleLabel: 'A', customerId: known },
          { roleLabel: 'B', customerExternalId: 'no-such-crm-id' },
          { roleLabel: 'C', customerId: '00000000-0000-4000-8000-000000000000' },
        ],
      },
    });
    expect(response.statusCode).toBe(422);
    const error = response.json().error;
    expect(error.code).toBe('validation_failed');
    expect(Object.keys(error.details.issues).sort()).toEqual(['parties[1].customerExternalId', 'parties[2].customerId']);
    expect(await groupCount(org.id)).toBe(before);
  });

  it("when a party names another organisation's customer, it is unknown (422)", async () => {
    const stranger = await ctx.createOrg({ features: ['groups'] });
    const theirs = await insertCustomer(stranger.id, { kind: 'individual', name: 'Their Person', externalId: 'shared-crm-id' });
    const byId = await ctx.request('POST', '/v1/groups', {
      key: org.key,
      body: { name: 'X', parties: [{ roleLabel: 'A', customerId: theirs }] },
    });
    expect(byId.statusCode).toBe(422);
    expect(byId.json().error.details.issues).toHaveProperty(['parties[0].customerId']);
    const byExternalId = await ctx.request('POST', '/v1/groups', {
      key: org.key,
      body: { name: 'X', parties: [{ roleLabel: 'A', customerExternalId: 'shared-crm-id' }] },
    });
    expect(byExternalId.statusCode).toBe(422);
    expect(byExternalId.json().error.details.issues).toHaveProperty(['parties[0].customerExternalId']);
  });

  it('when the partyType does not fit the customer kind, it answers 422 naming the item', async () => {
    const person = await insertCustomer(org.id, { kind: 'individual', name: 'Solo Person' });
    const company = await insertCustomer(org.id, { kind: 'entity', name: 'Solo Pty Ltd' });
    const response = await ctx.request('POST', '/v1/groups', {
      key: org.key,
      body: {
        name: 'Mismatch',
        parties: [
          { roleLabel: 'Director', partyType: 'INDIVIDUAL', customerId: company },
          { roleLabel: 'Company', partyType: 'ENTITY', customerId: person },
          { roleLabel: 'Anyone', partyType: 'EITHER', customerId: company },
        ],
      },
    });
    expect(response.statusCode).toBe(422);
    const issues = response.json().error.details.issues;
    expect(Object.keys(issues).sort()).toEqual(['parties[0].customerId', 'parties[1].customerId']);
    expect(issues['parties[0].customerId'][0]).toMatch(/INDIVIDUAL/);
  });

  it('when one party gives both customerId and customerExternalId, it answers 422 on that item', async () => {
    const person = await insertCustomer(org.id, { kind: 'individual', name: 'Both Ways', externalId: 'both-ways' });
    const response = await ctx.request('POST', '/v1/groups', {
      key: org.key,
      body: { name: 'X', parties: [{ roleLabel: 'A' }, { roleLabel: 'B', customerId: person, customerExternalId: 'both-ways' }] },
    });
    expect(response.statusCode).toBe(422);
    expect(Object.keys(response.json().error.details.issues)).toEqual(['parties[1].customerExternalId']);
  });

  it('when both templateId and parties are given, it answers 422 validation_failed', async () => {
    const template = (await templatesOf(org))[0]!;
    const response = await ctx.request('POST', '/v1/groups', {
      key: org.key,
      body: { name: 'X', templateId: template.id, parties: [{ roleLabel: 'A' }] },
    });
    expect(response.statusCode).toBe(422);
    expect(response.json().error).toMatchObject({ code: 'validation_failed', details: { issues: { parties: [expect.any(String)] } } });
  });

  it('when the body breaks the schema, it answers 422 naming each field', async () => {
    const response = await ctx.request('POST', '/v1/groups', {
      key: org.key,
      body: { reference: 'r'.repeat(256), templateId: 'not-a-uuid', colour: 'red', parties: undefined },
    });
    expect(response.statusCode).toBe(422);
    const issues = response.json().error.details.issues;
    expect(Object.keys(issues).sort()).toEqual(['colour', 'name', 'reference', 'templateId']);
    expect(issues.name).toEqual(['is required']);

    const badParty = await ctx.request('POST', '/v1/groups', {
      key: org.key,
      body: { name: 'X', parties: [{ roleLabel: 'A', partyType: 'ROBOT' }] },
    });
    expect(badParty.statusCode).toBe(422);
    expect(badParty.json().error.details.issues).toHaveProperty(['parties[0].partyType']);

    const tooMany = await ctx.request('POST', '/v1/groups', {
      key: org.key,
      body: { name: 'X', parties: Array.from({ length: 101 }, (_, index) => ({ roleLabel: `Role ${index}` })) },
    });
    expect(tooMany.statusCode).toBe(422);
    expect(tooMany.json().error.details.issues).toHaveProperty(['parties']);
  });

  it("when the template is unknown or another organisation's, it answers 404 not_found", async () => {
    const stranger = await ctx.createOrg({ features: ['groups'] });
    const theirs = (await templatesOf(stranger))[0]!;
    for (const templateId of [theirs.id, '00000000-0000-4000-8000-000000000000']) {
      const response = await ctx.request('POST', '/v1/groups', { key: org.key, body: { name: 'X', templateId } });
      expect(response.statusCode).toBe(404);
      expect(response.json().error.code).toBe('not_found');
    }
  });

  it('when an ACTIVE group holds the reference, it is returned unchanged with 200 and nothing is created or audited', async () => {
    const first = await ctx.request('POST', '/v1/groups', {
      key: org.key,
      body: { name: 'Original name', reference: 'DEAL-42', parties: [{ roleLabel: 'Buyer' }] },
    });
    expect(first.statusCode).toBe(201);
    const before = await groupCount(org.id);
    const again = await ctx.request('POST', '/v1/groups', {
      key: org.key,
      body: { name: 'Another name', reference: 'DEAL-42', parties: [{ roleLabel: 'Seller' }, { roleLabel: 'Agent' }] },
    });
    expect(again.statusCode).toBe(200);
    expect(again.json()).toEqual(first.json());
    expect(await groupCount(org.id)).toBe(before);
    const audits = await ctx.database.db.select().from(auditLog).where(eq(auditLog.subjectId, first.json().id));
    expect(audits.map((row) => row.action)).toEqual(['group.created']);
    expect(audits[0]).toMatchObject({ orgId: org.id, actorType: 'api_key', actorId: org.keyId, subjectType: 'group' });
  });

  it('when groups have no reference, or another organisation uses the reference, each request creates a group', async () => {
    const stranger = await ctx.createOrg({ features: ['groups'] });
    const a = await ctx.request('POST', '/v1/groups', { key: org.key, body: { name: 'Same' } });
    const b = await ctx.request('POST', '/v1/groups', { key: org.key, body: { name: 'Same' } });
    expect([a.statusCode, b.statusCode]).toEqual([201, 201]);
    expect(a.json().id).not.toBe(b.json().id);
    await ctx.request('POST', '/v1/groups', { key: org.key, body: { name: 'Mine', reference: 'SHARED-REF' } });
    const theirs = await ctx.request('POST', '/v1/groups', { key: stranger.key, body: { name: 'Theirs', reference: 'SHARED-REF' } });
    expect(theirs.statusCode).toBe(201);
  });

  it('when 10 requests with one reference race, exactly one group is created and all get it', async () => {
    const racer = await ctx.createOrg({ features: ['groups'] });
    const template = (await templatesOf(racer))[0]!;
    const responses = await Promise.all(
      Array.from({ length: 10 }, (_, index) =>
        ctx.request('POST', '/v1/groups', {
          key: racer.key,
          body: { name: `Attempt ${index}`, reference: 'RACE-1', templateId: template.id },
        }),
      ),
    );
    expect(responses.map((response) => response.statusCode).sort()).toEqual([200, 200, 200, 200, 200, 200, 200, 200, 200, 201]);
    expect(new Set(responses.map((response) => response.json().id)).size).toBe(1);
    const stored = await ctx.database.db.select().from(groups).where(eq(groups.orgId, racer.id));
    expect(stored).toHaveLength(1);
    expect(await ctx.database.db.$count(groupParties, eq(groupParties.groupId, stored[0]!.id))).toBe(template.roles.length);
  });

  it('when the group holding the reference is ARCHIVED, a new group is created with it', async () => {
    const first = await ctx.request('POST', '/v1/groups', { key: org.key, body: { name: 'Old', reference: 'REUSED' } });
    await ctx.database.db.update(groups).set({ status: 'ARCHIVED' }).where(eq(groups.id, first.json().id));
    const second = await ctx.request('POST', '/v1/groups', { key: org.key, body: { name: 'New', reference: 'REUSED' } });
    expect(second.statusCode).toBe(201);
    expect(second.json().id).not.toBe(first.json().id);
    const third = await ctx.request('POST', '/v1/groups', { key: org.key, body: { name: 'Again', reference: 'REUSED' } });
    expect(third.statusCode).toBe(200);
    expect(third.json().id).toBe(second.json().id);
  });

  it('when sent with an Idempotency-Key, a repeat replays the stored 201', async () => {
    const request = { key: org.key, headers: { 'idempotency-key': 'group-idem-1' }, body: { name: 'Idem', reference: 'IDEM-1' } };
    const first = await ctx.request('POST', '/v1/groups', request);
    const replay = await ctx.request('POST', '/v1/groups', request);
    expect(first.statusCode).toBe(201);
    expect(replay.statusCode).toBe(201);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.json()).toEqual(first.json());
  });

  it('when groups are created, nothing is charged', async () => {
    const [row] = await ctx.database.db.select().from(organisations).where(eq(organisations.id, org.id));
    expect(row!.credits).toBe(7);
    const ledger = await ctx.database.db.select().from(creditLedger).where(eq(creditLedger.orgId, org.id));
    expect(ledger.map((entry) => entry.reason)).toEqual(['initial_credits']);
  });

  it('when a group attaches customers, no verification is started, nothing is emailed and no event fires', async () => {
    const person = await insertCustomer(org.id, { kind: 'individual', name: 'Untouched Person', externalId: 'crm-untouched' });
    const events = await ctx.database.db.$count(outboxEvents, eq(outboxEvents.orgId, org.id));
    const response = await ctx.request('POST', '/v1/groups', {
      key: org.key,
      body: { name: 'Quiet deal', parties: [{ roleLabel: 'Purchaser', customerExternalId: 'crm-untouched' }] },
    });
    expect(response.statusCode, response.body).toBe(201);
    expect(await ctx.database.db.$count(verifications, eq(verifications.orgId, org.id))).toBe(0);
    expect(await ctx.database.db.$count(emails, eq(emails.orgId, org.id))).toBe(0);
    expect(await ctx.database.db.$count(outboxEvents, eq(outboxEvents.orgId, org.id))).toBe(events);
    const [row] = await ctx.database.db.select().from(customers).where(eq(customers.id, person));
    expect(row!.kycStatus).toBe('NOT_REQUIRED');
  });
});

describe('access to groups', () => {
  it('when the organisation lacks the groups feature, both routes answer 403 feature_disabled with details.feature', async () => {
    const org = await ctx.createOrg({ features: [] });
    const list = await ctx.request('GET', '/v1/group-templates', { key: org.key });
    // An invalid body still gets the feature answer: the gate runs before validation.
    const create = await ctx.request('POST', '/v1/groups', { key: org.key, body: { bogus: true } });
    for (const response of [list, create]) {
      expect(response.statusCode).toBe(403);
      expect(response.json()).toEqual({ error: { code: 'feature_disabled', message: expect.any(String), details: { feature: 'groups' } } });
    }
    expect(await groupCount(org.id)).toBe(0);
    expect(await ctx.database.db.$count(groupTemplates, eq(groupTemplates.orgId, org.id))).toBe(0);
  });

  it('when the key lacks the scope, it answers 403 forbidden_scope before the feature check', async () => {
    const org = await ctx.createOrg({ features: [], scopes: ['customers:read'] });
    const list = await ctx.request('GET', '/v1/group-templates', { key: org.key });
    expect(list.statusCode).toBe(403);
    expect(list.json().error).toMatchObject({ code: 'forbidden_scope', details: { required_scope: 'groups:read' } });
    const create = await ctx.request('POST', '/v1/groups', { key: org.key, body: { name: 'X' } });
    expect(create.statusCode).toBe(403);
    expect(create.json().error).toMatchObject({ code: 'forbidden_scope', details: { required_scope: 'groups:write' } });
  });

  it('when a read-only key creates a group, it is refused; with groups:write it may not list templates', async () => {
    const org = await ctx.createOrg({ features: ['groups'], scopes: ['groups:read'] });
    const create = await ctx.request('POST', '/v1/groups', { key: org.key, body: { name: 'X' } });
    expect(create.json().error).toMatchObject({ code: 'forbidden_scope', details: { required_scope: 'groups:write' } });
    const writer = await ctx.createKey(org.id, { scopes: ['groups:write'] });
    const list = await ctx.request('GET', '/v1/group-templates', { key: writer.key });
    expect(list.json().error).toMatchObject({ code: 'forbidden_scope', details: { required_scope: 'groups:read' } });
  });

  it('when the API document is read, both routes list the errors the spec gives them, POST /groups including 404 for an unknown template', async () => {
    const response = await ctx.request('GET', '/openapi.json');
    expect(response.statusCode).toBe(200);
    const paths = response.json<{ paths: Record<string, Record<string, { responses: Record<string, unknown> }>> }>().paths;
    expect(Object.keys(paths['/groups']!.post!.responses)).toEqual(
      expect.arrayContaining(['200', '201', '401', '403', '404', '422', '429']),
    );
    expect(Object.keys(paths['/group-templates']!.get!.responses)).toEqual(expect.arrayContaining(['200', '401', '403', '429']));
  });

  it('when no key is sent, it answers 401', async () => {
    const response = await ctx.request('GET', '/v1/group-templates');
    expect(response.statusCode).toBe(401);
  });
});
