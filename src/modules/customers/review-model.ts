import type { CustomerRow, NewCustomerRow } from '../../db/schema.js';
import type { RiskAnswers, RiskRating } from './risk-model.js';

/*
 * Ongoing and enhanced due diligence (docs/risk-model.md): what a record's review and EDD columns
 * are, as one pure function of the record before and after a change, its organisation's policy and
 * the time. Every write path, the review sweep and a policy's re-dating use it, so the same inputs
 * always give the same result.
 */

export const REVIEW_STATUSES = ['NOT_SCHEDULED', 'SCHEDULED', 'DUE', 'OVERDUE'] as const;
export type ReviewStatus = (typeof REVIEW_STATUSES)[number];

export const REVIEW_REASONS = [
  'SCHEDULED_DATE',
  'RISK_INCREASED',
  'AML_REVIEW',
  'SERVICES_CHANGED',
  'OWNERS_CHANGED',
  'CONTACT_CHANGED',
] as const;
export type ReviewReason = (typeof REVIEW_REASONS)[number];

export const EDD_REASONS = [
  'HIGH_RISK',
  'PEP',
  'SANCTIONS',
  'TERRORISM',
  'COMPLEX_STRUCTURE',
  'UNEXPLAINED_WEALTH',
  'FALSE_IDENTITY_INDICATORS',
  'HIGH_RISK_JURISDICTION',
] as const;
export type EddReason = (typeof EDD_REASONS)[number];

export const REVIEW_OUTCOMES = ['NO_CHANGE', 'UPDATED', 'ESCALATED', 'EXITED'] as const;
export type ReviewOutcome = (typeof REVIEW_OUTCOMES)[number];

/** What of an organisation's policy the model reads (modules/due-diligence owns the policy itself). */
export type ReviewPolicy = {
  reviewIntervalMonths: Record<RiskRating, number>;
  eddUsesHighInterval: boolean;
  highRiskJurisdictions: readonly string[];
  overdueAfterDays: number;
};

/** The columns the model derives. */
export type ReviewColumns = Pick<CustomerRow, 'reviewStatus' | 'nextReviewAt' | 'reviewReasons' | 'eddRequired' | 'eddReasons'>;

/** The columns the model reads. */
type Inputs = Pick<
  CustomerRow,
  | 'kycStatus'
  | 'kycCompletedAt'
  | 'riskRating'
  | 'riskAnswers'
  | 'amlStatus'
  | 'amlPep'
  | 'amlSanctions'
  | 'amlAdverseMedia'
  | 'amlTerrorism'
  | 'verifiedCountry'
  | 'countryOfFormation'
  | 'designatedServices'
  | 'contactCustomerId'
  | 'representativeName'
  | 'representativeEmail'
  | 'reviewCompletedAt'
> &
  ReviewColumns;

const RANK: Record<RiskRating, number> = { LOW: 1, MEDIUM: 2, HIGH: 3 };
const DECISIVE: ReadonlyArray<[keyof RiskAnswers, EddReason]> = [
  ['complexStructure', 'COMPLEX_STRUCTURE'],
  ['unexplainedWealth', 'UNEXPLAINED_WEALTH'],
  ['falseIdentityIndicators', 'FALSE_IDENTITY_INDICATORS'],
];

/** Enhanced due diligence and why, in the order of EDD_REASONS. */
export function assessEdd(row: Omit<Inputs, keyof ReviewColumns>, policy: ReviewPolicy): { eddRequired: boolean; eddReasons: EddReason[] } {
  const reasons: EddReason[] = [];
  const answers = (row.riskAnswers ?? {}) as RiskAnswers;
  if (row.riskRating === 'HIGH') reasons.push('HIGH_RISK');
  if (row.amlPep) reasons.push('PEP');
  if (row.amlSanctions) reasons.push('SANCTIONS');
  if (row.amlTerrorism) reasons.push('TERRORISM');
  for (const [answer, reason] of DECISIVE) if (answers[answer] === true) reasons.push(reason);
  const verifiedCountry = row.kycStatus === 'VERIFIED' ? row.verifiedCountry : null;
  const countries = [verifiedCountry, row.countryOfFormation].filter((code): code is string => typeof code === 'string');
  if (countries.some((code) => policy.highRiskJurisdictions.includes(code.toUpperCase()))) reasons.push('HIGH_RISK_JURISDICTION');
  return { eddRequired: reasons.length > 0, eddReasons: reasons };
}

/** Months to the next review: the rating's interval, or HIGH's for an EDD record when the policy says so. */
export function reviewIntervalMonths(rating: RiskRating, eddRequired: boolean, policy: ReviewPolicy): number {
  if (eddRequired && policy.eddUsesHighInterval) return policy.reviewIntervalMonths.HIGH;
  return policy.reviewIntervalMonths[rating];
}

/** `from` plus whole calendar months in UTC; a day the month lacks becomes its last (31 Jan + 1 → 28/29 Feb). */
export function addMonths(from: Date, months: number): Date {
  const year = from.getUTCFullYear();
  const month = from.getUTCMonth() + months;
  const lastDay = new Date(Date.UTC(year, month + 1, 0)).getUTCDate();
  const result = new Date(from.getTime());
  result.setUTCFullYear(year, month, Math.min(from.getUTCDate(), lastDay));
  return result;
}

/** What a scheduled review counts from: the last recorded review, else the verification. */
export function reviewAnchor(row: Pick<CustomerRow, 'reviewCompletedAt' | 'kycCompletedAt' | 'kycStatus'>): Date | null {
  if (row.reviewCompletedAt) return row.reviewCompletedAt;
  return row.kycStatus === 'VERIFIED' ? row.kycCompletedAt : null;
}

/** The review reasons that bring a review forward: everything but the date itself. */
const isTrigger = (reason: string) => reason !== 'SCHEDULED_DATE';

/**
 * What changed between `before` and `after` that brings a review forward (the triggers), in
 * the order of REVIEW_REASONS. `ownersChanged`: the change added, removed or edited a beneficial owner.
 */
export function triggersOf(before: Inputs, after: Omit<Inputs, keyof ReviewColumns>, ownersChanged: boolean): ReviewReason[] {
  const reasons: ReviewReason[] = [];
  const rose = RANK[after.riskRating] > RANK[before.riskRating];
  const servicesAdded = after.designatedServices.some((code) => !before.designatedServices.includes(code));
  if (rose && !servicesAdded) reasons.push('RISK_INCREASED');
  const flagTurnedOn =
    (after.amlPep && !before.amlPep) ||
    (after.amlSanctions && !before.amlSanctions) ||
    (after.amlAdverseMedia && !before.amlAdverseMedia) ||
    (after.amlTerrorism && !before.amlTerrorism);
  if ((after.amlStatus === 'NEEDS_REVIEW' && before.amlStatus !== 'NEEDS_REVIEW') || flagTurnedOn) reasons.push('AML_REVIEW');
  if (rose && servicesAdded) reasons.push('SERVICES_CHANGED');
  if (ownersChanged) reasons.push('OWNERS_CHANGED');
  const contactChanged =
    before.contactCustomerId !== after.contactCustomerId ||
    before.representativeName !== after.representativeName ||
    before.representativeEmail !== after.representativeEmail;
  if (contactChanged) reasons.push('CONTACT_CHANGED');
  return reasons;
}

/**
 * The review and EDD columns of `after` (a record as a change leaves it; `before` undefined for a new
 * record), at `now`:
 * - reaching VERIFIED schedules the first review from the verification, at the policy's interval;
 * - a trigger makes a scheduled review DUE now, its reason recorded once; an already due review keeps
 *   its date and gains the reason;
 * - otherwise a SCHEDULED review's date follows the policy from its anchor (a falling rating only
 *   moves it later); a date that has passed is made DUE by the review sweep, never by a request;
 * - a review that is due stays due, with its date and reasons, until one is recorded.
 */
export function deriveReview(input: {
  before: Inputs | undefined;
  after: Omit<Inputs, keyof ReviewColumns> & Partial<ReviewColumns>;
  policy: ReviewPolicy;
  now: Date;
  ownersChanged?: boolean;
}): ReviewColumns {
  const { before, after, policy, now } = input;
  const edd = assessEdd(after, policy);
  const current: ReviewColumns = {
    reviewStatus: before?.reviewStatus ?? 'NOT_SCHEDULED',
    nextReviewAt: before?.nextReviewAt ?? null,
    reviewReasons: before?.reviewReasons ?? [],
    ...edd,
  };
  const becameVerified = after.kycStatus === 'VERIFIED' && before?.kycStatus !== 'VERIFIED';
  const anchor = becameVerified ? (after.kycCompletedAt ?? now) : reviewAnchor(after);
  if (!anchor) return current;
  const scheduledAt = addMonths(anchor, reviewIntervalMonths(after.riskRating, edd.eddRequired, policy));
  if (becameVerified || current.reviewStatus === 'NOT_SCHEDULED') {
    return { ...current, reviewStatus: 'SCHEDULED', nextReviewAt: scheduledAt, reviewReasons: [] };
  }
  const triggers = before ? triggersOf(before, after, input.ownersChanged === true) : [];
  const fresh = triggers.filter((reason) => !current.reviewReasons.includes(reason));
  if (current.reviewStatus === 'SCHEDULED') {
    if (triggers.length > 0) return { ...current, reviewStatus: 'DUE', nextReviewAt: now, reviewReasons: triggers };
    return { ...current, nextReviewAt: scheduledAt };
  }
  if (fresh.length === 0) return current;
  return { ...current, reviewReasons: REVIEW_REASONS.filter((reason) => current.reviewReasons.includes(reason) || fresh.includes(reason)) };
}

/** Recording a review: the reasons clear and the next one is scheduled from now. */
export function afterReviewRecorded(row: Omit<Inputs, keyof ReviewColumns>, policy: ReviewPolicy, now: Date): ReviewColumns {
  const edd = assessEdd(row, policy);
  return {
    reviewStatus: 'SCHEDULED',
    nextReviewAt: addMonths(now, reviewIntervalMonths(row.riskRating, edd.eddRequired, policy)),
    reviewReasons: [],
    ...edd,
  };
}

/** Whether a change's columns can move the review or EDD columns (else the policy need not be read). */
export function touchesReview(diff: Partial<NewCustomerRow>): boolean {
  for (const key of REVIEW_INPUTS) if (diff[key] !== undefined) return true;
  return false;
}
const REVIEW_INPUTS: ReadonlyArray<keyof NewCustomerRow> = [
  'kycStatus',
  'kycCompletedAt',
  'riskRating',
  'riskAnswers',
  'amlStatus',
  'amlPep',
  'amlSanctions',
  'amlAdverseMedia',
  'amlTerrorism',
  'verifiedCountry',
  'countryOfFormation',
  'designatedServices',
  'contactCustomerId',
  'representativeName',
  'representativeEmail',
];

/** Only the derived columns that differ from `row`'s. */
export function reviewDiff(row: ReviewColumns, next: ReviewColumns): Partial<ReviewColumns> {
  const diff: Partial<ReviewColumns> = {};
  if (row.reviewStatus !== next.reviewStatus) diff.reviewStatus = next.reviewStatus;
  if ((row.nextReviewAt?.getTime() ?? null) !== (next.nextReviewAt?.getTime() ?? null)) diff.nextReviewAt = next.nextReviewAt;
  if (row.reviewReasons.join() !== next.reviewReasons.join()) diff.reviewReasons = next.reviewReasons;
  if (row.eddRequired !== next.eddRequired) diff.eddRequired = next.eddRequired;
  if (row.eddReasons.join() !== next.eddReasons.join()) diff.eddReasons = next.eddReasons;
  return diff;
}

/** Whether `reasons` holds a trigger (a review due for something other than its date). */
export const hasTrigger = (reasons: readonly string[]) => reasons.some(isTrigger);
