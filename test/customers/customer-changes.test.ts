import type { Tx } from '../../src/db/client.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { eq, sql } from 'drizzle-orm';
import { customers } from '../../src/db/schema.js';
import { auditChanges, auditSnapshot } from '../../src/modules/customers/customer-dto.js';
import { createCustomersRepository } from '../../src/modules/customers/customers.repository.js';
import { createTestContext, type TestContext, type TestOrg, testServices } from '../helpers/harness.js';
import { createCustomer, customerRow, insertEntity, issues, person, upsert } from './customers-fixtures.js';

let ctx: TestContext;
let org: TestOrg;
beforeAll(async () => {
  ctx = await createTestContext();
  org = await ctx.createOrg();
});
afterAll(async () => ctx?.close());

async function auditRows(subjectId: string) {
  const { rows } = await ctx.database.pool.query('SELECT * FROM audit_log WHERE subject_id = $1 ORDER BY created_at, id', [subjectId]);
  return rows as Record<string, any>[];
}

async function outboxEvents(customerId: string) {
  const { rows } = await ctx.database.pool.query('SELECT * FROM outbox_events WHERE customer_id = $1 ORDER BY created_at', [customerId]);
  return rows.map((row) => ({ type: row.type as string, payload: JSON.parse(row.payload) }));
}

async function markVerified(id: string) {
  await ctx.database.pool.query(
    `UPDATE customers SET kyc_status = 'VERIFIED', verified_legal_name = 'Jane Q Citizen', verified_country = 'AUS',
       kyc_started_at = now(), kyc_completed_at = now() WHERE id = $1`,
    [id],
  );
}

const patch = (ref: string, body: unknown) => ctx.request('PATCH', `/v1/customers/${encodeURIComponent(ref)}`, { key: org.key, body });
const get = (ref: string) => ctx.request('GET', `/v1/customers/${encodeURIComponent(ref)}`, { key: org.key });

describe('name provenance', () => {
  it('when the API writes structured names, they are stored at the integration rank 10', async () => {
    const dto = await createCustomer(ctx, org, person({ firstName: 'Jane', lastName: 'Citizen' }));
    expect(await customerRow(ctx, dto.id)).toMatchObject({ first_name: 'Jane', last_name: 'Citizen', name_provenance_rank: 10 });
  });

  it('when an officer corrected the names (rank 20), a later API upsert with other names does not overwrite them', async () => {
    const body = person({ externalId: 'crm-prov-1', firstName: 'Jane', lastName: 'Citizen' });
    const dto = await createCustomer(ctx, org, body);
    await ctx.database.pool.query(
      `UPDATE customers SET first_name = 'Janet', last_name = 'Citizen-Smith', name_provenance_rank = 20 WHERE id = $1`,
      [dto.id],
    );
    const response = await upsert(ctx, org, {
      externalId: 'crm-prov-1',
      firstName: 'J',
      middleName: 'X',
      lastName: 'Citizen',
      phone: '42',
    });
    expect(response.statusCode).toBe(200);
    expect(await customerRow(ctx, dto.id)).toMatchObject({
      first_name: 'Janet',
      middle_name: null,
      last_name: 'Citizen-Smith',
      name_provenance_rank: 20,
      phone: '42',
    });
  });

  it('when names were written by the API (rank 10), a later API upsert replaces them', async () => {
    const dto = await createCustomer(ctx, org, person({ externalId: 'crm-prov-2', firstName: 'Jane', lastName: 'Citizen' }));
    await upsert(ctx, org, { externalId: 'crm-prov-2', firstName: 'Janet', lastName: 'Citizen' });
    expect(await customerRow(ctx, dto.id)).toMatchObject({ first_name: 'Janet', name_provenance_rank: 10 });
  });
});

describe('freeze after VERIFIED', () => {
  it('when a VERIFIED record gets a PATCH changing fullName or email, it answers 422 on each and changes nothing', async () => {
    const dto = await createCustomer(ctx, org, person());
    await markVerified(dto.id);
    const response = await patch(dto.id, { fullName: 'Someone Else', email: 'else@example.com', phone: '1' });
    expect(response.statusCode).toBe(422);
    expect(Object.keys(issues(response)).sort()).toEqual(['email', 'fullName']);
    expect(await customerRow(ctx, dto.id)).toMatchObject({ name: dto.full_name, email: dto.email, phone: null });
  });

  it('when a VERIFIED record gets the same fullName and email re-sent, it answers 200', async () => {
    const dto = await createCustomer(ctx, org, person());
    await markVerified(dto.id);
    const response = await patch(dto.id, { fullName: dto.full_name, email: dto.email });
    expect(response.statusCode).toBe(200);
  });

  it('when a VERIFIED record gets its email re-sent in another case, it answers 200 and keeps the stored email', async () => {
    const dto = await createCustomer(ctx, org, person());
    await markVerified(dto.id);
    const response = await patch(dto.id, { email: dto.email.toUpperCase() });
    expect(response.statusCode).toBe(200);
    expect((await customerRow(ctx, dto.id)).email).toBe(dto.email);
  });

  it('when a VERIFIED record gets phone and risk changes, they are applied', async () => {
    const dto = await createCustomer(ctx, org, person());
    await markVerified(dto.id);
    const response = await patch(dto.id, { phone: '+61 400 000 000', risk: { complexStructure: true } });
    expect(response.statusCode).toBe(200);
    expect(await customerRow(ctx, dto.id)).toMatchObject({ phone: '+61 400 000 000', risk_rating: 'HIGH', kyc_status: 'VERIFIED' });
  });

  it('when an upsert would change the fullName of a VERIFIED record, it answers 422 too', async () => {
    const body = person({ externalId: 'crm-frozen-upsert' });
    const dto = await createCustomer(ctx, org, body);
    await markVerified(dto.id);
    const response = await upsert(ctx, org, { externalId: 'crm-frozen-upsert', fullName: 'Renamed Person' });
    expect(response.statusCode).toBe(422);
    expect(issues(response)).toHaveProperty('fullName');
    expect((await upsert(ctx, org, { ...body, phone: '7' })).statusCode).toBe(200);
  });

  it('when the record is VERIFIED, the identity block appears; before that it is null', async () => {
    const dto = await createCustomer(ctx, org, person());
    expect(dto.identity).toBeNull();
    await markVerified(dto.id);
    const response = await get(dto.id);
    expect(response.json()).toMatchObject({
      kyc_status: 'VERIFIED',
      identity: { verified_legal_name: 'Jane Q Citizen', verified_country: 'AUS' },
    });
    expect(Object.keys(response.json().identity).sort()).toEqual(['verified_country', 'verified_legal_name']);
  });
});

describe('PATCH /customers/{id}', () => {
  it('when PATCH sends type or externalId, it answers 422 naming the unknown property', async () => {
    const dto = await createCustomer(ctx, org, person({ externalId: 'crm-immutable' }));
    for (const body of [{ type: 'SOLE_TRADER' }, { externalId: 'crm-changed' }, { external_id: 'crm-changed' }]) {
      const response = await patch(dto.id, body);
      expect(response.statusCode).toBe(422);
      expect(issues(response)).toHaveProperty(Object.keys(body)[0]!);
    }
    expect(await customerRow(ctx, dto.id)).toMatchObject({ type: 'INDIVIDUAL', external_id: 'crm-immutable' });
  });

  it('when PATCH sends phone null, it clears the phone', async () => {
    const dto = await createCustomer(ctx, org, person({ phone: '+61 2 1234 5678' }));
    const response = await patch(dto.id, { phone: null });
    expect(response.statusCode).toBe(200);
    expect((await customerRow(ctx, dto.id)).phone).toBeNull();
  });

  it('when PATCH omits fields, they stay untouched', async () => {
    const dto = await createCustomer(ctx, org, person({ phone: '99', risk: { metFaceToFace: true } }));
    await patch(dto.id, { fullName: 'Renamed Someone' });
    expect(await customerRow(ctx, dto.id)).toMatchObject({
      name: 'Renamed Someone',
      email: dto.email,
      phone: '99',
      risk_answers: { metFaceToFace: true },
    });
  });

  it('when PATCH would give a record the name and email of another individual, it answers 409 conflict', async () => {
    const first = await createCustomer(ctx, org, person());
    const second = await createCustomer(ctx, org, person());
    const response = await patch(second.id, { fullName: first.full_name, email: first.email.toUpperCase() });
    expect(response.statusCode).toBe(409);
    expect(response.json().error.code).toBe('conflict');
    expect((await customerRow(ctx, second.id)).name).toBe(second.full_name);
  });

  it('when an upsert matched by externalId would take the name and email of another individual, it answers 409 conflict', async () => {
    const first = await createCustomer(ctx, org, person());
    const second = await createCustomer(ctx, org, person({ externalId: 'crm-collide' }));
    const response = await upsert(ctx, org, { externalId: 'crm-collide', fullName: first.full_name, email: first.email });
    expect(response.statusCode).toBe(409);
    expect((await customerRow(ctx, second.id)).name).toBe(second.full_name);
  });

  it('when an upsert turns a SOLE_TRADER into an INDIVIDUAL, the sole-trader fields are cleared', async () => {
    const dto = await createCustomer(
      ctx,
      org,
      person({ externalId: 'crm-type', type: 'SOLE_TRADER', businessName: 'Acme', abn: '51824753556' }),
    );
    const response = await upsert(ctx, org, { externalId: 'crm-type', type: 'INDIVIDUAL' });
    expect(response.json().type).toBe('INDIVIDUAL');
    expect(await customerRow(ctx, dto.id)).toMatchObject({
      type: 'INDIVIDUAL',
      business_name: null,
      abn: null,
      business_register_status: null,
    });
  });

  it('when the record does not exist, it answers 404', async () => {
    expect((await patch('00000000-0000-4000-8000-000000000000', { phone: '1' })).statusCode).toBe(404);
  });
});

describe('risk rating and audit', () => {
  it('when PUT assigns a high-risk code (FIN-CRYPTO), the rating becomes HIGH after the answers, with an audit row carrying the actor key', async () => {
    const dto = await createCustomer(ctx, org, person({ designatedServices: [] }));
    expect((await customerRow(ctx, dto.id)).risk_rating).toBe('LOW');
    const response = await ctx.request('PUT', `/v1/customers/${dto.id}/designated-services`, {
      key: org.key,
      body: { service_codes: ['FIN-CRYPTO'] },
    });
    expect(response.statusCode).toBe(200);
    // FIN-CRYPTO weighs 3 (MEDIUM); handling cash or crypto adds 2 → HIGH.
    expect((await customerRow(ctx, dto.id)).risk_rating).toBe('MEDIUM');
    await patch(dto.id, { risk: { handlesCashOrCrypto: true } });
    expect(await customerRow(ctx, dto.id)).toMatchObject({ risk_rating: 'HIGH', client_classification: 'ENHANCED_CDD' });
    const audit = await auditRows(dto.id);
    const replaced = audit.find((row) => row.action === 'customer.designated_services_replaced')!;
    expect(replaced).toMatchObject({ actor_type: 'api_key', actor_id: org.keyId, org_id: org.id });
    expect(replaced.before).toMatchObject({ designatedServices: [], riskRating: 'LOW', kycStatus: 'NOT_REQUIRED' });
    expect(replaced.after).toMatchObject({ designatedServices: ['FIN-CRYPTO'], riskRating: 'MEDIUM', kycStatus: 'NOT_STARTED' });
  });

  it('when a PATCH changes risk answers, the rating and classification are recomputed (and not otherwise)', async () => {
    const dto = await createCustomer(ctx, org, person({ designatedServices: ['PRO-REAL-ESTATE'] }));
    expect(await customerRow(ctx, dto.id)).toMatchObject({ risk_rating: 'LOW', client_classification: 'STANDARD_CDD' });
    await patch(dto.id, { risk: { metFaceToFace: false } });
    expect(await customerRow(ctx, dto.id)).toMatchObject({ risk_rating: 'MEDIUM', client_classification: 'STANDARD_CDD' });
    await patch(dto.id, { risk: { operatesCashBusiness: true } });
    expect(await customerRow(ctx, dto.id)).toMatchObject({
      risk_rating: 'HIGH',
      client_classification: 'ENHANCED_CDD',
      risk_answers: { metFaceToFace: false, operatesCashBusiness: true },
    });
  });

  it('when the risk answers include complexStructure, the rating is HIGH whatever the services', async () => {
    const dto = await createCustomer(ctx, org, person({ risk: { complexStructure: true }, designatedServices: ['FIN-PAYROLL'] }));
    expect(await customerRow(ctx, dto.id)).toMatchObject({ risk_rating: 'HIGH', client_classification: 'ENHANCED_CDD' });
  });

  it('when a record is created, upserted, patched and its services replaced, each change writes an audit row with before and after and the actor key', async () => {
    const body = person({ externalId: 'crm-audited' });
    const dto = await createCustomer(ctx, org, body);
    await upsert(ctx, org, { externalId: 'crm-audited', phone: '1' });
    await patch(dto.id, { phone: '2' });
    await ctx.request('PUT', `/v1/customers/${dto.id}/designated-services`, { key: org.key, body: { service_codes: ['FIN-FX'] } });
    const audit = await auditRows(dto.id);
    expect(audit.map((row) => row.action)).toEqual([
      'customer.created',
      'customer.upserted',
      'customer.patched',
      'customer.designated_services_replaced',
    ]);
    for (const row of audit) expect(row).toMatchObject({ actor_type: 'api_key', actor_id: org.keyId, subject_type: 'customer' });
    expect(audit[0]!.before).toBeNull();
    expect(audit[0]!.after).toMatchObject({ name: body.fullName, phone: null });
    expect(audit[1]!.before).toMatchObject({ phone: null });
    expect(audit[1]!.after).toMatchObject({ phone: '1' });
    expect(audit[2]!.before).toMatchObject({ phone: '1' });
    expect(audit[2]!.after).toMatchObject({ phone: '2' });
    expect(audit[3]!.after).toMatchObject({ designatedServices: ['FIN-FX'] });
  });

  it('when an upsert repeats the same body, it writes no audit row, fires no event and leaves updated_at alone', async () => {
    const body = person({
      externalId: 'crm-noop',
      phone: '5',
      designatedServices: ['FIN-FX'],
      risk: { isNewCustomer: true },
      firstName: 'A',
      lastName: 'B',
    });
    const dto = await createCustomer(ctx, org, body);
    const before = await customerRow(ctx, dto.id);
    await new Promise((resolve) => setTimeout(resolve, 20));
    const response = await upsert(ctx, org, body);
    expect(response.statusCode).toBe(200);
    expect(response.json().updated_at).toBe(before.updated_at.toISOString());
    expect((await customerRow(ctx, dto.id)).updated_at).toEqual(before.updated_at);
    expect(await auditRows(dto.id)).toHaveLength(1);
    expect(await outboxEvents(dto.id)).toHaveLength(0);
  });

  it('when PUT repeats the stored set or PATCH repeats stored values, nothing is audited and updated_at stays', async () => {
    const dto = await createCustomer(ctx, org, person({ designatedServices: ['FIN-FX'], phone: '3' }));
    const committed = (await get(dto.id)).json().updated_at;
    await ctx.request('PUT', `/v1/customers/${dto.id}/designated-services`, {
      key: org.key,
      body: { service_codes: ['FIN-FX', 'FIN-FX'] },
    });
    await patch(dto.id, { phone: '3', fullName: dto.full_name });
    expect(await auditRows(dto.id)).toHaveLength(1);
    expect((await get(dto.id)).json().updated_at).toBe(committed);
  });

  it('when an upsert or PUT re-sends the stored services in another order, it is a no-op (service lists are sets)', async () => {
    const body = person({ externalId: 'crm-set-order', designatedServices: ['FIN-FX', 'PRO-REAL-ESTATE'] });
    const dto = await createCustomer(ctx, org, body);
    const committed = (await get(dto.id)).json().updated_at;
    const reordered = await upsert(ctx, org, { ...body, designatedServices: ['PRO-REAL-ESTATE', 'FIN-FX', 'FIN-FX'] });
    expect(reordered.statusCode).toBe(200);
    const put = await ctx.request('PUT', `/v1/customers/${dto.id}/designated-services`, {
      key: org.key,
      body: { service_codes: ['PRO-REAL-ESTATE', 'FIN-FX'] },
    });
    expect(put.json().designated_services).toEqual(['FIN-FX', 'PRO-REAL-ESTATE']);
    expect(await auditRows(dto.id)).toHaveLength(1);
    expect(await outboxEvents(dto.id)).toHaveLength(0);
    expect((await get(dto.id)).json().updated_at).toBe(committed);
  });

  it("when a record's updated_at is ahead of the clock, a change still moves it forward by at least a millisecond", async () => {
    const dto = await createCustomer(ctx, org, person());
    const ahead = new Date(Date.now() + 3_600_000);
    // Written with triggers off (replica role), as a clock stepped back would leave it.
    const client = await ctx.database.pool.connect();
    try {
      await client.query(`SET session_replication_role = replica`);
      await client.query('UPDATE customers SET updated_at = $2 WHERE id = $1', [dto.id, ahead]);
      await client.query(`SET session_replication_role = origin`);
    } finally {
      client.release();
    }
    const changed = (await patch(dto.id, { phone: 'ahead' })).json();
    expect(new Date(changed.updated_at).getTime()).toBe(ahead.getTime() + 1);
    expect((await get(dto.id)).json().updated_at).toBe(changed.updated_at);
  });

  it('when a raw SQL writer rewrites the same values, the database keeps updated_at (no-op writes never move it)', async () => {
    const dto = await createCustomer(ctx, org, person());
    const committed = (await get(dto.id)).json().updated_at;
    await ctx.database.pool.query('UPDATE customers SET name = name, phone = phone WHERE id = $1', [dto.id]);
    expect((await get(dto.id)).json().updated_at).toBe(committed);
  });
});

describe('side-record storage', () => {
  it('when a record is snapshotted for the audit log, it keeps every column but the organisation and timestamps, and changes keep only what changed', async () => {
    const dto = await createCustomer(ctx, org, person({ externalId: 'crm-snapshot' }));
    const row = (await createCustomersRepository(ctx.database.db).findById(org.id, dto.id, ctx.database.db))!;
    const { orgId: _org, createdAt: _created, updatedAt: _updated, ...expected } = row;
    expect(auditSnapshot(row)).toEqual(expected);
    expect(Object.keys(auditSnapshot(row)).sort()).toEqual(Object.keys(expected).sort());
    expect(auditChanges({ phone: '1', orgId: org.id, updatedAt: new Date(), createdAt: new Date() })).toEqual({ phone: '1' });
  });

  it('when the server supports lz4, audit snapshots and event payloads are compressed with it, and neither table checks a foreign key per row', async () => {
    const { rows: support } = await ctx.database.pool.query(
      `SELECT 'lz4' = ANY (enumvals) AS lz4 FROM pg_settings WHERE name = 'default_toast_compression'`,
    );
    const { rows: settings } = await ctx.database.pool.query(
      `SELECT attrelid::regclass::text || '.' || attname AS name, attcompression AS method FROM pg_attribute
        WHERE (attrelid, attname) IN (('audit_log'::regclass, 'before'), ('audit_log'::regclass, 'after'), ('outbox_events'::regclass, 'payload'))
        ORDER BY 1`,
    );
    const method = support[0].lz4 ? 'l' : '';
    expect(settings).toEqual([
      { name: 'audit_log.after', method },
      { name: 'audit_log.before', method },
      { name: 'outbox_events.payload', method },
    ]);
    const dto = await createCustomer(ctx, org, person({ externalId: 'crm-storage' }));
    await upsert(ctx, org, { externalId: 'crm-storage', phone: 'stored' });
    const { rows: stored } = await ctx.database.pool.query(
      `SELECT pg_column_compression(before) AS before, pg_column_compression(after) AS after FROM audit_log WHERE subject_id = $1 AND action = 'customer.upserted'`,
      [dto.id],
    );
    if (support[0].lz4) expect(stored).toEqual([{ before: 'lz4', after: 'lz4' }]);
    const { rows: keys } = await ctx.database.pool.query(
      `SELECT conrelid::regclass::text AS name FROM pg_constraint WHERE contype = 'f' AND conrelid IN ('audit_log'::regclass, 'outbox_events'::regclass)`,
    );
    expect(keys).toEqual([]);
  });
});

describe('customer.updated outbox events', () => {
  it('when an INTEGRATION record is updated, it writes one customer.updated event whose data.customer equals the GET DTO', async () => {
    const dto = await createCustomer(ctx, org, person({ externalId: 'crm-evt' }));
    expect(await outboxEvents(dto.id)).toHaveLength(0);
    await patch(dto.id, { phone: '12345' });
    const events = await outboxEvents(dto.id);
    expect(events).toHaveLength(1);
    expect(events[0]!.type).toBe('customer.updated');
    expect(events[0]!.payload).toMatchObject({ type: 'customer.updated', id: expect.any(String), created: expect.any(String) });
    expect(events[0]!.payload.data.customer).toEqual((await get(dto.id)).json());
  });

  it('when upserts and service replacements change the record, each writes exactly one event with the DTO of that moment', async () => {
    const dto = await createCustomer(ctx, org, person({ externalId: 'crm-evt-2' }));
    await upsert(ctx, org, { externalId: 'crm-evt-2', phone: '1' });
    const afterUpsert = (await get(dto.id)).json();
    await ctx.request('PUT', `/v1/customers/${dto.id}/designated-services`, { key: org.key, body: { service_codes: ['RE-BROKER'] } });
    const afterPut = (await get(dto.id)).json();
    const events = await outboxEvents(dto.id);
    expect(events.map((event) => event.payload.data.customer)).toEqual([afterUpsert, afterPut]);
    expect(afterPut).not.toHaveProperty('designated_services');
  });

  it('when the change commits late and updated_at is re-stamped at commit, the event still carries the committed DTO', async () => {
    const dto = await createCustomer(ctx, org, person({ externalId: 'crm-evt-slow' }));
    const service = testServices(ctx.database).customers;
    await ctx.database.transaction(async (tx) => {
      // The change runs in this transaction, which commits only after the sleep.
      await service.patch({ orgId: org.id, actor: { type: 'system', id: null }, transaction: (work) => work(tx) }, dto.id, {
        phone: 'slow',
      });
      await tx.execute(sql`SELECT pg_sleep(0.8)`);
    });
    const events = await outboxEvents(dto.id);
    expect(events).toHaveLength(1);
    const current = (await get(dto.id)).json();
    expect(events[0]!.payload.data.customer).toEqual(current);
    expect(new Date(current.updated_at).getTime() - new Date(dto.updated_at).getTime()).toBeGreaterThanOrEqual(300);
  });

  it("when a late commit re-stamps a record, only that transaction's events are rewritten: the record's earlier events keep the DTO of their moment", async () => {
    const dto = await createCustomer(ctx, org, person({ externalId: 'crm-evt-slow-2' }));
    await patch(dto.id, { phone: 'first' });
    const afterFirst = (await get(dto.id)).json();
    const service = testServices(ctx.database).customers;
    await ctx.database.transaction(async (tx) => {
      // Both changes run in this transaction, which commits only after the sleep.
      const system = {
        orgId: org.id,
        actor: { type: 'system' as const, id: null },
        transaction: <T>(work: (tx: Tx) => Promise<T>) => work(tx),
      };
      await service.patch(system, dto.id, { phone: 'second' });
      await service.patch(system, dto.id, { phone: 'third' });
      await tx.execute(sql`SELECT pg_sleep(0.8)`);
    });
    const current = (await get(dto.id)).json();
    const events = await outboxEvents(dto.id);
    expect(events.map((event) => event.payload.data.customer.updated_at)).toEqual([
      afterFirst.updated_at,
      current.updated_at,
      current.updated_at,
    ]);
    expect(events[0]!.payload.data.customer).toEqual(afterFirst);
    expect(events[2]!.payload.data.customer).toEqual(current);
    expect(new Date(current.updated_at).getTime() - new Date(afterFirst.updated_at).getTime()).toBeGreaterThanOrEqual(300);
  });

  it('when a record not added by the integration changes, it fires no customer.updated', async () => {
    const dto = await createCustomer(ctx, org, person());
    await ctx.database.pool.query(`UPDATE customers SET added_via = 'ADMIN_MANUAL' WHERE id = $1`, [dto.id]);
    await patch(dto.id, { phone: '77' });
    expect(await outboxEvents(dto.id)).toHaveLength(0);
    expect(await auditRows(dto.id)).toHaveLength(2);
  });
});

describe('{id} routes', () => {
  it('when {id} is the UUID or the external_id, every route finds the record', async () => {
    const dto = await createCustomer(ctx, org, person({ externalId: 'crm/ref 1' }));
    for (const ref of [dto.id, 'crm/ref 1']) {
      expect((await get(ref)).json().id).toBe(dto.id);
      expect((await ctx.request('GET', `/v1/customers/${encodeURIComponent(ref)}/aml`, { key: org.key })).statusCode).toBe(200);
      expect((await patch(ref, { phone: ref.slice(0, 5) })).statusCode).toBe(200);
      const put = await ctx.request('PUT', `/v1/customers/${encodeURIComponent(ref)}/designated-services`, {
        key: org.key,
        body: { service_codes: [] },
      });
      expect(put.json().id).toBe(dto.id);
    }
  });

  it('when an external_id looks like a UUID, it is still found by it', async () => {
    const externalId = '11111111-2222-4333-8444-555555555555';
    const dto = await createCustomer(ctx, org, person({ externalId }));
    expect((await get(externalId)).json().id).toBe(dto.id);
  });

  it("when {id} is an entity's id or external_id, the customer routes answer 404", async () => {
    const entityId = await insertEntity(ctx, org.id, 'crm-entity-ref');
    for (const ref of [entityId, 'crm-entity-ref']) {
      expect((await get(ref)).statusCode).toBe(404);
      expect((await ctx.request('GET', `/v1/customers/${ref}/aml`, { key: org.key })).statusCode).toBe(404);
      expect((await patch(ref, { phone: '1' })).statusCode).toBe(404);
    }
  });

  it('when {id} belongs to another organisation, it answers 404', async () => {
    const other = await ctx.createOrg();
    const theirs = await createCustomer(ctx, other, person({ externalId: 'crm-theirs' }));
    expect((await get(theirs.id)).statusCode).toBe(404);
    expect((await get('crm-theirs')).statusCode).toBe(404);
    expect((await get(theirs.id)).json().error.code).toBe('not_found');
  });
});

describe('AML block and catalog', () => {
  it('when GET /customers/{id}/aml is called, it returns only the AML block', async () => {
    const dto = await createCustomer(ctx, org, person());
    const response = await ctx.request('GET', `/v1/customers/${dto.id}/aml`, { key: org.key });
    expect(response.statusCode).toBe(200);
    expect(response.json()).toEqual({
      status: 'NOT_SCREENED',
      screened_at: null,
      last_reviewed_at: null,
      flags: { pep: false, sanctions: false, adverse_media: false, terrorism: false },
    });
    expect(dto.aml).toEqual(response.json());
  });

  it('when a key holds only aml:read, it can fetch the AML block but not the customer', async () => {
    const dto = await createCustomer(ctx, org, person());
    const amlOnly = await ctx.createKey(org.id, { scopes: ['aml:read'] });
    expect((await ctx.request('GET', `/v1/customers/${dto.id}/aml`, { key: amlOnly.key })).statusCode).toBe(200);
    expect((await ctx.request('GET', `/v1/customers/${dto.id}`, { key: amlOnly.key })).statusCode).toBe(403);
    expect((await ctx.request('GET', '/v1/customers', { key: amlOnly.key })).statusCode).toBe(403);
  });

  it('when any valid key calls GET /designated-services, it returns the 27 codes with group, name and description', async () => {
    const narrow = await ctx.createKey(org.id, { scopes: ['aml:read'] });
    const response = await ctx.request('GET', '/v1/designated-services', { key: narrow.key });
    expect(response.statusCode).toBe(200);
    const body = response.json();
    expect(body.object).toBe('list');
    expect(body.data).toHaveLength(27);
    for (const entry of body.data) {
      expect(Object.keys(entry).sort()).toEqual(['code', 'description', 'group', 'name']);
      expect(entry.description.length).toBeGreaterThan(0);
    }
    expect(new Set(body.data.map((entry: { group: string }) => entry.group))).toEqual(
      new Set(['Professional services', 'Real estate', 'Financial services', 'Other']),
    );
    expect(body.data.map((entry: { code: string }) => entry.code)).toContain('OTH-HIGH-VALUE-GOODS');
    expect((await ctx.request('GET', '/v1/designated-services')).statusCode).toBe(401);
  });

  it('when a customer is read, the DTO holds exactly the spec fields and the review and edd blocks', async () => {
    const dto = await createCustomer(ctx, org, person({ designatedServices: ['FIN-FX'], risk: { complexStructure: true } }));
    expect(Object.keys((await get(dto.id)).json()).sort()).toEqual(
      [
        'added_via',
        'aml',
        'created_at',
        'edd',
        'email',
        'external_id',
        'full_name',
        'id',
        'identity',
        'kyc_completed_at',
        'kyc_started_at',
        'kyc_status',
        'review',
        'type',
        'updated_at',
      ].sort(),
    );
  });
});

describe('a change and its side records', () => {
  it("when an upsert, a PATCH and a PUT change a record, each audit row's after is exactly the stored record, and each event shows the committed updated_at", async () => {
    const body = person({ externalId: 'crm-exact-after', risk: { isNewCustomer: true } });
    const dto = await createCustomer(ctx, org, body);
    const repository = createCustomersRepository(ctx.database.db);
    // What the audit log keeps of the record as stored now, in the form jsonb gives it back.
    const storedSnapshot = async () =>
      JSON.parse(JSON.stringify(auditSnapshot((await repository.findById(org.id, dto.id, ctx.database.db))!)));
    const lastAfter = async () => {
      const rows = await auditRows(dto.id);
      return rows[rows.length - 1]!.after as Record<string, unknown>;
    };
    const changes = [
      () =>
        upsert(ctx, org, {
          ...body,
          phone: '1',
          firstName: 'Ada',
          lastName: 'Lovelace',
          risk: { isNewCustomer: true, handlesCashOrCrypto: true },
        }),
      () => patch(dto.id, { phone: '2', risk: { complexStructure: true } }),
      () =>
        ctx.request('PUT', `/v1/customers/${dto.id}/designated-services`, {
          key: org.key,
          body: { service_codes: ['FIN-FX', 'RE-BROKER'] },
        }),
    ];
    for (const change of changes) {
      const response = await change();
      expect(response.statusCode, response.body).toBe(200);
      const after = await lastAfter();
      const stored = await storedSnapshot();
      expect(after).toEqual(stored);
      const events = await outboxEvents(dto.id);
      expect(events[events.length - 1]!.payload.data.customer.updated_at).toBe((await get(dto.id)).json().updated_at);
      expect(response.json().updated_at).toBe((await get(dto.id)).json().updated_at);
    }
  });

  it('when an upsert, a PATCH and a PUT change a record, each answer is the record as stored, though the UPDATE reads back only updated_at', async () => {
    const body = person({ externalId: 'crm-answer-stored', risk: { isNewCustomer: true } });
    const dto = await createCustomer(ctx, org, body);
    const changes = [
      () =>
        upsert(ctx, org, { ...body, phone: '31', firstName: 'Ada', lastName: 'Lovelace', type: 'SOLE_TRADER', businessName: 'Ada Pty' }),
      () => patch(dto.id, { fullName: `${body.fullName as string} Jr`, risk: { complexStructure: true } }),
      () => ctx.request('PUT', `/v1/customers/${dto.id}/designated-services`, { key: org.key, body: { service_codes: ['FIN-FX'] } }),
    ];
    let previous = dto.updated_at as string;
    for (const change of changes) {
      const answer = await change();
      expect(answer.statusCode, answer.body).toBe(200);
      const { designated_services: _services, ...shown } = answer.json();
      expect(shown).toEqual((await get(dto.id)).json());
      expect(new Date(shown.updated_at).getTime()).toBeGreaterThan(new Date(previous).getTime());
      previous = shown.updated_at;
    }
  });

  it('when updateLocked writes a locked record, it returns the updated_at the database stamped, and undefined for no record', async () => {
    const dto = await createCustomer(ctx, org, person());
    const repository = createCustomersRepository(ctx.database.db);
    const stamped = await ctx.database.transaction(async (tx) => {
      await repository.findById(org.id, dto.id, tx, { forUpdate: true });
      return repository.updateLocked(org.id, dto.id, { phone: '41' }, tx);
    });
    const stored = await customerRow(ctx, dto.id);
    expect(stamped).toEqual({ updatedAt: stored.updated_at });
    expect(stored.phone).toBe('41');
    expect(stamped!.updatedAt.getTime()).toBeGreaterThan(new Date(dto.updated_at).getTime());
    // A value Drizzle must render (SQL) takes the statement built per call; it returns the same.
    const rendered = await repository.updateLocked(org.id, dto.id, { phone: sql`'4' || '2'` } as never, ctx.database.db);
    expect(rendered).toEqual({ updatedAt: (await customerRow(ctx, dto.id)).updated_at });
    expect((await customerRow(ctx, dto.id)).phone).toBe('42');
    expect(await repository.updateLocked(org.id, '00000000-0000-4000-8000-000000000000', { phone: '43' }, ctx.database.db)).toBeUndefined();
    expect(
      await repository.updateLocked(org.id, '00000000-0000-4000-8000-000000000000', { phone: sql`'43'` } as never, ctx.database.db),
    ).toBeUndefined();
  });
});

async function insertCustomer(externalId: string): Promise<string> {
  const { rows } = await ctx.database.pool.query(
    `INSERT INTO customers (org_id, kind, external_id, type, name, email, kyc_status, added_via, risk_answers, designated_services, client_since_date, kyc_started_at, pre_commencement_assessment)
     VALUES ($1, 'individual', $2, 'INDIVIDUAL', 'Prepared Update', $2 || '@example.com', 'NOT_STARTED', 'INTEGRATION', '{"isNewCustomer": false}', '{FIN-FX,RE-BROKER}', '2020-02-29', now(), '{"assessedAt": "2024-01-01"}')
     RETURNING id`,
    [org.id, externalId],
  );
  return rows[0].id;
}

describe('the customers UPDATE prepared per column set', () => {
  it('when an update clears jsonb, array, date and timestamp columns, they become SQL NULL or empty as sent, not the JSON text "null"', async () => {
    const id = await insertCustomer('bo-null');
    const repository = createCustomersRepository(ctx.database.db);
    const updated = await repository.update(
      org.id,
      id,
      {
        preCommencementAssessment: null,
        clientSinceDate: null,
        kycStartedAt: null,
        designatedServices: [],
      },
      ctx.database.db,
    );
    expect(updated).toMatchObject({ preCommencementAssessment: null, clientSinceDate: null, kycStartedAt: null, designatedServices: [] });
    const { rows } = await ctx.database.pool.query(
      `SELECT pre_commencement_assessment IS NULL AS assessment_null, client_since_date IS NULL AS date_null, kyc_started_at IS NULL AS started_null, designated_services FROM customers WHERE id = $1`,
      [id],
    );
    expect(rows[0]).toEqual({ assessment_null: true, date_null: true, started_null: true, designated_services: [] });
  });

  it('when an update sets jsonb, array, date and timestamp values, they are stored as a Drizzle update would store them', async () => {
    const id = await insertCustomer('bo-set');
    const repository = createCustomersRepository(ctx.database.db);
    const startedAt = new Date('2025-06-01T10:11:12.345Z');
    const values = {
      riskAnswers: { isNewCustomer: false, complexStructure: true },
      designatedServices: ['PRO-FORMATION'],
      clientSinceDate: '2019-12-31',
      kycStartedAt: startedAt,
    };
    const updated = await repository.update(org.id, id, values, ctx.database.db);
    const [stored] = await ctx.database.db.select().from(customers).where(eq(customers.id, id));
    expect(updated).toEqual(stored);
    expect(stored).toMatchObject(values);
  });
});
