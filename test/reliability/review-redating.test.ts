import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addMonths } from '../../src/modules/customers/review-model.js';
import { createTestContext, testServices, type TestContext } from '../helpers/harness.js';

/** Issue 45: a policy change re-dates a large book in batches, never holding a row past its batch. */
let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

describe('a policy change over 100,000 customers', () => {
  it('when the intervals change, every date moves and no row stays locked past its batch', async () => {
    const org = await ctx.createOrg();
    const verifiedAt = '2026-01-15T10:00:00.000Z';
    // In slices: one statement for all would outlast the pool's statement timeout on a busy machine.
    for (let slice = 0; slice < 20; slice += 1) {
      await ctx.database.pool.query(
        `INSERT INTO customers (org_id, kind, type, name, kyc_status, kyc_completed_at, added_via, review_status, next_review_at)
         SELECT $1, 'individual', 'INDIVIDUAL', 'Person ' || n, 'VERIFIED', $2::timestamptz, 'INTEGRATION', 'SCHEDULED', $2::timestamptz + interval '36 months'
           FROM generate_series($3::int * 5000 + 1, ($3::int + 1) * 5000) AS n`,
        [org.id, verifiedAt, slice],
      );
    }
    const put = await ctx.request('PUT', '/v1/due-diligence-policy', {
      key: org.key,
      body: { reviewIntervalMonths: { LOW: 12, MEDIUM: 12, HIGH: 6 } },
    });
    expect(put.json().redating).toMatchObject({ status: 'QUEUED', scheduled_reviews: 100_000, records_total: 100_000 });
    const { rows: ends } = await ctx.database.pool.query<{ first: string; last: string }>(
      `SELECT min(id::text) AS first, max(id::text) AS last FROM customers WHERE org_id = $1`,
      [org.id],
    );
    const probe = await ctx.database.pool.connect();
    const batches: number[] = [];
    try {
      await probe.query(`SET lock_timeout = '200ms'`);
      const { rows } = await ctx.database.pool.query<{ generation: number }>(
        `SELECT generation FROM due_diligence_policies WHERE org_id = $1`,
        [org.id],
      );
      const result = await testServices(ctx.database).reviewJobs.redate(org.id, rows[0]!.generation, async (progress) => {
        batches.push(progress.checked);
        if (batches.length % 40 !== 1) return;
        // Between batches, a writer takes the first record (re-dated already) and the last (still to come) at once.
        await probe.query('BEGIN');
        await probe.query(`SELECT 1 FROM customers WHERE org_id = $1 AND id = ANY ($2::uuid[]) FOR UPDATE`, [
          org.id,
          [ends[0]!.first, ends[0]!.last],
        ]);
        await probe.query('ROLLBACK');
      });
      expect(result).toEqual({ checked: 100_000, moved: 100_000 });
    } finally {
      probe.release();
    }
    expect(batches.length).toBe(201);
    expect(batches[0]).toBe(500);
    const { rows: dates } = await ctx.database.pool.query(
      `SELECT next_review_at, count(*)::int AS n FROM customers WHERE org_id = $1 GROUP BY 1`,
      [org.id],
    );
    expect(dates).toEqual([{ next_review_at: addMonths(new Date(verifiedAt), 12), n: 100_000 }]);
    const policy = (await ctx.request('GET', '/v1/due-diligence-policy', { key: org.key })).json();
    expect(policy.redating).toMatchObject({ status: 'DONE', records_checked: 100_000, reviews_moved: 100_000 });
    const { rows: audited } = await ctx.database.pool.query(
      `SELECT count(*)::int AS n FROM audit_log WHERE org_id = $1 AND action = 'customer.review_redated'`,
      [org.id],
    );
    expect(audited[0].n).toBe(100_000);
  });
});
