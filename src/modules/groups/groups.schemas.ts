import { z } from 'zod';
import { CHECK_TRIGGERS, CURATED_CODE_PREFIX, PARTY_TYPES } from './curated-templates.js';

const GROUP_STATUSES = ['ACTIVE', 'ON_HOLD', 'COMPLETE', 'ARCHIVED'] as const;
const TEMPLATE_SOURCES = ['PRE_BUILT', 'CUSTOM'] as const;
const MAX_GROUP_PARTIES = 100;
const MAX_TEMPLATE_ROLES = 50;

const requiredString = () => z.string({ error: (issue) => (issue.input === undefined ? 'is required' : 'must be a string') });
const text = (max: number) => requiredString().trim().min(1, 'must not be empty').max(max, `must be at most ${max} characters`);

// ---------------------------------------------------------------------------------------------
// POST /groups
// ---------------------------------------------------------------------------------------------

const groupPartyInputSchema = z
  .object({
    roleLabel: text(255).describe('The role in the deal, e.g. Vendor or Purchaser.').meta({ example: 'Vendor' }),
    partyType: z.enum(PARTY_TYPES).default('EITHER').describe('Who may fill the role: INDIVIDUAL, ENTITY or EITHER (default).'),
    required: z.boolean().default(true).describe('Whether the role must be filled; default true.'),
    customerId: z
      .uuid({ error: 'must be a UUID' })
      .optional()
      .describe('A customer or entity of your organisation (not with customerExternalId).'),
    // Not trimmed: it must equal the stored external_id exactly.
    customerExternalId: requiredString()
      .min(1, 'must not be empty')
      .max(255, 'must be at most 255 characters')
      .optional()
      .describe('The external_id of a customer or entity, matched exactly (not with customerId).'),
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
    name: text(255).describe('Display name, for example a property address.').meta({ example: '12 Harbour St, Sydney NSW 2000' }),
    reference: text(255)
      .optional()
      .describe('Your stable deal or listing id; an ACTIVE group with the same reference is returned instead of a new one.')
      .meta({ example: 'LISTING-2231' }),
    templateId: z
      .uuid({ error: 'must be a UUID' })
      .optional()
      .describe('A template of GET /group-templates whose roles become empty party slots (not with parties).'),
    parties: z
      .array(groupPartyInputSchema)
      .max(MAX_GROUP_PARTIES, `at most ${MAX_GROUP_PARTIES} parties`)
      .optional()
      .describe(`Explicit party slots, at most ${MAX_GROUP_PARTIES} (not with templateId).`),
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

const groupPartySchema = z.object({
  id: z.uuid().describe('The party slot id.'),
  role_label: z.string().describe('The role in the deal.').meta({ example: 'Vendor' }),
  party_type: z.enum(PARTY_TYPES).describe('Who may fill the role.'),
  required: z.boolean().describe('Whether the role must be filled.'),
  customer_id: z.uuid().nullable().describe('The customer or entity filling the slot; null while empty.'),
});

export const groupSchema = z.object({
  id: z.uuid().describe('The group id.'),
  name: z.string().describe('Display name, for example a property address.'),
  reference: z.string().nullable().describe('Your deal or listing id; null when none was given.'),
  status: z.enum(GROUP_STATUSES).describe('ACTIVE, ON_HOLD, COMPLETE or ARCHIVED.'),
  template_id: z.uuid().nullable().describe('The template the group was created from; null for explicit parties.'),
  industry: z.string().nullable().describe('Copied from the template; null without one.'),
  parties: z.array(groupPartySchema).describe('The party slots.'),
  url: z.url().describe('Deep link to the group workspace in the web app.'),
  created_at: z.iso.datetime().describe('When the group was created.'),
  updated_at: z.iso.datetime().describe('When the group last changed.'),
});
export type GroupDto = z.infer<typeof groupSchema>;

// ---------------------------------------------------------------------------------------------
// Group templates
// ---------------------------------------------------------------------------------------------

const templateRoleSchema = z.object({
  role_label: z.string().describe('The role in the deal.'),
  party_type: z.enum(PARTY_TYPES).describe('Who may fill the role.'),
  required: z.boolean().describe('Whether the role must be filled.'),
  check_trigger: z
    .enum(CHECK_TRIGGERS)
    .describe('When staff are prompted to verify whoever fills it: ON_ADD, BEFORE_SETTLEMENT or MANUAL.'),
});

const groupTemplateSchema = z.object({
  id: z.uuid().describe('The template id in your organisation (differs per organisation).'),
  code: z.string().describe('Stable code; curated templates start with PB-.').meta({ example: 'PB-PROPERTY-SALE' }),
  name: z.string().describe('Template name.'),
  description: z.string().describe('What the template is for.'),
  industry: z.string().describe('REAL_ESTATE, LEGAL, CORPORATE_SERVICES, LENDING or a custom value.'),
  source: z.enum(TEMPLATE_SOURCES).describe('PRE_BUILT (curated) or CUSTOM.'),
  is_verified: z.boolean().describe('true for curated templates.'),
  roles: z.array(templateRoleSchema).describe('The roles that become party slots.'),
});
export type GroupTemplateDto = z.infer<typeof groupTemplateSchema>;

export const groupTemplateListSchema = z.object({
  object: z.literal('list').describe('Always list.'),
  data: z.array(groupTemplateSchema).describe('Curated templates first (by code), then custom ones by creation time.'),
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
