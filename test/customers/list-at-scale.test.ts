import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';

/**
 * Lists at a million records (docs/decisions.md): an updated_since page is read in three parts
 * (created after updated_since; created in the second up to it; changed more than a second after
 * creation), and counts come from counters kept by triggers. These tests pin the rows each part must
 * find and the counts the counters must give; the scale itself is measured in bench/lists.bench.ts.
 */
let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

const SINCE = '2026-03-01T00:00:00.000Z';
const at = (offsetMs: number) => new Date(Date.parse(SINCE) + offsetMs).toISOString();

/** Rows with exact creation and change times, written as a bulk import would (no stamping triggers), then counted as migration 0011 counts. */
async function seedRows(
  orgId: string,
  rows: Array<{ name: string; created: string; updated: string; kycStatus?: string; amlStatus?: string }>,
) {
  const client = await ctx.database.pool.connect();
  try {
    await client.query('BEGIN');
    await client.query('SET LOCAL session_replication_role = replica');
    for (const row of rows) {
      await client.query(
        `INSERT INTO customers (org_id, kind, type, name, kyc_status, aml_status, added_via, created_at, updated_at)
         VALUES ($1, 'individual', 'INDIVIDUAL', $2, $3, $4, 'BULK_IMPORT', $5, $6)`,
        [orgId, row.name, row.kycStatus ?? 'NOT_REQUIRED', row.amlStatus ?? 'NOT_SCREENED', row.created, row.updated],
      );
    }
    await recount(client, orgId);
    await client.query('COMMIT');
  } finally {
    client.release();
  }
}

async function recount(client: { query: (text: string, values: unknown[]) => Promise<unknown> }, orgId: string) {
  await client.query('DELETE FROM customer_counts WHERE org_id = $1', [orgId]);
  await client.query(
    `INSERT INTO customer_counts (org_id, kind, type, kyc_status, aml_status, slot, records)
     SELECT org_id, kind, type, kyc_status, aml_status, 0, count(*) FROM customers WHERE org_id = $1 GROUP BY 1, 2, 3, 4, 5`,
    [orgId],
  );
}

async function walk(org: TestOrg, query: Record<string, string>, path = '/v1/customers'): Promise<string[]> {
  const ids: string[] = [];
  let cursor: string | undefined;
  for (let pages = 0; pages < 1000; pages++) {
    const response = await ctx.request('GET', path, { key: org.key, query: { ...query, ...(cursor ? { cursor } : {}) } });
    expect(response.statusCode, response.body).toBe(200);
    const page = response.json();
    ids.push(...page.data.map((row: { id: string }) => row.id));
    if (!page.has_more) return ids;
    cursor = page.next_cursor;
  }
  throw new Error('the walk did not end');
}

/** The ids (and names) of the rows matching `where`, in (created_at, id) order, straight from the table. */
async function expected(orgId: string, where: string, params: unknown[] = [], column: 'id' | 'name' = 'id'): Promise<string[]> {
  const { rows } = await ctx.database.pool.query(
    `SELECT ${column} AS value FROM customers WHERE org_id = $1 AND kind = 'individual' AND ${where} ORDER BY created_at, id`,
    [orgId, ...params],
  );
  return rows.map((row) => row.value as string);
}

describe('GET /customers?updated_since: every part of the changed set', () => {
  let org: TestOrg;
  beforeAll(async () => {
    org = await ctx.createOrg();
    await seedRows(org.id, [
      // Created long before, changed long after: only the "late" indexes hold it.
      { name: 'late, changed after', created: at(-86_400_000), updated: at(3_600_000) },
      { name: 'late, changed before', created: at(-86_400_000), updated: at(-3_600_000) },
      { name: 'late, changed exactly at', created: at(-50_000), updated: at(0) },
      // Created in the second up to updated_since and changed less than a second later, after it.
      { name: 'just before, changed after', created: at(-700), updated: at(200) },
      { name: 'at, changed after', created: at(0), updated: at(1) },
      { name: 'just before, changed before', created: at(-700), updated: at(-100) },
      // Created more than a second before, changed within its first second: before updated_since.
      { name: 'early, changed at once', created: at(-5_000), updated: at(-4_500) },
      // Created after updated_since: changed after it.
      { name: 'after, never changed', created: at(10), updated: at(10) },
      { name: 'after, changed late', created: at(20), updated: at(86_400_000) },
      // Ties on created_at are ordered by id, across parts.
      ...Array.from({ length: 4 }, (_, index) => ({
        name: `tie ${index}`,
        created: at(-1_500),
        updated: at(index % 2 === 0 ? 5_000 : -1_000),
      })),
      ...Array.from({ length: 4 }, (_, index) => ({ name: `tie after ${index}`, created: at(30), updated: at(30) })),
      // Screened ones, for the filters combined with updated_since.
      { name: 'late review', created: at(-86_400_000), updated: at(60_000), amlStatus: 'NEEDS_REVIEW' },
      { name: 'window review', created: at(-300), updated: at(300), amlStatus: 'NEEDS_REVIEW', kycStatus: 'FAILED' },
      { name: 'after review', created: at(40), updated: at(40), amlStatus: 'NEEDS_REVIEW' },
      { name: 'early review', created: at(-9_000), updated: at(-8_500), amlStatus: 'NEEDS_REVIEW' },
    ]);
  });

  it('when rows were created after updated_since, in the second up to it, or long before and changed after it, a walk returns exactly those changed after it, in (created_at, id) order, at every page size', async () => {
    const want = await expected(org.id, 'updated_at > $2', [SINCE]);
    const names = await expected(org.id, 'updated_at > $2', [SINCE], 'name');
    expect(names).toEqual(
      expect.arrayContaining([
        'late, changed after',
        'just before, changed after',
        'at, changed after',
        'after, never changed',
        'after, changed late',
        'late review',
        'window review',
      ]),
    );
    expect(names).not.toContain('late, changed exactly at');
    expect(names).not.toContain('just before, changed before');
    for (const limit of ['1', '2', '3', '7', '100']) {
      expect(await walk(org, { updated_since: SINCE, limit }), `limit ${limit}`).toEqual(want);
    }
    expect(await walk(org, { updated_since: '0001-01-01T00:00:00.500Z', limit: '3' })).toEqual(await expected(org.id, 'TRUE'));
  });

  it('when updated_since is combined with status or aml_status, each part keeps the filter', async () => {
    for (const [query, where] of [
      [{ aml_status: 'NEEDS_REVIEW' }, `aml_status = 'NEEDS_REVIEW'`],
      [{ status: 'FAILED' }, `kyc_status = 'FAILED'`],
      [{ status: 'NOT_REQUIRED', aml_status: 'NOT_SCREENED' }, `kyc_status = 'NOT_REQUIRED' AND aml_status = 'NOT_SCREENED'`],
    ] as const) {
      const want = await expected(org.id, `updated_at > $2 AND ${where}`, [SINCE]);
      expect(want.length).toBeGreaterThan(0);
      for (const limit of ['1', '2', '100']) expect(await walk(org, { ...query, updated_since: SINCE, limit })).toEqual(want);
    }
  });

  it('when include=total_count comes with updated_since, it counts exactly the rows each part holds', async () => {
    const cases: Array<[Record<string, string>, string]> = [
      [{}, 'TRUE'],
      [{ aml_status: 'NEEDS_REVIEW' }, `aml_status = 'NEEDS_REVIEW'`],
      [{ status: 'FAILED' }, `kyc_status = 'FAILED'`],
    ];
    // The first second of year 1 leaves no second before it: read and counted without the parts.
    for (const since of [
      SINCE,
      at(-1_000),
      at(-2_000),
      at(25),
      '2020-01-01T00:00:00.000Z',
      '2030-01-01T00:00:00.000Z',
      '0001-01-01T00:00:00.500Z',
    ]) {
      for (const [query, where] of cases) {
        const want = (await expected(org.id, `updated_at > $2 AND ${where}`, [since])).length;
        const response = await ctx.request('GET', '/v1/customers', {
          key: org.key,
          query: { ...query, updated_since: since, include: 'total_count', limit: '1' },
        });
        expect(response.json().total_count, `${since} ${JSON.stringify(query)}`).toBe(want);
      }
    }
  });
});

describe('GET /customers?include=total_count: counters kept in each change’s transaction', () => {
  let org: TestOrg;
  const count = async (query: Record<string, string> = {}, path = '/v1/customers') =>
    (await ctx.request('GET', path, { key: org.key, query: { ...query, include: 'total_count', limit: '1' } })).json()
      .total_count as number;
  const truth = async (where: string, kind = 'individual') =>
    (await ctx.database.pool.query(`SELECT count(*)::int AS n FROM customers WHERE org_id = $1 AND kind = $2 AND ${where}`, [org.id, kind]))
      .rows[0].n as number;
  const combinations: Array<[Record<string, string>, string]> = [
    [{}, 'TRUE'],
    [{ status: 'NOT_REQUIRED' }, `kyc_status = 'NOT_REQUIRED'`],
    [{ status: 'VERIFIED' }, `kyc_status = 'VERIFIED'`],
    [{ aml_status: 'CLEAR' }, `aml_status = 'CLEAR'`],
    [{ status: 'VERIFIED', aml_status: 'CLEAR' }, `kyc_status = 'VERIFIED' AND aml_status = 'CLEAR'`],
    [{ status: 'PENDING', aml_status: 'NEEDS_REVIEW' }, `kyc_status = 'PENDING' AND aml_status = 'NEEDS_REVIEW'`],
  ];
  const expectCountsMatch = async () => {
    for (const [query, where] of combinations) expect(await count(query), JSON.stringify(query)).toBe(await truth(where));
    expect(await count({}, '/v1/entities')).toBe(await truth('TRUE', 'entity'));
    expect(await count({ type: 'TRUST' }, '/v1/entities')).toBe(await truth(`type = 'TRUST'`, 'entity'));
  };

  beforeAll(async () => {
    org = await ctx.createOrg();
  });

  it('when records are created, change status, change kind of status together, or are deleted, every filter combination counts exactly the matching rows', async () => {
    const pool = ctx.database.pool;
    for (let index = 0; index < 12; index++) {
      const response = await ctx.request('POST', '/v1/customers', {
        key: org.key,
        body: { fullName: `Counted ${index}`, email: `counted-${index}@example.com` },
      });
      expect(response.statusCode, response.body).toBe(201);
    }
    await pool.query(
      `INSERT INTO customers (org_id, kind, type, name, kyc_status, added_via) SELECT $1, 'entity', t, 'Counted entity ' || t, 'NOT_REQUIRED', 'INTEGRATION' FROM unnest(ARRAY['TRUST', 'COMPANY', 'SMSF']) AS t`,
      [org.id],
    );
    await expectCountsMatch();
    await pool.query(`UPDATE customers SET kyc_status = 'VERIFIED' WHERE org_id = $1 AND kind = 'individual' AND name LIKE 'Counted 1%'`, [
      org.id,
    ]);
    await pool.query(
      `UPDATE customers SET aml_status = 'CLEAR' WHERE org_id = $1 AND kind = 'individual' AND name IN ('Counted 1', 'Counted 2', 'Counted 3')`,
      [org.id],
    );
    await pool.query(`UPDATE customers SET kyc_status = 'PENDING', aml_status = 'NEEDS_REVIEW' WHERE org_id = $1 AND name = 'Counted 4'`, [
      org.id,
    ]);
    await pool.query(`UPDATE customers SET type = 'TRUST' WHERE org_id = $1 AND name = 'Counted entity SMSF'`, [org.id]);
    await pool.query(`UPDATE customers SET phone = '+61400000000' WHERE org_id = $1 AND name = 'Counted 5'`, [org.id]);
    await expectCountsMatch();
    await pool.query(`DELETE FROM customers WHERE org_id = $1 AND name IN ('Counted 2', 'Counted 4', 'Counted entity TRUST')`, [org.id]);
    await expectCountsMatch();
    expect(await count()).toBe(10);
  });

  it('when a change of status rolls back, its counters roll back with it', async () => {
    const before = await count({ status: 'FAILED' });
    const client = await ctx.database.pool.connect();
    try {
      await client.query('BEGIN');
      await client.query(`UPDATE customers SET kyc_status = 'FAILED' WHERE org_id = $1 AND kind = 'individual'`, [org.id]);
      await client.query('ROLLBACK');
    } finally {
      client.release();
    }
    expect(await count({ status: 'FAILED' })).toBe(before);
    await expectCountsMatch();
  });

  it('when another organisation’s records change, this organisation’s counts do not move', async () => {
    const before = await count();
    const other = await ctx.createOrg();
    await ctx.request('POST', '/v1/customers', { key: other.key, body: { fullName: 'Elsewhere', email: 'elsewhere@example.com' } });
    expect(await count()).toBe(before);
  });
});

describe('GET /customers?updated_since&include=total_count beyond the count probe', () => {
  it('when more than 1,000 rows (the count probe) lie on either or both sides of updated_since, it still counts exactly', async () => {
    const org = await ctx.createOrg();
    const client = await ctx.database.pool.connect();
    try {
      await client.query('BEGIN');
      await client.query('SET LOCAL session_replication_role = replica');
      // 5,000 rows created one a second, each changed a second later; every tenth changed again days later.
      await client.query(
        `INSERT INTO customers (org_id, kind, type, name, kyc_status, added_via, created_at, updated_at)
         SELECT $1, 'individual', 'INDIVIDUAL', 'Bulk ' || g, 'NOT_REQUIRED', 'BULK_IMPORT',
                timestamptz '2026-01-01T00:00:00Z' + g * interval '1 second',
                timestamptz '2026-01-01T00:00:00Z' + g * interval '1 second' + CASE WHEN g % 10 = 0 THEN interval '30 days' ELSE interval '1 second' END
           FROM generate_series(1, 5000) AS g`,
        [org.id],
      );
      await recount(client, org.id);
      await client.query('COMMIT');
    } finally {
      client.release();
    }
    await ctx.database.pool.query('ANALYZE customers');
    // 500 created up to it (the whole less those), 500 created after it (counted directly), then both sides over 1,000.
    for (const seconds of [500, 4_500, 2_500]) {
      const since = new Date(Date.parse('2026-01-01T00:00:00Z') + seconds * 1000 + 500).toISOString();
      const want = (
        await ctx.database.pool.query(`SELECT count(*)::int AS n FROM customers WHERE org_id = $1 AND updated_at > $2`, [org.id, since])
      ).rows[0].n;
      const response = await ctx.request('GET', '/v1/customers', {
        key: org.key,
        query: { updated_since: since, include: 'total_count', limit: '1' },
      });
      expect(response.json().total_count, since).toBe(want);
    }
  });
});
