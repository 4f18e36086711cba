import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { createEntity, expectSameDto, expectValidation, postEntity, randomDigits, sql, uniqueName } from './entity-test-helpers.js';

let ctx: TestContext;
let org: TestOrg;
beforeAll(async () => {
  ctx = await createTestContext();
  org = await ctx.createOrg();
});
afterAll(async () => ctx?.close());

const noTrigger = { significantChange: false, resultingRisk: 'HIGH' };
const trigger = { significantChange: true, resultingRisk: 'MEDIUM' };

describe('kyb_status derivation on create', () => {
  it('when designatedServices is non-empty, the entity is NOT_STARTED', async () => {
    expect((await createEntity(ctx, org, { designatedServices: ['PRO-REAL-ESTATE'] })).kyb_status).toBe('NOT_STARTED');
  });

  it('when designatedServices is empty, the entity is NOT_REQUIRED', async () => {
    expect((await createEntity(ctx, org, { designatedServices: [] })).kyb_status).toBe('NOT_REQUIRED');
  });

  it('when isDesignatedService is false with no list, the entity is NOT_REQUIRED', async () => {
    expect((await createEntity(ctx, org, { risk: { isDesignatedService: false } })).kyb_status).toBe('NOT_REQUIRED');
  });

  it('when isDesignatedService is true with no list, the entity is NOT_STARTED', async () => {
    expect((await createEntity(ctx, org, { risk: { isDesignatedService: true } })).kyb_status).toBe('NOT_STARTED');
  });

  it('when nothing about services is sent, the entity is NOT_REQUIRED', async () => {
    expect((await createEntity(ctx, org)).kyb_status).toBe('NOT_REQUIRED');
  });

  it('when an existing client has a no-trigger assessment, the entity is NOT_REQUIRED with the services recorded', async () => {
    const entity = await createEntity(ctx, org, {
      designatedServices: ['PRO-REAL-ESTATE'],
      risk: { isNewCustomer: false },
      preCommencementAssessment: noTrigger,
    });
    expect(entity.kyb_status).toBe('NOT_REQUIRED');
    const [row] = await sql(ctx, 'SELECT designated_services, is_designated_service FROM customers WHERE id = $1', [entity.id]);
    expect(row).toEqual({ designated_services: ['PRO-REAL-ESTATE'], is_designated_service: true });
  });

  it('when an existing client has a triggering assessment, the entity is NOT_STARTED', async () => {
    const entity = await createEntity(ctx, org, {
      designatedServices: ['PRO-REAL-ESTATE'],
      risk: { isNewCustomer: false },
      preCommencementAssessment: trigger,
    });
    expect(entity.kyb_status).toBe('NOT_STARTED');
  });

  it('when an assessment is sent without isNewCustomer false, it answers 422', async () => {
    const response = await postEntity(ctx, org, {
      type: 'COMPANY',
      name: uniqueName(),
      designatedServices: ['PRO-REAL-ESTATE'],
      preCommencementAssessment: noTrigger,
    });
    expectValidation(response, 'preCommencementAssessment');
  });

  it('when the boolean disagrees with the list, it answers 422 on risk.isDesignatedService', async () => {
    const response = await postEntity(ctx, org, {
      type: 'COMPANY',
      name: uniqueName(),
      designatedServices: [],
      risk: { isDesignatedService: true },
    });
    expectValidation(response, 'risk.isDesignatedService');
  });

  it('when a service code is unknown, it answers 422', async () => {
    const response = await postEntity(ctx, org, { type: 'COMPANY', name: uniqueName(), designatedServices: ['NOT-A-CODE'] });
    expect(response.statusCode).toBe(422);
  });

  it('when an existing entity is upserted with an assessment, the status does not change (creation only)', async () => {
    const externalId = `crm-${randomDigits(8)}`;
    const entity = await createEntity(ctx, org, {
      externalId,
      designatedServices: ['PRO-REAL-ESTATE'],
      risk: { isNewCustomer: false },
      preCommencementAssessment: noTrigger,
    });
    expect(entity.kyb_status).toBe('NOT_REQUIRED');
    const response = await postEntity(ctx, org, {
      externalId,
      designatedServices: ['PRO-REAL-ESTATE'],
      risk: { isNewCustomer: false },
      preCommencementAssessment: trigger,
    });
    expect(response.statusCode, response.body).toBe(200);
    expect(response.json().kyb_status).toBe('NOT_REQUIRED');
    const [row] = await sql(ctx, 'SELECT pre_commencement_assessment FROM customers WHERE id = $1', [entity.id]);
    expect(row!.pre_commencement_assessment).toEqual(noTrigger);
  });

  it('when a NOT_REQUIRED entity is upserted with a new designated service, it becomes NOT_STARTED', async () => {
    const externalId = `crm-${randomDigits(8)}`;
    await createEntity(ctx, org, { externalId, designatedServices: [] });
    const response = await postEntity(ctx, org, { externalId, designatedServices: ['FIN-CRYPTO'] });
    expect(response.json().kyb_status).toBe('NOT_STARTED');
  });

  it('when a PATCH turns risk.isDesignatedService on for a NOT_REQUIRED entity, it becomes NOT_STARTED', async () => {
    const entity = await createEntity(ctx, org);
    expect(entity.kyb_status).toBe('NOT_REQUIRED');
    const response = await ctx.request('PATCH', `/v1/entities/${entity.id}`, {
      key: org.key,
      body: { risk: { isDesignatedService: true } },
    });
    expect(response.statusCode, response.body).toBe(200);
    expect(response.json().kyb_status).toBe('NOT_STARTED');
  });

  it('when the services of an entity are emptied later, kyb_status never moves back to NOT_REQUIRED', async () => {
    const externalId = `crm-${randomDigits(8)}`;
    await createEntity(ctx, org, { externalId, designatedServices: ['FIN-FX'] });
    const response = await postEntity(ctx, org, { externalId, designatedServices: [] });
    expect(response.statusCode, response.body).toBe(200);
    expect(response.json().kyb_status).toBe('NOT_STARTED');
  });

  it('when only preExistingServices are sent, they never trigger due diligence (NOT_REQUIRED) but are recorded', async () => {
    const entity = await createEntity(ctx, org, { risk: { isNewCustomer: false }, preExistingServices: ['FIN-CRYPTO'] });
    expect(entity.kyb_status).toBe('NOT_REQUIRED');
    const [row] = await sql(ctx, 'SELECT pre_existing_services, designated_services FROM customers WHERE id = $1', [entity.id]);
    expect(row).toEqual({ pre_existing_services: ['FIN-CRYPTO'], designated_services: [] });
  });

  it.each(['SMSF', 'OTHER'])('when the type is %s, responses keep the stored type', async (type) => {
    const entity = await createEntity(ctx, org, { type });
    expect(entity.type).toBe(type);
    expect((await ctx.request('GET', `/v1/entities/${entity.id}`, { key: org.key })).json().type).toBe(type);
    const [row] = await sql(ctx, 'SELECT type FROM customers WHERE id = $1', [entity.id]);
    expect(row!.type).toBe(type);
  });
});

describe('risk rating of entities (docs/risk-model.md)', () => {
  it('when services or risk answers change through create, upsert and PATCH, the rating and classification are recomputed', async () => {
    const externalId = `crm-${randomDigits(8)}`;
    const entity = await createEntity(ctx, org, { externalId, designatedServices: ['FIN-CRYPTO'] });
    const ratingOf = async () => (await sql(ctx, 'SELECT risk_rating, client_classification FROM customers WHERE id = $1', [entity.id]))[0];
    expect(await ratingOf()).toEqual({ risk_rating: 'MEDIUM', client_classification: 'STANDARD_CDD' });
    await postEntity(ctx, org, { externalId, risk: { handlesCashOrCrypto: true } });
    expect(await ratingOf()).toEqual({ risk_rating: 'HIGH', client_classification: 'ENHANCED_CDD' });
    await postEntity(ctx, org, { externalId, designatedServices: ['FIN-PAYROLL'] });
    expect(await ratingOf()).toEqual({ risk_rating: 'MEDIUM', client_classification: 'STANDARD_CDD' });
    await ctx.request('PATCH', `/v1/entities/${entity.id}`, { key: org.key, body: { risk: { complexStructure: true } } });
    expect(await ratingOf()).toEqual({ risk_rating: 'HIGH', client_classification: 'ENHANCED_CDD' });
    const audit = await sql(ctx, 'SELECT action, before, after FROM audit_log WHERE subject_id = $1 ORDER BY created_at, id', [entity.id]);
    expect(audit.map((row) => row.action)).toEqual(['entity.created', 'entity.upserted', 'entity.upserted', 'entity.patched']);
    expect(audit[1]).toMatchObject({ before: { riskRating: 'MEDIUM' }, after: { riskRating: 'HIGH' } });
  });
});

describe('due-diligence input rules shared with individuals', () => {
  const tomorrowEverywhere = new Date(Date.now() + 2 * 86_400_000).toISOString().slice(0, 10);
  it.each([
    ['clientSinceDate in the future', { risk: { isNewCustomer: false }, clientSinceDate: tomorrowEverywhere }, 'clientSinceDate'],
    ['clientSinceDate without isNewCustomer false', { clientSinceDate: '2020-01-01' }, 'clientSinceDate'],
    [
      'preExistingServices with a non-empty designatedServices',
      { risk: { isNewCustomer: false }, preExistingServices: ['FIN-FX'], designatedServices: ['FIN-LOANS'] },
      'preExistingServices',
    ],
    ['preExistingServices without isNewCustomer false', { preExistingServices: ['FIN-FX'] }, 'preExistingServices'],
    [
      'an assessment without a non-empty designatedServices',
      { risk: { isNewCustomer: false }, preCommencementAssessment: noTrigger },
      'preCommencementAssessment',
    ],
    [
      'isDesignatedService false with a non-empty list',
      { designatedServices: ['FIN-FX'], risk: { isDesignatedService: false } },
      'risk.isDesignatedService',
    ],
    ['65 designated services', { designatedServices: Array.from({ length: 65 }, () => 'FIN-FX') }, 'designatedServices'],
  ])('when an entity is created with %s, it answers 422 naming the field and creates nothing', async (_label, extra, field) => {
    const name = uniqueName();
    expectValidation(await postEntity(ctx, org, { type: 'COMPANY', name, ...extra }), field);
    expect(await sql(ctx, 'SELECT id FROM customers WHERE name = $1', [name])).toEqual([]);
  });

  it('when an update sends isDesignatedService false without a list while the entity has services, it answers 422 and keeps the flag', async () => {
    const externalId = `crm-${randomDigits(8)}`;
    const entity = await createEntity(ctx, org, { externalId, designatedServices: ['FIN-FX'] });
    expectValidation(await postEntity(ctx, org, { externalId, risk: { isDesignatedService: false } }), 'risk.isDesignatedService');
    const patched = await ctx.request('PATCH', `/v1/entities/${entity.id}`, {
      key: org.key,
      body: { risk: { isDesignatedService: false } },
    });
    expectValidation(patched, 'risk.isDesignatedService');
    const [row] = await sql(ctx, 'SELECT is_designated_service, designated_services FROM customers WHERE id = $1', [entity.id]);
    expect(row).toEqual({ is_designated_service: true, designated_services: ['FIN-FX'] });
  });

  it('when preExistingServices is sent on an update of an entity that has designated services, it answers 422 unless the request empties them', async () => {
    const externalId = `crm-${randomDigits(8)}`;
    const entity = await createEntity(ctx, org, { externalId, risk: { isNewCustomer: false }, designatedServices: ['FIN-FX'] });
    expectValidation(await postEntity(ctx, org, { externalId, preExistingServices: ['FIN-LOANS'] }), 'preExistingServices');
    const emptied = await postEntity(ctx, org, { externalId, preExistingServices: ['FIN-LOANS'], designatedServices: [] });
    expect(emptied.statusCode, emptied.body).toBe(200);
    const [row] = await sql(ctx, 'SELECT pre_existing_services, designated_services FROM customers WHERE id = $1', [entity.id]);
    expect(row).toEqual({ pre_existing_services: ['FIN-LOANS'], designated_services: [] });
  });
});

describe('audit rows and customer.updated events', () => {
  async function auditRows(subjectId: string) {
    return sql(
      ctx,
      'SELECT action, actor_type, actor_id, subject_type, before, after FROM audit_log WHERE org_id = $1 AND subject_id = $2 ORDER BY created_at, id',
      [org.id, subjectId],
    );
  }
  async function updatedEvents(customerId: string) {
    const rows = await sql<{ payload: string }>(
      ctx,
      `SELECT payload FROM outbox_events WHERE org_id = $1 AND customer_id = $2 AND type = 'customer.updated' ORDER BY created_at`,
      [org.id, customerId],
    );
    return rows.map((row) => JSON.parse(row.payload));
  }

  it('when an entity is created, it writes an entity.created audit row with the key as actor and no customer.updated event', async () => {
    const entity = await createEntity(ctx, org);
    const rows = await auditRows(entity.id);
    expect(rows).toHaveLength(1);
    expect(rows[0]).toMatchObject({
      action: 'entity.created',
      actor_type: 'api_key',
      actor_id: org.keyId,
      subject_type: 'entity',
      before: null,
    });
    expect(rows[0]!.after).toMatchObject({ id: entity.id, name: entity.name, kind: 'entity' });
    expect(await updatedEvents(entity.id)).toEqual([]);
  });

  it('when an upsert changes an entity, it writes an audit row and a customer.updated event equal to GET /entities/{id}', async () => {
    const externalId = `crm-${randomDigits(8)}`;
    const entity = await createEntity(ctx, org, { externalId, contact: { fullName: 'Event Contact', email: 'event.contact@example.com' } });
    const response = await postEntity(ctx, org, { externalId, name: uniqueName('Upserted') });
    expect(response.statusCode).toBe(200);
    const rows = await auditRows(entity.id);
    expect(rows.map((row) => row.action)).toEqual(['entity.created', 'entity.upserted']);
    expect(rows[1]).toMatchObject({ actor_type: 'api_key', actor_id: org.keyId });
    expect((rows[1]!.before as { name: string }).name).toBe(entity.name);
    expect((rows[1]!.after as { name: string }).name).toBe(response.json().name);
    const events = await updatedEvents(entity.id);
    expect(events).toHaveLength(1);
    const fetched = (await ctx.request('GET', `/v1/entities/${entity.id}`, { key: org.key })).json();
    expect(events[0].type).toBe('customer.updated');
    expectSameDto(events[0].data.customer, fetched);
    // The response is built before the commit; only a late commit's re-stamped updated_at may differ.
    expect({ ...events[0].data.customer, updated_at: undefined }).toEqual({ ...response.json(), updated_at: undefined });
  });

  it('when a PATCH changes an entity, it writes an entity.patched audit row and a customer.updated event equal to GET', async () => {
    const entity = await createEntity(ctx, org);
    const response = await ctx.request('PATCH', `/v1/entities/${entity.id}`, { key: org.key, body: { abn: randomDigits(11) } });
    expect(response.statusCode).toBe(200);
    const rows = await auditRows(entity.id);
    expect(rows.map((row) => row.action)).toEqual(['entity.created', 'entity.patched']);
    expect(rows[1]).toMatchObject({ actor_type: 'api_key', actor_id: org.keyId });
    const events = await updatedEvents(entity.id);
    expect(events).toHaveLength(1);
    const fetched = (await ctx.request('GET', `/v1/entities/${entity.id}`, { key: org.key })).json();
    expectSameDto(events[0].data.customer, fetched);
    // The response is built before the commit; only a late commit's re-stamped updated_at may differ.
    expect({ ...events[0].data.customer, updated_at: undefined }).toEqual({ ...response.json(), updated_at: undefined });
  });

  it('when an upsert changes nothing, it writes no audit row, no event and keeps updated_at', async () => {
    const externalId = `crm-${randomDigits(8)}`;
    const abn = randomDigits(11);
    const entity = await createEntity(ctx, org, {
      externalId,
      abn,
      designatedServices: ['PRO-REAL-ESTATE'],
      risk: { metFaceToFace: true },
      contact: { fullName: 'Same Person', email: 'same@example.com' },
    });
    const stored = (await ctx.request('GET', `/v1/entities/${entity.id}`, { key: org.key })).json();
    await new Promise((resolve) => setTimeout(resolve, 20));
    const response = await postEntity(ctx, org, {
      externalId,
      type: 'COMPANY',
      name: entity.name,
      abn: `${abn.slice(0, 2)} ${abn.slice(2)}`,
      designatedServices: ['PRO-REAL-ESTATE'],
      risk: { metFaceToFace: true },
      contact: { fullName: 'same person', email: 'SAME@example.com' },
    });
    expect(response.statusCode).toBe(200);
    expect(response.json()).toEqual(stored);
    expect((await auditRows(entity.id)).map((row) => row.action)).toEqual(['entity.created']);
    expect(await updatedEvents(entity.id)).toEqual([]);
    const [row] = await sql<{ updated_at: Date }>(ctx, 'SELECT updated_at FROM customers WHERE id = $1', [entity.id]);
    expect(row!.updated_at.toISOString()).toBe(stored.updated_at);
  });

  it('when an upsert re-sends the same designated services in another order, it is a no-op', async () => {
    const externalId = `crm-${randomDigits(8)}`;
    const entity = await createEntity(ctx, org, { externalId, designatedServices: ['PRO-REAL-ESTATE', 'FIN-CRYPTO'] });
    const stored = (await ctx.request('GET', `/v1/entities/${entity.id}`, { key: org.key })).json();
    const response = await postEntity(ctx, org, { externalId, designatedServices: ['FIN-CRYPTO', 'PRO-REAL-ESTATE', 'FIN-CRYPTO'] });
    expect(response.json()).toEqual(stored);
    expect((await auditRows(entity.id)).map((row) => row.action)).toEqual(['entity.created']);
    expect(await updatedEvents(entity.id)).toEqual([]);
  });

  it('when a PATCH changes nothing, it writes no audit row and no event', async () => {
    const entity = await createEntity(ctx, org, { address: 'Same St' });
    const stored = (await ctx.request('GET', `/v1/entities/${entity.id}`, { key: org.key })).json();
    const response = await ctx.request('PATCH', `/v1/entities/${entity.id}`, {
      key: org.key,
      body: { name: entity.name, address: 'Same St' },
    });
    expect(response.statusCode).toBe(200);
    expect(response.json()).toEqual(stored);
    expect((await auditRows(entity.id)).map((row) => row.action)).toEqual(['entity.created']);
    expect(await updatedEvents(entity.id)).toEqual([]);
  });

  it('when an entity not added via INTEGRATION changes, it is audited but fires no customer.updated', async () => {
    const entity = await createEntity(ctx, org);
    await sql(ctx, `UPDATE customers SET added_via = 'ADMIN_MANUAL' WHERE id = $1`, [entity.id]);
    const response = await ctx.request('PATCH', `/v1/entities/${entity.id}`, { key: org.key, body: { address: 'Back office' } });
    expect(response.statusCode).toBe(200);
    expect((await auditRows(entity.id)).map((row) => row.action)).toEqual(['entity.created', 'entity.patched']);
    expect(await updatedEvents(entity.id)).toEqual([]);
  });
});
