import { z } from 'zod';
import {
  amlBlockSchema,
  eddBlockSchema,
  reviewBlockSchema,
  calendarDate,
  digits,
  emailField,
  externalIdField,
  listQueryBase,
  nameField,
  preCommencementAssessmentSchema,
  riskAnswersSchema,
  serviceCodeList,
  ADDED_VIA,
} from '../customers/customers.schemas.js';
import { KYC_STATUSES } from '../customers/due-diligence.js';
import { countryCode } from '../../shared/country-code.js';

const ENTITY_TYPES = ['COMPANY', 'TRUST', 'PARTNERSHIP', 'SMSF', 'OTHER'] as const;
export type EntityType = (typeof ENTITY_TYPES)[number];
const ENTITY_ORIGINS = ['AUSTRALIAN', 'INTERNATIONAL'] as const;

const abnField = digits(11, 'ABN').describe('11 digits; spaces are tolerated and stripped.').meta({ example: '51 824 753 556' });
const acnField = digits(9, 'ACN').describe('9 digits; spaces are tolerated and stripped.').meta({ example: '004 085 616' });
const address = z.string().trim().max(500, 'At most 500 characters.');
const registrationNumber = z.string().trim().min(1).max(64, 'At most 64 characters.');

const contactInput = z
  .object({
    customerId: z.string().min(1).max(255).optional().describe("An existing individual's UUID or external_id."),
    fullName: nameField.optional().describe("The contact person's full name (with email).").meta({ example: 'Sam Director' }),
    email: emailField.optional().describe("The contact person's email (with fullName).").meta({ example: 'sam@acme.example' }),
    kycRequired: z
      .boolean()
      .optional()
      .describe('Whether the contact’s own KYC is intended alongside KYB; default true. Records intent only.'),
  })
  .strict()
  .describe('Either customerId, or fullName plus email (an exact match is reused, else a contact individual is created).');
export type ContactInput = z.output<typeof contactInput>;

export const upsertEntityBody = z
  .object({
    type: z.enum(ENTITY_TYPES).optional().describe('Required on create; immutable.'),
    name: nameField.optional().describe('Legal name; required on create.').meta({ example: 'Acme Holdings Pty Ltd' }),
    externalId: externalIdField.optional().describe('Your CRM id; recommended for idempotent upsert.').meta({ example: 'crm-acct-778' }),
    origin: z.enum(ENTITY_ORIGINS).optional().describe('Default AUSTRALIAN; immutable.'),
    abn: abnField.optional().describe('AUSTRALIAN only.'),
    acn: acnField.optional().describe('AUSTRALIAN only.'),
    address: address.optional().describe('Registered or principal address.').meta({ example: '1 Example St, Sydney NSW 2000' }),
    countryOfFormation: countryCode.optional().describe('Required for INTERNATIONAL; rejected for AUSTRALIAN.'),
    registrationNumber: registrationNumber.optional().describe('INTERNATIONAL only.'),
    contact: contactInput.optional(),
    clientSinceDate: calendarDate.optional().describe('Not in the future; requires risk.isNewCustomer false.'),
    preCommencementAssessment: preCommencementAssessmentSchema.optional(),
    preExistingServices: serviceCodeList
      .optional()
      .describe('History only; requires risk.isNewCustomer false; not with a non-empty designatedServices.'),
    preExistingServiceSince: calendarDate.optional().describe('Since when the pre-existing services were provided (yyyy-mm-dd).'),
    risk: riskAnswersSchema.optional(),
    designatedServices: serviceCodeList
      .optional()
      .describe('Designated services provided to the entity (catalog codes); replaces the stored set.'),
  })
  .strict();
export type UpsertEntityBody = z.output<typeof upsertEntityBody>;

export const patchEntityBody = z
  .object({
    name: nameField.optional().describe('Legal name.').meta({ example: 'Acme Holdings Pty Ltd' }),
    abn: abnField.nullable().optional().describe('null clears it.'),
    acn: acnField.nullable().optional().describe('null clears it.'),
    address: address.nullable().optional().describe('null clears it.'),
    registrationNumber: registrationNumber.nullable().optional().describe('null clears it.'),
    contact: contactInput.optional().describe('Replaces the contact person.'),
    risk: riskAnswersSchema.optional(),
  })
  .strict();
export type PatchEntityBody = z.output<typeof patchEntityBody>;

export const listEntitiesQuery = listQueryBase
  .extend({
    status: z.enum(KYC_STATUSES).optional().describe('Filter by kyb_status.'),
    type: z.enum(ENTITY_TYPES).optional().describe('Filter by entity type.'),
  })
  .strict();

const HOLDER_TYPES = ['INDIVIDUAL', 'JOINT', 'NOMINEE'] as const;
const ROLE_TYPES = [
  'SHAREHOLDER',
  'DIRECTOR',
  'TRUSTEE',
  'BENEFICIARY',
  'SETTLOR',
  'APPOINTOR',
  'PARTNER',
  'MEMBER',
  'CONTROLLER',
] as const;

const ownerInput = z
  .object({
    fullName: nameField
      .describe("The owner's full name; with email it links an existing individual or creates one.")
      .meta({ example: 'Sam Director' }),
    email: emailField.describe("The owner's email.").meta({ example: 'sam@acme.example' }),
    holderType: z.enum(HOLDER_TYPES).default('INDIVIDUAL').describe('How the interest is held; default INDIVIDUAL.'),
    roleTypes: z
      .array(z.enum(ROLE_TYPES))
      .min(1, 'At least one role.')
      .max(ROLE_TYPES.length)
      .describe("The owner's roles; the first is returned as role_type.")
      .meta({ example: ['SHAREHOLDER', 'DIRECTOR'] }),
    percentageHeld: z.number().min(0).max(100).default(0).describe('Percentage held, 0 to 100; default 0.').meta({ example: 50 }),
    kycRequired: z
      .boolean()
      .default(true)
      .describe('Whether the owner must be verified; default true. Nothing is emailed or charged here.'),
  })
  .strict();
export const addOwnersBody = z
  .object({
    owners: z
      .array(ownerInput)
      .min(1, 'At least one owner.')
      .max(50, 'At most 50 owners per request.')
      .describe('1 to 50 beneficial owners to add or update.'),
  })
  .strict();
export type AddOwnersBody = z.output<typeof addOwnersBody>;

// ------------------------------------------------------------------------------------------------
// Responses
// ------------------------------------------------------------------------------------------------

const dateTime = z.string().describe('ISO 8601 date-time (UTC).');

const entityContactSchema = z
  .object({
    id: z.uuid().describe("The contact individual's customer id."),
    external_id: z.string().nullable().describe("The contact's external_id."),
    full_name: z.string().describe('Full name.'),
    email: z.string().nullable().describe('Email address.'),
    kyc_status: z.enum(KYC_STATUSES).describe("The contact's own KYC status."),
    kyc_required: z.boolean().describe("Whether the contact's own KYC is intended alongside the entity's KYB."),
  })
  .describe('The contact person; null when none is set.');

export const entitySchema = z
  .object({
    id: z.uuid().describe("The entity's customer id."),
    external_id: z.string().nullable().describe('Your identifier; immutable once set.').meta({ example: 'crm-acct-778' }),
    type: z.enum(ENTITY_TYPES).describe('Entity type; immutable.'),
    name: z.string().describe('Legal name.').meta({ example: 'Acme Holdings Pty Ltd' }),
    origin: z.enum(ENTITY_ORIGINS).describe('AUSTRALIAN or INTERNATIONAL; immutable.'),
    abn: z.string().nullable().describe('ABN, 11 digits.'),
    acn: z.string().nullable().describe('ACN, 9 digits.'),
    country_of_formation: z.string().nullable().describe('ISO 3166-1 alpha-3; AUS for Australian entities.'),
    registration_number: z.string().nullable().describe('Registry number of an international entity.'),
    kyb_status: z.enum(KYC_STATUSES).describe('Business verification status.'),
    kyb_started_at: dateTime.nullable().describe('When the current verification started.'),
    kyb_completed_at: dateTime.nullable().describe('When verification reached VERIFIED or FAILED.'),
    contact: entityContactSchema.nullable(),
    aml: amlBlockSchema,
    review: reviewBlockSchema,
    edd: eddBlockSchema,
    added_via: z.enum(ADDED_VIA).describe('How the record was created; INTEGRATION for this API.'),
    created_at: dateTime.describe('When the record was created.'),
    updated_at: dateTime.describe('When the record last changed (stamped at commit; no-op writes leave it).'),
  })
  .describe('An entity customer (COMPANY, TRUST, PARTNERSHIP, SMSF or OTHER).');
export type EntityDto = z.infer<typeof entitySchema>;

export const beneficialOwnerSchema = z.object({
  id: z.uuid().describe('The owner id (for send-link).'),
  name: z.string().describe("The owner's full name."),
  holder_type: z.string().describe('INDIVIDUAL, JOINT or NOMINEE.'),
  role_type: z.string().describe('The first of role_types.').meta({ example: 'TRUSTEE' }),
  role_types: z.array(z.string()).describe('Every role of the owner.'),
  percentage_held: z.number().describe('Percentage held, 0 to 100.'),
  kyc_required: z.boolean().describe('Whether the owner must be verified.'),
  kyc_status: z.enum(KYC_STATUSES).describe("The linked individual's KYC status."),
  kyc_email: z.string().describe("The linked individual's email."),
  linked_customer: z
    .object({
      id: z.uuid().describe("The individual's customer id."),
      external_id: z.string().nullable().describe("The individual's external_id."),
    })
    .describe('The individual customer record of the owner.'),
  added_via: z.string().describe('How the owner was added.'),
  created_at: dateTime.describe('When the owner was added.'),
  updated_at: dateTime.describe('When the holding last changed.'),
});
export const ubosResponse = z.object({ ubos: z.array(beneficialOwnerSchema).describe('Individual beneficial owners, oldest first.') });
