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

const IDEMPOTENT_METHODS = new Set(['POST', 'PATCH', 'PUT', 'DELETE']);

/**
 * A random (version 4) UUID from the Web Crypto API, which browsers, Node 20+, Deno and Bun all
 * provide as `globalThis.crypto`: no Node built-in, so the client runs in a browser too. Browsers
 * offer `crypto.randomUUID()` only to pages served over HTTPS or from localhost; elsewhere the UUID
 * is built from `crypto.getRandomValues()`, which every context has.
 */
export function randomUUID(): string {
  const webCrypto = globalThis.crypto;
  if (typeof webCrypto?.randomUUID === 'function') return webCrypto.randomUUID();
  const bytes = webCrypto.getRandomValues(new Uint8Array(16));
  bytes[6] = (bytes[6]! & 0x0f) | 0x40; // version 4
  bytes[8] = (bytes[8]! & 0x3f) | 0x80; // RFC 9562 variant
  const hex = Array.from(bytes, (byte) => byte.toString(16).padStart(2, '0')).join('');
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

/**
 * Gives every POST, PATCH, PUT and DELETE an `Idempotency-Key` unless the caller set one, so a request
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
