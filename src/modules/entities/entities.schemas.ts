import { z } from 'zod';
import countries from 'i18n-iso-countries';
import {
  amlBlockSchema,
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

export const ENTITY_TYPES = ['COMPANY', 'TRUST', 'PARTNERSHIP', 'SMSF', 'OTHER'] as const;
export type EntityType = (typeof ENTITY_TYPES)[number];
export const ENTITY_ORIGINS = ['AUSTRALIAN', 'INTERNATIONAL'] as const;
export type EntityOrigin = (typeof ENTITY_ORIGINS)[number];

const alpha3 = new Set(Object.keys(countries.getAlpha3Codes()));
export const countryCode = z
  .string()
  .transform((value) => value.trim().toUpperCase())
  .refine((value) => alpha3.has(value), { message: 'Must be an ISO 3166-1 alpha-3 country code, e.g. NZL.' })
  .meta({ example: 'NZL' });

export const abnField = digits(11, 'ABN').describe('11 digits; spaces are tolerated and stripped.').meta({ example: '51 824 753 556' });
export const acnField = digits(9, 'ACN').describe('9 digits; spaces are tolerated and stripped.').meta({ example: '004 085 616' });
const address = z.string().trim().max(500, 'At most 500 characters.');
const registrationNumber = z.string().trim().min(1).max(64, 'At most 64 characters.');

export const contactInput = z
  .object({
    customerId: z.string().min(1).max(255).optional().describe("An existing individual's UUID or external_id."),
    fullName: nameField.optional(),
    email: emailField.optional(),
    kycRequired: z.boolean().optional().describe('Whether the contact’s own KYC is intended alongside KYB; default true. Records intent only.'),
  })
  .strict()
  .describe('Either customerId, or fullName plus email (an exact match is reused, else a contact individual is created).');
export type ContactInput = z.output<typeof contactInput>;

export const upsertEntityBody = z
  .object({
    type: z.enum(ENTITY_TYPES).optional().describe('Required on create; immutable.'),
    name: nameField.optional().describe('Legal name; required on create.').meta({ example: 'Acme Holdings Pty Ltd' }),
    externalId: externalIdField.optional().meta({ example: 'crm-acct-778' }),
    origin: z.enum(ENTITY_ORIGINS).optional().describe('Default AUSTRALIAN; immutable.'),
    abn: abnField.optional().describe('AUSTRALIAN only.'),
    acn: acnField.optional().describe('AUSTRALIAN only.'),
    address: address.optional(),
    countryOfFormation: countryCode.optional().describe('Required for INTERNATIONAL; rejected for AUSTRALIAN.'),
    registrationNumber: registrationNumber.optional().describe('INTERNATIONAL only.'),
    contact: contactInput.optional(),
    clientSinceDate: calendarDate.optional(),
    preCommencementAssessment: preCommencementAssessmentSchema.optional(),
    preExistingServices: serviceCodeList.optional(),
    preExistingServiceSince: calendarDate.optional(),
    risk: riskAnswersSchema.optional(),
    designatedServices: serviceCodeList.optional(),
  })
  .strict();
export type UpsertEntityBody = z.output<typeof upsertEntityBody>;

export const patchEntityBody = z
  .object({
    name: nameField.optional(),
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
    type: z.enum(ENTITY_TYPES).optional(),
  })
  .strict();

export const HOLDER_TYPES = ['INDIVIDUAL', 'JOINT', 'NOMINEE'] as const;
export const ROLE_TYPES = ['SHAREHOLDER', 'DIRECTOR', 'TRUSTEE', 'BENEFICIARY', 'SETTLOR', 'APPOINTOR', 'PARTNER', 'MEMBER', 'CONTROLLER'] as const;

export const ownerInput = z
  .object({
    fullName: nameField,
    email: emailField,
    holderType: z.enum(HOLDER_TYPES).default('INDIVIDUAL'),
    roleTypes: z.array(z.enum(ROLE_TYPES)).min(1, 'At least one role.').max(ROLE_TYPES.length),
    percentageHeld: z.number().min(0).max(100).default(0),
    kycRequired: z.boolean().default(true),
  })
  .strict();
export const addOwnersBody = z
  .object({ owners: z.array(ownerInput).min(1, 'At least one owner.').max(50, 'At most 50 owners per request.') })
  .strict();
export type AddOwnersBody = z.output<typeof addOwnersBody>;

// ------------------------------------------------------------------------------------------------
// Responses
// ------------------------------------------------------------------------------------------------

const dateTime = z.string().describe('ISO 8601 date-time (UTC).');

export const entityContactSchema = z.object({
  id: z.uuid(),
  external_id: z.string().nullable(),
  full_name: z.string(),
  email: z.string().nullable(),
  kyc_status: z.enum(KYC_STATUSES),
  kyc_required: z.boolean(),
});

export const entitySchema = z
  .object({
    id: z.uuid(),
    external_id: z.string().nullable(),
    type: z.enum(ENTITY_TYPES),
    name: z.string(),
    origin: z.enum(ENTITY_ORIGINS),
    abn: z.string().nullable(),
    acn: z.string().nullable(),
    country_of_formation: z.string().nullable(),
    registration_number: z.string().nullable(),
    kyb_status: z.enum(KYC_STATUSES),
    kyb_started_at: dateTime.nullable(),
    kyb_completed_at: dateTime.nullable(),
    contact: entityContactSchema.nullable(),
    aml: amlBlockSchema,
    added_via: z.enum(ADDED_VIA),
    created_at: dateTime,
    updated_at: dateTime,
  })
  .describe('An entity customer (COMPANY, TRUST, PARTNERSHIP, SMSF or OTHER).');
export type EntityDto = z.infer<typeof entitySchema>;

export const beneficialOwnerSchema = z.object({
  id: z.uuid(),
  name: z.string(),
  holder_type: z.string(),
  role_type: z.string(),
  role_types: z.array(z.string()),
  percentage_held: z.number(),
  kyc_required: z.boolean(),
  kyc_status: z.enum(KYC_STATUSES),
  kyc_email: z.string(),
  linked_customer: z.object({ id: z.uuid(), external_id: z.string().nullable() }),
  added_via: z.string(),
  created_at: dateTime,
  updated_at: dateTime,
});
export const ubosResponse = z.object({ ubos: z.array(beneficialOwnerSchema) });
