import { z } from 'zod';

export const FEATURES = ['groups', 'kyb_extra_methods'] as const;
export type Feature = (typeof FEATURES)[number];
export const PAYERS = ['organization', 'customer'] as const;
export type Payer = (typeof PAYERS)[number];

export const organisationInputSchema = z
  .object({
    name: z.string().trim().min(1, 'must not be empty').max(255),
    features: z.array(z.enum(FEATURES)).default([]),
    credits: z.number().int().min(0, 'must not be negative').default(0),
    defaultPayer: z.enum(PAYERS).default('organization'),
    isSandbox: z.boolean().default(false),
  })
  .strict();
export type OrganisationInput = z.input<typeof organisationInputSchema>;

export type OrganisationDto = {
  id: string;
  name: string;
  features: string[];
  credits: number;
  default_payer: Payer;
  is_sandbox: boolean;
  created_at: string;
  updated_at: string;
};
