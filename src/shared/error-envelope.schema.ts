import { z } from 'zod';

/**
 * The spec's error envelope. Registered under the id `Error`, so the OpenAPI document holds it once
 * as `#/components/schemas/Error` and every error response (declared by a route or added by the
 * OpenAPI plugin) refers to it.
 */
export const errorEnvelopeSchema = z
  .object({
    error: z
      .object({
        code: z.string().describe('Stable, machine-readable error code, e.g. `validation_failed`.'),
        message: z.string().describe('Human-readable explanation; may change, do not parse it.'),
        details: z
          .record(z.string(), z.unknown())
          .optional()
          .describe(
            'Extra information for some codes: `issues` (field path → messages) for `validation_failed`, ' +
              '`required_scope` for `forbidden_scope`, `limit` and `window_seconds` for `rate_limited`.',
          ),
      })
      .strict(),
  })
  .strict()
  .meta({
    id: 'Error',
    description: 'Every error response uses this envelope.',
    examples: [
      {
        error: {
          code: 'validation_failed',
          message: 'The request is invalid.',
          details: { issues: { email: ['Invalid email address'] } },
        },
      },
    ],
  });
