import type { CustomerRow } from '../../db/schema.js';
import type { AmlStatus, IndividualDto } from './customers.schemas.js';
import type { KycStatus } from './due-diligence.js';

const iso = (value: Date | null): string | null => (value ? value.toISOString() : null);

export function toAmlBlock(row: CustomerRow) {
  return {
    status: row.amlStatus as AmlStatus,
    screened_at: iso(row.amlScreenedAt),
    last_reviewed_at: iso(row.amlLastReviewedAt),
    flags: { pep: row.amlPep, sanctions: row.amlSanctions, adverse_media: row.amlAdverseMedia, terrorism: row.amlTerrorism },
  };
}
export type AmlBlock = ReturnType<typeof toAmlBlock>;

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
    added_via: row.addedVia as IndividualDto['added_via'],
    created_at: row.createdAt.toISOString(),
    updated_at: row.updatedAt.toISOString(),
  };
}

/** What the audit log keeps of a record: the public view plus the internal due-diligence inputs. */
export function auditSnapshot(row: CustomerRow): Record<string, unknown> {
  const { createdAt: _created, updatedAt: _updated, orgId: _org, ...rest } = row;
  return rest;
}
