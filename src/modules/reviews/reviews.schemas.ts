import { z } from 'zod';
import { limitParam } from '../../shared/request-params.js';
import { REVIEW_OUTCOMES, REVIEW_REASONS, REVIEW_STATUSES } from '../customers/review-model.js';

export const MAX_NOTES = 5000;
export const MAX_REVIEWER = 200;

const dateTime = z.string().describe('ISO 8601 date-time (UTC).').meta({ example: '2026-01-31T09:00:00.000Z' });

export const recordReviewBody = z
  .object({
    outcome: z
      .enum(REVIEW_OUTCOMES, { error: `Must be one of ${REVIEW_OUTCOMES.join(', ')}.` })
      .describe(
        'What the review concluded: NO_CHANGE (nothing to update), UPDATED (the information on record was brought up to date), ESCALATED (referred for enhanced due diligence or to the compliance officer), EXITED (the relationship is being ended).',
      )
      .meta({ example: 'NO_CHANGE' }),
    notes: z
      .string({ error: 'Must be text.' })
      .trim()
      .max(MAX_NOTES, `At most ${MAX_NOTES} characters.`)
      .optional()
      .describe(`What was reviewed and found; up to ${MAX_NOTES} characters, line breaks allowed.`)
      .meta({ example: 'Confirmed address and occupation; no change in risk.' }),
    reviewer: z
      .string({ error: 'Must be text.' })
      .trim()
      .min(1, 'Must not be empty.')
      .max(MAX_REVIEWER, `At most ${MAX_REVIEWER} characters.`)
      .describe('The name of the person who did the review.')
      .meta({ example: 'Sam Officer' }),
  })
  .strict()
  .describe('A completed review of the record.');
export type RecordReviewBody = z.output<typeof recordReviewBody>;

export const listReviewsQuery = z
  .object({
    limit: limitParam,
    cursor: z.string().max(1024).optional().describe('Opaque next_cursor of the previous page.'),
  })
  .strict();
export type ListReviewsQuery = z.infer<typeof listReviewsQuery>;

export const reviewSchema = z
  .object({
    object: z.literal('review').describe('Always review.'),
    id: z.uuid().describe('The review id.'),
    customer_id: z.uuid().describe('The customer or entity reviewed.'),
    outcome: z.enum(REVIEW_OUTCOMES).describe('What the review concluded.'),
    notes: z.string().nullable().describe('What was reviewed and found; null when none were given.'),
    reviewer: z.string().describe('Who did the review.'),
    reasons: z
      .array(z.enum(REVIEW_REASONS))
      .describe('Why the review was due when it was recorded; empty when it was recorded ahead of its date.')
      .meta({ example: ['SCHEDULED_DATE'] }),
    status_before: z
      .enum(REVIEW_STATUSES)
      .describe("The record's review status when the review was recorded: SCHEDULED (ahead of its date), DUE or OVERDUE."),
    next_review_at: dateTime.nullable().describe('The next review this one scheduled, from the policy.'),
    created_at: dateTime.describe("When the review was recorded: the record's review.last_completed_at then."),
  })
  .describe('A review recorded on a customer or entity (ongoing due diligence).')
  .meta({
    example: {
      object: 'review',
      id: '0b6a3c1e-5d2f-4e8a-9c7b-1a2b3c4d5e6f',
      customer_id: '3f0c2b1a-9d8e-4c7b-a6f5-0e1d2c3b4a59',
      outcome: 'NO_CHANGE',
      notes: 'Confirmed address and occupation; no change in risk.',
      reviewer: 'Sam Officer',
      reasons: ['SCHEDULED_DATE'],
      status_before: 'DUE',
      next_review_at: '2028-07-01T09:00:00.000Z',
      created_at: '2026-07-01T09:00:00.000Z',
    },
  });
export type ReviewDto = z.infer<typeof reviewSchema>;
