import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { createEntity, createIndividual, expectSameDto, expectValidation, randomDigits, sql } from './entity-test-helpers.js';

let ctx: TestContext;
/** An organisation of its own, so list assertions see exactly what this file wrote. */
let org: TestOrg;
const created: Record<string, any>[] = [];
let person: Record<string, any>;

beforeAll(async () => {
  ctx = await createTestContext();
  org = await ctx.createOrg();
  person = await createIndividual(ctx, org, { externalId: 'person-1' });
  for (const [index, type] of (['COMPANY', 'TRUST', 'COMPANY', 'SMSF', 'OTHER', 'PARTNERSHIP', 'COMPANY'] as const).entries()) {
    created.push(
      await createEntity(ctx, org, {
        type,
        externalId: `list-${index}`,
        ...(index % 2 === 0 ? { designatedServices: ['PRO-REAL-ESTATE'] } : { designatedServices: [] }),
      }),
    );
  }
});
afterAll(async () => ctx?.close());

async function list(query: Record<string, string> = {}, key = org.key) {
  return ctx.request('GET', '/v1/entities', { key, query });
}

describe('GET /entities', () => {
  it('when called without parameters, it returns the list envelope of entities only, oldest first', async () => {
    const response = await list();
    expect(response.statusCode).toBe(200);
    const body = response.json();
    expect(Object.keys(body).sort()).toEqual(['data', 'has_more', 'limit', 'next_cursor', 'object']);
    expect(body).toMatchObject({ object: 'list', has_more: false, next_cursor: null, limit: 50 });
    expect(body.data.map((item: { id: string }) => item.id)).toEqual(created.map((entity) => entity.id));
    expect(body.data).not.toContainEqual(expect.objectContaining({ id: person.id }));
    expectSameDto(created[0]!, body.data[0]);
  });

  it.each([
    ['0', 1],
    ['-5', 1],
    ['500', 100],
    ['3', 3],
  ])('when limit is %s, it is clamped and echoed as %i', async (limit, echoed) => {
    const body = (await list({ limit })).json();
    expect(body.limit).toBe(echoed);
    expect(body.data.length).toBeLessThanOrEqual(echoed);
  });

  it('when limit is not a number, it answers 422 on limit', async () => {
    expectValidation(await list({ limit: 'ten' }), 'limit');
  });

  it('when paging with the cursor, it walks every entity once', async () => {
    const seen: string[] = [];
    let cursor: string | undefined;
    for (let page = 0; page < 10; page += 1) {
      const body = (await list({ limit: '3', ...(cursor ? { cursor } : {}) })).json();
      seen.push(...body.data.map((item: { id: string }) => item.id));
      if (!body.has_more) {
        expect(body.next_cursor).toBeNull();
        break;
      }
      cursor = body.next_cursor;
    }
    expect(seen).toEqual(created.map((entity) => entity.id));
  });

  it('when a cursor is reused with other filters, it answers 422 on cursor', async () => {
    const first = (await list({ limit: '2' })).json();
    expectValidation(await list({ limit: '2', cursor: first.next_cursor, type: 'COMPANY' }), 'cursor');
  });

  it('when a cursor is garbage, it answers 422 on cursor', async () => {
    expectValidation(await list({ cursor: 'not-a-cursor' }), 'cursor');
  });

  it('when a cursor’s payload is edited or its mac stripped or swapped, it answers 422 on cursor', async () => {
    const first = (await list({ limit: '2' })).json().next_cursor as string;
    const second = (await list({ limit: '2', cursor: first })).json().next_cursor as string;
    const [payload, mac] = first.split('.') as [string, string];
    const position = JSON.parse(Buffer.from(payload, 'base64url').toString('utf8'));
    const edited = (fields: object) => Buffer.from(JSON.stringify({ ...position, ...fields })).toString('base64url');
    const tampered = [
      `${edited({ i: created[4]!.id })}.${mac}`,
      `${edited({ c: '0000-01-01T00:00:00.000Z' })}.${mac}`,
      `${edited({ c: '+275760-09-13T00:00:00.000Z' })}.${mac}`,
      payload,
      `${payload}.${second.split('.')[1]}`,
    ];
    for (const cursor of tampered) expectValidation(await list({ limit: '2', cursor }), 'cursor');
    // The untouched cursor still continues the walk.
    const next = (await list({ limit: '2', cursor: first })).json();
    expect(next.data.map((item: { id: string }) => item.id)).toEqual(created.slice(2, 4).map((entity) => entity.id));
  });

  it('when status is given, it filters on kyb_status', async () => {
    const body = (await list({ status: 'NOT_STARTED' })).json();
    expect(body.data.map((item: { id: string }) => item.id)).toEqual(
      created.filter((_, index) => index % 2 === 0).map((entity) => entity.id),
    );
    for (const item of body.data) expect(item.kyb_status).toBe('NOT_STARTED');
    const required = (await list({ status: 'NOT_REQUIRED' })).json();
    expect(required.data).toHaveLength(3);
  });

  it('when type is given, it filters on the entity type', async () => {
    const body = (await list({ type: 'COMPANY' })).json();
    expect(body.data).toHaveLength(3);
    for (const item of body.data) expect(item.type).toBe('COMPANY');
    expect((await list({ type: 'SMSF' })).json().data.map((item: { type: string }) => item.type)).toEqual(['SMSF']);
  });

  it('when type is not an entity type, it answers 422 on type', async () => {
    expectValidation(await list({ type: 'INDIVIDUAL' }), 'type');
  });

  it('when aml_status is given, it filters on the AML status', async () => {
    await sql(ctx, `UPDATE customers SET aml_status = 'CLEAR' WHERE id = $1`, [created[4]!.id]);
    const body = (await list({ aml_status: 'CLEAR' })).json();
    expect(body.data.map((item: { id: string }) => item.id)).toEqual([created[4]!.id]);
    expect(body.data[0].aml.status).toBe('CLEAR');
  });

  it('when external_id is given, it returns that entity only', async () => {
    const body = (await list({ external_id: 'list-3' })).json();
    expect(body.data.map((item: { id: string }) => item.id)).toEqual([created[3]!.id]);
  });

  it('when external_id belongs to an individual, it returns nothing', async () => {
    expect((await list({ external_id: 'person-1' })).json().data).toEqual([]);
  });

  it('when updated_since is given, it returns only entities updated after it', async () => {
    const since = new Date().toISOString();
    await new Promise((resolve) => setTimeout(resolve, 10));
    await ctx.request('PATCH', `/v1/entities/${created[5]!.id}`, { key: org.key, body: { address: 'Touched' } });
    const body = (await list({ updated_since: since })).json();
    expect(body.data.map((item: { id: string }) => item.id)).toEqual([created[5]!.id]);
  });

  it('when updated_since is not a date-time, it answers 422', async () => {
    expectValidation(await list({ updated_since: 'yesterday' }), 'updated_since');
  });

  it('when include=total_count, it counts the whole filtered set; otherwise total_count is absent', async () => {
    const body = (await list({ include: 'total_count', limit: '2', type: 'COMPANY' })).json();
    expect(body.total_count).toBe(3);
    expect(body.data).toHaveLength(2);
    expect('total_count' in (await list({ limit: '2' })).json()).toBe(false);
    expectValidation(await list({ include: 'everything' }), 'include');
  });

  it('when an unknown query parameter is sent, it answers 422 naming it', async () => {
    expectValidation(await list({ colour: 'blue' }), 'colour');
  });

  it('when another organisation lists, it sees none of these entities', async () => {
    const other = await ctx.createOrg();
    expect((await list({}, other.key)).json().data).toEqual([]);
  });
});

describe('entities and individuals stay apart', () => {
  it('when GET /customers lists, entities are excluded', async () => {
    const body = (await ctx.request('GET', '/v1/customers', { key: org.key, query: { include: 'total_count' } })).json();
    const ids = body.data.map((item: { id: string }) => item.id);
    for (const entity of created) expect(ids).not.toContain(entity.id);
    expect(ids).toContain(person.id);
  });

  it('when GET /customers/{entityId} is called, it answers 404', async () => {
    expect((await ctx.request('GET', `/v1/customers/${created[0]!.id}`, { key: org.key })).statusCode).toBe(404);
    expect((await ctx.request('GET', '/v1/customers/list-0', { key: org.key })).statusCode).toBe(404);
  });

  it('when GET /entities/{individualId} is called, it answers 404', async () => {
    const response = await ctx.request('GET', `/v1/entities/${person.id}`, { key: org.key });
    expect(response.statusCode).toBe(404);
    expect(response.json().error.code).toBe('not_found');
    expect((await ctx.request('GET', '/v1/entities/person-1', { key: org.key })).statusCode).toBe(404);
    expect((await ctx.request('GET', `/v1/entities/${person.id}/aml`, { key: org.key })).statusCode).toBe(404);
  });
});

describe('GET /entities/{id} and /aml', () => {
  it('when fetched by UUID or by external_id, it returns the same entity DTO', async () => {
    const byId = await ctx.request('GET', `/v1/entities/${created[1]!.id}`, { key: org.key });
    const byExternalId = await ctx.request('GET', '/v1/entities/list-1', { key: org.key });
    expect(byId.statusCode).toBe(200);
    expect(byExternalId.json()).toEqual(byId.json());
    expect(Object.keys(byId.json()).sort()).toEqual(
      [
        'id',
        'external_id',
        'type',
        'name',
        'origin',
        'abn',
        'acn',
        'country_of_formation',
        'registration_number',
        'kyb_status',
        'kyb_started_at',
        'kyb_completed_at',
        'contact',
        'aml',
        'review',
        'edd',
        'added_via',
        'created_at',
        'updated_at',
      ].sort(),
    );
  });

  it('when the id is unknown or belongs to another organisation, it answers 404', async () => {
    expect((await ctx.request('GET', `/v1/entities/${crypto.randomUUID()}`, { key: org.key })).statusCode).toBe(404);
    const other = await ctx.createOrg();
    expect((await ctx.request('GET', `/v1/entities/${created[0]!.id}`, { key: other.key })).statusCode).toBe(404);
    expect((await ctx.request('GET', `/v1/entities/${created[0]!.id}/aml`, { key: other.key })).statusCode).toBe(404);
  });

  it('when /aml is fetched, it returns only the AML block, matching the entity’s', async () => {
    const entity = created[2]!;
    await sql(ctx, `UPDATE customers SET aml_status = 'NEEDS_REVIEW', aml_pep = true, aml_screened_at = now() WHERE id = $1`, [entity.id]);
    const response = await ctx.request('GET', `/v1/entities/${entity.external_id}/aml`, { key: org.key });
    expect(response.statusCode).toBe(200);
    const block = response.json();
    expect(Object.keys(block).sort()).toEqual(['flags', 'last_reviewed_at', 'screened_at', 'status']);
    expect(block).toMatchObject({ status: 'NEEDS_REVIEW', flags: { pep: true, sanctions: false, adverse_media: false, terrorism: false } });
    expect((await ctx.request('GET', `/v1/entities/${entity.id}`, { key: org.key })).json().aml).toEqual(block);
  });

  it('when a key holds only aml:read, it can read the AML block but not the entity or the list', async () => {
    const amlOnly = await ctx.createKey(org.id, { scopes: ['aml:read'] });
    expect((await ctx.request('GET', `/v1/entities/${created[0]!.id}/aml`, { key: amlOnly.key })).statusCode).toBe(200);
    expect((await ctx.request('GET', `/v1/entities/${created[0]!.id}`, { key: amlOnly.key })).statusCode).toBe(403);
    expect((await ctx.request('GET', '/v1/entities', { key: amlOnly.key })).statusCode).toBe(403);
  });

  it('when a key holds only customers:read, it cannot create or patch entities', async () => {
    const readOnly = await ctx.createKey(org.id, { scopes: ['customers:read'] });
    const create = await ctx.request('POST', '/v1/entities', {
      key: readOnly.key,
      body: { type: 'COMPANY', name: `RO ${randomDigits(6)}` },
    });
    expect(create.statusCode).toBe(403);
    expect(create.json().error.code).toBe('forbidden_scope');
  });
});
