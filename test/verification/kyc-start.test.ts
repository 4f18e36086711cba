import { eq } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { customers } from '../../src/db/schema.js';
import { createTestContext, type TestContext, type TestOrg, testServices } from '../helpers/harness.js';
import {
  auditOf,
  balanceOf,
  createCustomer,
  createEntity,
  customerRow,
  emailsOf,
  errorOf,
  expectNothingArmed,
  ledgerOf,
  setStatus,
  verificationsOf,
} from './verification-fixtures.js';

let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

const LINK = /^https:\/\/app\.example\.test\/(verify|pay)\/[A-Za-z0-9_-]{43}$/;

type IndividualStart = { id: string; kyc_status: string; kyc_started_at: string | null; full_name: string; verification_link?: string };

async function startKyc(org: TestOrg, customerId: string, body?: unknown, key = org.key) {
  return ctx.request('POST', `/v1/customers/${customerId}/kyc`, { key, ...(body !== undefined ? { body } : {}) });
}

describe('POST /v1/customers/{id}/kyc', () => {
  it('when an individual starts KYC, it charges 1 credit, emails the person the link and goes PENDING', async () => {
    const org = await ctx.createOrg({ credits: 5 });
    const person = await createCustomer(ctx, org);
    const response = await startKyc(org, person.id, { customMessage: 'Hi from your adviser.' });
    expect(response.statusCode, response.body).toBe(200);
    const body = response.json<IndividualStart>();
    expect(body.id).toBe(person.id);
    expect(body.full_name).toBe(person.dto.full_name);
    expect(body.kyc_status).toBe('PENDING');
    expect(body.kyc_started_at).not.toBeNull();
    expect(body.verification_link).toMatch(LINK);
    expect(body.verification_link).toContain('/verify/');

    const [verification] = await verificationsOf(ctx, org.id, person.id);
    expect(verification).toMatchObject({ kind: 'KYC', payer: 'organization', status: 'PENDING', cost: 1, recipientEmail: person.email });
    expect(await balanceOf(ctx, org.id)).toBe(4);
    expect(await ledgerOf(ctx, org.id)).toEqual([
      expect.objectContaining({ delta: -1, balanceAfter: 4, reason: 'kyc_start', verificationId: verification!.id }),
    ]);
    const sent = await emailsOf(ctx, org.id);
    expect(sent).toHaveLength(1);
    expect(sent[0]).toMatchObject({ recipient: person.email, link: body.verification_link, verificationId: verification!.id });
    expect(sent[0]!.subject).toMatch(/identity verification/);
    expect(sent[0]!.body).toContain('Hi from your adviser.');
    expect(await auditOf(ctx, org.id, person.id, 'customer.kyc_started')).toHaveLength(1);
  });

  it('when EDD add-ons are asked, it charges 1 credit more for each', async () => {
    const org = await ctx.createOrg({ credits: 5 });
    const person = await createCustomer(ctx, org);
    const response = await startKyc(org, person.id, { eddCheckTypes: ['SOURCE_OF_FUNDS', 'BIOMETRIC_VERIFICATION'] });
    expect(response.statusCode, response.body).toBe(200);
    expect(await balanceOf(ctx, org.id)).toBe(2);
    expect((await ledgerOf(ctx, org.id))[0]).toMatchObject({ delta: -3, balanceAfter: 2 });
  });

  it('when a representative is recorded, it emails the representative instead of the person', async () => {
    const org = await ctx.createOrg({ credits: 5 });
    const person = await createCustomer(ctx, org, { representative: true });
    const response = await startKyc(org, person.id);
    expect(response.statusCode, response.body).toBe(200);
    const sent = await emailsOf(ctx, org.id);
    expect(sent).toHaveLength(1);
    expect(sent[0]!.recipient).toBe(person.representativeEmail);
    expect(sent[0]!.body).toMatch(/^Hello Attorney /);
    expect((await verificationsOf(ctx, org.id, person.id))[0]!.recipientEmail).toBe(person.representativeEmail);
  });

  it('when the customer pays, it spends no credits and emails a pay link', async () => {
    const org = await ctx.createOrg({ credits: 5 });
    const person = await createCustomer(ctx, org);
    const response = await startKyc(org, person.id, { payer: 'customer' });
    expect(response.statusCode, response.body).toBe(200);
    const body = response.json<IndividualStart>();
    expect(body.kyc_status).toBe('PENDING');
    expect(body.verification_link).toContain('/pay/');
    expect((await verificationsOf(ctx, org.id, person.id))[0]).toMatchObject({ payer: 'customer', status: 'PAYMENT_PENDING', cost: 0 });
    expect(await balanceOf(ctx, org.id)).toBe(5);
    expect(await ledgerOf(ctx, org.id)).toEqual([]);
    expect((await emailsOf(ctx, org.id))[0]!.link).toBe(body.verification_link);
  });

  it("when the organisation's default payer is customer, an omitted payer bills the customer", async () => {
    const org = await ctx.createOrg({ credits: 5, defaultPayer: 'customer' });
    const person = await createCustomer(ctx, org);
    expect((await startKyc(org, person.id, {})).statusCode).toBe(200);
    expect((await verificationsOf(ctx, org.id, person.id))[0]!.payer).toBe('customer');
    expect(await balanceOf(ctx, org.id)).toBe(5);
  });

  it("when the person's own default payer is customer, an omitted payer bills the customer", async () => {
    const org = await ctx.createOrg({ credits: 5 });
    const person = await createCustomer(ctx, org);
    await ctx.database.db.update(customers).set({ defaultPayer: 'customer' }).where(eq(customers.id, person.id));
    expect((await startKyc(org, person.id)).statusCode).toBe(200);
    expect((await verificationsOf(ctx, org.id, person.id))[0]!.payer).toBe('customer');
    expect(await balanceOf(ctx, org.id)).toBe(5);
  });

  it('when KYC is started twice, the second answers 409 and charges nothing more', async () => {
    const org = await ctx.createOrg({ credits: 5 });
    const person = await createCustomer(ctx, org);
    expect((await startKyc(org, person.id)).statusCode).toBe(200);
    const response = await startKyc(org, person.id);
    expect(response.statusCode, response.body).toBe(409);
    expect(errorOf(response).code).toBe('conflict');
    expect(await ledgerOf(ctx, org.id)).toHaveLength(1);
    expect(await emailsOf(ctx, org.id)).toHaveLength(1);
    expect(await balanceOf(ctx, org.id)).toBe(4);
  });

  it('when the organisation has no credits, it answers 402 and arms nothing', async () => {
    const org = await ctx.createOrg({ credits: 0 });
    const person = await createCustomer(ctx, org);
    const before = { credits: 0, status: (await customerRow(ctx, person.id)).kycStatus };
    const response = await startKyc(org, person.id);
    expect(response.statusCode, response.body).toBe(402);
    expect(errorOf(response).details).toEqual({ required: 1, available: 0 });
    await expectNothingArmed(ctx, org, person.id, before);
  });

  it('when the person has no email and no representative, it answers 422 on email and arms nothing', async () => {
    const org = await ctx.createOrg({ credits: 5 });
    const person = await createCustomer(ctx, org);
    await ctx.database.db.update(customers).set({ email: null }).where(eq(customers.id, person.id));
    const before = { credits: 5, status: (await customerRow(ctx, person.id)).kycStatus };
    const response = await startKyc(org, person.id);
    expect(response.statusCode, response.body).toBe(422);
    expect(errorOf(response).details?.issues?.email).toBeDefined();
    await expectNothingArmed(ctx, org, person.id, before);
  });

  it('when the body has a method (a KYB-only field), it answers 422 and arms nothing', async () => {
    const org = await ctx.createOrg({ credits: 5 });
    const person = await createCustomer(ctx, org);
    const before = { credits: 5, status: (await customerRow(ctx, person.id)).kycStatus };
    const response = await startKyc(org, person.id, { method: 'manual' });
    expect(response.statusCode, response.body).toBe(422);
    await expectNothingArmed(ctx, org, person.id, before);
  });

  it('when the id is an entity, it answers 404', async () => {
    const org = await ctx.createOrg({ credits: 5 });
    const entity = await createEntity(ctx, org);
    const response = await startKyc(org, entity.id);
    expect(response.statusCode).toBe(404);
    expect(await balanceOf(ctx, org.id)).toBe(5);
  });

  it('when the key lacks verification:write, it answers 403 forbidden_scope', async () => {
    const org = await ctx.createOrg({ credits: 5 });
    const person = await createCustomer(ctx, org);
    const key = await ctx.createKey(org.id, { scopes: ['customers:write'] });
    const before = { credits: 5, status: (await customerRow(ctx, person.id)).kycStatus };
    const response = await startKyc(org, person.id, undefined, key.key);
    expect(response.statusCode).toBe(403);
    expect(errorOf(response).code).toBe('forbidden_scope');
    await expectNothingArmed(ctx, org, person.id, before);
  });

  it("when another organisation's customer is named, it answers 404 and touches neither organisation", async () => {
    const owner = await ctx.createOrg({ credits: 5 });
    const stranger = await ctx.createOrg({ credits: 5 });
    const person = await createCustomer(ctx, owner);
    const before = { credits: 5, status: (await customerRow(ctx, person.id)).kycStatus };
    const response = await startKyc(stranger, person.id);
    expect(response.statusCode, response.body).toBe(404);
    expect(errorOf(response).code).toBe('not_found');
    await expectNothingArmed(ctx, owner, person.id, before);
    expect(await balanceOf(ctx, stranger.id)).toBe(5);
    expect(await verificationsOf(ctx, stranger.id)).toEqual([]);
    expect(await emailsOf(ctx, stranger.id)).toEqual([]);
  });

  it('when the previous KYC FAILED, a new start is allowed: it charges again, emails a new link and clears kyc_completed_at', async () => {
    const org = await ctx.createOrg({ credits: 5 });
    const person = await createCustomer(ctx, org);
    const backOffice = testServices(ctx.database).backOffice;
    const operator = { type: 'operator' as const, id: 'test' };
    const first = await startKyc(org, person.id);
    expect(first.statusCode, first.body).toBe(200);
    await backOffice.submit(org.id, person.id, operator);
    await backOffice.verdict(org.id, person.id, { result: 'FAILED' }, operator);
    expect((await customerRow(ctx, person.id)).kycCompletedAt).not.toBeNull();

    const again = await startKyc(org, person.id);
    expect(again.statusCode, again.body).toBe(200);
    const body = again.json<IndividualStart & { kyc_completed_at: string | null; identity: unknown }>();
    expect(body.kyc_status).toBe('PENDING');
    expect(body.kyc_completed_at).toBeNull();
    expect(body.identity).toBeNull();
    expect(body.verification_link).not.toBe(first.json<IndividualStart>().verification_link);
    expect(await balanceOf(ctx, org.id)).toBe(3);
    expect(await ledgerOf(ctx, org.id)).toHaveLength(2);
    expect(await verificationsOf(ctx, org.id, person.id)).toHaveLength(2);
    expect((await emailsOf(ctx, org.id)).map((email) => email.link).sort()).toEqual(
      [first.json<IndividualStart>().verification_link, body.verification_link].sort(),
    );
  });

  it('when the person was VERIFIED, a start answers 409', async () => {
    const org = await ctx.createOrg({ credits: 5 });
    const person = await createCustomer(ctx, org);
    await setStatus(ctx, person.id, 'VERIFIED');
    const response = await startKyc(org, person.id);
    expect(response.statusCode).toBe(409);
    await expectNothingArmed(ctx, org, person.id, { credits: 5, status: 'VERIFIED' });
  });
});

describe('POST /v1/entities/{id}/ubos/{uboId}/send-link', () => {
  async function entityWithOwner(org: TestOrg) {
    const entity = await createEntity(ctx, org);
    const response = await ctx.request('POST', `/v1/entities/${entity.id}/ubos`, {
      key: org.key,
      body: {
        owners: [
          { fullName: 'Olive Owner', email: `olive-${entity.id.slice(0, 8)}@example.test`, roleTypes: ['SHAREHOLDER'], percentageHeld: 60 },
        ],
      },
    });
    expect(response.statusCode, response.body).toBe(200);
    const owner = response.json<{ ubos: Array<{ id: string; kyc_email: string; linked_customer: { id: string } }> }>().ubos[0]!;
    return { entity, owner };
  }

  it("when an owner's link is sent, it emails the owner, charges 1 credit and arms the owner's KYC", async () => {
    const org = await ctx.createOrg({ credits: 5 });
    const { entity, owner } = await entityWithOwner(org);
    const response = await ctx.request('POST', `/v1/entities/${entity.id}/ubos/${owner.id}/send-link`, { key: org.key });
    expect(response.statusCode, response.body).toBe(200);
    const body = response.json<{ id: string; kyc_status: string; verification_link?: string }>();
    expect(body.id).toBe(owner.id);
    expect(body.kyc_status).toBe('PENDING');
    expect(body.verification_link).toMatch(LINK);

    const [verification] = await verificationsOf(ctx, org.id, owner.linked_customer.id);
    expect(verification).toMatchObject({ kind: 'KYC', beneficialOwnerId: owner.id, cost: 1 });
    expect(await balanceOf(ctx, org.id)).toBe(4);
    expect(await ledgerOf(ctx, org.id)).toEqual([
      expect.objectContaining({ delta: -1, reason: 'kyc_start', verificationId: verification!.id }),
    ]);
    const sent = await emailsOf(ctx, org.id);
    expect(sent).toHaveLength(1);
    expect(sent[0]).toMatchObject({ recipient: owner.kyc_email, link: body.verification_link });
    expect((await customerRow(ctx, entity.id)).kycStatus).not.toBe('PENDING');
  });

  it("when an owner's link is sent twice, the second answers 409 and charges nothing more", async () => {
    const org = await ctx.createOrg({ credits: 5 });
    const { entity, owner } = await entityWithOwner(org);
    expect((await ctx.request('POST', `/v1/entities/${entity.id}/ubos/${owner.id}/send-link`, { key: org.key })).statusCode).toBe(200);
    const again = await ctx.request('POST', `/v1/entities/${entity.id}/ubos/${owner.id}/send-link`, { key: org.key });
    expect(again.statusCode).toBe(409);
    expect(await balanceOf(ctx, org.id)).toBe(4);
    expect(await emailsOf(ctx, org.id)).toHaveLength(1);
  });

  it("when an owner's link is billed to the customer, it emails a pay link and spends no credits", async () => {
    const org = await ctx.createOrg({ credits: 5 });
    const { entity, owner } = await entityWithOwner(org);
    const response = await ctx.request('POST', `/v1/entities/${entity.id}/ubos/${owner.id}/send-link`, {
      key: org.key,
      body: { payer: 'customer' },
    });
    expect(response.statusCode, response.body).toBe(200);
    expect(response.json<{ verification_link: string }>().verification_link).toContain('/pay/');
    expect(await balanceOf(ctx, org.id)).toBe(5);
    expect(await ledgerOf(ctx, org.id)).toEqual([]);
    expect((await verificationsOf(ctx, org.id, owner.linked_customer.id))[0]).toMatchObject({
      payer: 'customer',
      status: 'PAYMENT_PENDING',
    });
  });

  it("when the owner has a recorded representative, the owner's link goes to the representative", async () => {
    const org = await ctx.createOrg({ credits: 5 });
    const person = await createCustomer(ctx, org, { representative: true });
    const entity = await createEntity(ctx, org);
    const added = await ctx.request('POST', `/v1/entities/${entity.id}/ubos`, {
      key: org.key,
      body: { owners: [{ fullName: person.dto.full_name, email: person.email, roleTypes: ['SHAREHOLDER'], percentageHeld: 40 }] },
    });
    expect(added.statusCode, added.body).toBe(200);
    const owner = added.json<{ ubos: Array<{ id: string; linked_customer: { id: string } }> }>().ubos[0]!;
    expect(owner.linked_customer.id).toBe(person.id);

    const response = await ctx.request('POST', `/v1/entities/${entity.id}/ubos/${owner.id}/send-link`, { key: org.key });
    expect(response.statusCode, response.body).toBe(200);
    const sent = await emailsOf(ctx, org.id);
    expect(sent).toHaveLength(1);
    expect(sent[0]).toMatchObject({
      recipient: person.representativeEmail,
      link: response.json<{ verification_link: string }>().verification_link,
    });
    expect(sent[0]!.body).toMatch(/^Hello Attorney /);
    expect((await verificationsOf(ctx, org.id, person.id))[0]!.recipientEmail).toBe(person.representativeEmail);
  });

  it("when the entity's own default payer is customer, an omitted payer bills the owner's link to the customer", async () => {
    const org = await ctx.createOrg({ credits: 5, defaultPayer: 'organization' });
    const { entity, owner } = await entityWithOwner(org);
    await ctx.database.db.update(customers).set({ defaultPayer: 'customer' }).where(eq(customers.id, entity.id));
    const response = await ctx.request('POST', `/v1/entities/${entity.id}/ubos/${owner.id}/send-link`, { key: org.key });
    expect(response.statusCode, response.body).toBe(200);
    expect(response.json<{ verification_link: string }>().verification_link).toContain('/pay/');
    expect((await verificationsOf(ctx, org.id, owner.linked_customer.id))[0]).toMatchObject({
      payer: 'customer',
      status: 'PAYMENT_PENDING',
      cost: 0,
    });
    expect(await balanceOf(ctx, org.id)).toBe(5);
    expect(await ledgerOf(ctx, org.id)).toEqual([]);
  });

  it('when the owner id is unknown, it answers 404 and arms nothing', async () => {
    const org = await ctx.createOrg({ credits: 5 });
    const { entity } = await entityWithOwner(org);
    const response = await ctx.request('POST', `/v1/entities/${entity.id}/ubos/6a1f3c4e-2222-4b4b-8c8c-abcdefabcdef/send-link`, {
      key: org.key,
    });
    expect(response.statusCode, response.body).toBe(404);
    expect(errorOf(response).code).toBe('not_found');
    expect(await verificationsOf(ctx, org.id)).toEqual([]);
    expect(await ledgerOf(ctx, org.id)).toEqual([]);
    expect(await emailsOf(ctx, org.id)).toEqual([]);
    expect(await balanceOf(ctx, org.id)).toBe(5);
  });

  it('when the owner belongs to another entity, it answers 404', async () => {
    const org = await ctx.createOrg({ credits: 5 });
    const { owner } = await entityWithOwner(org);
    const other = await createEntity(ctx, org);
    const response = await ctx.request('POST', `/v1/entities/${other.id}/ubos/${owner.id}/send-link`, { key: org.key });
    expect(response.statusCode).toBe(404);
    expect(await balanceOf(ctx, org.id)).toBe(5);
  });

  it('when the organisation lacks credits, it answers 402 and arms nothing', async () => {
    const org = await ctx.createOrg({ credits: 0 });
    const { entity, owner } = await entityWithOwner(org);
    const before = { credits: 0, status: (await customerRow(ctx, owner.linked_customer.id)).kycStatus };
    const response = await ctx.request('POST', `/v1/entities/${entity.id}/ubos/${owner.id}/send-link`, { key: org.key, body: {} });
    expect(response.statusCode).toBe(402);
    await expectNothingArmed(ctx, org, owner.linked_customer.id, before);
  });
});
