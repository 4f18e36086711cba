import { z } from 'zod';

/** The error envelope, declared on every error status of every route (and so in the OpenAPI document). */
export const errorEnvelopeSchema = z
  .object({
    error: z.object({
      code: z.string().describe('Stable machine-readable code, e.g. validation_failed.'),
      message: z.string().describe('Human-readable explanation.'),
      details: z.record(z.string(), z.unknown()).optional(),
    }),
  })
  .describe('Error envelope');

export function errorResponses(...statuses: number[]): Record<number, typeof errorEnvelopeSchema> {
  return Object.fromEntries(statuses.map((status) => [status, errorEnvelopeSchema]));
}
