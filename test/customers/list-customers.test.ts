import { createHmac } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { createCustomer, insertEntity, issues, person } from './customers-fixtures.js';

let ctx: TestContext;
let org: TestOrg;
const ids: string[] = [];
beforeAll(async () => {
  ctx = await createTestContext();
  org = await ctx.createOrg();
  // 60 individuals (some owing due diligence, some screened), two entities and another org's customer.
  await ctx.database.pool.query(
    `INSERT INTO customers (org_id, kind, type, name, email, kyc_status, aml_status, added_via, external_id, created_at, updated_at)
     SELECT $1, 'individual', 'INDIVIDUAL', 'Listed ' || n, 'listed' || n || '@example.com',
            CASE WHEN n % 3 = 0 THEN 'NOT_STARTED' ELSE 'NOT_REQUIRED' END,
            CASE WHEN n % 4 = 0 THEN 'CLEAR' ELSE 'NOT_SCREENED' END,
            'INTEGRATION', 'list-' || n,
            timestamptz '2026-01-01T00:00:00Z' + n * interval '1 second',
            timestamptz '2026-01-01T00:00:00Z'
       FROM generate_series(1, 60) AS n`,
    [org.id],
  );
  const { rows } = await ctx.database.pool.query(`SELECT id FROM customers WHERE org_id = $1 ORDER BY created_at, id`, [org.id]);
  ids.push(...rows.map((row) => row.id as string));
  await insertEntity(ctx, org.id, 'list-entity-1');
  await insertEntity(ctx, org.id);
  const other = await ctx.createOrg();
  await createCustomer(ctx, other, person({ externalId: 'list-1' }));
});
afterAll(async () => ctx?.close());

const list = (query: Record<string, string> = {}) => ctx.request('GET', '/v1/customers', { key: org.key, query });

async function walk(query: Record<string, string>): Promise<string[]> {
  const seen: string[] = [];
  let cursor: string | undefined;
  for (;;) {
    const response = await list({ ...query, ...(cursor ? { cursor } : {}) });
    expect(response.statusCode, response.body).toBe(200);
    const page = response.json();
    seen.push(...page.data.map((row: { id: string }) => row.id));
    if (!page.has_more) {
      expect(page.next_cursor).toBeNull();
      return seen;
    }
    cursor = page.next_cursor;
  }
}

describe('GET /customers envelope and limit', () => {
  it('when no limit is sent, it answers a page of 50 with has_more, next_cursor and limit echoed, without total_count', async () => {
    const response = await list();
    expect(response.statusCode).toBe(200);
    const page = response.json();
    expect(page).toMatchObject({ object: 'list', has_more: true, limit: 50, next_cursor: expect.any(String) });
    expect(page.data).toHaveLength(50);
    expect(page).not.toHaveProperty('total_count');
    expect(page.data.map((row: { id: string }) => row.id)).toEqual(ids.slice(0, 50));
  });

  it('when limit is above 100, it is clamped to 100 and echoed', async () => {
    const page = (await list({ limit: '500' })).json();
    expect(page.limit).toBe(100);
    expect(page.data).toHaveLength(60);
    expect(page).toMatchObject({ has_more: false, next_cursor: null });
  });

  it('when limit is 0 or negative, it is clamped to 1 and echoed', async () => {
    for (const limit of ['0', '-5']) {
      const page = (await list({ limit })).json();
      expect(page.limit).toBe(1);
      expect(page.data).toHaveLength(1);
    }
  });

  it('when limit is not a number, it answers 422 on limit', async () => {
    const response = await list({ limit: 'abc' });
    expect(response.statusCode).toBe(422);
    expect(issues(response)).toHaveProperty('limit');
  });

  it('when nothing matches, data is an empty array and has_more false', async () => {
    const page = (await list({ external_id: 'no-such-id' })).json();
    expect(page).toEqual({ object: 'list', data: [], has_more: false, next_cursor: null, limit: 50 });
  });

  it('when entities and other organisations have records, they are excluded', async () => {
    const all = await walk({ limit: '100' });
    expect(all).toEqual(ids);
    expect((await list({ external_id: 'list-entity-1' })).json().data).toEqual([]);
  });
});

describe('GET /customers filters', () => {
  it('when status is given, only records with that kyc_status are listed', async () => {
    const page = (await list({ status: 'NOT_STARTED', limit: '100' })).json();
    expect(page.data).toHaveLength(20);
    expect(page.data.every((row: { kyc_status: string }) => row.kyc_status === 'NOT_STARTED')).toBe(true);
  });

  it('when aml_status is given, only records with that AML status are listed', async () => {
    const page = (await list({ aml_status: 'CLEAR', limit: '100' })).json();
    expect(page.data).toHaveLength(15);
    expect(page.data.every((row: { aml: { status: string } }) => row.aml.status === 'CLEAR')).toBe(true);
  });

  it('when updated_since is given, only records updated strictly after it are listed (any offset notation)', async () => {
    const { rows } = await ctx.database.pool.query('SELECT clock_timestamp() AS now');
    const cut: Date = rows[0].now;
    await new Promise((resolve) => setTimeout(resolve, 5));
    const touched = Array.from({ length: 10 }, (_, i) => `list-${51 + i}`);
    await ctx.database.pool.query(`UPDATE customers SET phone = 'touched' WHERE org_id = $1 AND external_id = ANY($2)`, [org.id, touched]);
    const page = (await list({ updated_since: cut.toISOString(), limit: '100' })).json();
    expect(page.data.map((row: { external_id: string }) => row.external_id)).toEqual(touched);
    const inSydney = new Date(cut.getTime() + 10 * 3_600_000).toISOString().replace('Z', '+10:00');
    expect((await list({ updated_since: inSydney, limit: '100' })).json().data).toHaveLength(10);
  });

  it('when external_id is given, it looks up the caller id in this organisation only', async () => {
    const page = (await list({ external_id: 'list-1' })).json();
    expect(page.data).toHaveLength(1);
    expect(page.data[0].id).toBe(ids[0]);
  });

  it('when a filter value is invalid, it answers 422 naming it', async () => {
    for (const [name, value] of [
      ['status', 'DONE'],
      ['aml_status', 'clear'],
      ['updated_since', 'yesterday'],
      ['include', 'everything'],
      ['sort', 'name'],
    ] as const) {
      const response = await list({ [name]: value });
      expect(response.statusCode).toBe(422);
      expect(issues(response)).toHaveProperty(name);
    }
  });

  it('when include=total_count is asked, it counts the whole filtered set, not the page', async () => {
    expect((await list({ include: 'total_count', limit: '5' })).json()).toMatchObject({ total_count: 60, limit: 5 });
    expect((await list({ include: 'total_count', limit: '5', status: 'NOT_STARTED' })).json().total_count).toBe(20);
    expect((await list({ include: 'total_count', aml_status: 'CLEAR', status: 'NOT_STARTED' })).json().total_count).toBe(5);
  });
});

describe('GET /customers cursor', () => {
  it('when next_cursor is followed with the same filters, the walk sees every filtered record once, in ascending order', async () => {
    const seen = await walk({ limit: '7', status: 'NOT_REQUIRED' });
    expect(seen).toHaveLength(40);
    expect(new Set(seen).size).toBe(40);
    expect(seen).toEqual(seen.slice().sort((a, b) => ids.indexOf(a) - ids.indexOf(b)));
  });

  it('when the page size changes mid-walk, the cursor still continues the walk', async () => {
    const first = (await list({ limit: '10' })).json();
    const second = (await list({ limit: '20', cursor: first.next_cursor })).json();
    expect(second.data.map((row: { id: string }) => row.id)).toEqual(ids.slice(10, 30));
  });

  it('when a cursor is used with other filters, it answers 422 on cursor', async () => {
    const first = (await list({ limit: '10' })).json();
    const response = await list({ cursor: first.next_cursor, status: 'NOT_STARTED' });
    expect(response.statusCode).toBe(422);
    expect(issues(response)).toHaveProperty('cursor');
  });

  it('when the cursor is garbage or tampered with, it answers 422 on cursor', async () => {
    const tampered = Buffer.from(JSON.stringify({ c: 'x', i: 'y', f: 'z' })).toString('base64url');
    const nullJson = Buffer.from('null').toString('base64url');
    for (const cursor of ['garbage!!', 'e30', tampered, nullJson, Buffer.from('[1]').toString('base64url')]) {
      const response = await list({ cursor });
      expect(response.statusCode).toBe(422);
      expect(issues(response)).toHaveProperty('cursor');
    }
  });

  it('when a cursor’s payload is edited (another id, a date in year 0000 or 294276), with its mac or without one, it answers 422 on cursor', async () => {
    const [payload, mac] = (await list({ limit: '10' })).json().next_cursor.split('.');
    const position = JSON.parse(Buffer.from(payload, 'base64url').toString('utf8'));
    const edits = [
      { i: ids[20] },
      { c: '0000-01-01T00:00:00.000Z' },
      { c: '+275760-09-13T00:00:00.000Z' },
      { c: '+294276-01-01T00:00:00.000Z' },
      { f: 'other' },
    ];
    for (const edit of edits) {
      const edited = Buffer.from(JSON.stringify({ ...position, ...edit })).toString('base64url');
      for (const cursor of [`${edited}.${mac}`, edited]) {
        const response = await list({ limit: '10', cursor });
        expect(response.statusCode, `${JSON.stringify(edit)} ${cursor}`).toBe(422);
        expect(issues(response).cursor).toEqual(['Not a cursor returned by this API; pass next_cursor back unchanged.']);
      }
    }
  });

  it('when a cursor’s mac is stripped, mangled or taken from another cursor, it answers 422 on cursor', async () => {
    const first = (await list({ limit: '10' })).json().next_cursor as string;
    const second = (await list({ limit: '10', cursor: first })).json().next_cursor as string;
    const [payload, mac] = first.split('.') as [string, string];
    const flipped = `${mac.slice(0, -1)}${mac.endsWith('A') ? 'B' : 'A'}`;
    // The payload alone is the format of cursors issued before they were signed.
    for (const cursor of [
      payload,
      `${payload}.`,
      `${payload}.${second.split('.')[1]}`,
      `${payload}.${flipped}`,
      `${payload}.${mac}A`,
      `${payload}.${mac}.${mac}`,
      `.${mac}`,
    ]) {
      const response = await list({ limit: '10', cursor });
      expect(response.statusCode, cursor).toBe(422);
      expect(issues(response)).toHaveProperty('cursor');
    }
  });

  it('when a cursor signed with the service key holds a date outside years 0001 to 9999, it answers 422 on cursor, not 500', async () => {
    const { rows } = await ctx.database.pool.query(`SELECT value FROM service_secrets WHERE name = 'list_cursor_hmac'`);
    const key = Buffer.from(rows[0].value, 'hex');
    const [payload] = (await list({ limit: '10' })).json().next_cursor.split('.');
    const position = JSON.parse(Buffer.from(payload, 'base64url').toString('utf8'));
    const sign = (fields: object) => {
      const body = Buffer.from(JSON.stringify({ ...position, ...fields })).toString('base64url');
      return `${body}.${createHmac('sha256', key).update(body).digest().subarray(0, 16).toString('base64url')}`;
    };
    // The signing is right: the same payload, signed here, continues the walk.
    expect((await list({ limit: '10', cursor: sign({}) })).json().data.map((row: { id: string }) => row.id)).toEqual(ids.slice(10, 20));
    for (const c of [
      '0000-01-01T00:00:00.000Z',
      '-000001-01-01T00:00:00.000Z',
      '+010000-01-01T00:00:00.000Z',
      '+275760-09-13T00:00:00.000Z',
    ]) {
      const response = await list({ limit: '10', cursor: sign({ c }) });
      expect(response.statusCode, c).toBe(422);
      expect(issues(response)).toHaveProperty('cursor');
    }
  });

  it('when a cursor issued by one instance is followed on another instance on the same database, the walk continues', async () => {
    const other = await ctx.buildInstance();
    const first = (await list({ limit: '10' })).json();
    const second = await ctx.request('GET', '/v1/customers', { key: org.key, query: { limit: '10', cursor: first.next_cursor } }, other);
    expect(second.statusCode, second.body).toBe(200);
    expect(second.json().data.map((row: { id: string }) => row.id)).toEqual(ids.slice(10, 20));
    const third = (await list({ limit: '10', cursor: second.json().next_cursor })).json();
    expect(third.data.map((row: { id: string }) => row.id)).toEqual(ids.slice(20, 30));
  });

  it('when the cursor comes from the last page boundary, the next page holds exactly the rest', async () => {
    const first = (await list({ limit: '55' })).json();
    const rest = (await list({ cursor: first.next_cursor })).json();
    expect(rest.data.map((row: { id: string }) => row.id)).toEqual(ids.slice(55));
    expect(rest).toMatchObject({ has_more: false, next_cursor: null });
  });
});
