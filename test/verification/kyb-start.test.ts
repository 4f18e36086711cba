import { eq } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { customers } from '../../src/db/schema.js';
import { linkTokenHash } from '../../src/shared/link-tokens.js';
import { createTestContext, type TestContext, type TestOrg, testServices } from '../helpers/harness.js';
import {
  auditOf,
  balanceOf,
  createEntity,
  customerRow,
  emailsOf,
  errorOf,
  eventsOf,
  expectNothingArmed,
  ledgerOf,
  setStatus,
  verificationsOf,
  type EntityType,
} from './verification-fixtures.js';

/** The organisation's rows of verification_link_tokens: the SHA-256 of each token, never the token. */
async function tokenHashesOf(ctx: TestContext, orgId: string) {
  const { rows } = await ctx.database.pool.query('SELECT token_hash, verification_id FROM verification_link_tokens WHERE org_id = $1', [
    orgId,
  ]);
  return rows;
}

let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

const LINK = /^https:\/\/app\.example\.test\/(verify|pay)\/([A-Za-z0-9_-]{43})$/;
const operator = { type: 'operator' as const, id: 'test' };

type StartResponse = { id: string; kyb_status: string; kyb_started_at: string | null; verification_link?: string };

async function startKyb(org: TestOrg, entityId: string, body?: unknown, key = org.key) {
  return ctx.request('POST', `/v1/entities/${entityId}/kyb`, { key, ...(body !== undefined ? { body } : {}) });
}

describe('POST /v1/entities/{id}/kyb: emailing lanes on COMPANY and OTHER', () => {
  const cases: Array<{ type: EntityType; method: 'automated' | 'contact_led'; payer: 'organization' | 'customer'; cost: number }> = [];
  for (const type of ['COMPANY', 'OTHER'] as const) {
    for (const method of ['automated', 'contact_led'] as const) {
      for (const payer of ['organization', 'customer'] as const) {
        cases.push({ type, method, payer, cost: method === 'automated' ? 2 : 3 });
      }
    }
  }

  for (const { type, method, payer, cost } of cases.filter((c) => c.payer === 'organization')) {
    it(`when a ${type} starts ${method} paid by the organisation, it charges ${cost} credits, writes the ledger row, emails the contact the link and goes PENDING`, async () => {
      const org = await ctx.createOrg({ credits: 10 });
      const entity = await createEntity(ctx, org, { type });
      const response = await startKyb(org, entity.id, { method, payer, customMessage: 'Please finish by Friday.' });
      expect(response.statusCode, response.body).toBe(200);
      const body = response.json<StartResponse>();
      expect(body.kyb_status).toBe('PENDING');
      expect(body.kyb_started_at).not.toBeNull();
      expect(body.verification_link).toMatch(LINK);
      expect(body.verification_link).toContain('/verify/');

      const [verification] = await verificationsOf(ctx, org.id, entity.id);
      expect(verification).toMatchObject({
        kind: 'KYB',
        lane: method,
        payer: 'organization',
        status: 'PENDING',
        cost,
        recipientEmail: entity.contactEmail,
      });
      const token = body.verification_link!.split('/').pop()!;
      expect(await tokenHashesOf(ctx, org.id)).toEqual([{ token_hash: linkTokenHash(token), verification_id: verification!.id }]);

      expect(await balanceOf(ctx, org.id)).toBe(10 - cost);
      const ledger = await ledgerOf(ctx, org.id);
      expect(ledger).toHaveLength(1);
      expect(ledger[0]).toMatchObject({ delta: -cost, balanceAfter: 10 - cost, reason: 'kyb_start', verificationId: verification!.id });

      const sent = await emailsOf(ctx, org.id);
      expect(sent).toHaveLength(1);
      expect(sent[0]).toMatchObject({
        recipient: entity.contactEmail,
        link: body.verification_link,
        status: 'queued',
        verificationId: verification!.id,
      });
      expect(sent[0]!.subject).toMatch(/business verification/);
      expect(sent[0]!.body).toContain('Please finish by Friday.');
      expect(sent[0]!.body).toContain(body.verification_link);

      const row = await customerRow(ctx, entity.id);
      expect(row.kycStatus).toBe('PENDING');
      expect(row.kycStartedAt).not.toBeNull();
    });
  }

  for (const { type, method } of cases.filter((c) => c.payer === 'customer')) {
    it(`when a ${type} starts ${method} paid by the customer, it spends no credits, arms PAYMENT_PENDING and emails a pay link`, async () => {
      const org = await ctx.createOrg({ credits: 10 });
      const entity = await createEntity(ctx, org, { type });
      const response = await startKyb(org, entity.id, { method, payer: 'customer' });
      expect(response.statusCode, response.body).toBe(200);
      const body = response.json<StartResponse>();
      expect(body.kyb_status).toBe('PENDING');
      expect(body.verification_link).toMatch(LINK);
      expect(body.verification_link).toContain('/pay/');

      const [verification] = await verificationsOf(ctx, org.id, entity.id);
      expect(verification).toMatchObject({ lane: method, payer: 'customer', status: 'PAYMENT_PENDING', cost: 0 });
      expect(await balanceOf(ctx, org.id)).toBe(10);
      expect(await ledgerOf(ctx, org.id)).toEqual([]);

      const sent = await emailsOf(ctx, org.id);
      expect(sent).toHaveLength(1);
      expect(sent[0]).toMatchObject({ recipient: entity.contactEmail, link: body.verification_link });
      expect(sent[0]!.subject).toMatch(/pay for/);
    });
  }

  it('when EDD add-ons are asked on an emailing lane, it charges 1 credit more for each', async () => {
    const org = await ctx.createOrg({ credits: 10 });
    const entity = await createEntity(ctx, org);
    const response = await startKyb(org, entity.id, { method: 'contact_led', eddCheckTypes: ['SOURCE_OF_FUNDS', 'SOURCE_OF_WEALTH'] });
    expect(response.statusCode, response.body).toBe(200);
    expect(await balanceOf(ctx, org.id)).toBe(10 - 5);
    const [verification] = await verificationsOf(ctx, org.id, entity.id);
    expect(verification).toMatchObject({ cost: 5, eddCheckTypes: ['SOURCE_OF_FUNDS', 'SOURCE_OF_WEALTH'] });
    expect((await ledgerOf(ctx, org.id))[0]).toMatchObject({ delta: -5, balanceAfter: 5 });
  });

  it('when the same EDD add-on is listed twice, it is charged once', async () => {
    const org = await ctx.createOrg({ credits: 10 });
    const entity = await createEntity(ctx, org);
    const response = await startKyb(org, entity.id, { eddCheckTypes: ['BIOMETRIC_VERIFICATION', 'BIOMETRIC_VERIFICATION'] });
    expect(response.statusCode, response.body).toBe(200);
    expect(await balanceOf(ctx, org.id)).toBe(10 - 3);
  });

  it("when KYB starts, the contact's own KYC is not started: its status is unchanged and only the KYB is charged", async () => {
    const org = await ctx.createOrg({ credits: 10 });
    const entity = await createEntity(ctx, org);
    const contactId = (await customerRow(ctx, entity.id)).contactCustomerId!;
    const before = (await customerRow(ctx, contactId)).kycStatus;
    expect((await startKyb(org, entity.id, { method: 'automated' })).statusCode).toBe(200);
    expect((await customerRow(ctx, contactId)).kycStatus).toBe(before);
    expect(await verificationsOf(ctx, org.id, contactId)).toEqual([]);
    expect(await balanceOf(ctx, org.id)).toBe(8);
    const fetched = await ctx.request('GET', `/v1/entities/${entity.id}`, { key: org.key });
    expect(fetched.json<{ contact: { kyc_status: string; kyc_required: boolean } }>().contact).toMatchObject({
      kyc_status: before,
      kyc_required: true,
    });
  });

  it('when a start succeeds, it writes an audit row for the status change', async () => {
    const org = await ctx.createOrg({ credits: 10 });
    const entity = await createEntity(ctx, org);
    expect((await startKyb(org, entity.id)).statusCode).toBe(200);
    const audit = await auditOf(ctx, org.id, entity.id, 'entity.kyb_started');
    expect(audit).toHaveLength(1);
    expect(audit[0]).toMatchObject({ actorType: 'api_key', actorId: org.keyId });
  });
  it('when a start succeeds on an integration-added entity, it writes one customer.updated event with the entity DTO, without the link', async () => {
    const org = await ctx.createOrg({ credits: 10 });
    const entity = await createEntity(ctx, org);
    const response = await startKyb(org, entity.id);
    expect(response.statusCode).toBe(200);
    const events = await eventsOf(ctx, org.id, 'customer.updated');
    expect(events).toHaveLength(1);
    const { verification_link: link, updated_at: _ignored, ...entityState } = response.json<StartResponse & { updated_at: string }>();
    expect(link).toBeDefined();
    const { updated_at: _eventUpdatedAt, ...eventState } = events[0]!.document.data.customer;
    expect(eventState).toEqual(entityState);
    expect(events[0]!.document.data.customer).not.toHaveProperty('verification_link');
  });

  it('when a start is refused, it writes no event and no audit row', async () => {
    const org = await ctx.createOrg({ credits: 1 });
    const entity = await createEntity(ctx, org);
    expect((await startKyb(org, entity.id)).statusCode).toBe(402);
    expect(await eventsOf(ctx, org.id, 'customer.updated')).toEqual([]);
    expect(await auditOf(ctx, org.id, entity.id, 'entity.kyb_started')).toEqual([]);
  });
});

describe('POST /v1/entities/{id}/kyb: the manual lane', () => {
  for (const type of ['COMPANY', 'OTHER'] as const) {
    for (const payer of ['organization', 'customer'] as const) {
      it(`when a ${type} starts manual with payer ${payer}, it is free, silent, linkless and goes IN_PROGRESS`, async () => {
        const org = await ctx.createOrg({ credits: 10 });
        const entity = await createEntity(ctx, org, { type });
        const response = await startKyb(org, entity.id, { method: 'manual', payer });
        expect(response.statusCode, response.body).toBe(200);
        const body = response.json<StartResponse>();
        expect(body.kyb_status).toBe('IN_PROGRESS');
        expect(body.kyb_started_at).not.toBeNull();
        expect(body).not.toHaveProperty('verification_link');
        const [verification] = await verificationsOf(ctx, org.id, entity.id);
        expect(verification).toMatchObject({ lane: 'manual', payer: 'organization', status: 'IN_PROGRESS', cost: 0 });
        expect(await tokenHashesOf(ctx, org.id)).toEqual([]);
        expect(await balanceOf(ctx, org.id)).toBe(10);
        expect(await ledgerOf(ctx, org.id)).toEqual([]);
        expect(await emailsOf(ctx, org.id)).toEqual([]);
      });
    }
  }

  for (const type of ['TRUST', 'PARTNERSHIP', 'SMSF'] as const) {
    for (const payer of ['organization', 'customer', undefined] as const) {
      it(`when a ${type} starts with no method and payer ${payer ?? 'omitted'}, it defaults to manual: free, silent, linkless, IN_PROGRESS`, async () => {
        const org = await ctx.createOrg({ credits: 10 });
        const entity = await createEntity(ctx, org, { type });
        const response = await startKyb(org, entity.id, payer ? { payer } : {});
        expect(response.statusCode, response.body).toBe(200);
        const body = response.json<StartResponse>();
        expect(body.kyb_status).toBe('IN_PROGRESS');
        expect(body).not.toHaveProperty('verification_link');
        const [verification] = await verificationsOf(ctx, org.id, entity.id);
        expect(verification).toMatchObject({ lane: 'manual', cost: 0 });
        expect(await balanceOf(ctx, org.id)).toBe(10);
        expect(await ledgerOf(ctx, org.id)).toEqual([]);
        expect(await emailsOf(ctx, org.id)).toEqual([]);
      });
    }

    it(`when a ${type} without a contact starts manual, it needs no contact`, async () => {
      const org = await ctx.createOrg({ credits: 10 });
      const entity = await createEntity(ctx, org, { type, contact: false });
      const response = await startKyb(org, entity.id, { method: 'manual' });
      expect(response.statusCode, response.body).toBe(200);
      expect(response.json<StartResponse>().kyb_status).toBe('IN_PROGRESS');
    });

    for (const method of ['automated', 'contact_led'] as const) {
      it(`when a ${type} asks for ${method}, it answers 422 on method and arms nothing`, async () => {
        const org = await ctx.createOrg({ credits: 10 });
        const entity = await createEntity(ctx, org, { type });
        const before = { credits: 10, status: (await customerRow(ctx, entity.id)).kycStatus };
        const response = await startKyb(org, entity.id, { method });
        expect(response.statusCode, response.body).toBe(422);
        const error = errorOf(response);
        expect(error.code).toBe('validation_failed');
        expect(error.details?.issues?.method).toBeDefined();
        await expectNothingArmed(ctx, org, entity.id, before);
      });
    }
  }

  it('when the organisation has no credits, the free manual lane still starts', async () => {
    const org = await ctx.createOrg({ credits: 0 });
    const entity = await createEntity(ctx, org);
    const response = await startKyb(org, entity.id, { method: 'manual' });
    expect(response.statusCode, response.body).toBe(200);
    expect(await ledgerOf(ctx, org.id)).toEqual([]);
  });

  it('when eddCheckTypes are sent on the manual lane, it answers 422 on eddCheckTypes and arms nothing', async () => {
    const org = await ctx.createOrg({ credits: 10 });
    const entity = await createEntity(ctx, org);
    const before = { credits: 10, status: (await customerRow(ctx, entity.id)).kycStatus };
    const response = await startKyb(org, entity.id, { method: 'manual', eddCheckTypes: ['SOURCE_OF_FUNDS'] });
    expect(response.statusCode, response.body).toBe(422);
    expect(errorOf(response).details?.issues?.eddCheckTypes).toBeDefined();
    await expectNothingArmed(ctx, org, entity.id, before);
  });
});

describe('POST /v1/entities/{id}/kyb: defaults', () => {
  it('when the body is empty JSON, a COMPANY defaults to automated paid by the organisation', async () => {
    const org = await ctx.createOrg({ credits: 10 });
    const entity = await createEntity(ctx, org);
    const response = await startKyb(org, entity.id, {});
    expect(response.statusCode, response.body).toBe(200);
    const [verification] = await verificationsOf(ctx, org.id, entity.id);
    expect(verification).toMatchObject({ lane: 'automated', payer: 'organization', cost: 2 });
  });

  it('when there is no body at all, it starts with the defaults', async () => {
    const org = await ctx.createOrg({ credits: 10 });
    const entity = await createEntity(ctx, org);
    const response = await ctx.app.inject({
      method: 'POST',
      url: `/v1/entities/${entity.id}/kyb`,
      headers: { authorization: `Bearer ${org.key}` },
    });
    expect(response.statusCode, response.body).toBe(200);
    expect((await verificationsOf(ctx, org.id, entity.id))[0]).toMatchObject({ lane: 'automated', cost: 2 });
  });

  it('when the content type is JSON but the body is empty, it starts with the defaults', async () => {
    const org = await ctx.createOrg({ credits: 10 });
    const entity = await createEntity(ctx, org);
    const response = await ctx.app.inject({
      method: 'POST',
      url: `/v1/entities/${entity.id}/kyb`,
      headers: { authorization: `Bearer ${org.key}`, 'content-type': 'application/json' },
      payload: '',
    });
    expect(response.statusCode, response.body).toBe(200);
    expect((await verificationsOf(ctx, org.id, entity.id))[0]).toMatchObject({ lane: 'automated', cost: 2 });
  });

  it('when the entity has its own default payer, an omitted payer follows it', async () => {
    const org = await ctx.createOrg({ credits: 10, defaultPayer: 'organization' });
    const entity = await createEntity(ctx, org);
    await ctx.database.db.update(customers).set({ defaultPayer: 'customer' }).where(eq(customers.id, entity.id));
    const response = await startKyb(org, entity.id, {});
    expect(response.statusCode, response.body).toBe(200);
    expect(response.json<StartResponse>().verification_link).toContain('/pay/');
    expect((await verificationsOf(ctx, org.id, entity.id))[0]).toMatchObject({ payer: 'customer', cost: 0 });
    expect(await balanceOf(ctx, org.id)).toBe(10);
  });

  it("when the entity's own default payer is organization and the organisation's is customer, the entity's wins", async () => {
    const org = await ctx.createOrg({ credits: 10, defaultPayer: 'customer' });
    const entity = await createEntity(ctx, org);
    await ctx.database.db.update(customers).set({ defaultPayer: 'organization' }).where(eq(customers.id, entity.id));
    expect((await startKyb(org, entity.id, {})).statusCode).toBe(200);
    expect((await verificationsOf(ctx, org.id, entity.id))[0]).toMatchObject({ payer: 'organization', cost: 2 });
    expect(await balanceOf(ctx, org.id)).toBe(8);
  });

  it("when the entity has no default payer, an omitted payer follows the organisation's default", async () => {
    const org = await ctx.createOrg({ credits: 10, defaultPayer: 'customer' });
    const entity = await createEntity(ctx, org);
    const response = await startKyb(org, entity.id);
    expect(response.statusCode, response.body).toBe(200);
    expect((await verificationsOf(ctx, org.id, entity.id))[0]).toMatchObject({ payer: 'customer', status: 'PAYMENT_PENDING', cost: 0 });
    expect(await ledgerOf(ctx, org.id)).toEqual([]);
    expect(await balanceOf(ctx, org.id)).toBe(10);
  });

  it('when an explicit payer is sent, it overrides both defaults', async () => {
    const org = await ctx.createOrg({ credits: 10, defaultPayer: 'customer' });
    const entity = await createEntity(ctx, org);
    await ctx.database.db.update(customers).set({ defaultPayer: 'customer' }).where(eq(customers.id, entity.id));
    expect((await startKyb(org, entity.id, { payer: 'organization' })).statusCode).toBe(200);
    expect(await balanceOf(ctx, org.id)).toBe(8);
  });

  it('when the customer pays and the organisation has no credits, it still starts', async () => {
    const org = await ctx.createOrg({ credits: 0 });
    const entity = await createEntity(ctx, org);
    const response = await startKyb(org, entity.id, { payer: 'customer' });
    expect(response.statusCode, response.body).toBe(200);
    expect(await balanceOf(ctx, org.id)).toBe(0);
  });
});

describe('POST /v1/entities/{id}/kyb: errors arm nothing', () => {
  it('when the organisation has too few credits, it answers 402 insufficient_credits with required and available', async () => {
    const org = await ctx.createOrg({ credits: 1 });
    const entity = await createEntity(ctx, org);
    const before = { credits: 1, status: (await customerRow(ctx, entity.id)).kycStatus };
    const response = await startKyb(org, entity.id, { method: 'automated' });
    expect(response.statusCode, response.body).toBe(402);
    const error = errorOf(response);
    expect(error.code).toBe('insufficient_credits');
    expect(error.details).toEqual({ required: 2, available: 1 });
    await expectNothingArmed(ctx, org, entity.id, before);
  });

  it('when EDD add-ons push the price past the balance, it answers 402 with the full price', async () => {
    const org = await ctx.createOrg({ credits: 2 });
    const entity = await createEntity(ctx, org);
    const before = { credits: 2, status: (await customerRow(ctx, entity.id)).kycStatus };
    const response = await startKyb(org, entity.id, { eddCheckTypes: ['SOURCE_OF_FUNDS'] });
    expect(response.statusCode, response.body).toBe(402);
    expect(errorOf(response).details).toEqual({ required: 3, available: 2 });
    await expectNothingArmed(ctx, org, entity.id, before);
  });

  it('when contact_led is asked without the kyb_extra_methods feature, it answers 403 feature_disabled naming the feature', async () => {
    const org = await ctx.createOrg({ credits: 10, features: [] });
    const entity = await createEntity(ctx, org);
    const before = { credits: 10, status: (await customerRow(ctx, entity.id)).kycStatus };
    const response = await startKyb(org, entity.id, { method: 'contact_led' });
    expect(response.statusCode, response.body).toBe(403);
    const error = errorOf(response);
    expect(error.code).toBe('feature_disabled');
    expect(error.details).toEqual({ feature: 'kyb_extra_methods' });
    await expectNothingArmed(ctx, org, entity.id, before);
  });

  it('when the organisation lacks kyb_extra_methods, automated still works', async () => {
    const org = await ctx.createOrg({ credits: 10, features: [] });
    const entity = await createEntity(ctx, org);
    expect((await startKyb(org, entity.id, { method: 'automated' })).statusCode).toBe(200);
  });

  it('when the key lacks verification:write, it answers 403 forbidden_scope', async () => {
    const org = await ctx.createOrg({ credits: 10 });
    const entity = await createEntity(ctx, org);
    const before = { credits: 10, status: (await customerRow(ctx, entity.id)).kycStatus };
    const readOnly = await ctx.createKey(org.id, { scopes: ['customers:read', 'customers:write'] });
    const response = await startKyb(org, entity.id, {}, readOnly.key);
    expect(response.statusCode, response.body).toBe(403);
    expect(errorOf(response).code).toBe('forbidden_scope');
    await expectNothingArmed(ctx, org, entity.id, before);
  });

  it('when there is no API key, it answers 401', async () => {
    const org = await ctx.createOrg({ credits: 10 });
    const entity = await createEntity(ctx, org);
    const response = await ctx.request('POST', `/v1/entities/${entity.id}/kyb`, { body: {} });
    expect(response.statusCode).toBe(401);
    expect(await balanceOf(ctx, org.id)).toBe(10);
  });

  it('when the entity does not exist, it answers 404', async () => {
    const org = await ctx.createOrg({ credits: 10 });
    const response = await startKyb(org, '8b0c0d2e-1111-4a4a-9b9b-123456789abc', {});
    expect(response.statusCode, response.body).toBe(404);
    expect(errorOf(response).code).toBe('not_found');
    expect(await verificationsOf(ctx, org.id)).toEqual([]);
    expect(await balanceOf(ctx, org.id)).toBe(10);
  });

  it('when the entity belongs to another organisation, it answers 404 and touches neither organisation', async () => {
    const owner = await ctx.createOrg({ credits: 10 });
    const stranger = await ctx.createOrg({ credits: 10 });
    const entity = await createEntity(ctx, owner);
    const before = { credits: 10, status: (await customerRow(ctx, entity.id)).kycStatus };
    const response = await startKyb(stranger, entity.id, {});
    expect(response.statusCode, response.body).toBe(404);
    await expectNothingArmed(ctx, owner, entity.id, before);
    expect(await balanceOf(ctx, stranger.id)).toBe(10);
    expect(await ledgerOf(ctx, stranger.id)).toEqual([]);
  });

  it('when the id is an individual customer, it answers 404', async () => {
    const org = await ctx.createOrg({ credits: 10 });
    const person = await ctx.request('POST', '/v1/customers', {
      key: org.key,
      body: { fullName: 'Solo Person', email: 'solo@example.test' },
    });
    const response = await startKyb(org, person.json<{ id: string }>().id, {});
    expect(response.statusCode).toBe(404);
    expect(await balanceOf(ctx, org.id)).toBe(10);
  });

  it('when the entity is started twice, the second answers 409 conflict and charges nothing more', async () => {
    const org = await ctx.createOrg({ credits: 10 });
    const entity = await createEntity(ctx, org);
    expect((await startKyb(org, entity.id, {})).statusCode).toBe(200);
    const response = await startKyb(org, entity.id, {});
    expect(response.statusCode, response.body).toBe(409);
    expect(errorOf(response).code).toBe('conflict');
    expect(await verificationsOf(ctx, org.id)).toHaveLength(1);
    expect(await ledgerOf(ctx, org.id)).toHaveLength(1);
    expect(await emailsOf(ctx, org.id)).toHaveLength(1);
    expect(await balanceOf(ctx, org.id)).toBe(8);
  });

  for (const status of ['PENDING', 'IN_PROGRESS', 'AWAITING_RESUBMISSION', 'VERIFIED'] as const) {
    it(`when the entity's kyb_status is ${status}, a start answers 409 conflict and arms nothing`, async () => {
      const org = await ctx.createOrg({ credits: 10 });
      const entity = await createEntity(ctx, org);
      await setStatus(ctx, entity.id, status);
      const response = await startKyb(org, entity.id, { method: 'manual' });
      expect(response.statusCode, response.body).toBe(409);
      expect(errorOf(response).code).toBe('conflict');
      await expectNothingArmed(ctx, org, entity.id, { credits: 10, status });
    });
  }

  it('when the entity has no contact, an emailing lane answers 422 on contact and arms nothing', async () => {
    const org = await ctx.createOrg({ credits: 10 });
    const entity = await createEntity(ctx, org, { contact: false });
    const before = { credits: 10, status: (await customerRow(ctx, entity.id)).kycStatus };
    const response = await startKyb(org, entity.id, { method: 'automated' });
    expect(response.statusCode, response.body).toBe(422);
    expect(errorOf(response).details?.issues?.contact).toBeDefined();
    await expectNothingArmed(ctx, org, entity.id, before);
  });

  it('when the contact has no email, an emailing lane answers 422 on contact and arms nothing', async () => {
    const org = await ctx.createOrg({ credits: 10 });
    const entity = await createEntity(ctx, org);
    const contactId = (await customerRow(ctx, entity.id)).contactCustomerId!;
    await ctx.database.db.update(customers).set({ email: null }).where(eq(customers.id, contactId));
    const before = { credits: 10, status: (await customerRow(ctx, entity.id)).kycStatus };
    const response = await startKyb(org, entity.id, { method: 'contact_led', payer: 'customer' });
    expect(response.statusCode, response.body).toBe(422);
    expect(errorOf(response).details?.issues?.contact).toBeDefined();
    await expectNothingArmed(ctx, org, entity.id, before);
  });

  it('when the body has an unknown property, it answers 422 naming it and arms nothing', async () => {
    const org = await ctx.createOrg({ credits: 10 });
    const entity = await createEntity(ctx, org);
    const before = { credits: 10, status: (await customerRow(ctx, entity.id)).kycStatus };
    const response = await startKyb(org, entity.id, { method: 'automated', sendNow: true });
    expect(response.statusCode, response.body).toBe(422);
    expect(errorOf(response).code).toBe('validation_failed');
    expect(JSON.stringify(errorOf(response).details)).toContain('sendNow');
    await expectNothingArmed(ctx, org, entity.id, before);
  });

  it('when customMessage is 2001 characters, it answers 422 on customMessage and arms nothing', async () => {
    const org = await ctx.createOrg({ credits: 10 });
    const entity = await createEntity(ctx, org);
    const before = { credits: 10, status: (await customerRow(ctx, entity.id)).kycStatus };
    const response = await startKyb(org, entity.id, { customMessage: 'x'.repeat(2001) });
    expect(response.statusCode, response.body).toBe(422);
    expect(errorOf(response).details?.issues?.customMessage).toBeDefined();
    await expectNothingArmed(ctx, org, entity.id, before);
  });

  it('when customMessage is exactly 2000 characters, it is accepted and lands in the email', async () => {
    const org = await ctx.createOrg({ credits: 10 });
    const entity = await createEntity(ctx, org);
    const message = 'y'.repeat(2000);
    expect((await startKyb(org, entity.id, { customMessage: message })).statusCode).toBe(200);
    expect((await emailsOf(ctx, org.id))[0]!.body).toContain(message);
  });

  it('when the method is unknown, it answers 422 on method', async () => {
    const org = await ctx.createOrg({ credits: 10 });
    const entity = await createEntity(ctx, org);
    const response = await startKyb(org, entity.id, { method: 'telepathy' });
    expect(response.statusCode).toBe(422);
    expect(errorOf(response).details?.issues?.method).toBeDefined();
    expect(await verificationsOf(ctx, org.id)).toEqual([]);
  });
});

describe('after a start', () => {
  it('when the entity is read back, it shows the new status but never the link or its token', async () => {
    const org = await ctx.createOrg({ credits: 10 });
    const entity = await createEntity(ctx, org);
    const started = await startKyb(org, entity.id);
    const token = started.json<StartResponse>().verification_link!.split('/').pop()!;
    const fetched = await ctx.request('GET', `/v1/entities/${entity.id}`, { key: org.key });
    expect(fetched.json()).toMatchObject({ kyb_status: 'PENDING' });
    expect(fetched.json()).not.toHaveProperty('verification_link');
    expect(fetched.body).not.toContain(token);
    const listed = await ctx.request('GET', '/v1/entities', { key: org.key });
    expect(listed.body).not.toContain(token);
  });
});

describe('POST /v1/entities/{id}/kyb: starting again', () => {
  it('when the previous verification FAILED, a new start is allowed and charges again', async () => {
    const org = await ctx.createOrg({ credits: 10 });
    const entity = await createEntity(ctx, org);
    const backOffice = testServices(ctx.database).backOffice;
    expect((await startKyb(org, entity.id, {})).statusCode).toBe(200);
    await backOffice.submit(org.id, entity.id, operator);
    await backOffice.verdict(org.id, entity.id, { result: 'FAILED' }, operator);
    expect((await customerRow(ctx, entity.id)).kycStatus).toBe('FAILED');

    const again = await startKyb(org, entity.id, {});
    expect(again.statusCode, again.body).toBe(200);
    const body = again.json<StartResponse & { kyb_completed_at: string | null }>();
    expect(body.kyb_status).toBe('PENDING');
    expect(body.kyb_completed_at).toBeNull();
    expect(await balanceOf(ctx, org.id)).toBe(6);
    expect(await ledgerOf(ctx, org.id)).toHaveLength(2);
    expect(await verificationsOf(ctx, org.id, entity.id)).toHaveLength(2);
    const sent = await emailsOf(ctx, org.id);
    expect(sent).toHaveLength(2);
    expect(new Set(sent.map((email) => email.link)).size).toBe(2);
  });

  it('when the entity is NOT_REQUIRED, a start is allowed', async () => {
    const org = await ctx.createOrg({ credits: 10 });
    const entity = await createEntity(ctx, org);
    await setStatus(ctx, entity.id, 'NOT_REQUIRED');
    const response = await startKyb(org, entity.id, {});
    expect(response.statusCode, response.body).toBe(200);
    expect(response.json<StartResponse>().kyb_status).toBe('PENDING');
  });

  it('when the entity is NOT_STARTED, a start is allowed', async () => {
    const org = await ctx.createOrg({ credits: 10 });
    const entity = await createEntity(ctx, org);
    await setStatus(ctx, entity.id, 'NOT_STARTED');
    const response = await startKyb(org, entity.id, { method: 'manual' });
    expect(response.statusCode, response.body).toBe(200);
    expect(response.json<StartResponse>().kyb_status).toBe('IN_PROGRESS');
  });
});
