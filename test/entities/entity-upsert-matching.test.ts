import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { createEntity, createIndividual, expectConflict, postEntity, randomDigits, sql, uniqueName } from './entity-test-helpers.js';

let ctx: TestContext;
let org: TestOrg;
beforeAll(async () => {
  ctx = await createTestContext();
  org = await ctx.createOrg();
});
afterAll(async () => ctx?.close());

async function entityCount(where = 'TRUE', params: unknown[] = []): Promise<number> {
  const [row] = await sql<{ count: number }>(
    ctx,
    `SELECT count(*)::int AS count FROM customers WHERE org_id = $1 AND kind = 'entity' AND ${where}`,
    [org.id, ...params],
  );
  return row!.count;
}

describe('POST /entities: matching order', () => {
  it('when the externalId exists, it updates that entity and answers 200', async () => {
    const externalId = `crm-${randomDigits(8)}`;
    const created = await createEntity(ctx, org, { externalId });
    const response = await postEntity(ctx, org, { externalId, address: '1 Collins St, Melbourne' });
    expect(response.statusCode).toBe(200);
    expect(response.json()).toMatchObject({ id: created.id, name: created.name });
    const [row] = await sql(ctx, 'SELECT address FROM customers WHERE id = $1', [created.id]);
    expect(row!.address).toBe('1 Collins St, Melbourne');
  });

  it('when no externalId is sent and the ABN matches, it updates that entity and answers 200', async () => {
    const abn = randomDigits(11);
    const created = await createEntity(ctx, org, { abn });
    const response = await postEntity(ctx, org, { type: 'COMPANY', name: uniqueName('Renamed'), abn });
    expect(response.statusCode).toBe(200);
    expect(response.json().id).toBe(created.id);
  });

  it('when the ABN matches nothing but the ACN does, it updates the ACN match and answers 200', async () => {
    const acn = randomDigits(9);
    const created = await createEntity(ctx, org, { acn });
    const response = await postEntity(ctx, org, { type: 'COMPANY', name: uniqueName(), abn: randomDigits(11), acn });
    expect(response.statusCode).toBe(200);
    expect(response.json()).toMatchObject({ id: created.id, acn });
  });

  it('when ABN and ACN match different entities, the ABN match wins', async () => {
    const abn = randomDigits(11);
    const acn = randomDigits(9);
    const byAbn = await createEntity(ctx, org, { abn });
    await createEntity(ctx, org, { acn });
    const response = await postEntity(ctx, org, { type: 'COMPANY', abn, acn: undefined });
    expect(response.statusCode).toBe(200);
    expect(response.json().id).toBe(byAbn.id);
  });

  it('when legal name and type match case-insensitively, it updates that entity and answers 200', async () => {
    const name = uniqueName('Acme Holdings');
    const created = await createEntity(ctx, org, { type: 'TRUST', name });
    const response = await postEntity(ctx, org, { type: 'TRUST', name: name.toUpperCase() });
    expect(response.statusCode).toBe(200);
    expect(response.json().id).toBe(created.id);
  });

  it('when the same name arrives with another type, it creates a new entity (201)', async () => {
    const name = uniqueName('Dual');
    const company = await createEntity(ctx, org, { type: 'COMPANY', name });
    const response = await postEntity(ctx, org, { type: 'TRUST', name });
    expect(response.statusCode).toBe(201);
    expect(response.json().id).not.toBe(company.id);
    expect(response.json().type).toBe('TRUST');
  });

  it('when nothing matches, it creates the entity (201) with added_via INTEGRATION', async () => {
    const response = await postEntity(ctx, org, { type: 'PARTNERSHIP', name: uniqueName(), externalId: `crm-${randomDigits(8)}` });
    expect(response.statusCode).toBe(201);
    expect(response.json().added_via).toBe('INTEGRATION');
    const [row] = await sql(ctx, 'SELECT added_via, kind FROM customers WHERE id = $1', [response.json().id]);
    expect(row).toEqual({ added_via: 'INTEGRATION', kind: 'entity' });
  });

  it('when a matched entity has no external_id, the upsert adopts the sent externalId', async () => {
    const abn = randomDigits(11);
    const created = await createEntity(ctx, org, { abn });
    const externalId = `crm-${randomDigits(8)}`;
    const response = await postEntity(ctx, org, { externalId, abn });
    expect(response.statusCode).toBe(200);
    expect(response.json()).toMatchObject({ id: created.id, external_id: externalId });
  });
});

describe('POST /entities: Idempotency-Key', () => {
  it('when a create is retried with the same Idempotency-Key, it replays the 201 and creates one entity', async () => {
    const name = uniqueName('Idempotent');
    const options = {
      key: org.key,
      body: { type: 'COMPANY', name, contact: { fullName: 'Idem Contact', email: 'idem@example.com' } },
      headers: { 'idempotency-key': `create-${name}` },
    };
    const first = await ctx.request('POST', '/v1/entities', options);
    const replay = await ctx.request('POST', '/v1/entities', options);
    expect(first.statusCode).toBe(201);
    expect(replay.statusCode).toBe(201);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.json()).toEqual(first.json());
    expect(await entityCount('name = $2', [name])).toBe(1);
  });
});

describe('POST /entities: organisations are separate', () => {
  it('when another organisation holds the same externalId and ABN, it creates a separate entity (201)', async () => {
    const other = await ctx.createOrg();
    const externalId = `crm-${randomDigits(8)}`;
    const abn = randomDigits(11);
    const theirs = await createEntity(ctx, other, { externalId, abn });
    const response = await postEntity(ctx, org, { type: 'COMPANY', name: theirs.name, externalId, abn });
    expect(response.statusCode).toBe(201);
    expect(response.json().id).not.toBe(theirs.id);
  });
});

describe('POST /entities: conflicts', () => {
  it('when the ABN match carries a different external_id, it answers 409 and changes nothing', async () => {
    const abn = randomDigits(11);
    const created = await createEntity(ctx, org, { abn, externalId: `crm-${randomDigits(8)}` });
    const response = await postEntity(ctx, org, { type: 'COMPANY', name: uniqueName(), abn, externalId: `crm-${randomDigits(8)}` });
    expectConflict(response);
    const [row] = await sql(ctx, 'SELECT name, external_id FROM customers WHERE id = $1', [created.id]);
    expect(row).toEqual({ name: created.name, external_id: created.external_id });
    expect(await entityCount('abn = $2', [abn])).toBe(1);
  });

  it('when the ACN match carries a different external_id, it answers 409', async () => {
    const acn = randomDigits(9);
    await createEntity(ctx, org, { acn, externalId: `crm-${randomDigits(8)}` });
    expectConflict(await postEntity(ctx, org, { type: 'COMPANY', name: uniqueName(), acn, externalId: `crm-${randomDigits(8)}` }));
    expect(await entityCount('acn = $2', [acn])).toBe(1);
  });

  it('when the name+type match carries a different external_id, it answers 409', async () => {
    const name = uniqueName();
    await createEntity(ctx, org, { name, externalId: `crm-${randomDigits(8)}` });
    expectConflict(await postEntity(ctx, org, { type: 'COMPANY', name, externalId: `crm-${randomDigits(8)}` }));
  });

  it('when the externalId hit has another stored type, it answers 409', async () => {
    const externalId = `crm-${randomDigits(8)}`;
    await createEntity(ctx, org, { externalId, type: 'COMPANY' });
    expectConflict(await postEntity(ctx, org, { externalId, type: 'TRUST' }));
  });

  it('when the externalId hit has another stored origin, it answers 409', async () => {
    const externalId = `crm-${randomDigits(8)}`;
    await createEntity(ctx, org, { externalId });
    expectConflict(await postEntity(ctx, org, { externalId, origin: 'INTERNATIONAL', countryOfFormation: 'NZL' }));
  });

  it('when the ABN match has another stored type, it answers 409', async () => {
    const abn = randomDigits(11);
    await createEntity(ctx, org, { abn, type: 'COMPANY' });
    expectConflict(await postEntity(ctx, org, { type: 'SMSF', name: uniqueName(), abn }));
  });

  it('when the externalId belongs to an individual, it answers 409 and creates no entity', async () => {
    const externalId = `crm-${randomDigits(8)}`;
    await createIndividual(ctx, org, { externalId });
    const before = await entityCount();
    expectConflict(await postEntity(ctx, org, { type: 'COMPANY', name: uniqueName(), externalId }));
    expect(await entityCount()).toBe(before);
  });

  it('when an update would give the matched entity an ABN another entity holds, it answers 409 (not 500)', async () => {
    const externalId = `crm-${randomDigits(8)}`;
    await createEntity(ctx, org, { externalId });
    const other = await createEntity(ctx, org, { abn: randomDigits(11) });
    expectConflict(await postEntity(ctx, org, { externalId, abn: other.abn }));
  });

  it('when the clash happens under an Idempotency-Key, it still answers 409 and replays it', async () => {
    const externalId = `crm-${randomDigits(8)}`;
    await createEntity(ctx, org, { externalId });
    const other = await createEntity(ctx, org, { acn: randomDigits(9) });
    const options = { key: org.key, body: { externalId, acn: other.acn }, headers: { 'idempotency-key': `clash-${externalId}` } };
    expectConflict(await ctx.request('POST', '/v1/entities', options));
    const replay = await ctx.request('POST', '/v1/entities', options);
    expectConflict(replay);
  });

  it('when an update would rename the matched entity to another entity’s name and type, it answers 409 (not 500)', async () => {
    const abn = randomDigits(11);
    await createEntity(ctx, org, { abn });
    const other = await createEntity(ctx, org);
    expectConflict(await postEntity(ctx, org, { type: 'COMPANY', abn, name: other.name }));
  });
});

describe('POST /entities: ingest never starts KYB', () => {
  it('when entities are created and upserted, no KYB starts and nothing is emailed, charged or armed', async () => {
    const fresh = await ctx.createOrg({ credits: 40 });
    const countRows = async (table: string) =>
      (await sql<{ count: number }>(ctx, `SELECT count(*)::int AS count FROM ${table} WHERE org_id = $1`, [fresh.id]))[0]!.count;
    const ledgerBefore = await countRows('credit_ledger');
    const owed = await postEntity(ctx, fresh, {
      type: 'COMPANY',
      name: uniqueName(),
      externalId: 'kyb-owed',
      designatedServices: ['PRO-REAL-ESTATE'],
      contact: { fullName: 'Casey Contact', email: 'casey@example.com' },
    });
    expect(owed.statusCode).toBe(201);
    expect(owed.json()).toMatchObject({ kyb_status: 'NOT_STARTED', kyb_started_at: null, kyb_completed_at: null });
    const notOwed = await postEntity(ctx, fresh, { type: 'TRUST', name: uniqueName(), designatedServices: [] });
    expect(notOwed.json()).toMatchObject({ kyb_status: 'NOT_REQUIRED', kyb_started_at: null });
    const again = await postEntity(ctx, fresh, { externalId: 'kyb-owed', designatedServices: ['FIN-CRYPTO'] });
    expect(again.statusCode).toBe(200);
    expect(again.json()).toMatchObject({ kyb_status: 'NOT_STARTED', kyb_started_at: null });

    expect(await countRows('verifications')).toBe(0);
    expect(await countRows('emails')).toBe(0);
    expect(await countRows('credit_ledger')).toBe(ledgerBefore);
    const [orgRow] = await sql(ctx, 'SELECT credits FROM organisations WHERE id = $1', [fresh.id]);
    expect(orgRow!.credits).toBe(40);
  });
});

describe('POST /entities: concurrency', () => {
  it('when 20 upserts with one externalId race, exactly one entity exists and exactly one answer is 201', async () => {
    const externalId = `race-${randomDigits(8)}`;
    const name = uniqueName('Race');
    const responses = await Promise.all(Array.from({ length: 20 }, () => postEntity(ctx, org, { type: 'COMPANY', name, externalId })));
    expect(responses.map((response) => response.statusCode).sort((a, b) => a - b)).toEqual([...Array(19).fill(200), 201]);
    expect(new Set(responses.map((response) => response.json().id)).size).toBe(1);
    expect(await entityCount('external_id = $2', [externalId])).toBe(1);
  });

  it('when 20 upserts with one legal name and type (no ABN, ACN or externalId) race, exactly one entity exists', async () => {
    const name = uniqueName('Name race');
    const responses = await Promise.all(
      Array.from({ length: 20 }, (_, index) => postEntity(ctx, org, { type: 'TRUST', name: index % 2 === 0 ? name : name.toUpperCase() })),
    );
    for (const response of responses) expect([200, 201], response.body).toContain(response.statusCode);
    expect(new Set(responses.map((response) => response.json().id)).size).toBe(1);
    expect(await entityCount('lower(name) = lower($2)', [name])).toBe(1);
  });

  it('when 20 upserts with one ABN and no externalId race, exactly one entity exists', async () => {
    const abn = randomDigits(11);
    const responses = await Promise.all(
      Array.from({ length: 20 }, (_, index) => postEntity(ctx, org, { type: 'COMPANY', name: uniqueName(`Abn race ${index}`), abn })),
    );
    for (const response of responses) expect([200, 201], response.body).toContain(response.statusCode);
    expect(responses.filter((response) => response.statusCode === 201)).toHaveLength(1);
    expect(new Set(responses.map((response) => response.json().id)).size).toBe(1);
    expect(await entityCount('abn = $2', [abn])).toBe(1);
  });
});
