import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import {
  createEntity,
  createIndividual,
  expectSameDto,
  expectValidation,
  postEntity,
  randomDigits,
  sql,
  uniqueName,
} from './entity-test-helpers.js';

let ctx: TestContext;
let org: TestOrg;
beforeAll(async () => {
  ctx = await createTestContext();
  org = await ctx.createOrg();
});
afterAll(async () => ctx?.close());

async function individualCount(orgId = org.id): Promise<number> {
  const [row] = await sql<{ count: number }>(
    ctx,
    `SELECT count(*)::int AS count FROM customers WHERE org_id = $1 AND kind = 'individual'`,
    [orgId],
  );
  return row!.count;
}

describe('POST /entities: contact by customerId', () => {
  it('when contact.customerId is an existing individual’s UUID, it becomes the contact', async () => {
    const person = await createIndividual(ctx, org);
    const entity = await createEntity(ctx, org, { contact: { customerId: person.id } });
    expect(entity.contact).toEqual({
      id: person.id,
      external_id: person.external_id,
      full_name: person.full_name,
      email: person.email,
      kyc_status: person.kyc_status,
      kyc_required: true,
    });
  });

  it('when contact.customerId is an existing individual’s external_id, it becomes the contact', async () => {
    const externalId = `person-${randomDigits(8)}`;
    const person = await createIndividual(ctx, org, { externalId });
    const entity = await createEntity(ctx, org, { contact: { customerId: externalId } });
    expect(entity.contact).toMatchObject({ id: person.id, external_id: externalId });
  });

  it('when contact.customerId is unknown, it answers 422 on contact.customerId and creates nothing', async () => {
    const name = uniqueName();
    const response = await postEntity(ctx, org, { type: 'COMPANY', name, contact: { customerId: 'no-such-person' } });
    expectValidation(response, 'contact.customerId');
    expect(await sql(ctx, 'SELECT id FROM customers WHERE org_id = $1 AND name = $2', [org.id, name])).toEqual([]);
  });

  it('when contact.customerId is an entity’s id, it answers 422 on contact.customerId', async () => {
    const other = await createEntity(ctx, org);
    expectValidation(
      await postEntity(ctx, org, { type: 'COMPANY', name: uniqueName(), contact: { customerId: other.id } }),
      'contact.customerId',
    );
  });

  it('when contact.customerId belongs to another organisation, it answers 422 on contact.customerId', async () => {
    const otherOrg = await ctx.createOrg();
    const stranger = await createIndividual(ctx, otherOrg);
    expectValidation(
      await postEntity(ctx, org, { type: 'COMPANY', name: uniqueName(), contact: { customerId: stranger.id } }),
      'contact.customerId',
    );
  });
});

describe('POST /entities: inline contact', () => {
  it('when fullName+email match an individual case-insensitively, it reuses that individual and creates none', async () => {
    const person = await createIndividual(ctx, org, { fullName: 'Robin Reuse', email: 'robin.reuse@example.com' });
    const before = await individualCount();
    const entity = await createEntity(ctx, org, { contact: { fullName: 'ROBIN REUSE', email: 'Robin.Reuse@Example.com' } });
    expect(entity.contact.id).toBe(person.id);
    expect(await individualCount()).toBe(before);
  });

  it('when no individual matches, it creates a contact-role individual added via INTEGRATION with kyc NOT_STARTED', async () => {
    const before = await individualCount();
    const entity = await createEntity(ctx, org, { contact: { fullName: 'Nova Newcontact', email: 'nova@example.com' } });
    expect(await individualCount()).toBe(before + 1);
    expect(entity.contact).toMatchObject({
      full_name: 'Nova Newcontact',
      email: 'nova@example.com',
      kyc_status: 'NOT_STARTED',
      kyc_required: true,
      external_id: null,
    });
    const [row] = await sql(ctx, 'SELECT kind, is_contact_only, added_via, kyc_status FROM customers WHERE id = $1', [entity.contact.id]);
    expect(row).toEqual({ kind: 'individual', is_contact_only: true, added_via: 'INTEGRATION', kyc_status: 'NOT_STARTED' });
  });

  it('when kycRequired is false for a new inline contact, it is recorded and the person is NOT_REQUIRED', async () => {
    const entity = await createEntity(ctx, org, { contact: { fullName: 'Opal Optional', email: 'opal@example.com', kycRequired: false } });
    expect(entity.contact).toMatchObject({ kyc_required: false, kyc_status: 'NOT_REQUIRED' });
    const [row] = await sql(ctx, 'SELECT contact_kyc_required FROM customers WHERE id = $1', [entity.id]);
    expect(row!.contact_kyc_required).toBe(false);
  });

  it('when kycRequired is false for a customerId contact, the entity records it', async () => {
    const person = await createIndividual(ctx, org);
    const entity = await createEntity(ctx, org, { contact: { customerId: person.id, kycRequired: false } });
    expect(entity.contact).toMatchObject({ id: person.id, kyc_required: false });
  });

  it('when both customerId and inline fields are sent, it answers 422 on contact', async () => {
    const person = await createIndividual(ctx, org);
    const response = await postEntity(ctx, org, {
      type: 'COMPANY',
      name: uniqueName(),
      contact: { customerId: person.id, fullName: person.full_name, email: person.email },
    });
    expectValidation(response, 'contact');
  });

  it('when fullName is sent without email, it answers 422 on contact.email', async () => {
    expectValidation(
      await postEntity(ctx, org, { type: 'COMPANY', name: uniqueName(), contact: { fullName: 'Half Given' } }),
      'contact.email',
    );
  });

  it('when email is sent without fullName, it answers 422 on contact.fullName', async () => {
    expectValidation(
      await postEntity(ctx, org, { type: 'COMPANY', name: uniqueName(), contact: { email: 'half@example.com' } }),
      'contact.fullName',
    );
  });

  it('when contact is empty, it answers 422 on contact', async () => {
    expectValidation(await postEntity(ctx, org, { type: 'COMPANY', name: uniqueName(), contact: {} }), 'contact');
  });

  it('when contact has an unknown property, it answers 422 naming it', async () => {
    expectValidation(
      await postEntity(ctx, org, {
        type: 'COMPANY',
        name: uniqueName(),
        contact: { fullName: 'A B', email: 'ab@example.com', phone: '1' },
      }),
      'contact.phone',
    );
  });
});

describe('entity DTO contact summary', () => {
  it('when a contact is set, the DTO embeds exactly id, external_id, full_name, email, kyc_status, kyc_required', async () => {
    const entity = await createEntity(ctx, org, { contact: { fullName: 'Kim Keys', email: 'kim.keys@example.com' } });
    expect(Object.keys(entity.contact).sort()).toEqual(['email', 'external_id', 'full_name', 'id', 'kyc_required', 'kyc_status']);
    const fetched = (await ctx.request('GET', `/v1/entities/${entity.id}`, { key: org.key })).json();
    expect(fetched.contact).toEqual(entity.contact);
  });

  it('when no contact is set, the DTO carries contact null', async () => {
    const entity = await createEntity(ctx, org);
    expect(entity.contact).toBeNull();
  });

  it('when a contact is created, nothing is sent, armed or billed', async () => {
    const fresh = await ctx.createOrg({ credits: 10 });
    const ledger = async () =>
      (await sql<{ count: number }>(ctx, 'SELECT count(*)::int AS count FROM credit_ledger WHERE org_id = $1', [fresh.id]))[0]!.count;
    const ledgerBefore = await ledger();
    await createEntity(ctx, fresh, { contact: { fullName: 'Quiet Contact', email: 'quiet@example.com' } });
    const person = await createIndividual(ctx, fresh);
    await createEntity(ctx, fresh, { contact: { customerId: person.id } });
    expect(await sql(ctx, 'SELECT id FROM emails WHERE org_id = $1', [fresh.id])).toEqual([]);
    expect(await sql(ctx, 'SELECT id FROM verifications WHERE org_id = $1', [fresh.id])).toEqual([]);
    expect(await ledger()).toBe(ledgerBefore);
    expect((await sql(ctx, 'SELECT credits FROM organisations WHERE id = $1', [fresh.id]))[0]!.credits).toBe(10);
  });

  it('when an upsert sends another contact, it replaces the contact person', async () => {
    const externalId = `crm-${randomDigits(8)}`;
    const first = await createEntity(ctx, org, { externalId, contact: { fullName: 'First Person', email: 'first@example.com' } });
    const response = await postEntity(ctx, org, { externalId, contact: { fullName: 'Second Person', email: 'second@example.com' } });
    expect(response.statusCode).toBe(200);
    expect(response.json().contact.full_name).toBe('Second Person');
    expect(response.json().contact.id).not.toBe(first.contact.id);
  });

  it('when an upsert omits contact, the contact is kept', async () => {
    const externalId = `crm-${randomDigits(8)}`;
    const first = await createEntity(ctx, org, { externalId, contact: { fullName: 'Kept Person', email: 'kept@example.com' } });
    const response = await postEntity(ctx, org, { externalId, address: 'Somewhere' });
    expect(response.json().contact).toEqual(first.contact);
  });
});

describe('inline contacts under concurrency', () => {
  it('when 20 different entities are created at once with the same new inline contact, one individual is created', async () => {
    const before = await individualCount();
    const responses = await Promise.all(
      Array.from({ length: 20 }, () =>
        postEntity(ctx, org, {
          type: 'COMPANY',
          name: uniqueName('Shared contact'),
          contact: { fullName: 'Shared Sam', email: 'shared.sam@example.com' },
        }),
      ),
    );
    for (const response of responses) expect(response.statusCode, response.body).toBe(201);
    expect(new Set(responses.map((response) => response.json().contact.id)).size).toBe(1);
    expect(await individualCount()).toBe(before + 1);
  });

  it('when listed, an entity carries the same contact summary as GET /entities/{id}', async () => {
    const entity = await createEntity(ctx, org, {
      externalId: `crm-${randomDigits(8)}`,
      contact: { fullName: 'Listed Lee', email: 'listed.lee@example.com', kycRequired: false },
    });
    const listed = (await ctx.request('GET', '/v1/entities', { key: org.key, query: { external_id: entity.external_id } })).json();
    expect(listed.data).toHaveLength(1);
    expectSameDto(entity, listed.data[0]);
  });
});
