import type { Executor } from '../../db/client.js';
import type { CustomerRow, NewCustomerRow } from '../../db/schema.js';
import type { Clock } from '../../shared/clock.js';
import { assessEdd, deriveReview, reviewDiff, touchesReview, type ReviewPolicy } from './review-model.js';

/** Reads an organisation's review policy (its defaults until one is set) in the caller's transaction. */
export type ReviewPolicyReader = { reviewPolicy(orgId: string, tx: Executor): Promise<ReviewPolicy> };

/**
 * The review and EDD columns a change writes with its own (review-model.ts), in its transaction. The
 * policy is read only when the change touches what the model reads, so most writes cost nothing more.
 */
export function createReviewColumns(deps: { policies: ReviewPolicyReader; clock: Clock }) {
  const { policies, clock } = deps;

  /** New records' EDD columns, the policy read once for all (they are of one organisation). */
  async function forNewRecords(records: NewCustomerRow[], tx: Executor): Promise<NewCustomerRow[]> {
    let policy: Pick<ReviewPolicy, 'highRiskJurisdictions'> | undefined;
    const assessed: NewCustomerRow[] = [];
    for (const values of records) {
      const hasCountry = typeof values.countryOfFormation === 'string';
      const answers = (values.riskAnswers ?? {}) as Record<string, unknown>;
      const decisive = answers.complexStructure === true || answers.unexplainedWealth === true || answers.falseIdentityIndicators === true;
      if (!hasCountry && !decisive && values.riskRating !== 'HIGH') {
        assessed.push(values);
        continue;
      }
      const recordPolicy = hasCountry
        ? (policy ??= await policies.reviewPolicy(values.orgId, tx))
        : { highRiskJurisdictions: [] as string[] };
      const edd = assessEdd(
        {
          ...values,
          kycStatus: values.kycStatus,
          riskRating: values.riskRating ?? 'LOW',
          riskAnswers: values.riskAnswers ?? {},
          verifiedCountry: values.verifiedCountry ?? null,
          countryOfFormation: values.countryOfFormation ?? null,
        } as CustomerRow,
        recordPolicy as ReviewPolicy,
      );
      assessed.push({ ...values, ...edd });
    }
    return assessed;
  }

  return {
    /** `diff` with the review and EDD columns that `before` + `diff` implies. */
    async withReview(
      before: CustomerRow,
      diff: Partial<NewCustomerRow>,
      tx: Executor,
      options: { ownersChanged?: boolean } = {},
    ): Promise<Partial<NewCustomerRow>> {
      if (!options.ownersChanged && !touchesReview(diff)) return diff;
      const policy = await policies.reviewPolicy(before.orgId, tx);
      const after = { ...before, ...diff };
      const derived = deriveReview({ before, after, policy, now: clock.now(), ownersChanged: options.ownersChanged });
      return { ...diff, ...reviewDiff(before, derived) };
    },

    /** A new record's EDD columns (it has no review until it is verified). */
    async forNewRecord(values: NewCustomerRow, tx: Executor): Promise<NewCustomerRow> {
      return (await forNewRecords([values], tx))[0]!;
    },

    forNewRecords,
  };
}
export type ReviewColumnsWriter = ReturnType<typeof createReviewColumns>;
