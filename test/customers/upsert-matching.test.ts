import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { countCustomers, createCustomer, customerRow, insertEntity, issues, person, upsert } from './customers-fixtures.js';

let ctx: TestContext;
let org: TestOrg;
beforeAll(async () => {
  ctx = await createTestContext();
  org = await ctx.createOrg();
});
afterAll(async () => ctx?.close());

describe('POST /customers upsert matching table', () => {
  it('when no record matches, it creates one with added_via INTEGRATION and answers 201', async () => {
    const body = person({ externalId: 'crm-new-1' });
    const response = await upsert(ctx, org, body);
    expect(response.statusCode).toBe(201);
    const dto = response.json();
    expect(dto).toMatchObject({
      external_id: 'crm-new-1',
      type: 'INDIVIDUAL',
      full_name: body.fullName,
      email: body.email,
      added_via: 'INTEGRATION',
    });
    expect((await customerRow(ctx, dto.id)).org_id).toBe(org.id);
  });

  it('when the externalId exists in the organisation, it updates that record and answers 200 with the same id', async () => {
    const created = await createCustomer(ctx, org, person({ externalId: 'crm-hit-1' }));
    const response = await upsert(ctx, org, { externalId: 'crm-hit-1', phone: '+61400000001' });
    expect(response.statusCode).toBe(200);
    expect(response.json().id).toBe(created.id);
    expect((await customerRow(ctx, created.id)).phone).toBe('+61400000001');
  });

  it('when the externalId misses but name and email match (any case) a record with no external_id, it adopts it and answers 200', async () => {
    const body = person();
    const created = await createCustomer(ctx, org, body);
    const response = await upsert(ctx, org, {
      externalId: 'crm-adopt-1',
      fullName: String(body.fullName).toUpperCase(),
      email: String(body.email).toUpperCase(),
    });
    expect(response.statusCode).toBe(200);
    expect(response.json()).toMatchObject({ id: created.id, external_id: 'crm-adopt-1' });
    expect((await customerRow(ctx, created.id)).external_id).toBe('crm-adopt-1');
  });

  it('when the externalId misses but name and email match a record with a different external_id, it answers 409 conflict and changes nothing', async () => {
    const body = person({ externalId: 'crm-owner-1' });
    const created = await createCustomer(ctx, org, body);
    const response = await upsert(ctx, org, { ...body, externalId: 'crm-other-1', phone: '123' });
    expect(response.statusCode).toBe(409);
    expect(response.json().error.code).toBe('conflict');
    const row = await customerRow(ctx, created.id);
    expect(row.external_id).toBe('crm-owner-1');
    expect(row.phone).toBeNull();
    expect(await countCustomers(ctx, org.id, 'external_id = $2', ['crm-other-1'])).toBe(0);
  });

  it('when no externalId is sent and name and email match a record, it updates that record and answers 200', async () => {
    const body = person({ externalId: 'crm-keep-1' });
    const created = await createCustomer(ctx, org, body);
    const response = await upsert(ctx, org, { fullName: body.fullName, email: String(body.email).toUpperCase(), phone: '555' });
    expect(response.statusCode).toBe(200);
    expect(response.json()).toMatchObject({ id: created.id, external_id: 'crm-keep-1' });
    expect((await customerRow(ctx, created.id)).phone).toBe('555');
  });

  it('when only the email matches (another full name), it never matches and creates a new record (201)', async () => {
    const body = person();
    const first = await createCustomer(ctx, org, body);
    const response = await upsert(ctx, org, { fullName: 'A Family Member', email: body.email });
    expect(response.statusCode).toBe(201);
    expect(response.json().id).not.toBe(first.id);
    expect(await countCustomers(ctx, org.id, 'lower(email) = lower($2)', [body.email])).toBe(2);
  });

  it('when the externalId belongs to an entity, it answers 409 conflict and creates nothing', async () => {
    await insertEntity(ctx, org.id, 'crm-entity-1');
    const response = await upsert(ctx, org, person({ externalId: 'crm-entity-1' }));
    expect(response.statusCode).toBe(409);
    expect(response.json().error.code).toBe('conflict');
    expect(await countCustomers(ctx, org.id, "external_id = $2 AND kind = 'individual'", ['crm-entity-1'])).toBe(0);
  });

  it('when the same externalId is used in another organisation, it does not match across organisations', async () => {
    const other = await ctx.createOrg();
    const mine = await createCustomer(ctx, org, person({ externalId: 'crm-shared-1' }));
    const response = await upsert(ctx, other, person({ externalId: 'crm-shared-1' }));
    expect(response.statusCode).toBe(201);
    expect(response.json().id).not.toBe(mine.id);
  });
});

describe('POST /customers required fields', () => {
  it('when fullName and email are missing on create, it answers 422 naming each', async () => {
    const response = await upsert(ctx, org, { externalId: 'crm-missing-1' });
    expect(response.statusCode).toBe(422);
    expect(response.json().error.code).toBe('validation_failed');
    expect(Object.keys(issues(response)).sort()).toEqual(['email', 'fullName']);
    expect(await countCustomers(ctx, org.id, 'external_id = $2', ['crm-missing-1'])).toBe(0);
  });

  it('when only fullName is missing on create, it names fullName alone', async () => {
    const response = await upsert(ctx, org, { email: 'only-email@example.com' });
    expect(response.statusCode).toBe(422);
    expect(Object.keys(issues(response))).toEqual(['fullName']);
  });

  it('when a matched record is updated, every field is optional and omitted fields stay untouched', async () => {
    const body = person({
      externalId: 'crm-partial-1',
      phone: '+61 2 0000 0000',
      designatedServices: ['FIN-LOANS'],
      risk: { metFaceToFace: true },
    });
    const created = await createCustomer(ctx, org, body);
    const before = await customerRow(ctx, created.id);
    const response = await upsert(ctx, org, { externalId: 'crm-partial-1', risk: { handlesCashOrCrypto: true } });
    expect(response.statusCode).toBe(200);
    const after = await customerRow(ctx, created.id);
    expect(after).toMatchObject({
      name: before.name,
      email: before.email,
      phone: before.phone,
      designated_services: ['FIN-LOANS'],
      kyc_status: 'NOT_STARTED',
    });
    expect(after.risk_answers).toEqual({ metFaceToFace: true, handlesCashOrCrypto: true });
  });

  it('when designatedServices is sent on an update, the list replaces the stored set', async () => {
    const created = await createCustomer(ctx, org, person({ externalId: 'crm-replace-1', designatedServices: ['FIN-LOANS', 'FIN-FX'] }));
    const response = await upsert(ctx, org, { externalId: 'crm-replace-1', designatedServices: ['RE-BROKER'] });
    expect(response.statusCode).toBe(200);
    expect((await customerRow(ctx, created.id)).designated_services).toEqual(['RE-BROKER']);
  });
});

describe('POST /customers with Idempotency-Key', () => {
  it('when a create is repeated with the same Idempotency-Key, it replays the 201 and writes nothing more', async () => {
    const body = person({ externalId: 'crm-idem-1' });
    const headers = { 'idempotency-key': 'create-crm-idem-1' };
    const first = await ctx.request('POST', '/v1/customers', { key: org.key, body, headers });
    const again = await ctx.request('POST', '/v1/customers', { key: org.key, body, headers });
    expect(first.statusCode).toBe(201);
    expect(again.statusCode).toBe(201);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.json()).toEqual(first.json());
    const { rows } = await ctx.database.pool.query('SELECT count(*)::int AS n FROM audit_log WHERE subject_id = $1', [first.json().id]);
    expect(rows[0].n).toBe(1);
  });
});
