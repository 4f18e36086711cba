import { errorEnvelopeSchema } from './error-envelope.schema.js';

/**
 * The error statuses a route declares, each answered with the spec's envelope. It is the registered
 * `Error` schema, so the document refers to `#/components/schemas/Error` and the OpenAPI plugin gives
 * each status its standard description naming its `error.code` values (a schema of its own would
 * lend the response its own description, e.g. a bare "Error envelope").
 */
export function errorResponses(...statuses: number[]): Record<number, typeof errorEnvelopeSchema> {
  return Object.fromEntries(statuses.map((status) => [status, errorEnvelopeSchema]));
}
