import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';

let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

const DEFAULTS = {
  object: 'due_diligence_policy',
  review_interval_months: { LOW: 36, MEDIUM: 24, HIGH: 12 },
  edd_uses_high_interval: true,
  high_risk_jurisdictions: ['IRN', 'MMR', 'PRK'],
  overdue_after_days: 30,
  updated_at: null,
  redating: null,
};

const getPolicy = (org: TestOrg) => ctx.request('GET', '/v1/due-diligence-policy', { key: org.key });
const putPolicy = (org: TestOrg, body: unknown, headers: Record<string, string> = {}) =>
  ctx.request('PUT', '/v1/due-diligence-policy', { key: org.key, body, headers });

async function auditRows(orgId: string) {
  const { rows } = await ctx.database.pool.query<{ action: string; subject_type: string; before: unknown; after: unknown }>(
    `SELECT action, subject_type, before, after FROM audit_log WHERE org_id = $1 AND action = 'due_diligence_policy.updated' ORDER BY id`,
    [orgId],
  );
  return rows;
}

describe('GET and PUT /v1/due-diligence-policy', () => {
  it('when no policy was ever set, GET answers the defaults with updated_at null', async () => {
    const org = await ctx.createOrg();
    const response = await getPolicy(org);
    expect(response.statusCode, response.body).toBe(200);
    expect(response.json()).toEqual(DEFAULTS);
  });

  it('when a policy is PUT, GET answers it; codes are upper-cased, deduplicated and sorted; what the body leaves out takes its default', async () => {
    const org = await ctx.createOrg();
    const put = await putPolicy(org, {
      reviewIntervalMonths: { LOW: 48, HIGH: 6 },
      highRiskJurisdictions: ['syr', 'PRK', ' prk '],
      overdueAfterDays: 14,
    });
    expect(put.statusCode, put.body).toBe(200);
    const expected = {
      ...DEFAULTS,
      review_interval_months: { LOW: 48, MEDIUM: 24, HIGH: 6 },
      high_risk_jurisdictions: ['PRK', 'SYR'],
      overdue_after_days: 14,
      updated_at: expect.any(String),
      // An organisation without records has nothing to re-date.
      redating: expect.objectContaining({ scheduled_reviews: 0, records_total: 0 }),
    };
    expect(put.json()).toEqual(expected);
    expect((await getPolicy(org)).json()).toEqual(put.json());

    // A PUT replaces the whole policy: fields left out return to their defaults.
    const replaced = await putPolicy(org, { eddUsesHighInterval: false });
    expect(replaced.json()).toEqual({
      ...DEFAULTS,
      edd_uses_high_interval: false,
      updated_at: expect.any(String),
      redating: expect.objectContaining({ records_total: 0 }),
    });
  });

  it('when one organisation sets its policy, another still gets the defaults', async () => {
    const [mine, theirs] = await Promise.all([ctx.createOrg(), ctx.createOrg()]);
    expect((await putPolicy(mine, { reviewIntervalMonths: { HIGH: 3 } })).statusCode).toBe(200);
    expect((await getPolicy(theirs)).json()).toEqual(DEFAULTS);
  });

  it.each([
    ['a higher rating waits longer than a lower one', { reviewIntervalMonths: { HIGH: 30, MEDIUM: 24 } }, 'reviewIntervalMonths'],
    ['an interval of 0 months', { reviewIntervalMonths: { LOW: 0 } }, 'reviewIntervalMonths.LOW'],
    ['an interval of more than 120 months', { reviewIntervalMonths: { LOW: 121 } }, 'reviewIntervalMonths.LOW'],
    ['a fractional interval', { reviewIntervalMonths: { MEDIUM: 18.5 } }, 'reviewIntervalMonths.MEDIUM'],
    ['an unknown rating', { reviewIntervalMonths: { EXTREME: 1 } }, 'reviewIntervalMonths.EXTREME'],
    ['a code that is no ISO 3166-1 alpha-3 country', { highRiskJurisdictions: ['XXX'] }, 'highRiskJurisdictions[0]'],
    ['an alpha-2 code', { highRiskJurisdictions: ['IR'] }, 'highRiskJurisdictions[0]'],
    ['overdue after 0 days', { overdueAfterDays: 0 }, 'overdueAfterDays'],
    ['a flag that is not a boolean', { eddUsesHighInterval: 'yes' }, 'eddUsesHighInterval'],
    ['an unknown field', { reviewIntervalMonthsHigh: 6 }, ''],
  ])('when the body has %s, it is refused with 422 naming the field, and the policy is unchanged', async (_case, body, field) => {
    const org = await ctx.createOrg();
    const response = await putPolicy(org, body);
    expect(response.statusCode, response.body).toBe(422);
    const error = response.json().error;
    expect(error.code).toBe('validation_failed');
    if (field) expect(Object.keys(error.details.issues)).toContain(field);
    expect((await getPolicy(org)).json()).toEqual(DEFAULTS);
    expect(await auditRows(org.id)).toEqual([]);
  });

  it('when a PUT succeeds, one audit row records the policy before and after, in its transaction', async () => {
    const org = await ctx.createOrg();
    await putPolicy(org, { reviewIntervalMonths: { HIGH: 6 } });
    await putPolicy(org, { reviewIntervalMonths: { HIGH: 3 } });
    const rows = await auditRows(org.id);
    expect(rows).toHaveLength(2);
    expect(rows[0]).toMatchObject({ subject_type: 'due_diligence_policy', before: DEFAULTS });
    expect((rows[0]!.after as typeof DEFAULTS).review_interval_months.HIGH).toBe(6);
    expect((rows[1]!.before as typeof DEFAULTS).review_interval_months.HIGH).toBe(6);
    expect((rows[1]!.after as typeof DEFAULTS).review_interval_months.HIGH).toBe(3);
  });

  it('when two first PUTs race, each audit row names what it really replaced: the defaults, then the other PUT', async () => {
    const org = await ctx.createOrg();
    const responses = await Promise.all([
      putPolicy(org, { reviewIntervalMonths: { HIGH: 6 } }),
      putPolicy(org, { reviewIntervalMonths: { HIGH: 3 } }),
    ]);
    expect(responses.map((response) => response.statusCode)).toEqual([200, 200]);
    const [first, second] = await auditRows(org.id);
    expect(first!.before).toEqual(DEFAULTS);
    expect(second!.before).toEqual(first!.after);
    expect((await getPolicy(org)).json()).toEqual(second!.after);
  });

  it('when a PUT is repeated with its Idempotency-Key, the stored answer is replayed and nothing is written again', async () => {
    const org = await ctx.createOrg();
    const headers = { 'idempotency-key': randomUUID() };
    const first = await putPolicy(org, { reviewIntervalMonths: { HIGH: 6 } }, headers);
    const again = await putPolicy(org, { reviewIntervalMonths: { HIGH: 6 } }, headers);
    expect(first.statusCode).toBe(200);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.body).toBe(first.body);
    expect(await auditRows(org.id)).toHaveLength(1);
  });

  it('when a key lacks policy:read or policy:write, GET or PUT is refused with 403 and nothing changes', async () => {
    const org = await ctx.createOrg();
    const reader = await ctx.createKey(org.id, { scopes: ['policy:read'] });
    const writer = await ctx.createKey(org.id, { scopes: ['policy:write'] });
    expect((await ctx.request('GET', '/v1/due-diligence-policy', { key: writer.key })).statusCode).toBe(403);
    const refused = await ctx.request('PUT', '/v1/due-diligence-policy', { key: reader.key, body: { overdueAfterDays: 10 } });
    expect(refused.statusCode).toBe(403);
    expect((await ctx.request('GET', '/v1/due-diligence-policy', { key: reader.key })).json()).toEqual(DEFAULTS);
    expect((await ctx.request('PUT', '/v1/due-diligence-policy', { key: writer.key, body: { overdueAfterDays: 10 } })).statusCode).toBe(
      200,
    );
  });
});
