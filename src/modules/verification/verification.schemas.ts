import { z } from 'zod';
import { individualSchema } from '../customers/customers.schemas.js';
import { beneficialOwnerSchema, entitySchema } from '../entities/entities.schemas.js';

const EDD_CHECK_TYPES = ['SOURCE_OF_FUNDS', 'SOURCE_OF_WEALTH', 'BIOMETRIC_VERIFICATION'] as const;
const KYB_METHODS = ['automated', 'contact_led', 'manual'] as const;

const startFields = {
  payer: z.enum(['organization', 'customer']).optional().describe("Omit to follow the record's billing default, else the organisation's."),
  customMessage: z
    .string()
    .max(2000, 'At most 2000 characters.')
    .optional()
    .describe('Note included in the verification email.')
    .meta({ example: 'Please complete this before settlement on Friday.' }),
  eddCheckTypes: z
    .array(z.enum(EDD_CHECK_TYPES))
    .max(EDD_CHECK_TYPES.length)
    .optional()
    .describe('Enhanced due-diligence add-ons (emailing lanes only); 1 credit each.')
    .meta({ example: ['SOURCE_OF_FUNDS'] }),
};

export const startKybBody = z
  .object({
    method: z
      .enum(KYB_METHODS)
      .optional()
      .describe(
        'automated (default for COMPANY/OTHER), contact_led, or manual (the only lane, and the default, for TRUST, PARTNERSHIP, SMSF).',
      ),
    ...startFields,
  })
  .strict()
  .nullish();
export type StartKybBody = z.output<typeof startKybBody>;

export const startKycBody = z.object(startFields).strict().nullish();
export type StartKycBody = z.output<typeof startKycBody>;

const verificationLink = z.url().optional().describe('Portal link emailed to the person (emailing lanes only).');
export const entityStartResponse = entitySchema.extend({ verification_link: verificationLink });
export const individualStartResponse = individualSchema.extend({ verification_link: verificationLink });
export const ownerStartResponse = beneficialOwnerSchema.extend({ verification_link: verificationLink });

export const ownerParams = z
  .object({
    id: z.string().min(1).max(255).describe('The entity UUID or your external_id.'),
    uboId: z.uuid().describe('The beneficial owner id (ubos[].id).'),
  })
  .strict();
