import { randomUUID } from 'node:crypto';
import createClient, { type Client, type Middleware } from 'openapi-fetch';
import type { paths } from './schema.js';

export type { components, paths } from './schema.js';

export type VerificationClientOptions = {
  /** The API's base address, ending in `/v1`, e.g. `https://api.example.com/v1`. */
  baseUrl: string;
  /** An API key `svc_live_…`. */
  apiKey: string;
  /** A custom fetch (tests, proxies); defaults to the global one. */
  fetch?: (request: Request) => Promise<Response>;
};

const IDEMPOTENT_METHODS = new Set(['POST', 'PATCH', 'PUT']);

/**
 * Gives every POST, PATCH and PUT an `Idempotency-Key` unless the caller set one, so a request
 * retried after a timeout replays the first answer instead of repeating the change. To retry by
 * hand, pass the same key yourself in `headers`.
 */
export const idempotencyKeys: Middleware = {
  onRequest({ request }) {
    if (IDEMPOTENT_METHODS.has(request.method) && !request.headers.has('Idempotency-Key')) {
      request.headers.set('Idempotency-Key', randomUUID());
    }
    return request;
  },
};

/** A client typed from `openapi/openapi.json` (paths, parameters, bodies, responses and the error envelope). */
export function createVerificationClient(options: VerificationClientOptions): Client<paths> {
  const client = createClient<paths>({
    baseUrl: options.baseUrl.replace(/\/+$/, ''),
    headers: { Authorization: `Bearer ${options.apiKey}` },
    ...(options.fetch ? { fetch: options.fetch } : {}),
  });
  client.use(idempotencyKeys);
  return client;
}
