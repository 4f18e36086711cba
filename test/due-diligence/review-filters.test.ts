import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { issues } from '../customers/customers-fixtures.js';

/*
 * The review work-queue filters of both lists (issue 45, item 7): review_status (a comma list),
 * review_due_before and edd_required, alone and with the other filters. The review columns are set
 * with SQL here: these tests are about the filters, not about how the model derives the columns.
 * Every expectation comes from the table itself (`expected`), so each walk is compared with the exact
 * set, in list order, at every page size.
 */

let ctx: TestContext;
/** ~50 individuals and 12 entities in every review state; another organisation alike. */
let org: TestOrg;
let other: TestOrg;
/** 48,000 individuals: enough rows dated before CUTOFF for a page to read them in list order first (customers.repository.ts, DUE_PROBE). */
let large: TestOrg;

/** The review_due_before the tests ask for most: some dates fall before it, one on it, others after. */
const CUTOFF = '2026-06-01T00:00:00.000Z';

type Row = {
  id: string;
  kind: 'individual' | 'entity';
  created: number;
  updated: number;
  kyc_status: string;
  aml_status: string;
  review_status: string;
  next_review_at: number | null;
  edd_required: boolean;
};

/** When seed() last set an organisation's review columns; some records changed after it. */
const reviewedAt = new Map<string, string>();

/** Individuals and entities, spread over the review states (some created in the same millisecond: ties go by id). */
async function seed(orgId: string) {
  const pool = ctx.database.pool;
  await pool.query(
    `INSERT INTO customers (org_id, kind, type, name, email, kyc_status, aml_status, added_via, external_id, created_at, updated_at)
     SELECT $1, 'individual', 'INDIVIDUAL', 'Reviewed ' || n, 'reviewed' || n || '@example.com',
            CASE WHEN n % 3 = 0 THEN 'NOT_STARTED' ELSE 'NOT_REQUIRED' END,
            CASE WHEN n % 5 = 0 THEN 'CLEAR' ELSE 'NOT_SCREENED' END,
            'INTEGRATION', 'review-' || n,
            timestamptz '2026-01-01T00:00:00Z' + (n / 3) * interval '1 second',
            timestamptz '2026-01-01T00:00:00Z' + (n / 3) * interval '1 second'
       FROM generate_series(1, 50) AS n`,
    [orgId],
  );
  await pool.query(
    `INSERT INTO customers (org_id, kind, type, name, kyc_status, aml_status, added_via, external_id, created_at, updated_at)
     SELECT $1, 'entity', CASE WHEN n % 2 = 0 THEN 'COMPANY' ELSE 'TRUST' END, 'Reviewed Entity ' || n, 'NOT_REQUIRED',
            CASE WHEN n % 4 = 0 THEN 'CLEAR' ELSE 'NOT_SCREENED' END, 'INTEGRATION', 'review-entity-' || n,
            timestamptz '2026-01-01T00:00:00Z' + (n / 2) * interval '1 second',
            timestamptz '2026-01-01T00:00:00Z' + (n / 2) * interval '1 second'
       FROM generate_series(1, 12) AS n`,
    [orgId],
  );
  // The review states, as the model and the sweep would leave them (and two oddities: a record not
  // scheduled yet dated, and one dated exactly at CUTOFF, which review_due_before excludes).
  await pool.query(
    `UPDATE customers AS c
        SET review_status = s.status, next_review_at = s.at, edd_required = s.edd
       FROM (SELECT id,
                    (ARRAY['NOT_SCHEDULED','SCHEDULED','DUE','OVERDUE','SCHEDULED','DUE'])[n % 6 + 1] AS status,
                    n % 4 = 0 AS edd,
                    CASE WHEN n % 6 = 0 AND n % 12 <> 6 THEN NULL
                         WHEN n = 20 THEN timestamptz '${CUTOFF}'
                         ELSE timestamptz '2026-01-01T00:00:00Z' + ((n * 37) % 300) * interval '1 day' + n * interval '1 millisecond' END AS at
               FROM (SELECT id, (row_number() OVER (ORDER BY created_at, id))::int AS n FROM customers WHERE org_id = $1) AS numbered) AS s
      WHERE c.org_id = $1 AND c.id = s.id`,
    [orgId],
  );
  const { rows } = await pool.query(`SELECT max(updated_at) AS at FROM customers WHERE org_id = $1`, [orgId]);
  // Some records change again afterwards: updated_since this time finds only them.
  await pool.query(`UPDATE customers SET phone = '0400000000' WHERE org_id = $1 AND external_id ~ '(3|7)$'`, [orgId]);
  reviewedAt.set(orgId, (rows[0].at as Date).toISOString());
}

async function rowsOf(orgId: string): Promise<Row[]> {
  const { rows } = await ctx.database.pool.query(
    `SELECT id, kind, created_at, updated_at, kyc_status, aml_status, review_status, next_review_at, edd_required
       FROM customers WHERE org_id = $1`,
    [orgId],
  );
  return rows.map((row) => ({
    ...row,
    created: (row.created_at as Date).getTime(),
    updated: (row.updated_at as Date).getTime(),
    next_review_at: row.next_review_at ? (row.next_review_at as Date).getTime() : null,
  }));
}

const snapshots = new Map<string, Row[]>();

/** The ids a list with `query` must answer, in list order (created_at, id), from the table itself. */
function expected(orgId: string, kind: Row['kind'], query: Record<string, string>): string[] {
  const statuses = query.review_status?.split(',').map((part) => part.trim());
  const before = query.review_due_before ? Date.parse(query.review_due_before) : undefined;
  const since = query.updated_since ? Date.parse(query.updated_since) : undefined;
  return snapshots
    .get(orgId)!
    .filter(
      (row) =>
        row.kind === kind &&
        (!statuses || statuses.includes(row.review_status)) &&
        (before === undefined || (row.next_review_at !== null && row.next_review_at < before)) &&
        (query.edd_required === undefined || row.edd_required === (query.edd_required === 'true')) &&
        (since === undefined || row.updated > since) &&
        (query.status === undefined || row.kyc_status === query.status) &&
        (query.aml_status === undefined || row.aml_status === query.aml_status),
    )
    .sort((a, b) => a.created - b.created || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0))
    .map((row) => row.id);
}

const pathOf = (kind: Row['kind']) => (kind === 'individual' ? '/v1/customers' : '/v1/entities');
const list = (owner: TestOrg, kind: Row['kind'], query: Record<string, string>) =>
  ctx.request('GET', pathOf(kind), { key: owner.key, query });

/** The pages of a walk (up to maxPages), with `include=total_count` on each (or the first only); each page's count must be the whole set's. */
async function walk(
  owner: TestOrg,
  kind: Row['kind'],
  query: Record<string, string>,
  limit: number,
  { maxPages = Infinity, countFirstOnly = false } = {},
) {
  const seen: string[] = [];
  const counts = new Set<number>();
  let cursor: string | undefined;
  for (let pages = 0; pages < maxPages; pages++) {
    const counted: Record<string, string> = !countFirstOnly || pages === 0 ? { include: 'total_count' } : {};
    const response = await list(owner, kind, { ...query, ...counted, limit: String(limit), ...(cursor ? { cursor } : {}) });
    expect(response.statusCode, response.body).toBe(200);
    const page = response.json();
    expect(page.data.length).toBeLessThanOrEqual(limit);
    seen.push(...page.data.map((record: { id: string }) => record.id));
    if (counted.include) counts.add(page.total_count);
    if (!page.has_more) {
      expect(page.next_cursor).toBeNull();
      break;
    }
    expect(page.data).toHaveLength(limit);
    cursor = page.next_cursor;
  }
  return { seen, counts: [...counts] };
}

const PAGE_SIZES = [1, 2, 3, 7, 50];

async function expectExactWalks(owner: TestOrg, kind: Row['kind'], query: Record<string, string>) {
  const ids = expected(owner.id, kind, query);
  for (const limit of PAGE_SIZES) {
    const { seen, counts } = await walk(owner, kind, query, limit);
    expect(seen, `${JSON.stringify(query)} limit ${limit}`).toEqual(ids);
    expect(counts, `${JSON.stringify(query)} limit ${limit}`).toEqual([ids.length]);
  }
  return ids;
}

beforeAll(async () => {
  ctx = await createTestContext();
  org = await ctx.createOrg();
  other = await ctx.createOrg();
  large = await ctx.createOrg();
  await seed(org.id);
  await seed(other.id);
  // The large organisation: 20,000 DUE records dated after CUTOFF first, then 28,000 records, three in
  // four DUE or OVERDUE before CUTOFF, the rest SCHEDULED on either side of it. Its first pages of
  // review_due_before find no match among the first rows in list order and read by date; the later
  // ones find full pages in list order; the last finds too few again.
  // In batches: each statement stays within the pool's statement timeout.
  for (let from = 1; from <= 48_000; from += 6_000) {
    await ctx.database.pool.query(
      `INSERT INTO customers (org_id, kind, type, name, kyc_status, aml_status, added_via, created_at, updated_at,
                            review_status, next_review_at, edd_required)
     SELECT $1, 'individual', 'INDIVIDUAL', 'Queued ' || n, 'NOT_REQUIRED', CASE WHEN n % 7 = 0 THEN 'CLEAR' ELSE 'NOT_SCREENED' END,
            'BULK_IMPORT', timestamptz '2025-01-01T00:00:00Z' + (n / 2) * interval '1 second', timestamptz '2025-01-01T00:00:00Z' + (n / 2) * interval '1 second',
            CASE WHEN n <= 20000 THEN 'DUE' WHEN n % 4 = 1 THEN 'SCHEDULED' WHEN n % 4 = 2 THEN 'OVERDUE' ELSE 'DUE' END,
            CASE WHEN n <= 20000 THEN timestamptz '${CUTOFF}' + interval '1 day'
                 WHEN n % 8 = 1 THEN timestamptz '${CUTOFF}' + n * interval '1 second'
                 ELSE timestamptz '${CUTOFF}' - n * interval '1 second' END,
            n % 9 = 0
       FROM generate_series($2::int, $2::int + 5999) AS n`,
      [large.id, from],
    );
  }
  // As autovacuum would: index-only reads need the visibility map.
  await ctx.database.pool.query('VACUUM ANALYZE customers');
  for (const owner of [org, other, large]) snapshots.set(owner.id, await rowsOf(owner.id));
}, 120_000);
afterAll(async () => ctx?.close());

describe('review_status', () => {
  it('when one status is asked, every page size walks exactly the records in that status, in list order, with the exact total_count', async () => {
    for (const status of ['NOT_SCHEDULED', 'SCHEDULED', 'DUE', 'OVERDUE']) {
      const ids = await expectExactWalks(org, 'individual', { review_status: status });
      expect(ids.length).toBeGreaterThan(0);
    }
  });

  it('when several statuses are asked, every page size walks exactly their union, in list order, with the exact total_count', async () => {
    for (const statuses of ['DUE,OVERDUE', 'NOT_SCHEDULED,OVERDUE', 'SCHEDULED,DUE,OVERDUE', 'NOT_SCHEDULED,SCHEDULED,DUE,OVERDUE']) {
      await expectExactWalks(org, 'individual', { review_status: statuses });
    }
  });

  it('when statuses repeat, are reordered or padded with spaces, it answers the same set, and a cursor of one spelling continues the other', async () => {
    const ids = expected(org.id, 'individual', { review_status: 'DUE,OVERDUE' });
    const first = (await list(org, 'individual', { review_status: 'OVERDUE, DUE,DUE', limit: '3' })).json();
    expect(first.data.map((record: { id: string }) => record.id)).toEqual(ids.slice(0, 3));
    const second = await list(org, 'individual', { review_status: 'DUE,OVERDUE', limit: '3', cursor: first.next_cursor });
    expect(second.statusCode, second.body).toBe(200);
    expect(second.json().data.map((record: { id: string }) => record.id)).toEqual(ids.slice(3, 6));
  });

  it('when combined with status, aml_status or updated_since, it answers exactly the records matching all of them', async () => {
    const since = new Date(reviewedAt.get(org.id)!);
    const changedSince = expected(org.id, 'individual', { updated_since: since.toISOString() }).length;
    expect(changedSince).toBeGreaterThan(0);
    expect(changedSince).toBeLessThan(expected(org.id, 'individual', {}).length);
    for (const query of [
      { review_status: 'DUE', aml_status: 'NOT_SCREENED' },
      { review_status: 'DUE,OVERDUE', status: 'NOT_REQUIRED' },
      { review_status: 'SCHEDULED,OVERDUE', aml_status: 'CLEAR', status: 'NOT_STARTED' },
      { review_status: 'DUE,OVERDUE', updated_since: since.toISOString() },
      { review_status: 'SCHEDULED', updated_since: since.toISOString() },
      { review_status: 'SCHEDULED,DUE', updated_since: '2000-01-01T00:00:00Z' },
    ] as Array<Record<string, string>>) {
      await expectExactWalks(org, 'individual', query);
    }
  });
});

describe('review_due_before', () => {
  it('when a time is given, every page size walks exactly the records dated strictly before it; records without a date never match', async () => {
    for (const before of [CUTOFF, '2026-03-01T12:00:00+10:00', '9999-12-31T23:59:59Z', '2000-01-01T00:00:00Z']) {
      await expectExactWalks(org, 'individual', { review_due_before: before });
    }
    const everything = expected(org.id, 'individual', { review_due_before: '9999-12-31T23:59:59Z' });
    const dated = snapshots.get(org.id)!.filter((row) => row.kind === 'individual' && row.next_review_at !== null);
    expect(everything).toHaveLength(dated.length);
    const onTheCutoff = snapshots.get(org.id)!.find((row) => row.next_review_at === Date.parse(CUTOFF))!;
    expect(expected(org.id, onTheCutoff.kind, { review_due_before: CUTOFF })).not.toContain(onTheCutoff.id);
    const justAfter = new Date(Date.parse(CUTOFF) + 1).toISOString();
    const { seen } = await walk(org, onTheCutoff.kind, { review_due_before: justAfter }, 50);
    expect(seen).toContain(onTheCutoff.id);
    expect(seen).toEqual(expected(org.id, onTheCutoff.kind, { review_due_before: justAfter }));
  });

  it('when combined with review_status, edd_required, status, aml_status or updated_since, it answers exactly the records matching all of them', async () => {
    for (const query of [
      { review_due_before: CUTOFF, review_status: 'DUE,OVERDUE' },
      { review_due_before: CUTOFF, review_status: 'SCHEDULED' },
      { review_due_before: CUTOFF, edd_required: 'true' },
      { review_due_before: CUTOFF, edd_required: 'false', aml_status: 'NOT_SCREENED' },
      { review_due_before: CUTOFF, status: 'NOT_STARTED' },
      { review_due_before: CUTOFF, updated_since: reviewedAt.get(org.id)! },
      { review_due_before: CUTOFF, review_status: 'NOT_SCHEDULED' },
    ] as Array<Record<string, string>>) {
      await expectExactWalks(org, 'individual', query);
    }
  });

  it('when more records are dated before it than a page reads by date, walks still answer exactly them, whether a page is found in list order or by date', async () => {
    for (const query of [
      { review_due_before: CUTOFF },
      { review_due_before: CUTOFF, review_status: 'DUE,OVERDUE' },
      { review_due_before: CUTOFF, aml_status: 'CLEAR' },
    ] as Array<Record<string, string>>) {
      const ids = expected(large.id, 'individual', query);
      {
        const limit = 100;
        const { seen, counts } = await walk(large, 'individual', query, limit, { countFirstOnly: true });
        expect(seen, `${JSON.stringify(query)} limit ${limit}`).toEqual(ids);
        expect(counts).toEqual([ids.length]);
      }
      // Small pages: the first 40 (those that read by date, and the first found in list order).
      for (const limit of [1, 2, 3, 7]) {
        const { seen } = await walk(large, 'individual', query, limit, { maxPages: 40, countFirstOnly: true });
        expect(seen, `${JSON.stringify(query)} limit ${limit}`).toEqual(ids.slice(0, seen.length));
        expect(seen.length).toBe(Math.min(ids.length, 40 * limit));
      }
    }
    expect(expected(large.id, 'individual', { review_due_before: CUTOFF }).length).toBeGreaterThan(20_000);
  }, 240_000);
});

describe('edd_required', () => {
  it('when true or false, every page size walks exactly the records that do (or do not) need enhanced due diligence', async () => {
    const required = await expectExactWalks(org, 'individual', { edd_required: 'true' });
    const notRequired = await expectExactWalks(org, 'individual', { edd_required: 'false' });
    expect(required.length + notRequired.length).toBe(expected(org.id, 'individual', {}).length);
  });

  it('when combined with review_status, status, aml_status or updated_since, it answers exactly the records matching all of them', async () => {
    for (const query of [
      { edd_required: 'true', review_status: 'DUE,OVERDUE' },
      { edd_required: 'false', review_status: 'SCHEDULED' },
      { edd_required: 'true', aml_status: 'NOT_SCREENED', status: 'NOT_REQUIRED' },
      { edd_required: 'true', updated_since: reviewedAt.get(org.id)! },
      { edd_required: 'false', review_status: 'NOT_SCHEDULED,DUE', updated_since: reviewedAt.get(org.id)! },
    ] as Array<Record<string, string>>) {
      await expectExactWalks(org, 'individual', query);
    }
  });
});

describe('the entities list', () => {
  it('when filtered by review_status, review_due_before, edd_required and type, it answers exactly the matching entities, never an individual', async () => {
    for (const query of [
      { review_status: 'DUE,OVERDUE' },
      { review_status: 'SCHEDULED' },
      { review_due_before: CUTOFF },
      { edd_required: 'true' },
      { edd_required: 'false', review_status: 'SCHEDULED,DUE' },
    ] as Array<Record<string, string>>) {
      const ids = await expectExactWalks(org, 'entity', query);
      const entities = new Set(
        snapshots
          .get(org.id)!
          .filter((row) => row.kind === 'entity')
          .map((row) => row.id),
      );
      expect(ids.every((id) => entities.has(id))).toBe(true);
    }
    const { seen } = await walk(org, 'entity', { review_status: 'SCHEDULED,DUE', type: 'COMPANY' }, 2);
    const companies = await ctx.database.pool.query(`SELECT id FROM customers WHERE org_id = $1 AND kind = 'entity' AND type = 'COMPANY'`, [
      org.id,
    ]);
    const companyIds = new Set(companies.rows.map((row) => row.id));
    expect(seen).toEqual(expected(org.id, 'entity', { review_status: 'SCHEDULED,DUE' }).filter((id) => companyIds.has(id)));
  });
});

describe('organisations', () => {
  it('when another organisation holds records in the same review states, a list never shows or counts them', async () => {
    const mine = new Set(snapshots.get(org.id)!.map((row) => row.id));
    for (const query of [{ review_status: 'DUE' }, { review_due_before: CUTOFF }, { edd_required: 'true' }] as Array<
      Record<string, string>
    >) {
      const page = (await list(org, 'individual', { ...query, include: 'total_count', limit: '100' })).json();
      expect(page.data.every((record: { id: string }) => mine.has(record.id))).toBe(true);
      expect(page.total_count).toBe(expected(org.id, 'individual', query).length);
    }
  });
});

describe('validation and cursors', () => {
  it('when a filter value is invalid, it answers 422 validation_failed naming the filter and the valid values', async () => {
    for (const [name, value, message] of [
      ['review_status', 'DONE', 'Unknown review status "DONE". Valid statuses: NOT_SCHEDULED, SCHEDULED, DUE, OVERDUE.'],
      ['review_status', 'DUE,due', 'Unknown review status "due". Valid statuses: NOT_SCHEDULED, SCHEDULED, DUE, OVERDUE.'],
      ['review_status', '', 'Unknown review status (empty). Valid statuses: NOT_SCHEDULED, SCHEDULED, DUE, OVERDUE.'],
      ['review_status', 'DUE,,OVERDUE', 'Unknown review status (empty). Valid statuses: NOT_SCHEDULED, SCHEDULED, DUE, OVERDUE.'],
      ['review_due_before', 'next month', undefined],
      ['review_due_before', '2026-06-01', undefined],
      ['review_due_before', '0000-01-01T00:00:00Z', undefined],
      ['edd_required', 'yes', 'Must be true or false.'],
      ['edd_required', 'TRUE', 'Must be true or false.'],
      ['edd_required', '1', 'Must be true or false.'],
    ] as const) {
      for (const kind of ['individual', 'entity'] as const) {
        const response = await list(org, kind, { [name]: value });
        expect(response.statusCode, `${name}=${value}`).toBe(422);
        expect(response.json().error.code).toBe('validation_failed');
        expect(issues(response)).toHaveProperty(name);
        if (message) expect(issues(response)[name]).toEqual([message]);
      }
    }
  });

  it('when a cursor from one set of review filters is sent with another, it answers 422 on cursor', async () => {
    const cursorOf = async (query: Record<string, string>) => {
      const page = (await list(org, 'individual', { ...query, limit: '1' })).json();
      expect(page.next_cursor).toEqual(expect.any(String));
      return page.next_cursor as string;
    };
    for (const [from, to] of [
      [{ review_status: 'DUE' }, { review_status: 'OVERDUE' }],
      [{ review_status: 'DUE' }, { review_status: 'DUE,OVERDUE' }],
      [{ review_status: 'DUE' }, {}],
      [{}, { review_status: 'DUE' }],
      [{ review_due_before: CUTOFF }, { review_due_before: '2026-06-01T00:00:00.001Z' }],
      [{ review_due_before: CUTOFF }, {}],
      [{ edd_required: 'true' }, { edd_required: 'false' }],
      [{ edd_required: 'false' }, {}],
      [{}, { edd_required: 'false' }],
      [{ review_status: 'DUE', edd_required: 'false' }, { review_status: 'DUE' }],
    ] as Array<[Record<string, string>, Record<string, string>]>) {
      const response = await list(org, 'individual', { ...to, cursor: await cursorOf(from) });
      expect(response.statusCode, `${JSON.stringify(from)} → ${JSON.stringify(to)}`).toBe(422);
      expect(issues(response)).toHaveProperty('cursor');
    }
    // The same instant written another way is the same walk.
    const cursor = await cursorOf({ review_due_before: CUTOFF });
    const same = await list(org, 'individual', { review_due_before: '2026-06-01T10:00:00+10:00', cursor });
    expect(same.statusCode, same.body).toBe(200);
  });
});
