import { z } from 'zod';
import { isDesignatedServiceCode } from '../designated-services/catalog.js';
import { KYC_STATUSES } from './due-diligence.js';

export const AML_STATUSES = ['NOT_SCREENED', 'IN_PROGRESS', 'CLEAR', 'NEEDS_REVIEW', 'RESOLVED'] as const;
export type AmlStatus = (typeof AML_STATUSES)[number];
export const ADDED_VIA = ['ADMIN_MANUAL', 'AI_EXTRACTED', 'CONTACT_PORTAL', 'BULK_IMPORT', 'INTEGRATION', 'SYSTEM'] as const;
export const INDIVIDUAL_TYPES = ['INDIVIDUAL', 'SOLE_TRADER'] as const;
export const MAX_SERVICE_CODES = 64;

// ------------------------------------------------------------------------------------------------
// Request building blocks (shared with entities)
// ------------------------------------------------------------------------------------------------

export const serviceCode = z
  .string()
  .refine(isDesignatedServiceCode, { message: 'Unknown or non-designated service code; see GET /v1/designated-services.' });

export const serviceCodeList = z
  .array(serviceCode)
  .max(MAX_SERVICE_CODES, `At most ${MAX_SERVICE_CODES} codes.`)
  .describe('Designated-service catalog codes; duplicates are merged.')
  .meta({ example: ['PRO-REAL-ESTATE'] });

/** yyyy-mm-dd, a real calendar date. */
export const calendarDate = z.iso.date({ error: 'Must be a date in the form yyyy-mm-dd.' });

export const riskAnswersSchema = z
  .object({
    isNewCustomer: z.boolean().optional(),
    isDesignatedService: z.boolean().optional(),
    handlesCashOrCrypto: z.boolean().optional(),
    metFaceToFace: z.boolean().optional(),
    operatesCashBusiness: z.boolean().optional(),
    unusualTransactions: z.boolean().optional(),
    unexplainedWealth: z.boolean().optional(),
    falseIdentityIndicators: z.boolean().optional(),
    complexStructure: z.boolean().optional(),
  })
  .strict()
  .describe('Risk pre-answers that seed the risk assessment; all optional.');

export const preCommencementAssessmentSchema = z
  .object({
    significantChange: z.boolean().describe('Whether the relationship changed significantly.'),
    resultingRisk: z.enum(['LOW', 'MEDIUM', 'HIGH']).describe('Risk resulting from the change.'),
    assessedAt: calendarDate.optional(),
  })
  .strict()
  .describe('Pre-commencement assessment for an existing client; due diligence is triggered only when significantChange is true and resultingRisk is MEDIUM or HIGH.');

const trimmed = (max: number) => z.string().trim().max(max, `At most ${max} characters.`);
export const nameField = z.string().trim().min(1, 'Must not be empty.').max(255, 'At most 255 characters.');
export const emailField = z.email({ error: 'Must be a valid email address.' }).max(254);
export const externalIdField = z.string().trim().min(1, 'Must not be empty.').max(255, 'At most 255 characters.');
export const digits = (count: number, label: string) =>
  z
    .string()
    .transform((value) => value.replace(/\s+/g, ''))
    .refine((value) => new RegExp(`^\\d{${count}}$`).test(value), { message: `${label} must be ${count} digits (spaces are ignored).` });

export const upsertCustomerBody = z
  .object({
    externalId: externalIdField.optional().describe("Caller's CRM id; recommended for idempotent upsert.").meta({ example: 'crm-10442' }),
    type: z.enum(INDIVIDUAL_TYPES).optional().describe('Defaults to INDIVIDUAL on create.'),
    fullName: nameField.optional().describe('Required on create.').meta({ example: 'Jane Citizen' }),
    email: emailField.optional().describe('Required on create.').meta({ example: 'jane@example.com' }),
    phone: trimmed(32).optional(),
    firstName: trimmed(255).optional(),
    middleName: trimmed(255).optional(),
    lastName: trimmed(255).optional(),
    clientSinceDate: calendarDate.optional().describe('Not in the future; requires risk.isNewCustomer false.'),
    preCommencementAssessment: preCommencementAssessmentSchema.optional(),
    preExistingServices: serviceCodeList.optional().describe('History only; requires risk.isNewCustomer false; not with a non-empty designatedServices.'),
    preExistingServiceSince: calendarDate.optional(),
    representative: z
      .object({ fullName: nameField, email: emailField })
      .strict()
      .optional()
      .describe('An attorney acting under a power of attorney; verification links go to them.'),
    businessName: trimmed(255).optional().describe('SOLE_TRADER only.'),
    abn: digits(11, 'ABN').optional().describe('SOLE_TRADER only; 11 digits, spaces tolerated.'),
    risk: riskAnswersSchema.optional(),
    designatedServices: serviceCodeList.optional(),
  })
  .strict();
export type UpsertCustomerBody = z.output<typeof upsertCustomerBody>;

export const patchCustomerBody = z
  .object({
    fullName: nameField.optional(),
    email: emailField.optional(),
    phone: trimmed(32).nullable().optional().describe('null clears it.'),
    risk: riskAnswersSchema.optional(),
  })
  .strict();
export type PatchCustomerBody = z.output<typeof patchCustomerBody>;

export const replaceServicesBody = z
  .object({ service_codes: serviceCodeList.describe('The complete new set; an empty array removes every assignment.') })
  .strict();

export const idParams = z
  .object({ id: z.string().min(1).max(255).describe('The customer UUID or your external_id.') })
  .strict();

const limitParam = z
  .string()
  .regex(/^-?\d+$/, 'Must be a whole number.')
  .transform((value) => Math.min(100, Math.max(1, Number(value))))
  .optional()
  .describe('Page size 1 to 100 (clamped), default 50.');

export const listQueryBase = z
  .object({
    limit: limitParam,
    cursor: z.string().max(1024).optional().describe('Opaque next_cursor of the previous page.'),
    aml_status: z.enum(AML_STATUSES).optional(),
    updated_since: z.iso
      .datetime({ offset: true, error: 'Must be an ISO 8601 date-time, e.g. 2026-01-31T09:00:00Z.' })
      .optional()
      .describe('Only records updated after this instant.'),
    external_id: z.string().min(1).max(255).optional(),
    include: z
      .string()
      .refine((value) => value.split(',').every((part) => part.trim() === 'total_count'), {
        message: 'The only supported value is total_count.',
      })
      .optional(),
  })
  .strict();

export const listCustomersQuery = listQueryBase.extend({ status: z.enum(KYC_STATUSES).optional().describe('Filter by kyc_status.') }).strict();

// ------------------------------------------------------------------------------------------------
// Responses
// ------------------------------------------------------------------------------------------------

const dateTime = z.string().describe('ISO 8601 date-time (UTC).').meta({ example: '2026-01-31T09:00:00.000Z' });

export const amlBlockSchema = z
  .object({
    status: z.enum(AML_STATUSES),
    screened_at: dateTime.nullable(),
    last_reviewed_at: dateTime.nullable(),
    flags: z.object({ pep: z.boolean(), sanctions: z.boolean(), adverse_media: z.boolean(), terrorism: z.boolean() }),
  })
  .describe('AML screening status and flags.');

export const individualSchema = z
  .object({
    id: z.uuid(),
    external_id: z.string().nullable(),
    type: z.enum(INDIVIDUAL_TYPES),
    full_name: z.string(),
    email: z.string(),
    kyc_status: z.enum(KYC_STATUSES),
    kyc_started_at: dateTime.nullable(),
    kyc_completed_at: dateTime.nullable(),
    identity: z
      .object({ verified_legal_name: z.string(), verified_country: z.string().describe('ISO 3166-1 alpha-3.') })
      .nullable()
      .describe('Populated only when kyc_status is VERIFIED.'),
    aml: amlBlockSchema,
    added_via: z.enum(ADDED_VIA),
    designated_services: z.array(z.string()).optional().describe('Present in the designated-services replace response.'),
    created_at: dateTime,
    updated_at: dateTime,
  })
  .describe('An individual customer (INDIVIDUAL or SOLE_TRADER).');
export type IndividualDto = z.infer<typeof individualSchema>;

export const listEnvelope = <T extends z.ZodType>(item: T) =>
  z.object({
    object: z.literal('list'),
    data: z.array(item),
    has_more: z.boolean(),
    next_cursor: z.string().nullable(),
    limit: z.number().int(),
    total_count: z.number().int().optional(),
  });
