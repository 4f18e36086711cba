import type { CustomerRow } from '../../db/schema.js';
import { toAmlBlock, toReviewBlocks } from '../customers/customer-dto.js';
import type { KycStatus } from '../customers/due-diligence.js';
import type { BeneficialOwnerWithPerson } from './entities.repository.js';
import type { EntityDto, EntityType } from './entities.schemas.js';

const iso = (value: Date | null): string | null => (value ? value.toISOString() : null);

/** The public entity DTO, with the contact summary when one is set. */
export function toEntityDto(row: CustomerRow, contact: CustomerRow | undefined): EntityDto {
  return {
    id: row.id,
    external_id: row.externalId,
    type: row.type as EntityType,
    name: row.name,
    origin: row.origin ?? 'AUSTRALIAN',
    abn: row.abn,
    acn: row.acn,
    country_of_formation: row.countryOfFormation,
    registration_number: row.registrationNumber,
    kyb_status: row.kycStatus as KycStatus,
    kyb_started_at: iso(row.kycStartedAt),
    kyb_completed_at: iso(row.kycCompletedAt),
    contact: contact
      ? {
          id: contact.id,
          external_id: contact.externalId,
          full_name: contact.name,
          email: contact.email,
          kyc_status: contact.kycStatus as KycStatus,
          kyc_required: row.contactKycRequired ?? true,
        }
      : null,
    aml: toAmlBlock(row),
    ...toReviewBlocks(row),
    added_via: row.addedVia as EntityDto['added_via'],
    created_at: row.createdAt.toISOString(),
    updated_at: row.updatedAt.toISOString(),
  };
}

export function toBeneficialOwnerDto({ owner, person }: BeneficialOwnerWithPerson) {
  return {
    id: owner.id,
    name: person.name,
    holder_type: owner.holderType,
    role_type: owner.roleTypes[0] ?? '',
    role_types: owner.roleTypes,
    percentage_held: Number(owner.percentageHeld),
    kyc_required: owner.kycRequired,
    kyc_status: person.kycStatus as KycStatus,
    kyc_email: person.email ?? '',
    linked_customer: { id: person.id, external_id: person.externalId },
    added_via: owner.addedVia,
    created_at: owner.createdAt.toISOString(),
    updated_at: owner.updatedAt.toISOString(),
  };
}
