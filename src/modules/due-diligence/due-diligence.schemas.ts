import { z } from 'zod';
import { countryCode } from '../../shared/country-code.js';

export const RISK_RATINGS = ['LOW', 'MEDIUM', 'HIGH'] as const;
export type ReviewIntervals = Record<(typeof RISK_RATINGS)[number], number>;

/**
 * The FATF's "high-risk jurisdictions subject to a call for action" (its public statement of June 2025):
 * the Democratic People's Republic of Korea, Iran and Myanmar. An organisation replaces the list with its own.
 */
export const FATF_CALL_FOR_ACTION = ['IRN', 'MMR', 'PRK'] as const;

export const DEFAULT_POLICY = {
  reviewIntervalMonths: { LOW: 36, MEDIUM: 24, HIGH: 12 } satisfies ReviewIntervals,
  eddUsesHighInterval: true,
  highRiskJurisdictions: [...FATF_CALL_FOR_ACTION],
  overdueAfterDays: 30,
};

const MAX_INTERVAL_MONTHS = 120;
const MAX_OVERDUE_DAYS = 365;
const MAX_JURISDICTIONS = 250;

const months = (rating: string, fallback: number) =>
  z
    .number({ error: 'must be a whole number of months' })
    .int('must be a whole number of months')
    .min(1, 'must be at least 1 month')
    .max(MAX_INTERVAL_MONTHS, `must be at most ${MAX_INTERVAL_MONTHS} months`)
    .default(fallback)
    .describe(`Months between reviews of a customer rated ${rating}; default ${fallback}.`);

export const putPolicyBody = z
  .object({
    reviewIntervalMonths: z
      .object({
        LOW: months('LOW', DEFAULT_POLICY.reviewIntervalMonths.LOW),
        MEDIUM: months('MEDIUM', DEFAULT_POLICY.reviewIntervalMonths.MEDIUM),
        HIGH: months('HIGH', DEFAULT_POLICY.reviewIntervalMonths.HIGH),
      })
      .strict()
      .default(DEFAULT_POLICY.reviewIntervalMonths)
      .refine((intervals) => intervals.HIGH <= intervals.MEDIUM && intervals.MEDIUM <= intervals.LOW, {
        message: 'A higher rating must not wait longer: HIGH ≤ MEDIUM ≤ LOW.',
      })
      .describe('Months between reviews per risk rating; a rating left out takes its default.')
      .meta({ example: { LOW: 36, MEDIUM: 24, HIGH: 12 } }),
    eddUsesHighInterval: z
      .boolean({ error: 'must be true or false' })
      .default(DEFAULT_POLICY.eddUsesHighInterval)
      .describe('Whether a customer who needs enhanced due diligence is reviewed at the HIGH interval, whatever its rating; default true.'),
    highRiskJurisdictions: z
      .array(countryCode)
      .max(MAX_JURISDICTIONS, `must list at most ${MAX_JURISDICTIONS} countries`)
      .default(DEFAULT_POLICY.highRiskJurisdictions)
      .transform((codes) => [...new Set(codes)].sort())
      .describe(
        'ISO 3166-1 alpha-3 codes of the countries that call for enhanced due diligence; default the FATF call-for-action list (IRN, MMR, PRK, June 2025).',
      )
      .meta({ example: ['IRN', 'MMR', 'PRK'] }),
    overdueAfterDays: z
      .number({ error: 'must be a whole number of days' })
      .int('must be a whole number of days')
      .min(1, 'must be at least 1 day')
      .max(MAX_OVERDUE_DAYS, `must be at most ${MAX_OVERDUE_DAYS} days`)
      .default(DEFAULT_POLICY.overdueAfterDays)
      .describe('Days a due review may wait before it is OVERDUE; default 30.'),
  })
  .strict()
  .describe('The whole policy: what it leaves out takes its default, as in a first PUT.');
export type PutPolicyBody = z.output<typeof putPolicyBody>;

const intervalsSchema = z.object({
  LOW: z.number().int().describe('Months between reviews of a customer rated LOW.'),
  MEDIUM: z.number().int().describe('Months between reviews of a customer rated MEDIUM.'),
  HIGH: z.number().int().describe('Months between reviews of a customer rated HIGH.'),
});

export const redatingSchema = z
  .object({
    status: z
      .enum(['QUEUED', 'RUNNING', 'DONE'])
      .describe(
        'QUEUED until the background re-dating starts, RUNNING while it works through the records in batches, DONE once all were checked.',
      ),
    scheduled_reviews: z
      .number()
      .int()
      .describe(
        'Scheduled reviews when the policy was set: the reviews whose date the re-dating recomputes (those due already keep theirs).',
      ),
    records_total: z.number().int().describe('Records of the organisation to check (their EDD follows the high-risk jurisdictions too).'),
    records_checked: z.number().int().describe('Records checked so far.'),
    reviews_moved: z.number().int().describe('Records whose review date or EDD changed so far.'),
    finished_at: z.iso.datetime().nullable().describe('When the re-dating finished; null until then.'),
  })
  .describe('The re-dating that the last PUT started; null before the first PUT.')
  .meta({
    example: {
      status: 'RUNNING',
      scheduled_reviews: 1200,
      records_total: 1500,
      records_checked: 500,
      reviews_moved: 310,
      finished_at: null,
    },
  });

export const policySchema = z
  .object({
    object: z.literal('due_diligence_policy').describe('Always due_diligence_policy.'),
    review_interval_months: intervalsSchema.describe('Months between reviews per risk rating.'),
    edd_uses_high_interval: z.boolean().describe('Whether a customer needing enhanced due diligence is reviewed at the HIGH interval.'),
    high_risk_jurisdictions: z.array(z.string()).describe('ISO 3166-1 alpha-3 codes that call for enhanced due diligence, sorted.'),
    overdue_after_days: z.number().int().describe('Days a due review may wait before it is OVERDUE.'),
    updated_at: z.iso.datetime().nullable().describe('When the policy was last set; null while the defaults apply.'),
    redating: redatingSchema.nullable(),
  })
  .describe("The organisation's ongoing due diligence policy.")
  .meta({
    example: {
      object: 'due_diligence_policy',
      review_interval_months: { LOW: 36, MEDIUM: 24, HIGH: 12 },
      edd_uses_high_interval: true,
      high_risk_jurisdictions: ['IRN', 'MMR', 'PRK'],
      overdue_after_days: 30,
      updated_at: '2026-07-01T09:00:00.000Z',
      redating: {
        status: 'DONE',
        scheduled_reviews: 1200,
        records_total: 1500,
        records_checked: 1500,
        reviews_moved: 1180,
        finished_at: '2026-07-01T09:00:04.000Z',
      },
    },
  });
export type PolicyDto = z.infer<typeof policySchema>;
