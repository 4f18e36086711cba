import type { TemplateRole } from '../../db/schema.js';

export const PARTY_TYPES = ['INDIVIDUAL', 'ENTITY', 'EITHER'] as const;
export type PartyType = (typeof PARTY_TYPES)[number];

/**
 * When the workspace asks staff to verify whoever fills a role. The API never starts a check by
 * itself (creating a group charges and triggers nothing); the value drives prompts in the app.
 * - ON_ADD: due as soon as a customer is attached to the slot.
 * - BEFORE_SETTLEMENT: may wait, but must be verified before the deal settles or completes.
 * - MANUAL: never prompted; staff decide (e.g. the other side's party, already verified elsewhere).
 */
export const CHECK_TRIGGERS = ['ON_ADD', 'BEFORE_SETTLEMENT', 'MANUAL'] as const;
export type CheckTrigger = (typeof CHECK_TRIGGERS)[number];

/** Codes of pre-built templates start with this; custom templates may not use it, so a later addition never clashes. */
export const CURATED_CODE_PREFIX = 'PB-';

const INDUSTRIES = {
  realEstate: 'REAL_ESTATE',
  legal: 'LEGAL',
  corporateServices: 'CORPORATE_SERVICES',
  lending: 'LENDING',
} as const;

export type CuratedTemplate = {
  code: string;
  name: string;
  description: string;
  industry: string;
  roles: Array<TemplateRole & { party_type: PartyType; check_trigger: CheckTrigger }>;
};

function role(role_label: string, party_type: PartyType, required: boolean, check_trigger: CheckTrigger) {
  return { role_label, party_type, required, check_trigger };
}

/**
 * The pre-built set every organisation receives (as its own copies). Codes are stable forever;
 * names, descriptions and roles may be edited here and propagate to every organisation on its next
 * use of groups. A code removed from this list is retired: hidden from listings and unusable for
 * new groups, while groups already made from it keep their reference.
 */
export const CURATED_TEMPLATES: readonly CuratedTemplate[] = [
  {
    code: 'PB-PROPERTY-SALE',
    name: 'Property sale (agency)',
    description:
      'A real estate agency selling a property for a vendor (designated service RE-BROKER). Verify the vendor when the listing is taken and the purchaser before settlement.',
    industry: INDUSTRIES.realEstate,
    roles: [
      role('Vendor', 'EITHER', true, 'ON_ADD'),
      role('Co-vendor', 'EITHER', false, 'ON_ADD'),
      role('Purchaser', 'EITHER', true, 'BEFORE_SETTLEMENT'),
      role('Vendor attorney or representative', 'INDIVIDUAL', false, 'ON_ADD'),
    ],
  },
  {
    code: 'PB-PROPERTY-DEVELOPMENT-SALE',
    name: 'Off-the-plan or development sale',
    description:
      'A developer selling new lots (designated service RE-DEVELOPER). The developer entity and each purchaser are verified; the purchaser before settlement.',
    industry: INDUSTRIES.realEstate,
    roles: [
      role('Developer', 'ENTITY', true, 'ON_ADD'),
      role('Purchaser', 'EITHER', true, 'BEFORE_SETTLEMENT'),
      role('Co-purchaser', 'EITHER', false, 'BEFORE_SETTLEMENT'),
    ],
  },
  {
    code: 'PB-PROPERTY-PURCHASE',
    name: 'Property purchase (conveyancing)',
    description:
      'A conveyancing matter acting for the purchaser (designated service PRO-REAL-ESTATE). The client is verified on engagement; the vendor is recorded for reference.',
    industry: INDUSTRIES.legal,
    roles: [
      role('Purchaser', 'EITHER', true, 'ON_ADD'),
      role('Co-purchaser', 'EITHER', false, 'ON_ADD'),
      role('Guarantor', 'INDIVIDUAL', false, 'BEFORE_SETTLEMENT'),
      role('Vendor', 'EITHER', false, 'MANUAL'),
    ],
  },
  {
    code: 'PB-CONVEYANCING-SALE',
    name: 'Property sale (conveyancing)',
    description:
      'A conveyancing matter acting for the vendor (designated service PRO-REAL-ESTATE). The client is verified on engagement; the purchaser is recorded for reference.',
    industry: INDUSTRIES.legal,
    roles: [
      role('Vendor', 'EITHER', true, 'ON_ADD'),
      role('Co-vendor', 'EITHER', false, 'ON_ADD'),
      role('Purchaser', 'EITHER', false, 'MANUAL'),
    ],
  },
  {
    code: 'PB-COMPANY-FORMATION',
    name: 'Company formation',
    description:
      'Registering a new company (designated service PRO-FORMATION). Directors and shareholders are verified before registration; the company itself once it exists.',
    industry: INDUSTRIES.corporateServices,
    roles: [
      role('Director', 'INDIVIDUAL', true, 'ON_ADD'),
      role('Shareholder', 'EITHER', true, 'ON_ADD'),
      role('Company secretary', 'INDIVIDUAL', false, 'ON_ADD'),
      role('Company', 'ENTITY', false, 'MANUAL'),
    ],
  },
  {
    code: 'PB-TRUST-ESTABLISHMENT',
    name: 'Trust establishment',
    description:
      'Settling a new trust (designated service PRO-FORMATION). The settlor, trustee and appointor are verified; beneficiaries as staff decide.',
    industry: INDUSTRIES.corporateServices,
    roles: [
      role('Settlor', 'INDIVIDUAL', true, 'ON_ADD'),
      role('Trustee', 'EITHER', true, 'ON_ADD'),
      role('Appointor', 'EITHER', false, 'ON_ADD'),
      role('Beneficiary', 'EITHER', false, 'MANUAL'),
      role('Trust', 'ENTITY', false, 'MANUAL'),
    ],
  },
  {
    code: 'PB-SMSF-ESTABLISHMENT',
    name: 'SMSF establishment',
    description: 'Setting up a self-managed superannuation fund (designated service PRO-FORMATION). Members and the trustee are verified.',
    industry: INDUSTRIES.corporateServices,
    roles: [
      role('Member', 'INDIVIDUAL', true, 'ON_ADD'),
      role('Additional member', 'INDIVIDUAL', false, 'ON_ADD'),
      role('Trustee', 'EITHER', true, 'ON_ADD'),
      role('Fund', 'ENTITY', false, 'MANUAL'),
    ],
  },
  {
    code: 'PB-BUSINESS-PURCHASE',
    name: 'Company or trust purchase or sale',
    description:
      'Buying or selling a company or trust (designated service PRO-PURCHASE-SALE). Both sides and the target are verified before completion.',
    industry: INDUSTRIES.corporateServices,
    roles: [
      role('Purchaser', 'EITHER', true, 'ON_ADD'),
      role('Vendor', 'EITHER', true, 'ON_ADD'),
      role('Target company or trust', 'ENTITY', true, 'BEFORE_SETTLEMENT'),
    ],
  },
  {
    code: 'PB-LENDING-DEAL',
    name: 'Lending deal',
    description:
      'A loan or financing arrangement (designated services FIN-LOANS, PRO-FINANCING). Borrowers are verified on application; guarantors and security providers before settlement.',
    industry: INDUSTRIES.lending,
    roles: [
      role('Borrower', 'EITHER', true, 'ON_ADD'),
      role('Co-borrower', 'EITHER', false, 'ON_ADD'),
      role('Guarantor', 'EITHER', false, 'BEFORE_SETTLEMENT'),
      role('Security provider', 'EITHER', false, 'BEFORE_SETTLEMENT'),
    ],
  },
];
