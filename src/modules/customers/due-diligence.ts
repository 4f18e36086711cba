import type { RiskAnswers } from './risk-model.js';

export const KYC_STATUSES = [
  'NOT_STARTED',
  'PENDING',
  'IN_PROGRESS',
  'VERIFIED',
  'FAILED',
  'NOT_REQUIRED',
  'AWAITING_RESUBMISSION',
] as const;
export type KycStatus = (typeof KYC_STATUSES)[number];

export type PreCommencementAssessment = {
  significantChange: boolean;
  resultingRisk: 'LOW' | 'MEDIUM' | 'HIGH';
  assessedAt?: string;
};

/**
 * Status of a new record (the spec's "States and transitions"):
 * - a non-empty service list owes due diligence, unless the pre-commencement carve-out applies
 *   (`isNewCustomer: false` with a recorded no-trigger assessment);
 * - an empty list, `isDesignatedService: false` with no list, or nothing at all owes none;
 * - `isDesignatedService: true` with no list owes it (the services are chosen in the app).
 */
export function initialStatus(input: {
  designatedServices: readonly string[] | undefined;
  risk: RiskAnswers;
  assessment: PreCommencementAssessment | undefined;
}): KycStatus {
  const { designatedServices, risk, assessment } = input;
  if (designatedServices === undefined) return risk.isDesignatedService === true ? 'NOT_STARTED' : 'NOT_REQUIRED';
  if (designatedServices.length === 0) return 'NOT_REQUIRED';
  if (risk.isNewCustomer === false && assessment) return assessmentTriggers(assessment) ? 'NOT_STARTED' : 'NOT_REQUIRED';
  return 'NOT_STARTED';
}

/** Pre-commencement rule 1: due diligence is owed only when both limbs hold. */
export function assessmentTriggers(assessment: PreCommencementAssessment): boolean {
  return assessment.significantChange && assessment.resultingRisk !== 'LOW';
}

/**
 * A later change to services or the designated flag: a record that owed nothing starts owing due
 * diligence when a service it did not have is added or the flag turns on, unless the same request
 * records a no-trigger pre-commencement assessment for an existing client (`carveOut`, rule 2).
 * Once owed, always owed: emptying the set never moves the status back.
 */
export function statusAfterServicesChange(input: {
  status: KycStatus;
  previousServices: readonly string[];
  nextServices: readonly string[];
  previousFlag: boolean | null;
  nextFlag: boolean | null;
  carveOut?: boolean;
}): KycStatus {
  if (input.status !== 'NOT_REQUIRED' || input.carveOut === true) return input.status;
  const added = input.nextServices.some((code) => !input.previousServices.includes(code));
  const flagTurnedOn = input.nextFlag === true && input.previousFlag !== true;
  return added || flagTurnedOn ? 'NOT_STARTED' : input.status;
}

/** The designated flag: derived from the list when there is one, else the caller's boolean. */
export function designatedFlag(services: readonly string[], explicit: boolean | undefined | null): boolean | null {
  if (services.length > 0) return true;
  return explicit ?? null;
}
