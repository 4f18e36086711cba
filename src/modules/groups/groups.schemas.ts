import { z } from 'zod';
import { CHECK_TRIGGERS, CURATED_CODE_PREFIX, PARTY_TYPES } from './curated-templates.js';

export const GROUP_STATUSES = ['ACTIVE', 'ON_HOLD', 'COMPLETE', 'ARCHIVED'] as const;
export const TEMPLATE_SOURCES = ['PRE_BUILT', 'CUSTOM'] as const;
export const MAX_GROUP_PARTIES = 100;
export const MAX_TEMPLATE_ROLES = 50;

const requiredString = () =>
  z.string({ error: (issue) => (issue.input === undefined ? 'is required' : 'must be a string') });
const text = (max: number) => requiredString().trim().min(1, 'must not be empty').max(max, `must be at most ${max} characters`);

// ---------------------------------------------------------------------------------------------
// POST /groups
// ---------------------------------------------------------------------------------------------

export const groupPartyInputSchema = z
  .object({
    roleLabel: text(255).describe('The role this party plays, e.g. Vendor or Borrower.'),
    partyType: z.enum(PARTY_TYPES).default('EITHER').describe('Which kind of customer may fill the slot.'),
    required: z.boolean().default(true).describe('Whether the slot must be filled.'),
    customerId: z.uuid({ error: 'must be a UUID' }).optional().describe('Attach an existing customer or entity by its service UUID.'),
    // Not trimmed: it must equal the stored external_id exactly.
    customerExternalId: requiredString()
      .min(1, 'must not be empty')
      .max(255, 'must be at most 255 characters')
      .optional()
      .describe("Attach an existing customer or entity by the caller's external_id; not with customerId."),
  })
  .strict()
  .superRefine((party, context) => {
    if (party.customerId !== undefined && party.customerExternalId !== undefined) {
      context.addIssue({
        code: 'custom',
        path: ['customerExternalId'],
        message: 'Give either customerId or customerExternalId, not both.',
      });
    }
  });

export const createGroupBodySchema = z
  .object({
    name: text(255).describe('Display name, for example a property address.'),
    reference: text(255).optional().describe("Caller's stable deal or listing id; also the duplicate guard among ACTIVE groups."),
    templateId: z.uuid({ error: 'must be a UUID' }).optional().describe('Template whose roles become the party slots. Not with parties.'),
    parties: z
      .array(groupPartyInputSchema)
      .max(MAX_GROUP_PARTIES, `at most ${MAX_GROUP_PARTIES} parties`)
      .optional()
      .describe('Explicit party slots. Not with templateId.'),
  })
  .strict()
  .superRefine((body, context) => {
    if (body.templateId !== undefined && body.parties !== undefined) {
      context.addIssue({
        code: 'custom',
        path: ['parties'],
        message: 'templateId and parties are mutually exclusive: give one or the other.',
      });
    }
  });
export type CreateGroupInput = z.output<typeof createGroupBodySchema>;
export type GroupPartyInput = z.output<typeof groupPartyInputSchema>;

export const groupPartySchema = z.object({
  id: z.uuid(),
  role_label: z.string(),
  party_type: z.enum(PARTY_TYPES),
  required: z.boolean(),
  customer_id: z.uuid().nullable(),
});

export const groupSchema = z.object({
  id: z.uuid(),
  name: z.string(),
  reference: z.string().nullable(),
  status: z.enum(GROUP_STATUSES),
  template_id: z.uuid().nullable(),
  industry: z.string().nullable(),
  parties: z.array(groupPartySchema),
  url: z.url(),
  created_at: z.iso.datetime(),
  updated_at: z.iso.datetime(),
});
export type GroupDto = z.infer<typeof groupSchema>;

// ---------------------------------------------------------------------------------------------
// Group templates
// ---------------------------------------------------------------------------------------------

export const templateRoleSchema = z.object({
  role_label: z.string(),
  party_type: z.enum(PARTY_TYPES),
  required: z.boolean(),
  check_trigger: z.enum(CHECK_TRIGGERS),
});

export const groupTemplateSchema = z.object({
  id: z.uuid(),
  code: z.string(),
  name: z.string(),
  description: z.string(),
  industry: z.string(),
  source: z.enum(TEMPLATE_SOURCES),
  is_verified: z.boolean(),
  roles: z.array(templateRoleSchema),
});
export type GroupTemplateDto = z.infer<typeof groupTemplateSchema>;

export const groupTemplateListSchema = z.object({
  object: z.literal('list'),
  data: z.array(groupTemplateSchema),
});

/** The operator's template file (`svc template create --file`). Field names follow the request convention (camelCase). */
export const customTemplateFileSchema = z
  .object({
    code: requiredString()
      .trim()
      .regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/, 'must be 1 to 64 letters, digits, ".", "_" or "-", starting with a letter or digit')
      .refine((code) => !code.toUpperCase().startsWith(CURATED_CODE_PREFIX), {
        message: `the "${CURATED_CODE_PREFIX}" prefix is reserved for pre-built templates`,
      }),
    name: text(255),
    description: z.string().trim().max(2000, 'must be at most 2000 characters').default(''),
    industry: text(100),
    roles: z
      .array(
        z
          .object({
            roleLabel: text(255),
            partyType: z.enum(PARTY_TYPES).default('EITHER'),
            required: z.boolean().default(true),
            checkTrigger: z.enum(CHECK_TRIGGERS).default('ON_ADD'),
          })
          .strict(),
      )
      .min(1, 'must have at least one role')
      .max(MAX_TEMPLATE_ROLES, `at most ${MAX_TEMPLATE_ROLES} roles`)
      .superRefine((roles, context) => {
        const seen = new Map<string, number>();
        roles.forEach((role, index) => {
          const key = role.roleLabel.toLowerCase();
          const first = seen.get(key);
          if (first !== undefined) {
            context.addIssue({ code: 'custom', path: [index, 'roleLabel'], message: `duplicates the label of roles[${first}]` });
          } else {
            seen.set(key, index);
          }
        });
      }),
  })
  .strict();
export type CustomTemplateFile = z.output<typeof customTemplateFileSchema>;
