import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { countCustomers, createCustomer, customerRow, issues, person, upsert } from './customers-fixtures.js';

let ctx: TestContext;
let org: TestOrg;
beforeAll(async () => {
  ctx = await createTestContext();
  org = await ctx.createOrg();
});
afterAll(async () => ctx?.close());

const isoDate = (date: Date) => date.toISOString().slice(0, 10);

/** Sends a create that must fail with 422 naming `field`, and proves nothing was written. */
async function rejects(body: Record<string, unknown>, field: string) {
  const before = await countCustomers(ctx, org.id);
  const response = await upsert(ctx, org, body);
  expect(response.statusCode, response.body).toBe(422);
  expect(response.json().error.code).toBe('validation_failed');
  expect(issues(response)).toHaveProperty([field]);
  expect(await countCustomers(ctx, org.id)).toBe(before);
  return response;
}

describe('service codes', () => {
  it('when a service code is unknown, it answers 422 naming the item', async () => {
    const response = await rejects(person({ designatedServices: ['FIN-LOANS', 'nope'] }), 'designatedServices[1]');
    expect(response.json().error.details.issues['designatedServices[1]'][0]).toMatch(/designated-services/);
  });

  it('when a code looks valid but is not in the catalog, it answers 422 (nothing is silently dropped)', async () => {
    await rejects(person({ designatedServices: ['FIN-MORTGAGE'] }), 'designatedServices[0]');
    await rejects(person({ risk: { isNewCustomer: false }, preExistingServices: ['PRO-TAX'] }), 'preExistingServices[0]');
  });

  it('when PUT designated-services carries an unknown code, it answers 422 and keeps the stored set', async () => {
    const dto = await createCustomer(ctx, org, person({ designatedServices: ['FIN-LOANS'] }));
    const response = await ctx.request('PUT', `/v1/customers/${dto.id}/designated-services`, {
      key: org.key,
      body: { service_codes: ['fin-loans'] },
    });
    expect(response.statusCode).toBe(422);
    expect(issues(response)).toHaveProperty(['service_codes[0]']);
    expect((await customerRow(ctx, dto.id)).designated_services).toEqual(['FIN-LOANS']);
  });

  it('when more than 64 codes are sent, it answers 422', async () => {
    const codes = Array.from({ length: 65 }, () => 'FIN-LOANS');
    await rejects(person({ designatedServices: codes }), 'designatedServices');
    const dto = await createCustomer(ctx, org, person());
    const response = await ctx.request('PUT', `/v1/customers/${dto.id}/designated-services`, {
      key: org.key,
      body: { service_codes: codes },
    });
    expect(response.statusCode).toBe(422);
    expect(issues(response)).toHaveProperty(['service_codes']);
  });

  it('when codes repeat, they are deduplicated and PUT returns the normalized set', async () => {
    const dto = await createCustomer(ctx, org, person({ designatedServices: ['FIN-FX', 'FIN-FX', 'RE-BROKER', 'FIN-FX'] }));
    expect((await customerRow(ctx, dto.id)).designated_services).toEqual(['FIN-FX', 'RE-BROKER']);
    const response = await ctx.request('PUT', `/v1/customers/${dto.id}/designated-services`, {
      key: org.key,
      body: { service_codes: ['OTH-BULLION', 'RE-BROKER', 'OTH-BULLION', 'RE-BROKER'] },
    });
    expect(response.statusCode).toBe(200);
    expect(response.json().designated_services).toEqual(['OTH-BULLION', 'RE-BROKER']);
    expect((await customerRow(ctx, dto.id)).designated_services).toEqual(['OTH-BULLION', 'RE-BROKER']);
  });
});

describe('designated flag agreement', () => {
  it('when isDesignatedService is false but the list is non-empty, it answers 422', async () => {
    await rejects(person({ risk: { isDesignatedService: false }, designatedServices: ['FIN-LOANS'] }), 'risk.isDesignatedService');
  });

  it('when isDesignatedService is true but the list is empty, it answers 422', async () => {
    await rejects(person({ risk: { isDesignatedService: true }, designatedServices: [] }), 'risk.isDesignatedService');
  });

  it('when the boolean agrees with the list, it is accepted', async () => {
    const response = await upsert(ctx, org, person({ risk: { isDesignatedService: true }, designatedServices: ['FIN-LOANS'] }));
    expect(response.statusCode).toBe(201);
  });

  it('when an update sends isDesignatedService false while the stored list is non-empty, it answers 422 and keeps the flag', async () => {
    const body = person({ externalId: 'crm-flag-stored', designatedServices: ['FIN-LOANS'] });
    const dto = await createCustomer(ctx, org, body);
    const viaUpsert = await upsert(ctx, org, { externalId: 'crm-flag-stored', risk: { isDesignatedService: false } });
    expect(viaUpsert.statusCode).toBe(422);
    expect(issues(viaUpsert)).toHaveProperty(['risk.isDesignatedService']);
    const viaPatch = await ctx.request('PATCH', `/v1/customers/${dto.id}`, {
      key: org.key,
      body: { risk: { isDesignatedService: false } },
    });
    expect(viaPatch.statusCode).toBe(422);
    expect(issues(viaPatch)).toHaveProperty(['risk.isDesignatedService']);
    expect((await customerRow(ctx, dto.id)).is_designated_service).toBe(true);
  });
});

describe('sole-trader fields', () => {
  it('when businessName is sent for an INDIVIDUAL, it answers 422', async () => {
    await rejects(person({ businessName: 'Acme' }), 'businessName');
    await rejects(person({ type: 'INDIVIDUAL', businessName: 'Acme' }), 'businessName');
  });

  it('when abn is sent for an INDIVIDUAL, it answers 422', async () => {
    await rejects(person({ abn: '51824753556' }), 'abn');
  });

  it('when an abn is not 11 digits, it answers 422', async () => {
    await rejects(person({ type: 'SOLE_TRADER', abn: '5182475355' }), 'abn');
    await rejects(person({ type: 'SOLE_TRADER', abn: '5182475355X' }), 'abn');
  });

  it('when an abn has spaces on a SOLE_TRADER, it is accepted and stored without them, recorded as not checked', async () => {
    const dto = await createCustomer(ctx, org, person({ type: 'SOLE_TRADER', businessName: 'Acme Plumbing', abn: '51 824 753 556' }));
    expect(dto.type).toBe('SOLE_TRADER');
    const row = await customerRow(ctx, dto.id);
    expect(row).toMatchObject({ abn: '51824753556', business_name: 'Acme Plumbing', business_register_status: 'NOT_CHECKED' });
  });
});

describe('pre-commencement fields', () => {
  it('when clientSinceDate is in the future everywhere on Earth (past UTC+14), it answers 422', async () => {
    const future = isoDate(new Date(Date.now() + 2 * 86_400_000));
    await rejects(person({ risk: { isNewCustomer: false }, clientSinceDate: future }), 'clientSinceDate');
  });

  it('when clientSinceDate is already today somewhere (UTC+14), it is accepted', async () => {
    const latestToday = isoDate(new Date(Date.now() + 14 * 3_600_000 - 60_000));
    const response = await upsert(ctx, org, person({ risk: { isNewCustomer: false }, clientSinceDate: latestToday }));
    expect(response.statusCode, response.body).toBe(201);
  });

  it('when clientSinceDate is not a calendar date, it answers 422', async () => {
    await rejects(person({ risk: { isNewCustomer: false }, clientSinceDate: '2024-02-30' }), 'clientSinceDate');
  });

  it('when clientSinceDate is sent without risk.isNewCustomer false, it answers 422', async () => {
    await rejects(person({ clientSinceDate: '2020-01-01' }), 'clientSinceDate');
    await rejects(person({ risk: { isNewCustomer: true }, clientSinceDate: '2020-01-01' }), 'clientSinceDate');
  });

  it('when preCommencementAssessment is sent without risk.isNewCustomer false, it answers 422', async () => {
    await rejects(
      person({ preCommencementAssessment: { significantChange: false, resultingRisk: 'LOW' }, designatedServices: ['FIN-LOANS'] }),
      'preCommencementAssessment',
    );
  });

  it('when preCommencementAssessment is sent without a non-empty designatedServices, it answers 422', async () => {
    const assessment = { significantChange: false, resultingRisk: 'LOW' };
    await rejects(person({ risk: { isNewCustomer: false }, preCommencementAssessment: assessment }), 'preCommencementAssessment');
    await rejects(
      person({ risk: { isNewCustomer: false }, preCommencementAssessment: assessment, designatedServices: [] }),
      'preCommencementAssessment',
    );
  });

  it('when preCommencementAssessment has an unknown resultingRisk, it answers 422', async () => {
    await rejects(
      person({
        risk: { isNewCustomer: false },
        preCommencementAssessment: { significantChange: false, resultingRisk: 'NONE' },
        designatedServices: ['FIN-LOANS'],
      }),
      'preCommencementAssessment.resultingRisk',
    );
  });

  it('when preCommencementAssessment.assessedAt is in the future, it answers 422', async () => {
    const future = isoDate(new Date(Date.now() + 2 * 86_400_000));
    await rejects(
      person({
        risk: { isNewCustomer: false },
        preCommencementAssessment: { significantChange: false, resultingRisk: 'LOW', assessedAt: future },
        designatedServices: ['FIN-LOANS'],
      }),
      'preCommencementAssessment.assessedAt',
    );
  });

  it('when preExistingServices is combined with a non-empty designatedServices, it answers 422', async () => {
    await rejects(
      person({ risk: { isNewCustomer: false }, preExistingServices: ['FIN-LOANS'], designatedServices: ['FIN-FX'] }),
      'preExistingServices',
    );
  });

  it('when preExistingServices is sent on an update of a record that has designated services, it answers 422 unless the request empties them', async () => {
    await createCustomer(
      ctx,
      org,
      person({ externalId: 'crm-pre-existing', risk: { isNewCustomer: false }, designatedServices: ['FIN-LOANS'] }),
    );
    const rejected = await upsert(ctx, org, { externalId: 'crm-pre-existing', preExistingServices: ['FIN-FX'] });
    expect(rejected.statusCode).toBe(422);
    expect(issues(rejected)).toHaveProperty('preExistingServices');
    const accepted = await upsert(ctx, org, { externalId: 'crm-pre-existing', preExistingServices: ['FIN-FX'], designatedServices: [] });
    expect(accepted.statusCode).toBe(200);
  });

  it('when preExistingServices is sent without risk.isNewCustomer false, it answers 422', async () => {
    await rejects(person({ preExistingServices: ['FIN-LOANS'] }), 'preExistingServices');
  });
});

describe('representative', () => {
  it('when a representative is sent, it is stored; a representative without an email answers 422', async () => {
    const dto = await createCustomer(ctx, org, person({ representative: { fullName: 'Attorney Person', email: 'attorney@example.com' } }));
    expect(await customerRow(ctx, dto.id)).toMatchObject({
      representative_name: 'Attorney Person',
      representative_email: 'attorney@example.com',
    });
    await rejects(person({ representative: { fullName: 'Attorney Person' } }), 'representative.email');
  });
});

describe('structured names', () => {
  it('when firstName is sent without lastName, it answers 422 on lastName', async () => {
    await rejects(person({ firstName: 'Jane' }), 'lastName');
  });

  it('when lastName is sent without firstName, it answers 422 on firstName', async () => {
    await rejects(person({ lastName: 'Citizen' }), 'firstName');
  });

  it('when middleName is sent without first and last names, it answers 422 on middleName', async () => {
    await rejects(person({ middleName: 'Q' }), 'middleName');
  });

  it('when first, middle and last names come together, they are stored', async () => {
    const dto = await createCustomer(ctx, org, person({ firstName: 'Jane', middleName: 'Q', lastName: 'Citizen' }));
    expect(await customerRow(ctx, dto.id)).toMatchObject({ first_name: 'Jane', middle_name: 'Q', last_name: 'Citizen' });
  });
});

describe('length bounds', () => {
  it('when fullName has 256 characters, it answers 422 (255 is accepted)', async () => {
    await rejects(person({ fullName: 'x'.repeat(256) }), 'fullName');
    expect((await upsert(ctx, org, person({ fullName: 'y'.repeat(255) }))).statusCode).toBe(201);
  });

  it('when fullName is empty, it answers 422', async () => {
    await rejects(person({ fullName: '' }), 'fullName');
  });

  it('when externalId has 256 characters, it answers 422', async () => {
    await rejects(person({ externalId: 'e'.repeat(256) }), 'externalId');
  });

  it('when phone has 33 characters, it answers 422', async () => {
    await rejects(person({ phone: '1'.repeat(33) }), 'phone');
  });

  it.each(['firstName', 'middleName', 'lastName'])(
    'when %s has 256 characters, it answers 422 naming it (255 is accepted)',
    async (field) => {
      const names = { firstName: 'Jane', middleName: 'Q', lastName: 'Citizen' };
      await rejects(person({ ...names, [field]: 'n'.repeat(256) }), field);
      expect((await upsert(ctx, org, person({ ...names, [field]: 'n'.repeat(255) }))).statusCode).toBe(201);
    },
  );

  it('when representative.fullName has 256 characters, it answers 422 naming it', async () => {
    await rejects(person({ representative: { fullName: 'r'.repeat(256), email: 'attorney@example.com' } }), 'representative.fullName');
  });

  it('when businessName has 256 characters, it answers 422', async () => {
    await rejects(person({ type: 'SOLE_TRADER', businessName: 'b'.repeat(256) }), 'businessName');
  });

  it('when the email is not an email, it answers 422', async () => {
    await rejects(person({ email: 'not-an-email' }), 'email');
  });

  it('when an unknown property is sent, it answers 422 naming it', async () => {
    await rejects(person({ dateOfBirth: '1990-01-01' }), 'dateOfBirth');
  });
});
