import { z } from 'zod';
import { limitParam } from '../../shared/request-params.js';
import { calendarDateSchema, dateTimeSchema } from '../../shared/dates.schema.js';
import { listEnvelope } from '../../shared/list-envelope.js';
import { isDesignatedServiceCode } from '../designated-services/catalog.js';
import { KYC_STATUSES } from './due-diligence.js';
import { EDD_REASONS, REVIEW_REASONS, REVIEW_STATUSES } from './review-model.js';

export const AML_STATUSES = ['NOT_SCREENED', 'IN_PROGRESS', 'CLEAR', 'NEEDS_REVIEW', 'RESOLVED'] as const;
export type AmlStatus = (typeof AML_STATUSES)[number];
export const ADDED_VIA = ['ADMIN_MANUAL', 'AI_EXTRACTED', 'CONTACT_PORTAL', 'BULK_IMPORT', 'INTEGRATION', 'SYSTEM'] as const;
const INDIVIDUAL_TYPES = ['INDIVIDUAL', 'SOLE_TRADER'] as const;
const MAX_SERVICE_CODES = 64;

// ------------------------------------------------------------------------------------------------
// Request building blocks (shared with entities)
// ------------------------------------------------------------------------------------------------

const serviceCode = z
  .string()
  .refine(isDesignatedServiceCode, { message: 'Unknown or non-designated service code; see GET /v1/designated-services.' });

export const serviceCodeList = z
  .array(serviceCode)
  .max(MAX_SERVICE_CODES, `At most ${MAX_SERVICE_CODES} codes.`)
  .describe('Designated-service catalog codes; duplicates are merged.')
  .meta({ example: ['PRO-REAL-ESTATE'] });

/** yyyy-mm-dd, a real calendar date in years 0001 to 9999. */
export const calendarDate = calendarDateSchema();

export const riskAnswersSchema = z
  .object({
    isNewCustomer: z
      .boolean()
      .optional()
      .describe('false for an existing client (then clientSinceDate, preExistingServices and a preCommencementAssessment may be sent).'),
    isDesignatedService: z
      .boolean()
      .optional()
      .describe('Whether a designated service is provided; derived from designatedServices when a list is sent.'),
    handlesCashOrCrypto: z.boolean().optional().describe('The relationship involves cash or cryptocurrency.'),
    metFaceToFace: z.boolean().optional().describe('The customer was met in person.'),
    operatesCashBusiness: z.boolean().optional().describe('The customer runs a cash-intensive business.'),
    unusualTransactions: z.boolean().optional().describe('Unusual transactions or patterns were observed.'),
    unexplainedWealth: z.boolean().optional().describe('Wealth or funds without a plausible source; rates HIGH risk.'),
    falseIdentityIndicators: z.boolean().optional().describe('Signs of a false or borrowed identity; rates HIGH risk.'),
    complexStructure: z.boolean().optional().describe('An unusually complex or opaque structure; rates HIGH risk.'),
  })
  .strict()
  .describe('Risk pre-answers that seed the risk assessment; all optional.');

export const preCommencementAssessmentSchema = z
  .object({
    significantChange: z.boolean().describe('Whether the relationship changed significantly.'),
    resultingRisk: z.enum(['LOW', 'MEDIUM', 'HIGH']).describe('Risk resulting from the change.'),
    assessedAt: calendarDate.optional().describe('When the assessment was made (yyyy-mm-dd, not in the future).'),
  })
  .strict()
  .describe(
    'Pre-commencement assessment for an existing client; due diligence is triggered only when significantChange is true and resultingRisk is MEDIUM or HIGH.',
  );

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
    phone: trimmed(32).optional().describe('Stored, not returned in v1.').meta({ example: '+61 400 000 000' }),
    firstName: trimmed(255).optional().describe('Structured name, with lastName (and middleName); stored, not returned in v1.'),
    middleName: trimmed(255).optional().describe('Structured name; cleared when firstName and lastName are sent without it.'),
    lastName: trimmed(255).optional().describe('Structured name, with firstName (and middleName).'),
    clientSinceDate: calendarDate.optional().describe('Not in the future; requires risk.isNewCustomer false.'),
    preCommencementAssessment: preCommencementAssessmentSchema.optional(),
    preExistingServices: serviceCodeList
      .optional()
      .describe('History only; requires risk.isNewCustomer false; not with a non-empty designatedServices.'),
    preExistingServiceSince: calendarDate.optional().describe('Since when the pre-existing services were provided (yyyy-mm-dd).'),
    representative: z
      .object({
        fullName: nameField.describe("The representative's full name."),
        email: emailField.describe('Where verification links are sent.'),
      })
      .strict()
      .optional()
      .describe('An attorney acting under a power of attorney; verification links go to them.'),
    businessName: trimmed(255).optional().describe('SOLE_TRADER only.'),
    abn: digits(11, 'ABN').optional().describe('SOLE_TRADER only; 11 digits, spaces tolerated.'),
    risk: riskAnswersSchema.optional(),
    designatedServices: serviceCodeList
      .optional()
      .describe('Designated services provided to the customer (catalog codes); replaces the stored set.'),
  })
  .strict();
export type UpsertCustomerBody = z.output<typeof upsertCustomerBody>;

export const patchCustomerBody = z
  .object({
    fullName: nameField.optional().describe('Frozen once kyc_status is VERIFIED.').meta({ example: 'Jane Citizen' }),
    email: emailField.optional().describe('Frozen once kyc_status is VERIFIED.').meta({ example: 'jane@example.com' }),
    phone: trimmed(32).nullable().optional().describe('null clears it.'),
    risk: riskAnswersSchema.optional(),
  })
  .strict();
export type PatchCustomerBody = z.output<typeof patchCustomerBody>;

export const replaceServicesBody = z
  .object({ service_codes: serviceCodeList.describe('The complete new set; an empty array removes every assignment.') })
  .strict();

const KNOWN_REVIEW_STATUSES: ReadonlySet<string> = new Set(REVIEW_STATUSES);
const VALID_REVIEW_STATUSES = `Valid statuses: ${REVIEW_STATUSES.join(', ')}.`;

/** `review_status`: a comma list of review statuses, as a set in REVIEW_STATUSES order (so `DUE,OVERDUE` and `OVERDUE,DUE,DUE` are one walk). */
const reviewStatusList = z
  .string()
  .max(200)
  .transform((value, context) => {
    const given = new Set(value.split(',').map((part) => part.trim()));
    const unknown = [...given].filter((status) => !KNOWN_REVIEW_STATUSES.has(status));
    if (unknown.length > 0) {
      const named = unknown.map((status) => (status === '' ? '(empty)' : JSON.stringify(status))).join(', ');
      context.issues.push({ code: 'custom', message: `Unknown review status ${named}. ${VALID_REVIEW_STATUSES}`, input: value });
      return z.NEVER;
    }
    return REVIEW_STATUSES.filter((status) => given.has(status));
  })
  .describe(`Only records whose review.status is one of these, comma-separated. ${VALID_REVIEW_STATUSES}`)
  .meta({ example: 'DUE,OVERDUE' });

export const listQueryBase = z
  .object({
    limit: limitParam,
    cursor: z.string().max(1024).optional().describe('Opaque next_cursor of the previous page.'),
    aml_status: z.enum(AML_STATUSES).optional().describe('Filter by aml.status.'),
    updated_since: dateTimeSchema()
      .optional()
      .describe('Only records updated after this instant (years 0001 to 9999, also once converted to UTC).'),
    external_id: z.string().min(1).max(255).optional().describe('Only the record with this external_id.'),
    review_status: reviewStatusList.optional(),
    review_due_before: dateTimeSchema()
      .optional()
      .describe(
        'Only records whose review.next_review_at is before this instant (a record without a review date never matches; years 0001 to 9999, also once converted to UTC).',
      )
      .meta({ example: '2026-03-01T00:00:00Z' }),
    edd_required: z
      .enum(['true', 'false'], { error: 'Must be true or false.' })
      .transform((value) => value === 'true')
      .optional()
      .describe('true: only records that need enhanced due diligence (edd.required); false: only those that do not.'),
    include: z
      .string()
      .refine((value) => value.split(',').every((part) => part.trim() === 'total_count'), {
        message: 'The only supported value is total_count.',
      })
      .optional()
      .describe('total_count adds the number of matching records (an extra count query; avoid on hot polling loops).'),
  })
  .strict();

export const listCustomersQuery = listQueryBase
  .extend({ status: z.enum(KYC_STATUSES).optional().describe('Filter by kyc_status.') })
  .strict();

// ------------------------------------------------------------------------------------------------
// Responses
// ------------------------------------------------------------------------------------------------

const dateTime = z.string().describe('ISO 8601 date-time (UTC).').meta({ example: '2026-01-31T09:00:00.000Z' });

export const amlBlockSchema = z
  .object({
    status: z.enum(AML_STATUSES).describe('Screening status; RESOLVED once the compliance team finished reviewing matches.'),
    screened_at: dateTime.nullable().describe('When the last screening ran.'),
    last_reviewed_at: dateTime.nullable().describe('When the compliance team last completed a review.'),
    flags: z
      .object({
        pep: z.boolean().describe('Politically exposed person match.'),
        sanctions: z.boolean().describe('Sanctions list match.'),
        adverse_media: z.boolean().describe('Adverse media match.'),
        terrorism: z.boolean().describe('Terrorism list match.'),
      })
      .describe('What the screening matched.'),
  })
  .describe('AML screening status and flags.');

export const reviewBlockSchema = z
  .object({
    status: z
      .enum(REVIEW_STATUSES)
      .describe(
        "NOT_SCHEDULED until verification reaches VERIFIED; SCHEDULED until next_review_at; DUE from then (or from a trigger); OVERDUE once due for the policy's overdue_after_days.",
      ),
    next_review_at: dateTime
      .nullable()
      .describe('When the review falls (or fell) due: its scheduled date, or when a trigger brought it forward.'),
    last_completed_at: dateTime.nullable().describe('When a review was last recorded (POST …/reviews).'),
    reasons: z
      .array(z.enum(REVIEW_REASONS))
      .describe('Why the review is due now; empty unless status is DUE or OVERDUE.')
      .meta({ example: ['RISK_INCREASED'] }),
  })
  .describe('Ongoing due diligence: when this record is next reviewed, and why it is due now.')
  .meta({ example: { status: 'SCHEDULED', next_review_at: '2027-01-31T09:00:00.000Z', last_completed_at: null, reasons: [] } });

export const eddBlockSchema = z
  .object({
    required: z.boolean().describe('Whether enhanced due diligence applies (docs/risk-model.md).'),
    reasons: z
      .array(z.enum(EDD_REASONS))
      .describe('Why, in a fixed order; empty when not required.')
      .meta({ example: ['PEP'] }),
  })
  .describe('Enhanced due diligence, derived from the rating, the AML flags, the decisive risk answers and the countries on record.')
  .meta({ example: { required: true, reasons: ['PEP'] } });

export const individualSchema = z
  .object({
    id: z.uuid().describe('The customer id.'),
    external_id: z.string().nullable().describe('Your identifier; immutable once set.').meta({ example: 'crm-10442' }),
    type: z.enum(INDIVIDUAL_TYPES).describe('INDIVIDUAL or SOLE_TRADER.'),
    full_name: z.string().describe('Full name.').meta({ example: 'Jane Citizen' }),
    email: z.string().describe('Email address.').meta({ example: 'jane@example.com' }),
    kyc_status: z.enum(KYC_STATUSES).describe('Identity verification status.'),
    kyc_started_at: dateTime.nullable().describe('When the current verification started.'),
    kyc_completed_at: dateTime.nullable().describe('When verification reached VERIFIED or FAILED.'),
    identity: z
      .object({
        verified_legal_name: z.string().describe('The legal name the verification confirmed.'),
        verified_country: z.string().describe('ISO 3166-1 alpha-3.'),
      })
      .nullable()
      .describe('Populated only when kyc_status is VERIFIED.'),
    aml: amlBlockSchema,
    review: reviewBlockSchema,
    edd: eddBlockSchema,
    added_via: z.enum(ADDED_VIA).describe('How the record was created; INTEGRATION for this API.'),
    designated_services: z.array(z.string()).optional().describe('Present in the designated-services replace response.'),
    created_at: dateTime.describe('When the record was created.'),
    updated_at: dateTime.describe('When the record last changed (stamped at commit; no-op writes leave it).'),
  })
  .describe('An individual customer (INDIVIDUAL or SOLE_TRADER).');
export type IndividualDto = z.infer<typeof individualSchema>;

/** The list envelope of customers and entities (src/shared/list-envelope.ts), with the optional total_count. */
export const recordListEnvelope = <T extends z.ZodType>(item: T) =>
  listEnvelope(item, 'oldest first (created_at, then id)').extend({
    total_count: z.number().int().optional().describe('Matching records in total; only with include=total_count.'),
  });
