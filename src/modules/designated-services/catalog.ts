export type CatalogEntry = { code: string; group: string; name: string; description: string };

const PROFESSIONAL = 'Professional services';
const REAL_ESTATE = 'Real estate';
const FINANCIAL = 'Financial services';
const OTHER = 'Other';

/** The stable designated-service codes of the spec's catalog (27 codes). */
export const DESIGNATED_SERVICES: readonly CatalogEntry[] = [
  {
    code: 'PRO-FORMATION',
    group: PROFESSIONAL,
    name: 'Company or trust formation',
    description: 'Assisting a person to form a company, trust or other legal arrangement.',
  },
  {
    code: 'PRO-PURCHASE-SALE',
    group: PROFESSIONAL,
    name: 'Company or trust purchase/sale',
    description: 'Assisting in the purchase or sale of a company, trust or other business entity.',
  },
  {
    code: 'PRO-RESTRUCTURE',
    group: PROFESSIONAL,
    name: 'Restructure',
    description: 'Assisting in the restructure of a company, trust or other legal arrangement.',
  },
  {
    code: 'PRO-REAL-ESTATE',
    group: PROFESSIONAL,
    name: 'Conveyancing and real estate legal work',
    description: 'Assisting in the buying, selling or transfer of real estate (conveyancing, legal work).',
  },
  {
    code: 'PRO-CLIENT-MONEY',
    group: PROFESSIONAL,
    name: 'Client money and assets management',
    description: 'Receiving, holding or managing client money, accounts, securities or other assets.',
  },
  {
    code: 'PRO-FINANCING',
    group: PROFESSIONAL,
    name: 'Financing arrangements',
    description: 'Arranging or assisting with the financing of a transaction or business.',
  },
  { code: 'PRO-SHELF', group: PROFESSIONAL, name: 'Shelf company sales', description: 'Selling or transferring shelf companies.' },
  {
    code: 'PRO-NOMINEE',
    group: PROFESSIONAL,
    name: 'Nominee director or shareholder',
    description: 'Acting as, or arranging for a person to act as, a nominee director or shareholder.',
  },
  {
    code: 'PRO-REGISTERED-OFFICE',
    group: PROFESSIONAL,
    name: 'Registered office or business address',
    description: 'Providing a registered office, business address or correspondence address.',
  },
  {
    code: 'RE-BROKER',
    group: REAL_ESTATE,
    name: 'Real estate agency and brokering',
    description: 'Brokering the sale, purchase or transfer of real estate as an agent.',
  },
  {
    code: 'RE-DEVELOPER',
    group: REAL_ESTATE,
    name: 'Property development sales',
    description: 'Selling or transferring real estate as a property developer.',
  },
  {
    code: 'FIN-BANKING',
    group: FINANCIAL,
    name: 'Banking and deposit accounts',
    description: 'Opening or providing accounts and deposit-taking services.',
  },
  {
    code: 'FIN-REMITTANCE',
    group: FINANCIAL,
    name: 'Remittance',
    description: 'Transferring money or value on behalf of customers (remittance services).',
  },
  {
    code: 'FIN-CRYPTO',
    group: FINANCIAL,
    name: 'Digital currency exchange',
    description: 'Exchanging, transferring or safekeeping digital currency or virtual assets.',
  },
  { code: 'FIN-FX', group: FINANCIAL, name: 'Foreign exchange', description: 'Currency exchange services.' },
  { code: 'FIN-LOANS', group: FINANCIAL, name: 'Loans and credit', description: 'Making loans or providing credit facilities.' },
  {
    code: 'FIN-INVESTMENT',
    group: FINANCIAL,
    name: 'Investment services',
    description: 'Issuing, dealing in or managing securities and investment products.',
  },
  {
    code: 'FIN-ADVISORY',
    group: FINANCIAL,
    name: 'Financial advisory',
    description: 'Providing financial product advice connected to a designated service.',
  },
  {
    code: 'FIN-INSURANCE',
    group: FINANCIAL,
    name: 'Life insurance',
    description: 'Issuing or dealing in life policies and sinking-fund policies.',
  },
  {
    code: 'FIN-SUPER',
    group: FINANCIAL,
    name: 'Superannuation',
    description: 'Providing superannuation fund services and accepting contributions.',
  },
  { code: 'FIN-PENSION', group: FINANCIAL, name: 'Pensions and annuities', description: 'Issuing or paying pensions and annuities.' },
  {
    code: 'FIN-STORED-VALUE',
    group: FINANCIAL,
    name: 'Stored value cards',
    description: 'Issuing or increasing the value of stored value cards.',
  },
  {
    code: 'FIN-CUSTODIAL',
    group: FINANCIAL,
    name: 'Custodial and depository services',
    description: 'Holding assets in custody or providing depository services.',
  },
  {
    code: 'FIN-PAYROLL',
    group: FINANCIAL,
    name: 'Payroll services',
    description: 'Making payments to employees on behalf of an employer.',
  },
  { code: 'OTH-BULLION', group: OTHER, name: 'Bullion dealing', description: 'Buying or selling bullion.' },
  {
    code: 'OTH-GAMBLING',
    group: OTHER,
    name: 'Gambling services',
    description: 'Providing gambling services, including accepting bets and operating gaming machines.',
  },
  {
    code: 'OTH-HIGH-VALUE-GOODS',
    group: OTHER,
    name: 'High-value goods dealing',
    description: 'Dealing in high-value goods such as precious stones, art or vehicles for cash.',
  },
];

const CODES = new Set(DESIGNATED_SERVICES.map((entry) => entry.code));

export function isDesignatedServiceCode(code: string): boolean {
  return CODES.has(code);
}

/** Deduplicates while keeping the caller's first-seen order. */
export function normalizeServiceCodes(codes: readonly string[]): string[] {
  return [...new Set(codes)];
}
