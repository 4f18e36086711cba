import type { DataAccess } from '../../db/client.js';
import type { DueDiligencePolicyRow } from '../../db/schema.js';
import type { AuditWriter } from '../../shared/audit-writer.js';
import type { RequestContext } from '../../shared/request-context.js';
import type { DueDiligenceRepository } from './due-diligence.repository.js';
import { DEFAULT_POLICY, type PolicyDto, type PutPolicyBody } from './due-diligence.schemas.js';

function toPolicyDto(row: DueDiligencePolicyRow | undefined): PolicyDto {
  if (!row) {
    return {
      object: 'due_diligence_policy',
      review_interval_months: { ...DEFAULT_POLICY.reviewIntervalMonths },
      edd_uses_high_interval: DEFAULT_POLICY.eddUsesHighInterval,
      high_risk_jurisdictions: [...DEFAULT_POLICY.highRiskJurisdictions],
      overdue_after_days: DEFAULT_POLICY.overdueAfterDays,
      updated_at: null,
    };
  }
  return {
    object: 'due_diligence_policy',
    review_interval_months: { LOW: row.reviewMonthsLow, MEDIUM: row.reviewMonthsMedium, HIGH: row.reviewMonthsHigh },
    edd_uses_high_interval: row.eddUsesHighInterval,
    high_risk_jurisdictions: [...row.highRiskJurisdictions],
    overdue_after_days: row.overdueAfterDays,
    updated_at: row.updatedAt.toISOString(),
  };
}

/** The organisation's ongoing due diligence policy: GET and PUT /v1/due-diligence-policy. */
export function createDueDiligenceService(deps: { database: DataAccess; dueDiligence: DueDiligenceRepository; audit: AuditWriter }) {
  const { database, dueDiligence, audit } = deps;
  return {
    async getPolicy(ctx: RequestContext): Promise<PolicyDto> {
      return toPolicyDto(await dueDiligence.findPolicy(ctx.orgId, database.db));
    },

    /** Replaces the policy (what the body leaves out takes its default); audited with the policy before and after. */
    async putPolicy(ctx: RequestContext, body: PutPolicyBody): Promise<PolicyDto> {
      return ctx.transaction(async (tx) => {
        await dueDiligence.lockPolicy(ctx.orgId, tx);
        const before = toPolicyDto(await dueDiligence.findPolicy(ctx.orgId, tx));
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
          tx,
        );
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
