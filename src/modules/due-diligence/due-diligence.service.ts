import type { DataAccess } from '../../db/client.js';
import type { DueDiligencePolicyRow } from '../../db/schema.js';
import type { AuditWriter } from '../../shared/audit-writer.js';
import { QUEUES, type JobQueue } from '../../shared/job-runner.js';
import type { RequestContext } from '../../shared/request-context.js';
import type { DueDiligenceRepository } from './due-diligence.repository.js';
import { DEFAULT_POLICY, type PolicyDto, type PutPolicyBody } from './due-diligence.schemas.js';

function redatingOf(row: DueDiligencePolicyRow): PolicyDto['redating'] {
  return {
    status: row.redateFinishedAt ? 'DONE' : row.redateChecked > 0 ? 'RUNNING' : 'QUEUED',
    scheduled_reviews: row.redateScheduled,
    records_total: row.redateTotal,
    records_checked: row.redateChecked,
    reviews_moved: row.redateMoved,
    finished_at: row.redateFinishedAt ? row.redateFinishedAt.toISOString() : null,
  };
}

function toPolicyDto(row: DueDiligencePolicyRow | undefined): PolicyDto {
  if (!row) {
    return {
      object: 'due_diligence_policy',
      review_interval_months: { ...DEFAULT_POLICY.reviewIntervalMonths },
      edd_uses_high_interval: DEFAULT_POLICY.eddUsesHighInterval,
      high_risk_jurisdictions: [...DEFAULT_POLICY.highRiskJurisdictions],
      overdue_after_days: DEFAULT_POLICY.overdueAfterDays,
      updated_at: null,
      redating: null,
    };
  }
  return {
    object: 'due_diligence_policy',
    review_interval_months: { LOW: row.reviewMonthsLow, MEDIUM: row.reviewMonthsMedium, HIGH: row.reviewMonthsHigh },
    edd_uses_high_interval: row.eddUsesHighInterval,
    high_risk_jurisdictions: [...row.highRiskJurisdictions],
    overdue_after_days: row.overdueAfterDays,
    updated_at: row.updatedAt.toISOString(),
    redating: redatingOf(row),
  };
}

/** The organisation's ongoing due diligence policy: GET and PUT /v1/due-diligence-policy. */
/** Whether review dates or EDD depend on what changed: intervals, the EDD interval rule or the jurisdictions. */
function movesReviews(before: PolicyDto, body: PutPolicyBody): boolean {
  const intervals = before.review_interval_months;
  return (
    intervals.LOW !== body.reviewIntervalMonths.LOW ||
    intervals.MEDIUM !== body.reviewIntervalMonths.MEDIUM ||
    intervals.HIGH !== body.reviewIntervalMonths.HIGH ||
    before.edd_uses_high_interval !== body.eddUsesHighInterval ||
    before.high_risk_jurisdictions.join() !== body.highRiskJurisdictions.join()
  );
}

export function createDueDiligenceService(deps: {
  database: DataAccess;
  dueDiligence: DueDiligenceRepository;
  audit: AuditWriter;
  jobs: JobQueue;
}) {
  const { database, dueDiligence, audit, jobs } = deps;
  return {
    async getPolicy(ctx: RequestContext): Promise<PolicyDto> {
      return toPolicyDto(await dueDiligence.findPolicy(ctx.orgId, database.db));
    },

    /** Replaces the policy (what the body leaves out takes its default); audited with the policy before and after. */
    async putPolicy(ctx: RequestContext, body: PutPolicyBody): Promise<PolicyDto> {
      return ctx.transaction(async (tx) => {
        await dueDiligence.lockPolicy(ctx.orgId, tx);
        const before = toPolicyDto(await dueDiligence.findPolicy(ctx.orgId, tx));
        // The records are re-dated by a background job in batches, never in this request; it starts
        // once this transaction commits, and the counts it reports are visible on GET as it goes.
        const counts = movesReviews(before, body) ? await dueDiligence.recordCounts(ctx.orgId, tx) : undefined;
        const row = await dueDiligence.savePolicy(
          ctx.orgId,
          {
            reviewMonthsLow: body.reviewIntervalMonths.LOW,
            reviewMonthsMedium: body.reviewIntervalMonths.MEDIUM,
            reviewMonthsHigh: body.reviewIntervalMonths.HIGH,
            eddUsesHighInterval: body.eddUsesHighInterval,
            highRiskJurisdictions: body.highRiskJurisdictions,
            overdueAfterDays: body.overdueAfterDays,
          },
          counts ? { recordsTotal: counts.records, scheduled: counts.scheduled } : undefined,
          tx,
        );
        if (counts) await jobs.send(tx, QUEUES.reviewRedate.name, { orgId: ctx.orgId, generation: row.generation }, { group: ctx.orgId });
        const after = toPolicyDto(row);
        await audit.record(
          {
            orgId: ctx.orgId,
            actor: ctx.actor,
            action: 'due_diligence_policy.updated',
            subjectType: 'due_diligence_policy',
            subjectId: null,
            before,
            after,
          },
          tx,
        );
        return after;
      });
    },
  };
}
