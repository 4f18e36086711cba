import { Writable } from 'node:stream';
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp } from '../../src/app.js';
import { loggerOptions } from '../../src/shared/logging.js';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';

let ctx: TestContext;
let a: TestOrg;
let b: TestOrg;
const ofA: Record<string, string> = {};
const MISSING_UUID = '00000000-0000-4000-8000-000000000000';

/** Every request of B goes through an instance logging at debug level into `logOfB`. */
const logOfB: string[] = [];
let appOfB: FastifyInstance;

async function json(method: string, url: string, key: string, body?: unknown, headers?: Record<string, string>) {
  const response = await ctx.request(method, url, { key, body, headers }, key === b.key ? appOfB : ctx.app);
  return { status: response.statusCode, body: response.body };
}

beforeAll(async () => {
  ctx = await createTestContext();
  a = await ctx.createOrg({ credits: 100 });
  b = await ctx.createOrg({ credits: 100 });
  const stream = new Writable({
    write(chunk, _encoding, done) {
      logOfB.push(...String(chunk).split('\n').filter(Boolean));
      done();
    },
  });
  appOfB = await buildApp({ config: ctx.config, database: ctx.database, logger: { ...loggerOptions({ logLevel: 'debug' }), stream } });
  const person = JSON.parse(
    (await json('POST', '/v1/customers', a.key, { externalId: 'a-person', fullName: 'Alice Secret', email: 'alice@a.test' })).body,
  );
  const entity = JSON.parse(
    (
      await json('POST', '/v1/entities', a.key, {
        externalId: 'a-entity',
        type: 'COMPANY',
        name: 'Alpha Secret Pty Ltd',
        contact: { customerId: person.id },
      })
    ).body,
  );
  const owners = JSON.parse(
    (
      await json('POST', `/v1/entities/${entity.id}/ubos`, a.key, {
        owners: [{ fullName: 'Olive Secret', email: 'olive@a.test', roleTypes: ['SHAREHOLDER'] }],
      })
    ).body,
  );
  const templates = JSON.parse((await json('GET', '/v1/group-templates', a.key)).body);
  Object.assign(ofA, { person: person.id, entity: entity.id, owner: owners.ubos[0].id, template: templates.data[0].id });
});
afterAll(async () => {
  await appOfB?.close();
  await ctx?.close();
});

describe("organisation B with organisation A's identifiers", () => {
  const pathCases: Array<[string, (id: string) => string, unknown?]> = [
    ['GET', (id) => `/v1/customers/${id}`],
    ['PATCH', (id) => `/v1/customers/${id}`, { phone: '1' }],
    ['PUT', (id) => `/v1/customers/${id}/designated-services`, { service_codes: [] }],
    ['GET', (id) => `/v1/customers/${id}/aml`],
    ['POST', (id) => `/v1/customers/${id}/kyc`, {}],
    ['GET', (id) => `/v1/entities/${id}`],
    ['PATCH', (id) => `/v1/entities/${id}`, { address: 'x' }],
    ['GET', (id) => `/v1/entities/${id}/aml`],
    ['GET', (id) => `/v1/entities/${id}/ubos`],
    ['POST', (id) => `/v1/entities/${id}/ubos`, { owners: [{ fullName: 'X Y', email: 'x@y.test', roleTypes: ['DIRECTOR'] }] }],
    ['POST', (id) => `/v1/entities/${id}/kyb`, {}],
  ];

  for (const [method, path, body] of pathCases) {
    it(`when B calls ${method} ${path(':id')} with A's UUID or external_id, it gets a 404 byte-identical to a missing id's`, async () => {
      const isEntityRoute = path('x').startsWith('/v1/entities');
      const missing = await json(method, path(MISSING_UUID), b.key, body);
      expect(missing.status).toBe(404);
      for (const id of isEntityRoute ? [ofA.entity!, 'a-entity'] : [ofA.person!, 'a-person']) {
        const foreign = await json(method, path(id), b.key, body);
        expect(foreign).toEqual(missing);
      }
    });
  }

  it("when B sends A's owner id to send-link under A's entity, it gets the missing-id 404", async () => {
    const missing = await json('POST', `/v1/entities/${MISSING_UUID}/ubos/${MISSING_UUID}/send-link`, b.key, {});
    expect(await json('POST', `/v1/entities/${ofA.entity}/ubos/${ofA.owner}/send-link`, b.key, {})).toEqual(missing);
  });

  it("when B references A's individual as an entity contact, it is refused exactly like an unknown id", async () => {
    const unknown = await json('POST', '/v1/entities', b.key, {
      type: 'COMPANY',
      name: 'Beta Pty Ltd',
      contact: { customerId: MISSING_UUID },
    });
    const foreign = await json('POST', '/v1/entities', b.key, {
      type: 'COMPANY',
      name: 'Beta Pty Ltd',
      contact: { customerId: ofA.person },
    });
    expect(unknown.status).toBe(422);
    expect(foreign.body.replace(ofA.person!, MISSING_UUID)).toBe(unknown.body);
  });

  it("when B creates a group from A's template or with A's customers, it is refused exactly like unknown ids", async () => {
    const unknownTemplate = await json('POST', '/v1/groups', b.key, { name: 'Deal', templateId: MISSING_UUID });
    expect(unknownTemplate.status).toBe(404);
    expect(await json('POST', '/v1/groups', b.key, { name: 'Deal', templateId: ofA.template })).toEqual(unknownTemplate);
    const unknownParty = await json('POST', '/v1/groups', b.key, {
      name: 'Deal',
      parties: [{ roleLabel: 'Buyer', customerId: MISSING_UUID }],
    });
    const foreignParty = await json('POST', '/v1/groups', b.key, {
      name: 'Deal',
      parties: [{ roleLabel: 'Buyer', customerId: ofA.person }],
    });
    expect(unknownParty.status).toBe(422);
    expect(foreignParty.body.replace(ofA.person!, MISSING_UUID)).toBe(unknownParty.body);
    const byExternal = await json('POST', '/v1/groups', b.key, {
      name: 'Deal',
      parties: [{ roleLabel: 'Buyer', customerExternalId: 'a-person' }],
    });
    const byMissingExternal = await json('POST', '/v1/groups', b.key, {
      name: 'Deal',
      parties: [{ roleLabel: 'Buyer', customerExternalId: 'no-such-person' }],
    });
    expect(byExternal.body.replace('a-person', 'no-such-person')).toBe(byMissingExternal.body);
  });

  it("when B upserts with A's external ids, it creates its own records and never touches A's", async () => {
    const person = await json('POST', '/v1/customers', b.key, { externalId: 'a-person', fullName: 'Bob', email: 'bob@b.test' });
    expect(person.status).toBe(201);
    expect(JSON.parse(person.body).id).not.toBe(ofA.person);
    const entity = await json('POST', '/v1/entities', b.key, { externalId: 'a-entity', type: 'COMPANY', name: 'Alpha Secret Pty Ltd' });
    expect(entity.status).toBe(201);
    expect(JSON.parse(entity.body).id).not.toBe(ofA.entity);
    const aStill = await json('GET', '/v1/customers/a-person', a.key);
    expect(JSON.parse(aStill.body)).toMatchObject({ id: ofA.person, full_name: 'Alice Secret' });
  });

  it("when B walks lists with a cursor taken from A's walk, it sees only its own records", async () => {
    const aPage = JSON.parse((await json('GET', '/v1/customers?limit=1', a.key)).body);
    const cursor = aPage.next_cursor as string;
    expect(cursor).toBeTruthy();
    const bPage = await json('GET', `/v1/customers?limit=100&cursor=${encodeURIComponent(cursor)}`, b.key);
    expect(bPage.body).not.toContain('Secret');
    expect(bPage.body).not.toContain(ofA.person!);
  });

  it("when B reuses A's Idempotency-Key, it gets its own result, never A's replay", async () => {
    const headers = { 'idempotency-key': 'shared-key-1' };
    const first = await json('POST', '/v1/customers', a.key, { externalId: 'idem-a', fullName: 'Idem A', email: 'ia@a.test' }, headers);
    const second = await json('POST', '/v1/customers', b.key, { externalId: 'idem-a', fullName: 'Idem A', email: 'ia@a.test' }, headers);
    expect(first.status).toBe(201);
    expect(second.status).toBe(201);
    expect(JSON.parse(second.body).id).not.toBe(JSON.parse(first.body).id);
  });

  it("when B lists anything, nothing of A appears in B's responses or B's events", async () => {
    const bodies = await Promise.all(
      [
        '/v1/customers?limit=100&include=total_count',
        '/v1/entities?limit=100',
        '/v1/group-templates',
        '/v1/customers?external_id=a-person',
      ].map(async (url) => (await json('GET', url, b.key)).body),
    );
    for (const body of bodies) {
      for (const secret of ['Alice Secret', 'Olive Secret', ofA.person!, ofA.entity!, ofA.template!]) expect(body).not.toContain(secret);
    }
    const { rows } = await ctx.database.pool.query(`SELECT payload FROM outbox_events WHERE org_id = $1`, [b.id]);
    for (const row of rows) for (const secret of [ofA.person!, ofA.entity!, 'Alice Secret']) expect(row.payload).not.toContain(secret);
  });

  // Last in the file: by now B has sent every request above through the logging instance.
  it("when B's requests are logged, no line of B's log carries A's organisation, key, names or emails", () => {
    expect(logOfB.length).toBeGreaterThan(50);
    expect(logOfB.some((line) => line.includes(b.id))).toBe(true);
    for (const secret of [a.id, a.keyId, 'Alice Secret', 'Olive Secret', 'alice@a.test', 'olive@a.test']) {
      expect(logOfB.filter((line) => line.includes(secret))).toEqual([]);
    }
  });
});
