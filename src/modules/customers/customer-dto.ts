import type { CustomerRow } from '../../db/schema.js';
import type { AmlStatus, IndividualDto } from './customers.schemas.js';
import type { KycStatus } from './due-diligence.js';
import type { EddReason, ReviewReason } from './review-model.js';

const iso = (value: Date | null): string | null => (value ? value.toISOString() : null);

export function toAmlBlock(row: CustomerRow) {
  return {
    status: row.amlStatus as AmlStatus,
    screened_at: iso(row.amlScreenedAt),
    last_reviewed_at: iso(row.amlLastReviewedAt),
    flags: { pep: row.amlPep, sanctions: row.amlSanctions, adverse_media: row.amlAdverseMedia, terrorism: row.amlTerrorism },
  };
}
/** Ongoing due diligence: the review and EDD blocks of both DTOs. */
export function toReviewBlocks(row: CustomerRow) {
  return {
    review: {
      status: row.reviewStatus,
      next_review_at: iso(row.nextReviewAt),
      last_completed_at: iso(row.reviewCompletedAt),
      reasons: row.reviewStatus === 'DUE' || row.reviewStatus === 'OVERDUE' ? (row.reviewReasons as ReviewReason[]) : [],
    },
    edd: { required: row.eddRequired, reasons: row.eddReasons as EddReason[] },
  };
}

/** The public individual DTO: exactly the spec's fields, as GET /customers/{id} and webhooks show it. */
export function toIndividualDto(row: CustomerRow): IndividualDto {
  return {
    id: row.id,
    external_id: row.externalId,
    type: row.type as IndividualDto['type'],
    full_name: row.name,
    email: row.email ?? '',
    kyc_status: row.kycStatus as KycStatus,
    kyc_started_at: iso(row.kycStartedAt),
    kyc_completed_at: iso(row.kycCompletedAt),
    identity:
      row.kycStatus === 'VERIFIED' && row.verifiedLegalName
        ? { verified_legal_name: row.verifiedLegalName, verified_country: row.verifiedCountry ?? '' }
        : null,
    aml: toAmlBlock(row),
    ...toReviewBlocks(row),
    added_via: row.addedVia as IndividualDto['added_via'],
    created_at: row.createdAt.toISOString(),
    updated_at: row.updatedAt.toISOString(),
  };
}

/** The columns the audit log keeps of a record: all but its bookkeeping (organisation and timestamps). */
type BookkeepingColumn = 'orgId' | 'createdAt' | 'updatedAt';
export type AuditSnapshot = Omit<CustomerRow, BookkeepingColumn>;

/**
 * What the audit log keeps of a record: the public view plus the internal due-diligence inputs.
 * Spelled out, not `const { orgId, createdAt, updatedAt, ...rest } = row`: the compiler checks the
 * list against the table (a column added to it must be added here), and a literal is cheaper to build
 * and serialize than V8's generic rest copy, on every change.
 */
export function auditSnapshot(row: CustomerRow): AuditSnapshot {
  return {
    id: row.id,
    kind: row.kind,
    externalId: row.externalId,
    type: row.type,
    name: row.name,
    email: row.email,
    phone: row.phone,
    firstName: row.firstName,
    middleName: row.middleName,
    lastName: row.lastName,
    nameProvenanceRank: row.nameProvenanceRank,
    businessName: row.businessName,
    abn: row.abn,
    acn: row.acn,
    businessRegisterStatus: row.businessRegisterStatus,
    origin: row.origin,
    address: row.address,
    countryOfFormation: row.countryOfFormation,
    registrationNumber: row.registrationNumber,
    representativeName: row.representativeName,
    representativeEmail: row.representativeEmail,
    contactCustomerId: row.contactCustomerId,
    contactKycRequired: row.contactKycRequired,
    isContactOnly: row.isContactOnly,
    defaultPayer: row.defaultPayer,
    kycStatus: row.kycStatus,
    kycStartedAt: row.kycStartedAt,
    kycCompletedAt: row.kycCompletedAt,
    verifiedLegalName: row.verifiedLegalName,
    verifiedCountry: row.verifiedCountry,
    amlStatus: row.amlStatus,
    amlScreenedAt: row.amlScreenedAt,
    amlLastReviewedAt: row.amlLastReviewedAt,
    amlPep: row.amlPep,
    amlSanctions: row.amlSanctions,
    amlAdverseMedia: row.amlAdverseMedia,
    amlTerrorism: row.amlTerrorism,
    addedVia: row.addedVia,
    isDesignatedService: row.isDesignatedService,
    designatedServices: row.designatedServices,
    preExistingServices: row.preExistingServices,
    preExistingServiceSince: row.preExistingServiceSince,
    clientSinceDate: row.clientSinceDate,
    preCommencementAssessment: row.preCommencementAssessment,
    riskAnswers: row.riskAnswers,
    riskRating: row.riskRating,
    clientClassification: row.clientClassification,
    reviewStatus: row.reviewStatus,
    nextReviewAt: row.nextReviewAt,
    reviewCompletedAt: row.reviewCompletedAt,
    reviewReasons: row.reviewReasons,
    eddRequired: row.eddRequired,
    eddReasons: row.eddReasons,
  };
}

/** Changed columns as the audit log keeps them (see auditSnapshot): without bookkeeping columns. */
export function auditChanges(changes: Partial<CustomerRow>): Partial<AuditSnapshot> {
  const kept: Record<string, unknown> = {};
  for (const key of Object.keys(changes)) {
    if (key !== 'orgId' && key !== 'createdAt' && key !== 'updatedAt') kept[key] = changes[key as keyof CustomerRow];
  }
  return kept;
}
