import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext } from '../helpers/harness.js';
import {
  balanceOf,
  createCustomer,
  createEntity,
  customerRow,
  emailsOf,
  expectNothingArmed,
  ledgerOf,
  verificationsOf,
} from './verification-fixtures.js';

let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

describe('starts under replay and concurrency', () => {
  it('when a KYB start is replayed with the same Idempotency-Key, it answers the same body and charges and emails once', async () => {
    const org = await ctx.createOrg({ credits: 10 });
    const entity = await createEntity(ctx, org);
    const headers = { 'idempotency-key': `kyb-${entity.id}` };
    const first = await ctx.request('POST', `/v1/entities/${entity.id}/kyb`, { key: org.key, headers, body: { method: 'automated' } });
    const second = await ctx.request('POST', `/v1/entities/${entity.id}/kyb`, { key: org.key, headers, body: { method: 'automated' } });
    expect(first.statusCode, first.body).toBe(200);
    expect(second.statusCode, second.body).toBe(200);
    expect(second.headers['idempotent-replayed']).toBe('true');
    expect(second.json()).toEqual(first.json());
    expect(await ledgerOf(ctx, org.id)).toHaveLength(1);
    expect(await emailsOf(ctx, org.id)).toHaveLength(1);
    expect(await verificationsOf(ctx, org.id)).toHaveLength(1);
    expect(await balanceOf(ctx, org.id)).toBe(8);
  });

  it('when a KYC start is replayed concurrently with the same Idempotency-Key, it charges and emails once', async () => {
    const org = await ctx.createOrg({ credits: 10 });
    const person = await createCustomer(ctx, org);
    const headers = { 'idempotency-key': `kyc-${person.id}` };
    const responses = await Promise.all(
      Array.from({ length: 5 }, () => ctx.request('POST', `/v1/customers/${person.id}/kyc`, { key: org.key, headers, body: {} })),
    );
    expect(responses.map((response) => response.statusCode)).toEqual([200, 200, 200, 200, 200]);
    const links = new Set(responses.map((response) => response.json<{ verification_link: string }>().verification_link));
    expect(links.size).toBe(1);
    expect(await ledgerOf(ctx, org.id)).toHaveLength(1);
    expect(await emailsOf(ctx, org.id)).toHaveLength(1);
    expect(await balanceOf(ctx, org.id)).toBe(9);
  });

  it('when 10 starts on one entity race without an idempotency key, exactly one wins: one charge, one email, nine 409s', async () => {
    const org = await ctx.createOrg({ credits: 100 });
    const entity = await createEntity(ctx, org);
    const responses = await Promise.all(
      Array.from({ length: 10 }, () =>
        ctx.request('POST', `/v1/entities/${entity.id}/kyb`, { key: org.key, body: { method: 'contact_led' } }),
      ),
    );
    const codes = responses.map((response) => response.statusCode).sort();
    expect(codes).toEqual([200, 409, 409, 409, 409, 409, 409, 409, 409, 409]);
    expect(await verificationsOf(ctx, org.id)).toHaveLength(1);
    expect(await ledgerOf(ctx, org.id)).toEqual([expect.objectContaining({ delta: -3, balanceAfter: 97 })]);
    expect(await emailsOf(ctx, org.id)).toHaveLength(1);
    expect(await balanceOf(ctx, org.id)).toBe(97);
    expect((await customerRow(ctx, entity.id)).kycStatus).toBe('PENDING');
  });

  it('when starts on different entities race for the last credits, the balance never goes negative', async () => {
    const org = await ctx.createOrg({ credits: 5 });
    const entities = await Promise.all(Array.from({ length: 4 }, () => createEntity(ctx, org)));
    const responses = await Promise.all(
      entities.map((entity) => ctx.request('POST', `/v1/entities/${entity.id}/kyb`, { key: org.key, body: {} })),
    );
    const codes = responses.map((response) => response.statusCode).sort();
    expect(codes).toEqual([200, 200, 402, 402]);
    expect(await balanceOf(ctx, org.id)).toBe(1);
    const ledger = await ledgerOf(ctx, org.id);
    expect(ledger.map((row) => row.balanceAfter).sort()).toEqual([1, 3]);
    expect(await verificationsOf(ctx, org.id)).toHaveLength(2);
    expect(await emailsOf(ctx, org.id)).toHaveLength(2);
  });

  it('when a refused start (402) carries an Idempotency-Key, nothing is armed and the replay answers the same 402', async () => {
    const org = await ctx.createOrg({ credits: 1 });
    const entity = await createEntity(ctx, org);
    const status = (await customerRow(ctx, entity.id)).kycStatus;
    const headers = { 'idempotency-key': `poor-${entity.id}` };
    const first = await ctx.request('POST', `/v1/entities/${entity.id}/kyb`, { key: org.key, headers, body: {} });
    const second = await ctx.request('POST', `/v1/entities/${entity.id}/kyb`, { key: org.key, headers, body: {} });
    expect(first.statusCode, first.body).toBe(402);
    expect(second.statusCode).toBe(402);
    expect(second.json()).toEqual(first.json());
    await expectNothingArmed(ctx, org, entity.id, { credits: 1, status });
  });
});
