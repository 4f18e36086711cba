/**
 * The deterministic risk model (docs/risk-model.md): a rating from the designated services and the
 * risk pre-answers, and the AML/CTF client classification derived from it.
 */
export type RiskRating = 'LOW' | 'MEDIUM' | 'HIGH';
export type ClientClassification = 'NOT_DESIGNATED' | 'PRE_COMMENCEMENT_MONITORING' | 'STANDARD_CDD' | 'ENHANCED_CDD';

export type RiskAnswers = Partial<
  Record<
    | 'isNewCustomer'
    | 'isDesignatedService'
    | 'handlesCashOrCrypto'
    | 'metFaceToFace'
    | 'operatesCashBusiness'
    | 'unusualTransactions'
    | 'unexplainedWealth'
    | 'falseIdentityIndicators'
    | 'complexStructure',
    boolean
  >
>;

/** Inherent risk of each designated service: 3 high, 2 medium, 1 low. */
export const SERVICE_WEIGHTS: Readonly<Record<string, 1 | 2 | 3>> = {
  'PRO-FORMATION': 2,
  'PRO-PURCHASE-SALE': 2,
  'PRO-RESTRUCTURE': 2,
  'PRO-REAL-ESTATE': 2,
  'PRO-CLIENT-MONEY': 3,
  'PRO-FINANCING': 2,
  'PRO-SHELF': 3,
  'PRO-NOMINEE': 3,
  'PRO-REGISTERED-OFFICE': 2,
  'RE-BROKER': 2,
  'RE-DEVELOPER': 2,
  'FIN-BANKING': 2,
  'FIN-REMITTANCE': 3,
  'FIN-CRYPTO': 3,
  'FIN-FX': 3,
  'FIN-LOANS': 2,
  'FIN-INVESTMENT': 2,
  'FIN-ADVISORY': 1,
  'FIN-INSURANCE': 1,
  'FIN-SUPER': 1,
  'FIN-PENSION': 1,
  'FIN-STORED-VALUE': 3,
  'FIN-CUSTODIAL': 2,
  'FIN-PAYROLL': 1,
  'OTH-BULLION': 3,
  'OTH-GAMBLING': 3,
  'OTH-HIGH-VALUE-GOODS': 3,
};

/** Answers that make a customer HIGH risk on their own. */
const DECISIVE_ANSWERS = ['complexStructure', 'unexplainedWealth', 'falseIdentityIndicators'] as const;

export function rateRisk(services: readonly string[], answers: RiskAnswers, preExistingServices: readonly string[] = []): RiskRating {
  if (DECISIVE_ANSWERS.some((answer) => answers[answer] === true)) return 'HIGH';
  const serviceScore = Math.max(0, ...[...services, ...preExistingServices].map((code) => SERVICE_WEIGHTS[code] ?? 0));
  let score = serviceScore;
  if (answers.handlesCashOrCrypto === true) score += 2;
  if (answers.operatesCashBusiness === true) score += 2;
  if (answers.unusualTransactions === true) score += 2;
  if (answers.metFaceToFace === false) score += 1;
  if (score >= 5) return 'HIGH';
  if (score >= 3) return 'MEDIUM';
  return 'LOW';
}

export function classifyClient(input: { rating: RiskRating; designated: boolean; dueDiligenceOwed: boolean }): ClientClassification {
  if (!input.designated) return 'NOT_DESIGNATED';
  if (!input.dueDiligenceOwed) return 'PRE_COMMENCEMENT_MONITORING';
  return input.rating === 'HIGH' ? 'ENHANCED_CDD' : 'STANDARD_CDD';
}
