import { and, eq, sql } from 'drizzle-orm';
import type { Executor } from '../../db/client.js';
import { customerCounts, dueDiligencePolicies, type DueDiligencePolicyRow } from '../../db/schema.js';
import type { ReviewPolicy } from '../customers/review-model.js';
import { DEFAULT_POLICY } from './due-diligence.schemas.js';

type PolicyValues = Pick<
  DueDiligencePolicyRow,
  'reviewMonthsLow' | 'reviewMonthsMedium' | 'reviewMonthsHigh' | 'eddUsesHighInterval' | 'highRiskJurisdictions' | 'overdueAfterDays'
>;

/** The policy as the review model reads it: the organisation's row, or the defaults. */
export function reviewPolicyOf(row: DueDiligencePolicyRow | undefined): ReviewPolicy {
  if (!row) return DEFAULT_POLICY;
  return {
    reviewIntervalMonths: { LOW: row.reviewMonthsLow, MEDIUM: row.reviewMonthsMedium, HIGH: row.reviewMonthsHigh },
    eddUsesHighInterval: row.eddUsesHighInterval,
    highRiskJurisdictions: row.highRiskJurisdictions,
    overdueAfterDays: row.overdueAfterDays,
  };
}

export function createDueDiligenceRepository() {
  return {
    async findPolicy(orgId: string, tx: Executor): Promise<DueDiligencePolicyRow | undefined> {
      const [row] = await tx.select().from(dueDiligencePolicies).where(eq(dueDiligencePolicies.orgId, orgId));
      return row;
    },

    /** The review model's view of the organisation's policy (ReviewPolicyReader). */
    async reviewPolicy(orgId: string, tx: Executor): Promise<ReviewPolicy> {
      return reviewPolicyOf(await this.findPolicy(orgId, tx));
    },

    /**
     * Serialises the organisation's policy writes until `tx` ends. A row lock cannot: before the first
     * PUT there is no row, and two first PUTs would each audit the defaults as what they replaced.
     */
    async lockPolicy(orgId: string, tx: Executor): Promise<void> {
      await tx.execute(sql`SELECT pg_advisory_xact_lock(hashtextextended(${`due_diligence_policy:${orgId}`}, 0))`);
    },

    /**
     * Sets the organisation's policy, creating its row on the first call. With `redate`, a new
     * generation starts: its re-dating counts from zero over `recordsTotal` records.
     */
    async savePolicy(
      orgId: string,
      values: PolicyValues,
      redate: { recordsTotal: number; scheduled: number } | undefined,
      tx: Executor,
    ): Promise<DueDiligencePolicyRow> {
      const restart = redate
        ? { redateScheduled: redate.scheduled, redateTotal: redate.recordsTotal, redateChecked: 0, redateMoved: 0, redateFinishedAt: null }
        : {};
      const [row] = await tx
        .insert(dueDiligencePolicies)
        // A first PUT that moves nothing has nothing to re-date: its generation is done at once.
        .values({ orgId, ...values, ...(redate ? restart : { redateFinishedAt: sql`clock_timestamp()` }) })
        .onConflictDoUpdate({
          target: dueDiligencePolicies.orgId,
          set: {
            ...values,
            ...restart,
            ...(redate ? { generation: sql`${dueDiligencePolicies.generation} + 1` } : {}),
            updatedAt: sql`clock_timestamp()`,
          },
        })
        .returning();
      return row!;
    },

    /** The organisation's records, and those with a SCHEDULED review, from the counters (migration 0019). */
    async recordCounts(orgId: string, tx: Executor): Promise<{ records: number; scheduled: number }> {
      const [row] = await tx
        .select({
          records: sql<string>`coalesce(sum(${customerCounts.records}), 0)`,
          scheduled: sql<string>`coalesce(sum(${customerCounts.records}) FILTER (WHERE ${customerCounts.reviewStatus} = 'SCHEDULED'), 0)`,
        })
        .from(customerCounts)
        .where(eq(customerCounts.orgId, orgId));
      return { records: Number(row?.records ?? 0), scheduled: Number(row?.scheduled ?? 0) };
    },

    /** Adds a re-dating batch's progress, unless a newer PUT replaced the generation (then false: stop). */
    async recordRedateProgress(
      orgId: string,
      generation: number,
      progress: { checked: number; moved: number; finished: boolean },
      tx: Executor,
    ): Promise<boolean> {
      const rows = await tx
        .update(dueDiligencePolicies)
        .set({
          redateChecked: sql`${dueDiligencePolicies.redateChecked} + ${progress.checked}`,
          redateMoved: sql`${dueDiligencePolicies.redateMoved} + ${progress.moved}`,
          ...(progress.finished ? { redateFinishedAt: sql`clock_timestamp()` } : {}),
        })
        .where(and(eq(dueDiligencePolicies.orgId, orgId), eq(dueDiligencePolicies.generation, generation)))
        .returning({ orgId: dueDiligencePolicies.orgId });
      return rows.length > 0;
    },

    /** Restarts a generation's counts (a retried re-dating run starts over). */
    async restartRedate(orgId: string, generation: number, tx: Executor): Promise<DueDiligencePolicyRow | undefined> {
      const [row] = await tx
        .update(dueDiligencePolicies)
        .set({ redateChecked: 0, redateMoved: 0, redateFinishedAt: null })
        .where(and(eq(dueDiligencePolicies.orgId, orgId), eq(dueDiligencePolicies.generation, generation)))
        .returning();
      return row;
    },

    /**
     * The organisations with review work for the sweep at `now`: a SCHEDULED review whose date passed,
     * or a DUE one due for longer than the organisation's overdue_after_days. One index probe each
     * (customers_review_scheduled_idx, customers_review_pending_idx).
     */
    async organisationsWithReviewWork(now: Date, tx: Executor): Promise<Array<{ orgId: string; overdueAfterDays: number }>> {
      const at = now.toISOString();
      const { rows } = await tx.execute<{ org_id: string; overdue_after_days: number }>(sql`
        SELECT o.id AS org_id, coalesce(p.overdue_after_days, ${DEFAULT_POLICY.overdueAfterDays})::int AS overdue_after_days
          FROM organisations o
          LEFT JOIN due_diligence_policies p ON p.org_id = o.id
         WHERE EXISTS (SELECT 1 FROM customers c
                        WHERE c.org_id = o.id AND c.review_status = 'SCHEDULED' AND c.next_review_at <= ${at}::timestamptz)
            OR EXISTS (SELECT 1 FROM customers c
                        WHERE c.org_id = o.id AND c.review_status = 'DUE'
                          AND c.next_review_at <= ${at}::timestamptz - make_interval(days => coalesce(p.overdue_after_days, ${DEFAULT_POLICY.overdueAfterDays})))`);
      return rows.map((row) => ({ orgId: row.org_id, overdueAfterDays: Number(row.overdue_after_days) }));
    },
  };
}
export type DueDiligenceRepository = ReturnType<typeof createDueDiligenceRepository>;
