import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { createEntity, expectValidation, postEntity, randomDigits, sql, uniqueName } from './entity-test-helpers.js';

let ctx: TestContext;
let org: TestOrg;
beforeAll(async () => {
  ctx = await createTestContext();
  org = await ctx.createOrg();
});
afterAll(async () => ctx?.close());

async function countEntities(): Promise<number> {
  const [row] = await sql<{ count: number }>(ctx, `SELECT count(*)::int AS count FROM customers WHERE org_id = $1 AND kind = 'entity'`, [
    org.id,
  ]);
  return row!.count;
}

describe('POST /entities: required fields on create', () => {
  it('when type and name are both missing, it answers 422 naming each and writes nothing', async () => {
    const before = await countEntities();
    const response = await postEntity(ctx, org, { abn: '51824753556' });
    expectValidation(response, 'type', 'name');
    expect(await countEntities()).toBe(before);
  });

  it('when only the name is missing, it answers 422 naming name', async () => {
    expectValidation(await postEntity(ctx, org, { type: 'TRUST' }), 'name');
  });

  it('when only the type is missing, it answers 422 naming type', async () => {
    expectValidation(await postEntity(ctx, org, { name: uniqueName() }), 'type');
  });

  it('when an INTERNATIONAL entity has no countryOfFormation, it answers 422 naming countryOfFormation', async () => {
    expectValidation(await postEntity(ctx, org, { type: 'COMPANY', name: uniqueName(), origin: 'INTERNATIONAL' }), 'countryOfFormation');
  });

  it('when origin is omitted, it defaults to AUSTRALIAN with country_of_formation AUS', async () => {
    const entity = await createEntity(ctx, org);
    expect(entity.origin).toBe('AUSTRALIAN');
    expect(entity.country_of_formation).toBe('AUS');
  });
});

describe('POST /entities: ABN and ACN', () => {
  it('when ABN and ACN carry spaces, it strips them in the response and in the database', async () => {
    const entity = await createEntity(ctx, org, { abn: '51 824 753 556', acn: ' 004 085 616 ' });
    expect(entity.abn).toBe('51824753556');
    expect(entity.acn).toBe('004085616');
    const [row] = await sql(ctx, 'SELECT abn, acn FROM customers WHERE id = $1', [entity.id]);
    expect(row).toEqual({ abn: '51824753556', acn: '004085616' });
  });

  it.each([
    ['abn', '5182475355'],
    ['abn', '518247535561'],
    ['abn', '5182475355A'],
    ['acn', '00408561'],
    ['acn', '0040856167'],
    ['acn', '00408561X'],
  ])('when %s is %s (wrong length or not digits), it answers 422 naming it', async (field, value) => {
    expectValidation(await postEntity(ctx, org, { type: 'COMPANY', name: uniqueName(), [field]: value }), field);
  });

  it.each(['abn', 'acn'])('when an INTERNATIONAL entity sends %s, it answers 422 naming it', async (field) => {
    const value = randomDigits(field === 'abn' ? 11 : 9);
    const response = await postEntity(ctx, org, {
      type: 'COMPANY',
      name: uniqueName(),
      origin: 'INTERNATIONAL',
      countryOfFormation: 'NZL',
      [field]: value,
    });
    expectValidation(response, field);
  });
});

describe('POST /entities: a payload invalid on its own is rejected before matching', () => {
  it('when an INTERNATIONAL payload carries the ABN of a stored AUSTRALIAN entity, it answers 422 on abn (not 409)', async () => {
    const abn = randomDigits(11);
    await createEntity(ctx, org, { abn });
    const response = await postEntity(ctx, org, {
      type: 'COMPANY',
      name: uniqueName(),
      origin: 'INTERNATIONAL',
      countryOfFormation: 'NZL',
      abn,
    });
    expectValidation(response, 'abn');
  });
});

describe('POST /entities: country of formation and registration number', () => {
  it.each(['NZL', 'AUS'])('when an AUSTRALIAN entity sends countryOfFormation %s, it answers 422 naming it', async (country) => {
    expectValidation(
      await postEntity(ctx, org, { type: 'COMPANY', name: uniqueName(), countryOfFormation: country }),
      'countryOfFormation',
    );
  });

  it.each(['NZ', 'XXX', 'New Zealand', ''])(
    'when countryOfFormation is %j (not ISO alpha-3), it answers 422 naming it',
    async (country) => {
      const response = await postEntity(ctx, org, {
        type: 'COMPANY',
        name: uniqueName(),
        origin: 'INTERNATIONAL',
        countryOfFormation: country,
      });
      expectValidation(response, 'countryOfFormation');
    },
  );

  it('when countryOfFormation is lower case, it stores it upper-cased', async () => {
    const entity = await createEntity(ctx, org, { origin: 'INTERNATIONAL', countryOfFormation: 'nzl' });
    expect(entity.country_of_formation).toBe('NZL');
    const [row] = await sql(ctx, 'SELECT country_of_formation FROM customers WHERE id = $1', [entity.id]);
    expect(row!.country_of_formation).toBe('NZL');
  });

  it('when an AUSTRALIAN entity sends registrationNumber, it answers 422 naming it', async () => {
    expectValidation(
      await postEntity(ctx, org, { type: 'COMPANY', name: uniqueName(), registrationNumber: 'NZ-123' }),
      'registrationNumber',
    );
  });

  it('when an INTERNATIONAL entity sends registrationNumber, it is stored and returned', async () => {
    const entity = await createEntity(ctx, org, { origin: 'INTERNATIONAL', countryOfFormation: 'GBR', registrationNumber: '  09876543 ' });
    expect(entity).toMatchObject({
      origin: 'INTERNATIONAL',
      country_of_formation: 'GBR',
      registration_number: '09876543',
      abn: null,
      acn: null,
    });
  });
});

describe('POST /entities: limits and unknown properties', () => {
  it('when address is longer than 500 characters, it answers 422 naming address', async () => {
    expectValidation(await postEntity(ctx, org, { type: 'COMPANY', name: uniqueName(), address: 'a'.repeat(501) }), 'address');
  });

  it('when address is exactly 500 characters, it is accepted', async () => {
    await createEntity(ctx, org, { address: 'a'.repeat(500) });
  });

  it('when name is 256 characters, it answers 422 naming name', async () => {
    expectValidation(await postEntity(ctx, org, { type: 'COMPANY', name: 'n'.repeat(256) }), 'name');
  });

  it('when name is 255 characters, it is accepted', async () => {
    const entity = await createEntity(ctx, org, { name: `${'n'.repeat(250)}${Math.random().toString(36).slice(2, 7)}` });
    expect(entity.name).toHaveLength(255);
  });

  it('when registrationNumber is 65 characters, it answers 422 naming registrationNumber', async () => {
    const response = await postEntity(ctx, org, {
      type: 'COMPANY',
      name: uniqueName(),
      origin: 'INTERNATIONAL',
      countryOfFormation: 'NZL',
      registrationNumber: 'r'.repeat(65),
    });
    expectValidation(response, 'registrationNumber');
  });

  it('when externalId is 256 characters, it answers 422 naming externalId (255 is accepted)', async () => {
    expectValidation(await postEntity(ctx, org, { type: 'COMPANY', name: uniqueName(), externalId: 'e'.repeat(256) }), 'externalId');
    const entity = await createEntity(ctx, org, { externalId: `${'e'.repeat(247)}${randomDigits(8)}` });
    expect(entity.external_id).toHaveLength(255);
  });

  it('when an inline contact name is 256 characters or its email is not an email, it answers 422 naming the contact field', async () => {
    expectValidation(
      await postEntity(ctx, org, { type: 'COMPANY', name: uniqueName(), contact: { fullName: 'c'.repeat(256), email: 'c@example.com' } }),
      'contact.fullName',
    );
    expectValidation(
      await postEntity(ctx, org, { type: 'COMPANY', name: uniqueName(), contact: { fullName: 'Casey', email: 'casey' } }),
      'contact.email',
    );
  });

  it('when the body has an unknown property, it answers 422 naming it and writes nothing', async () => {
    const before = await countEntities();
    const response = await postEntity(ctx, org, { type: 'COMPANY', name: uniqueName(), kybStatus: 'VERIFIED' });
    expectValidation(response, 'kybStatus');
    expect(await countEntities()).toBe(before);
  });

  it('when type is not an EntityType, it answers 422 naming type', async () => {
    expectValidation(await postEntity(ctx, org, { type: 'INDIVIDUAL', name: uniqueName() }), 'type');
  });
});
