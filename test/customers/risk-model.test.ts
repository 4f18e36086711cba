import { describe, expect, it } from 'vitest';
import { DESIGNATED_SERVICES } from '../../src/modules/designated-services/catalog.js';
import { SERVICE_WEIGHTS, classifyClient, rateRisk } from '../../src/modules/customers/risk-model.js';

describe('risk model (docs/risk-model.md)', () => {
  it('when the catalog is compared with the weights table, every catalog code has a weight and no other code does', () => {
    expect(Object.keys(SERVICE_WEIGHTS).sort()).toEqual(DESIGNATED_SERVICES.map((entry) => entry.code).sort());
  });

  it('when there are no services and no answers, it rates LOW', () => {
    expect(rateRisk([], {})).toBe('LOW');
  });

  it('when a decisive answer is true, it rates HIGH whatever the services', () => {
    for (const answer of ['complexStructure', 'unexplainedWealth', 'falseIdentityIndicators'] as const) {
      expect(rateRisk([], { [answer]: true })).toBe('HIGH');
    }
  });

  it('when several services are held, the highest weight counts, not the sum', () => {
    expect(rateRisk(['FIN-ADVISORY', 'FIN-PAYROLL', 'FIN-SUPER'], {})).toBe('LOW');
    expect(rateRisk(['FIN-LOANS', 'RE-BROKER'], {})).toBe('LOW');
    expect(rateRisk(['FIN-LOANS', 'FIN-CRYPTO'], {})).toBe('MEDIUM');
  });

  it('when the total reaches 3 it rates MEDIUM, and 5 HIGH', () => {
    expect(rateRisk(['PRO-REAL-ESTATE'], { metFaceToFace: false })).toBe('MEDIUM');
    expect(rateRisk(['FIN-CRYPTO'], { handlesCashOrCrypto: true })).toBe('HIGH');
    expect(rateRisk(['FIN-ADVISORY'], { operatesCashBusiness: true, unusualTransactions: true })).toBe('HIGH');
    expect(rateRisk([], { unusualTransactions: true })).toBe('LOW');
  });

  it('when metFaceToFace is absent or true, it adds nothing; only an explicit false adds a point', () => {
    expect(rateRisk(['PRO-REAL-ESTATE'], {})).toBe('LOW');
    expect(rateRisk(['PRO-REAL-ESTATE'], { metFaceToFace: true })).toBe('LOW');
  });

  it('when only pre-existing services are held, they weigh like current services', () => {
    expect(rateRisk([], { handlesCashOrCrypto: true }, ['OTH-BULLION'])).toBe('HIGH');
  });

  it('when isNewCustomer or isDesignatedService are answered, the rating does not change', () => {
    expect(rateRisk(['FIN-LOANS'], { isNewCustomer: false, isDesignatedService: true })).toBe('LOW');
  });

  it('when classifying, it follows designated → owed → rating', () => {
    expect(classifyClient({ rating: 'HIGH', designated: false, dueDiligenceOwed: true })).toBe('NOT_DESIGNATED');
    expect(classifyClient({ rating: 'HIGH', designated: true, dueDiligenceOwed: false })).toBe('PRE_COMMENCEMENT_MONITORING');
    expect(classifyClient({ rating: 'MEDIUM', designated: true, dueDiligenceOwed: true })).toBe('STANDARD_CDD');
    expect(classifyClient({ rating: 'HIGH', designated: true, dueDiligenceOwed: true })).toBe('ENHANCED_CDD');
  });
});
