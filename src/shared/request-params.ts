import { z } from 'zod';
import { dateTimeSchema } from './dates.schema.js';

/** A record in the path: its UUID or the caller's external_id. */
export const idParams = z.object({ id: z.string().min(1).max(255).describe('The customer UUID or your external_id.') }).strict();

/** A whole number in the query string, clamped to 1..100; anything else is left for the schema to refuse. */
const clampLimit = (value: unknown) =>
  typeof value === 'string' && /^-?\d+$/.test(value) ? Math.min(100, Math.max(1, Number(value))) : value;

// The query string arrives as text; the document (which shows what a request sends) types it as the
// integer it stands for: the input side of a preprocess is the schema after it.
/** `limit` of every list. */
export const limitParam = z
  .preprocess(clampLimit, z.int({ error: 'Must be a whole number.' }).min(1).max(100).meta({ default: 50 }))
  .optional()
  .describe('Page size 1 to 100, default 50; a whole number outside the range is clamped to it.');

/** `created_after` and `created_before` of the feeds (events, audit events). */
export const createdBetweenParams = {
  created_after: dateTimeSchema()
    .optional()
    .describe('Only events created strictly after this instant (ISO 8601).')
    .meta({ example: '2026-01-31T09:00:00Z' }),
  created_before: dateTimeSchema()
    .optional()
    .describe('Only events created strictly before this instant (ISO 8601).')
    .meta({ example: '2026-02-28T09:00:00Z' }),
};
