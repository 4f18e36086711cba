import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { createEntity, createIndividual, expectValidation, postEntity, randomDigits, sql, uniqueName } from './entity-test-helpers.js';

let ctx: TestContext;
let org: TestOrg;
beforeAll(async () => {
  ctx = await createTestContext();
  org = await ctx.createOrg();
});
afterAll(async () => ctx?.close());

async function patchEntity(ref: string, body: Record<string, unknown>) {
  return ctx.request('PATCH', `/v1/entities/${encodeURIComponent(ref)}`, { key: org.key, body });
}

/** An entity whose KYB reached VERIFIED (set directly, as the verdict flow would). */
async function verifiedEntity(body: Record<string, unknown> = {}) {
  const entity = await createEntity(ctx, org, {
    externalId: `crm-${randomDigits(8)}`,
    abn: randomDigits(11),
    acn: randomDigits(9),
    ...body,
  });
  await sql(ctx, `UPDATE customers SET kyc_status = 'VERIFIED', kyc_completed_at = now() WHERE id = $1`, [entity.id]);
  return entity;
}

async function verifiedInternational() {
  const entity = await createEntity(ctx, org, {
    externalId: `crm-${randomDigits(8)}`,
    origin: 'INTERNATIONAL',
    countryOfFormation: 'NZL',
    registrationNumber: 'NZ-1',
  });
  await sql(ctx, `UPDATE customers SET kyc_status = 'VERIFIED' WHERE id = $1`, [entity.id]);
  return entity;
}

describe('freeze after KYB VERIFIED: upsert', () => {
  it.each([
    ['name', () => uniqueName('Changed')],
    ['abn', () => randomDigits(11)],
    ['acn', () => randomDigits(9)],
  ])('when an upsert changes %s, it answers 422 naming it and changes nothing', async (field, value) => {
    const entity = await verifiedEntity();
    const response = await postEntity(ctx, org, { externalId: entity.external_id, [field]: value() });
    expectValidation(response, field);
    const [row] = await sql(ctx, 'SELECT name, abn, acn FROM customers WHERE id = $1', [entity.id]);
    expect(row).toEqual({ name: entity.name, abn: entity.abn, acn: entity.acn });
  });

  it('when an upsert changes countryOfFormation of an INTERNATIONAL entity, it answers 422 naming it', async () => {
    const entity = await verifiedInternational();
    expectValidation(await postEntity(ctx, org, { externalId: entity.external_id, countryOfFormation: 'GBR' }), 'countryOfFormation');
  });

  it('when an upsert changes registrationNumber of a verified INTERNATIONAL entity, it answers 422 (as PATCH does)', async () => {
    const entity = await verifiedInternational();
    expectValidation(await postEntity(ctx, org, { externalId: entity.external_id, registrationNumber: 'NZ-2' }), 'registrationNumber');
    expect((await postEntity(ctx, org, { externalId: entity.external_id, registrationNumber: 'NZ-1' })).statusCode).toBe(200);
  });

  it('when an upsert re-sends the frozen values unchanged, it answers 200', async () => {
    const entity = await verifiedEntity();
    const spacedAbn = `${entity.abn.slice(0, 2)} ${entity.abn.slice(2)}`;
    const response = await postEntity(ctx, org, {
      externalId: entity.external_id,
      type: 'COMPANY',
      name: entity.name,
      abn: spacedAbn,
      acn: entity.acn,
    });
    expect(response.statusCode, response.body).toBe(200);
    expect(response.json().kyb_status).toBe('VERIFIED');
  });

  it('when an upsert re-sends an INTERNATIONAL countryOfFormation unchanged (lower case), it answers 200', async () => {
    const entity = await verifiedInternational();
    const response = await postEntity(ctx, org, { externalId: entity.external_id, countryOfFormation: 'nzl', name: entity.name });
    expect(response.statusCode, response.body).toBe(200);
  });

  it('when an upsert changes only non-frozen fields of a verified entity, it is applied', async () => {
    const entity = await verifiedEntity();
    const response = await postEntity(ctx, org, {
      externalId: entity.external_id,
      address: '9 New Rd',
      risk: { handlesCashOrCrypto: true },
    });
    expect(response.statusCode).toBe(200);
    const [row] = await sql(ctx, 'SELECT address, risk_answers FROM customers WHERE id = $1', [entity.id]);
    expect(row!.address).toBe('9 New Rd');
    expect(row!.risk_answers).toMatchObject({ handlesCashOrCrypto: true });
  });
});

describe('freeze after KYB VERIFIED: PATCH', () => {
  it.each([
    ['name', () => uniqueName('Changed')],
    ['abn', () => randomDigits(11)],
    ['acn', () => randomDigits(9)],
    ['abn', () => null],
  ])('when a PATCH changes %s, it answers 422 naming it', async (field, value) => {
    const entity = await verifiedEntity();
    expectValidation(await patchEntity(entity.id, { [field]: value() }), field);
  });

  it('when a PATCH changes registrationNumber of a verified INTERNATIONAL entity, it answers 422', async () => {
    const entity = await verifiedInternational();
    expectValidation(await patchEntity(entity.id, { registrationNumber: 'NZ-2' }), 'registrationNumber');
  });

  it('when a PATCH re-sends frozen values unchanged, it answers 200', async () => {
    const entity = await verifiedEntity();
    const response = await patchEntity(entity.id, { name: entity.name, abn: entity.abn, acn: entity.acn });
    expect(response.statusCode, response.body).toBe(200);
    const international = await verifiedInternational();
    expect((await patchEntity(international.id, { registrationNumber: 'NZ-1' })).statusCode).toBe(200);
  });

  it('when a PATCH changes address and risk of a verified entity, both are applied', async () => {
    const entity = await verifiedEntity({ address: 'Old address' });
    const response = await patchEntity(entity.id, { address: 'New address', risk: { complexStructure: true } });
    expect(response.statusCode, response.body).toBe(200);
    const [row] = await sql(ctx, 'SELECT address, risk_rating FROM customers WHERE id = $1', [entity.id]);
    expect(row).toEqual({ address: 'New address', risk_rating: 'HIGH' });
  });
});

describe('PATCH /entities/{id}', () => {
  it('when fields are omitted, they are untouched', async () => {
    const entity = await createEntity(ctx, org, { abn: randomDigits(11), acn: randomDigits(9), address: 'Kept St' });
    const response = await patchEntity(entity.id, { name: uniqueName('Patched') });
    expect(response.statusCode).toBe(200);
    expect(response.json()).toMatchObject({ abn: entity.abn, acn: entity.acn });
    const [row] = await sql(ctx, 'SELECT address FROM customers WHERE id = $1', [entity.id]);
    expect(row!.address).toBe('Kept St');
  });

  it('when abn, acn and address are null, it clears them', async () => {
    const entity = await createEntity(ctx, org, { abn: randomDigits(11), acn: randomDigits(9), address: 'Gone St' });
    const response = await patchEntity(entity.id, { abn: null, acn: null, address: null });
    expect(response.statusCode, response.body).toBe(200);
    expect(response.json()).toMatchObject({ abn: null, acn: null });
    const [row] = await sql(ctx, 'SELECT abn, acn, address FROM customers WHERE id = $1', [entity.id]);
    expect(row).toEqual({ abn: null, acn: null, address: null });
  });

  it('when registrationNumber is null on an INTERNATIONAL entity, it clears it', async () => {
    const entity = await createEntity(ctx, org, { origin: 'INTERNATIONAL', countryOfFormation: 'SGP', registrationNumber: 'SG-9' });
    const response = await patchEntity(entity.id, { registrationNumber: null });
    expect(response.statusCode, response.body).toBe(200);
    expect(response.json().registration_number).toBeNull();
  });

  it('when ABN and ACN are patched with spaces, they are stripped', async () => {
    const entity = await createEntity(ctx, org);
    const abn = randomDigits(11);
    const response = await patchEntity(entity.id, { abn: `${abn.slice(0, 2)} ${abn.slice(2, 5)} ${abn.slice(5)}` });
    expect(response.json().abn).toBe(abn);
  });

  it('when an AUSTRALIAN entity is patched with a registrationNumber, it answers 422', async () => {
    const entity = await createEntity(ctx, org);
    expectValidation(await patchEntity(entity.id, { registrationNumber: 'X1' }), 'registrationNumber');
  });

  it('when an INTERNATIONAL entity is patched with an abn, it answers 422', async () => {
    const entity = await createEntity(ctx, org, { origin: 'INTERNATIONAL', countryOfFormation: 'USA' });
    expectValidation(await patchEntity(entity.id, { abn: randomDigits(11) }), 'abn');
  });

  it('when a PATCH would take another entity’s ABN, it answers 409', async () => {
    const other = await createEntity(ctx, org, { abn: randomDigits(11) });
    const entity = await createEntity(ctx, org);
    const response = await patchEntity(entity.id, { abn: other.abn });
    expect(response.statusCode, response.body).toBe(409);
  });

  it('when contact is sent, it replaces the contact person', async () => {
    const entity = await createEntity(ctx, org, { contact: { fullName: 'Old Contact', email: 'old.contact@example.com' } });
    const person = await createIndividual(ctx, org);
    const response = await patchEntity(entity.id, { contact: { customerId: person.id, kycRequired: false } });
    expect(response.statusCode, response.body).toBe(200);
    expect(response.json().contact).toMatchObject({ id: person.id, kyc_required: false });
    const fetched = (await ctx.request('GET', `/v1/entities/${entity.id}`, { key: org.key })).json();
    expect(fetched.contact.id).toBe(person.id);
  });

  it.each([
    ['type', 'TRUST'],
    ['origin', 'INTERNATIONAL'],
    ['kybStatus', 'VERIFIED'],
    ['kyb_status', 'VERIFIED'],
    ['countryOfFormation', 'NZL'],
    ['externalId', 'new-id'],
  ])('when a PATCH sends %s, it answers 422 unknown property and changes nothing', async (field, value) => {
    const entity = await createEntity(ctx, org);
    expectValidation(await patchEntity(entity.id, { [field]: value }), field);
    const [row] = await sql(ctx, 'SELECT type, origin, kyc_status, external_id FROM customers WHERE id = $1', [entity.id]);
    expect(row).toEqual({ type: 'COMPANY', origin: 'AUSTRALIAN', kyc_status: entity.kyb_status, external_id: null });
  });

  it('when the PATCH targets the external_id, it finds the entity', async () => {
    const externalId = `crm-${randomDigits(8)}`;
    await createEntity(ctx, org, { externalId });
    const response = await patchEntity(externalId, { address: 'By external id' });
    expect(response.statusCode).toBe(200);
    expect(response.json().external_id).toBe(externalId);
  });

  it('when the PATCH targets an individual or another organisation’s entity, it answers 404', async () => {
    const person = await createIndividual(ctx, org);
    expect((await patchEntity(person.id, { address: 'x' })).statusCode).toBe(404);
    const otherOrg = await ctx.createOrg();
    const foreign = await createEntity(ctx, otherOrg);
    expect((await patchEntity(foreign.id, { address: 'x' })).statusCode).toBe(404);
  });
});
