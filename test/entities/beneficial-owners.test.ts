import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { createEntity, createIndividual, expectValidation, sql } from './entity-test-helpers.js';

let ctx: TestContext;
let org: TestOrg;
beforeAll(async () => {
  ctx = await createTestContext();
  org = await ctx.createOrg();
});
afterAll(async () => ctx?.close());

const UBO_KEYS = [
  'id',
  'name',
  'holder_type',
  'role_type',
  'role_types',
  'percentage_held',
  'kyc_required',
  'kyc_status',
  'kyc_email',
  'linked_customer',
  'added_via',
  'created_at',
  'updated_at',
].sort();

async function addOwners(ref: string, owners: unknown[], key = org.key) {
  return ctx.request('POST', `/v1/entities/${encodeURIComponent(ref)}/ubos`, { key, body: { owners } });
}
async function listOwners(ref: string, key = org.key) {
  return ctx.request('GET', `/v1/entities/${encodeURIComponent(ref)}/ubos`, { key });
}
async function individualCount(orgId = org.id): Promise<number> {
  const [row] = await sql<{ count: number }>(
    ctx,
    `SELECT count(*)::int AS count FROM customers WHERE org_id = $1 AND kind = 'individual'`,
    [orgId],
  );
  return row!.count;
}

describe('POST /entities/{id}/ubos', () => {
  it('when an owner matches an existing individual by name+email, it links that individual without creating one', async () => {
    const entity = await createEntity(ctx, org);
    const person = await createIndividual(ctx, org, { fullName: 'Lena Linked', email: 'lena@example.com', externalId: 'lena-1' });
    const before = await individualCount();
    const response = await addOwners(entity.id, [
      { fullName: 'lena linked', email: 'LENA@example.com', roleTypes: ['SHAREHOLDER'], percentageHeld: 40 },
    ]);
    expect(response.statusCode, response.body).toBe(200);
    expect(await individualCount()).toBe(before);
    const [owner] = response.json().ubos;
    expect(owner).toMatchObject({
      name: 'Lena Linked',
      holder_type: 'INDIVIDUAL',
      role_type: 'SHAREHOLDER',
      role_types: ['SHAREHOLDER'],
      percentage_held: 40,
      kyc_required: true,
      kyc_status: person.kyc_status,
      kyc_email: 'lena@example.com',
      linked_customer: { id: person.id, external_id: 'lena-1' },
      added_via: 'INTEGRATION',
    });
  });

  it('when an owner matches no individual, it creates one added via INTEGRATION, NOT_STARTED when KYC is required', async () => {
    const entity = await createEntity(ctx, org);
    const before = await individualCount();
    const response = await addOwners(entity.id, [
      {
        fullName: 'Nina New',
        email: 'nina@example.com',
        roleTypes: ['DIRECTOR', 'SHAREHOLDER'],
        percentageHeld: 25.5,
        holderType: 'JOINT',
      },
      { fullName: 'Omar Optional', email: 'omar@example.com', roleTypes: ['CONTROLLER'], kycRequired: false },
    ]);
    expect(response.statusCode, response.body).toBe(200);
    expect(await individualCount()).toBe(before + 2);
    const [nina, omar] = response.json().ubos;
    expect(nina).toMatchObject({
      name: 'Nina New',
      holder_type: 'JOINT',
      role_type: 'DIRECTOR',
      role_types: ['DIRECTOR', 'SHAREHOLDER'],
      percentage_held: 25.5,
      kyc_status: 'NOT_STARTED',
      kyc_required: true,
    });
    expect(omar).toMatchObject({ name: 'Omar Optional', percentage_held: 0, kyc_status: 'NOT_REQUIRED', kyc_required: false });
    const rows = await sql(ctx, 'SELECT kind, added_via, kyc_status FROM customers WHERE id = ANY($1::uuid[]) ORDER BY name', [
      [nina.linked_customer.id, omar.linked_customer.id],
    ]);
    expect(rows).toEqual([
      { kind: 'individual', added_via: 'INTEGRATION', kyc_status: 'NOT_STARTED' },
      { kind: 'individual', added_via: 'INTEGRATION', kyc_status: 'NOT_REQUIRED' },
    ]);
  });

  it('when the TRUSTEE role is sent for a trust, it is accepted', async () => {
    const trust = await createEntity(ctx, org, { type: 'TRUST' });
    const response = await addOwners(trust.id, [{ fullName: 'Tara Trustee', email: 'tara@example.com', roleTypes: ['TRUSTEE'] }]);
    expect(response.statusCode, response.body).toBe(200);
    expect(response.json().ubos[0]).toMatchObject({ role_type: 'TRUSTEE', role_types: ['TRUSTEE'] });
  });

  it('when the same person is added again, it updates their holding instead of adding a second owner', async () => {
    const entity = await createEntity(ctx, org);
    const first = (
      await addOwners(entity.id, [{ fullName: 'Reo Repeat', email: 'reo@example.com', roleTypes: ['SHAREHOLDER'], percentageHeld: 10 }])
    ).json().ubos[0];
    const response = await addOwners(entity.id, [
      { fullName: 'Reo Repeat', email: 'reo@example.com', roleTypes: ['DIRECTOR'], percentageHeld: 60, holderType: 'NOMINEE' },
    ]);
    const ubos = response.json().ubos;
    expect(ubos).toHaveLength(1);
    expect(ubos[0]).toMatchObject({
      id: first.id,
      role_types: ['DIRECTOR'],
      percentage_held: 60,
      holder_type: 'NOMINEE',
      created_at: first.created_at,
    });
  });

  it('when owners are added, the response is the full list, including earlier owners', async () => {
    const entity = await createEntity(ctx, org);
    await addOwners(entity.id, [{ fullName: 'Ada Early', email: 'ada@example.com', roleTypes: ['MEMBER'] }]);
    const response = await addOwners(entity.id, [{ fullName: 'Ben Later', email: 'ben@example.com', roleTypes: ['PARTNER'] }]);
    expect(response.json().ubos.map((owner: { name: string }) => owner.name)).toEqual(['Ada Early', 'Ben Later']);
  });

  it.each([
    ['no owners', [], 'owners'],
    ['no roles', [{ fullName: 'A B', email: 'ab@example.com', roleTypes: [] }], 'owners[0].roleTypes'],
    ['an unknown role', [{ fullName: 'A B', email: 'ab@example.com', roleTypes: ['CEO'] }], 'owners[0].roleTypes[0]'],
    [
      'percentage above 100',
      [{ fullName: 'A B', email: 'ab@example.com', roleTypes: ['MEMBER'], percentageHeld: 100.5 }],
      'owners[0].percentageHeld',
    ],
    [
      'a negative percentage',
      [{ fullName: 'A B', email: 'ab@example.com', roleTypes: ['MEMBER'], percentageHeld: -1 }],
      'owners[0].percentageHeld',
    ],
    ['a missing email', [{ fullName: 'A B', roleTypes: ['MEMBER'] }], 'owners[0].email'],
    [
      'an unknown holder type',
      [{ fullName: 'A B', email: 'ab@example.com', roleTypes: ['MEMBER'], holderType: 'COMPANY' }],
      'owners[0].holderType',
    ],
    ['an unknown property', [{ fullName: 'A B', email: 'ab@example.com', roleTypes: ['MEMBER'], linkToken: 'x' }], 'owners[0].linkToken'],
  ])('when the body has %s, it answers 422 naming the field and adds nothing', async (_label, owners, field) => {
    const entity = await createEntity(ctx, org);
    expectValidation(await addOwners(entity.id, owners as unknown[]), field);
    expect((await listOwners(entity.id)).json().ubos).toEqual([]);
  });

  it('when more than 50 owners are sent, it answers 422 on owners', async () => {
    const entity = await createEntity(ctx, org);
    const owners = Array.from({ length: 51 }, (_, index) => ({
      fullName: `Bulk ${index}`,
      email: `bulk${index}@example.com`,
      roleTypes: ['MEMBER'],
    }));
    expectValidation(await addOwners(entity.id, owners), 'owners');
  });

  it('when owners are added, nothing is emailed, armed or charged', async () => {
    const fresh = await ctx.createOrg({ credits: 7 });
    const ledger = async () =>
      (await sql<{ count: number }>(ctx, 'SELECT count(*)::int AS count FROM credit_ledger WHERE org_id = $1', [fresh.id]))[0]!.count;
    const ledgerBefore = await ledger();
    const entity = await createEntity(ctx, fresh);
    const response = await addOwners(
      entity.id,
      [{ fullName: 'Quiet Owner', email: 'quiet.owner@example.com', roleTypes: ['SHAREHOLDER'] }],
      fresh.key,
    );
    expect(response.statusCode).toBe(200);
    expect(await sql(ctx, 'SELECT id FROM emails WHERE org_id = $1', [fresh.id])).toEqual([]);
    expect(await sql(ctx, 'SELECT id FROM verifications WHERE org_id = $1', [fresh.id])).toEqual([]);
    expect(await ledger()).toBe(ledgerBefore);
    expect((await sql(ctx, 'SELECT credits FROM organisations WHERE id = $1', [fresh.id]))[0]!.credits).toBe(7);
  });

  it('when owners are added, each save is audited with the key as actor', async () => {
    const entity = await createEntity(ctx, org);
    const [owner] = (
      await addOwners(entity.id, [{ fullName: 'Audit Owner', email: 'audit.owner@example.com', roleTypes: ['MEMBER'] }])
    ).json().ubos;
    const rows = await sql(ctx, 'SELECT action, actor_id, subject_type FROM audit_log WHERE org_id = $1 AND subject_id = $2', [
      org.id,
      owner.id,
    ]);
    expect(rows).toEqual([{ action: 'entity.beneficial_owner_saved', actor_id: org.keyId, subject_type: 'beneficial_owner' }]);
  });

  it('when an owner’s holding is updated, the audit row keeps the previous holding as before', async () => {
    const entity = await createEntity(ctx, org);
    const owner = { fullName: 'Before Owner', email: 'before.owner@example.com', roleTypes: ['MEMBER'] };
    const [saved] = (await addOwners(entity.id, [{ ...owner, percentageHeld: 5 }])).json().ubos;
    await addOwners(entity.id, [{ ...owner, percentageHeld: 15 }]);
    const rows = await sql<{ before: any; after: any }>(
      ctx,
      'SELECT before, after FROM audit_log WHERE org_id = $1 AND subject_id = $2 ORDER BY created_at, id',
      [org.id, saved.id],
    );
    expect(rows).toHaveLength(2);
    expect(rows[0]!.before).toBeNull();
    expect(rows[1]!.before).toMatchObject({ percentageHeld: 5 });
    expect(rows[1]!.after).toMatchObject({ percentageHeld: 15 });
  });

  it('when the entity belongs to another organisation or is an individual, it answers 404 and adds nothing', async () => {
    const other = await ctx.createOrg();
    const foreign = await createEntity(ctx, other);
    const owner = { fullName: 'Nobody', email: 'nobody@example.com', roleTypes: ['MEMBER'] };
    expect((await addOwners(foreign.id, [owner])).statusCode).toBe(404);
    expect(await sql(ctx, 'SELECT id FROM beneficial_owners WHERE entity_id = $1', [foreign.id])).toEqual([]);
    const person = await createIndividual(ctx, org);
    expect((await addOwners(person.id, [owner])).statusCode).toBe(404);
  });
});

describe('GET /entities/{id}/ubos', () => {
  it('when owners exist, it returns {ubos} whose items carry exactly the spec’s fields and no link token', async () => {
    const entity = await createEntity(ctx, org, { externalId: 'ubo-shape' });
    await addOwners(entity.id, [
      { fullName: 'Shape Owner', email: 'shape@example.com', roleTypes: ['BENEFICIARY', 'SETTLOR'], percentageHeld: 12.5 },
    ]);
    const response = await listOwners('ubo-shape');
    expect(response.statusCode).toBe(200);
    const body = response.json();
    expect(Object.keys(body)).toEqual(['ubos']);
    expect(body.ubos).toHaveLength(1);
    const [owner] = body.ubos;
    expect(Object.keys(owner).sort()).toEqual(UBO_KEYS);
    expect(Object.keys(owner.linked_customer).sort()).toEqual(['external_id', 'id']);
    expect(response.body).not.toMatch(/token/i);
    expect(owner).toMatchObject({ role_type: 'BENEFICIARY', role_types: ['BENEFICIARY', 'SETTLOR'], percentage_held: 12.5 });
    expect(new Date(owner.created_at).toISOString()).toBe(owner.created_at);
  });

  it('when an entity has no owners, it returns an empty ubos array', async () => {
    const entity = await createEntity(ctx, org);
    expect((await listOwners(entity.id)).json()).toEqual({ ubos: [] });
  });

  it('when owners exist, the entity DTO does not embed them', async () => {
    const entity = await createEntity(ctx, org);
    await addOwners(entity.id, [{ fullName: 'Hidden Owner', email: 'hidden@example.com', roleTypes: ['MEMBER'] }]);
    const fetched = (await ctx.request('GET', `/v1/entities/${entity.id}`, { key: org.key })).json();
    expect(JSON.stringify(fetched)).not.toContain('Hidden Owner');
  });

  it('when the entity belongs to another organisation, it answers 404', async () => {
    const other = await ctx.createOrg();
    const foreign = await createEntity(ctx, other);
    await addOwners(foreign.id, [{ fullName: 'Foreign Owner', email: 'foreign@example.com', roleTypes: ['MEMBER'] }], other.key);
    const response = await listOwners(foreign.id);
    expect(response.statusCode).toBe(404);
    expect(response.json().error.code).toBe('not_found');
  });

  it('when a key holds only customers:read, it can list owners but not add them', async () => {
    const entity = await createEntity(ctx, org);
    const readOnly = await ctx.createKey(org.id, { scopes: ['customers:read'] });
    expect((await listOwners(entity.id, readOnly.key)).statusCode).toBe(200);
    expect(
      (await addOwners(entity.id, [{ fullName: 'X Y', email: 'xy@example.com', roleTypes: ['MEMBER'] }], readOnly.key)).statusCode,
    ).toBe(403);
  });
});

describe('beneficial owners under concurrency', () => {
  it('when requests for different entities add the same new people in opposite orders, none deadlocks: each succeeds, at most after the retries record_locked asks for', async () => {
    const pairs = await Promise.all(
      Array.from({ length: 8 }, async (_, index) => {
        const people = Array.from({ length: 6 }, (_, person) => ({
          fullName: `Crossed ${index} ${person}`,
          email: `crossed.${index}.${person}@example.com`,
          roleTypes: ['SHAREHOLDER'],
        }));
        const [first, second] = [await createEntity(ctx, org), await createEntity(ctx, org)];
        return { first, second, people };
      }),
    );
    const before = await individualCount();
    // The second request of a pair waits for the first's new people to commit; on a loaded machine
    // that can outlast lock_timeout (3 s), and the API then answers 409 record_locked (or, past the
    // pool's wait, 503 database_unavailable) with Retry-After, which a client follows. A deadlock
    // (people taken in request order) would be a 500.
    const refused: string[] = [];
    const addRetryingLocked = async (ref: string, people: unknown[]) => {
      for (let attempt = 1; ; attempt += 1) {
        const response = await addOwners(ref, people);
        const code = response.statusCode >= 400 ? (response.json().error?.code as string | undefined) : undefined;
        // The two answers the API asks a client to retry after Retry-After; anything else is final.
        if ((code !== 'record_locked' && code !== 'database_unavailable') || attempt === 5) return response;
        refused.push(response.body);
        await new Promise((resolve) => setTimeout(resolve, Number(response.headers['retry-after']) * 1000));
      }
    };
    const responses = await Promise.all(
      pairs.flatMap(({ first, second, people }) => [
        addRetryingLocked(first.id, people),
        addRetryingLocked(second.id, [...people].reverse()),
      ]),
    );
    for (const response of responses) expect(response.statusCode, response.body).toBe(200);
    expect(await individualCount()).toBe(before + 8 * 6);
    // Most rounds need no retry at all; a retry is the documented answer to a long wait, never a failure.
    expect(refused.length).toBeLessThan(responses.length);
  });

  it('when 20 requests add the same new owner to one entity at once, one individual and one owner result', async () => {
    const entity = await createEntity(ctx, org);
    const before = await individualCount();
    const owner = { fullName: 'Racing Owner', email: 'racing.owner@example.com', roleTypes: ['DIRECTOR'] };
    const responses = await Promise.all(Array.from({ length: 20 }, () => addOwners(entity.id, [owner])));
    for (const response of responses) expect(response.statusCode, response.body).toBe(200);
    expect(await individualCount()).toBe(before + 1);
    expect((await listOwners(entity.id)).json().ubos).toHaveLength(1);
  });
});
