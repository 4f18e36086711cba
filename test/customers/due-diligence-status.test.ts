import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { createCustomer, customerRow, issues, person, upsert } from './customers-fixtures.js';

let ctx: TestContext;
let org: TestOrg;
beforeAll(async () => {
  ctx = await createTestContext();
  org = await ctx.createOrg();
});
afterAll(async () => ctx?.close());

async function statusOf(body: Record<string, unknown>): Promise<{ status: string; row: Record<string, any> }> {
  const dto = await createCustomer(ctx, org, person(body));
  return { status: dto.kyc_status, row: await customerRow(ctx, dto.id) };
}

const noTriggerAssessments = [
  { label: 'significantChange false', assessment: { significantChange: false, resultingRisk: 'HIGH' } },
  { label: 'resultingRisk LOW', assessment: { significantChange: true, resultingRisk: 'LOW' } },
];

describe('status of a new record', () => {
  it('when designatedServices is non-empty, it lands NOT_STARTED with the flag derived true', async () => {
    const { status, row } = await statusOf({ designatedServices: ['PRO-REAL-ESTATE'] });
    expect(status).toBe('NOT_STARTED');
    expect(row.is_designated_service).toBe(true);
  });

  it('when designatedServices is an empty array, it lands NOT_REQUIRED with the flag derived false', async () => {
    const { status, row } = await statusOf({ designatedServices: [] });
    expect(status).toBe('NOT_REQUIRED');
    expect(row.is_designated_service).toBe(false);
  });

  it('when risk.isDesignatedService is false with no list, it lands NOT_REQUIRED', async () => {
    expect((await statusOf({ risk: { isDesignatedService: false } })).status).toBe('NOT_REQUIRED');
  });

  it('when risk.isDesignatedService is true with no list, it lands NOT_STARTED (services are chosen in the app)', async () => {
    const { status, row } = await statusOf({ risk: { isDesignatedService: true } });
    expect(status).toBe('NOT_STARTED');
    expect(row.is_designated_service).toBe(true);
    expect(row.designated_services).toEqual([]);
  });

  it('when nothing about designated services is sent, it lands NOT_REQUIRED', async () => {
    expect((await statusOf({})).status).toBe('NOT_REQUIRED');
  });

  for (const { label, assessment } of noTriggerAssessments) {
    it(`when an existing client (isNewCustomer false) has a no-trigger assessment (${label}) and services, it lands NOT_REQUIRED with the services recorded`, async () => {
      const { status, row } = await statusOf({
        risk: { isNewCustomer: false },
        preCommencementAssessment: assessment,
        designatedServices: ['FIN-LOANS', 'RE-BROKER'],
      });
      expect(status).toBe('NOT_REQUIRED');
      expect(row.designated_services).toEqual(['FIN-LOANS', 'RE-BROKER']);
      expect(row.pre_commencement_assessment).toEqual(assessment);
      expect(row.client_classification).toBe('PRE_COMMENCEMENT_MONITORING');
    });
  }

  for (const resultingRisk of ['MEDIUM', 'HIGH']) {
    it(`when the assessment has significantChange true and resultingRisk ${resultingRisk}, it lands NOT_STARTED`, async () => {
      const { status } = await statusOf({
        risk: { isNewCustomer: false },
        preCommencementAssessment: { significantChange: true, resultingRisk },
        designatedServices: ['FIN-LOANS'],
      });
      expect(status).toBe('NOT_STARTED');
    });
  }

  it('when an existing client has services but no assessment, the conservative rule gives NOT_STARTED', async () => {
    const { status } = await statusOf({ risk: { isNewCustomer: false }, clientSinceDate: '2020-01-01', designatedServices: ['FIN-LOANS'] });
    expect(status).toBe('NOT_STARTED');
  });

  it('when only preExistingServices are sent, they never trigger due diligence (NOT_REQUIRED) but are recorded', async () => {
    const { status, row } = await statusOf({
      risk: { isNewCustomer: false },
      preExistingServices: ['FIN-CRYPTO'],
      preExistingServiceSince: '2019-05-01',
    });
    expect(status).toBe('NOT_REQUIRED');
    expect(row.pre_existing_services).toEqual(['FIN-CRYPTO']);
    expect(row.designated_services).toEqual([]);
  });
});

describe('status after later service changes', () => {
  it('when PUT designated-services adds a service to a NOT_REQUIRED record, it moves to NOT_STARTED', async () => {
    const dto = await createCustomer(ctx, org, person({ designatedServices: [] }));
    expect(dto.kyc_status).toBe('NOT_REQUIRED');
    const response = await ctx.request('PUT', `/v1/customers/${dto.id}/designated-services`, {
      key: org.key,
      body: { service_codes: ['RE-BROKER'] },
    });
    expect(response.statusCode).toBe(200);
    expect(response.json()).toMatchObject({ kyc_status: 'NOT_STARTED', designated_services: ['RE-BROKER'] });
    expect((await customerRow(ctx, dto.id)).is_designated_service).toBe(true);
  });

  it('when the services set is emptied later, the status never moves back to NOT_REQUIRED', async () => {
    const dto = await createCustomer(ctx, org, person({ designatedServices: ['RE-BROKER'] }));
    const response = await ctx.request('PUT', `/v1/customers/${dto.id}/designated-services`, { key: org.key, body: { service_codes: [] } });
    expect(response.statusCode).toBe(200);
    expect(response.json()).toMatchObject({ kyc_status: 'NOT_STARTED', designated_services: [] });
    const row = await customerRow(ctx, dto.id);
    expect(row.kyc_status).toBe('NOT_STARTED');
    expect(row.is_designated_service).toBe(false);
  });

  it('when an upsert turns risk.isDesignatedService on for a NOT_REQUIRED record, it moves to NOT_STARTED', async () => {
    const body = person({ externalId: 'crm-flag-on' });
    await createCustomer(ctx, org, body);
    const response = await upsert(ctx, org, { externalId: 'crm-flag-on', risk: { isDesignatedService: true } });
    expect(response.statusCode).toBe(200);
    expect(response.json().kyc_status).toBe('NOT_STARTED');
  });

  it('when a PATCH turns risk.isDesignatedService on for a NOT_REQUIRED record, it moves to NOT_STARTED', async () => {
    const dto = await createCustomer(ctx, org, person());
    expect(dto.kyc_status).toBe('NOT_REQUIRED');
    const response = await ctx.request('PATCH', `/v1/customers/${dto.id}`, { key: org.key, body: { risk: { isDesignatedService: true } } });
    expect(response.statusCode).toBe(200);
    expect(response.json().kyc_status).toBe('NOT_STARTED');
    expect((await customerRow(ctx, dto.id)).is_designated_service).toBe(true);
  });

  it('when services are added to a record whose due diligence is already under way, its status is not touched', async () => {
    const dto = await createCustomer(ctx, org, person({ designatedServices: ['FIN-LOANS'] }));
    await ctx.database.pool.query(`UPDATE customers SET kyc_status = 'IN_PROGRESS' WHERE id = $1`, [dto.id]);
    const response = await ctx.request('PUT', `/v1/customers/${dto.id}/designated-services`, {
      key: org.key,
      body: { service_codes: ['FIN-LOANS', 'FIN-CRYPTO'] },
    });
    expect(response.json()).toMatchObject({ kyc_status: 'IN_PROGRESS', designated_services: ['FIN-LOANS', 'FIN-CRYPTO'] });
  });

  it('when an existing client later receives services through an upsert with a no-trigger assessment, it stays NOT_REQUIRED with the services recorded', async () => {
    const body = person({ externalId: 'crm-carve-out-later', risk: { isNewCustomer: false } });
    const dto = await createCustomer(ctx, org, body);
    const response = await upsert(ctx, org, {
      externalId: 'crm-carve-out-later',
      preCommencementAssessment: { significantChange: false, resultingRisk: 'MEDIUM' },
      designatedServices: ['FIN-LOANS'],
    });
    expect(response.statusCode).toBe(200);
    expect(response.json().kyc_status).toBe('NOT_REQUIRED');
    expect((await customerRow(ctx, dto.id)).designated_services).toEqual(['FIN-LOANS']);
  });

  it('when an existing client later receives services through an upsert without an assessment, the conservative rule gives NOT_STARTED', async () => {
    const body = person({ externalId: 'crm-conservative-later', risk: { isNewCustomer: false } });
    await createCustomer(ctx, org, body);
    const response = await upsert(ctx, org, { externalId: 'crm-conservative-later', designatedServices: ['FIN-LOANS'] });
    expect(response.json().kyc_status).toBe('NOT_STARTED');
  });

  it('when PATCH sends a status field, it answers 422 naming the unknown property and changes nothing', async () => {
    const dto = await createCustomer(ctx, org, person());
    for (const field of ['kycStatus', 'kyc_status', 'amlStatus']) {
      const response = await ctx.request('PATCH', `/v1/customers/${dto.id}`, { key: org.key, body: { [field]: 'VERIFIED' } });
      expect(response.statusCode).toBe(422);
      expect(issues(response)).toHaveProperty(field);
    }
    expect((await customerRow(ctx, dto.id)).kyc_status).toBe('NOT_REQUIRED');
  });

  it('when POST /customers sends a status field, it answers 422 (statuses are never set by ingest)', async () => {
    const response = await upsert(ctx, org, person({ kycStatus: 'VERIFIED' }));
    expect(response.statusCode).toBe(422);
    expect(issues(response)).toHaveProperty('kycStatus');
  });
});

describe('ingest never starts KYC', () => {
  it('when customers are created, upserted, patched and their services replaced, no KYC starts and nothing is emailed, charged or armed', async () => {
    const fresh = await ctx.createOrg({ credits: 40 });
    const count = async (table: string) =>
      (await ctx.database.pool.query(`SELECT count(*)::int AS n FROM ${table} WHERE org_id = $1`, [fresh.id])).rows[0].n as number;
    const ledgerBefore = await count('credit_ledger');
    const body = person({
      externalId: 'kyc-owed',
      designatedServices: ['FIN-CRYPTO'],
      representative: { fullName: 'Ann Attorney', email: 'ann@example.com' },
    });
    const created = await upsert(ctx, fresh, body);
    expect(created.statusCode).toBe(201);
    expect(created.json()).toMatchObject({ kyc_status: 'NOT_STARTED', kyc_started_at: null, kyc_completed_at: null });
    const notOwed = await createCustomer(ctx, fresh, person({ designatedServices: [] }));
    const again = await upsert(ctx, fresh, { externalId: 'kyc-owed', designatedServices: ['FIN-FX'], phone: '1' });
    expect(again.json()).toMatchObject({ kyc_status: 'NOT_STARTED', kyc_started_at: null });
    await ctx.request('PATCH', `/v1/customers/kyc-owed`, { key: fresh.key, body: { risk: { handlesCashOrCrypto: true } } });
    const put = await ctx.request('PUT', `/v1/customers/${notOwed.id}/designated-services`, {
      key: fresh.key,
      body: { service_codes: ['RE-BROKER'] },
    });
    expect(put.json()).toMatchObject({ kyc_status: 'NOT_STARTED', kyc_started_at: null });

    expect(await count('verifications')).toBe(0);
    expect(await count('emails')).toBe(0);
    expect(await count('credit_ledger')).toBe(ledgerBefore);
    const { rows } = await ctx.database.pool.query('SELECT credits FROM organisations WHERE id = $1', [fresh.id]);
    expect(rows[0].credits).toBe(40);
  });
});
