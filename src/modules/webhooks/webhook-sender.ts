import http from 'node:http';
import https from 'node:https';
import { isIP } from 'node:net';
import { Webhook } from 'standardwebhooks';
import { guardedLookup, nonPublicRange, portProblem, type ResolveHost, type WebhookTargetPolicy } from './endpoint-url.js';

export const DEFAULT_REQUEST_TIMEOUT_MS = 15_000;
/** Response bytes read (and discarded) to keep the connection reusable; more and the socket is dropped. */
const MAX_DRAINED_RESPONSE_BYTES = 64 * 1024;

export type SignedHeaders = {
  'webhook-id': string;
  'webhook-timestamp': string;
  'webhook-signature': string;
};

/**
 * Standard Webhooks signature: `v1,` + base64 HMAC-SHA256 over `${id}.${timestamp}.${body}`, keyed by
 * the base64-decoded part of the `whsec_` secret. Signed with the reference library so any Standard
 * Webhooks verifier accepts it.
 */
function signWebhook(secret: string, id: string, timestampSeconds: number, body: string, previousSecret?: string | null): SignedHeaders {
  const at = new Date(timestampSeconds * 1000);
  const signatures = [new Webhook(secret).sign(id, at, body)];
  // During a rotation's grace the old secret signs too, space separated as Standard Webhooks allows:
  // a receiver still holding it verifies, and one that already switched does as well.
  if (previousSecret) signatures.push(new Webhook(previousSecret).sign(id, at, body));
  return { 'webhook-id': id, 'webhook-timestamp': String(timestampSeconds), 'webhook-signature': signatures.join(' ') };
}

/** `Retry-After` as delay-seconds or an HTTP date; `null` when absent or unreadable. */
export function parseRetryAfter(value: string | undefined, nowMs: number): number | null {
  if (value === undefined) return null;
  const trimmed = value.trim();
  if (/^\d+$/.test(trimmed)) return Number(trimmed) * 1000;
  const at = Date.parse(trimmed);
  if (Number.isNaN(at)) return null;
  return Math.max(0, at - nowMs);
}

export type SendResult = {
  statusCode: number | null;
  retryAfterMs: number | null;
  error: string | null;
  latencyMs: number;
  /** True when the worker aborted the request itself (shutdown), not the receiver or the network. */
  aborted: boolean;
};

export type SendRequest = {
  url: string;
  secret: string;
  /** The secret a rotation replaced, while its grace lasts: it signs too. */
  previousSecret?: string | null;
  eventId: string;
  payload: string;
  signal?: AbortSignal;
};

/**
 * Posts signed payloads. Redirects are never followed (Node's http client does not follow them), so
 * a 3xx is just a failed attempt; the whole exchange must finish within the timeout. The target rules
 * of registration are applied again here, to the port and to every address the socket may connect
 * to: the configuration may have changed since, and a DNS answer may have (rebinding).
 */
export function createWebhookSender(options: WebhookTargetPolicy & { timeoutMs?: number; userAgent?: string; resolveHost?: ResolveHost }) {
  const timeoutMs = options.timeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
  const policy: WebhookTargetPolicy = { allowPrivateUrls: options.allowPrivateUrls, allowedPorts: options.allowedPorts };
  const lookup = guardedLookup(policy, options.resolveHost);
  const agentOptions = { keepAlive: true, maxSockets: 64, lookup };
  const httpsAgent = new https.Agent(agentOptions);
  const httpAgent = new http.Agent(agentOptions);
  const userAgent = options.userAgent ?? 'svc-webhooks/1';

  function refuse(message: string, startedAt: number): SendResult {
    return { statusCode: null, retryAfterMs: null, error: message, latencyMs: Math.round(performance.now() - startedAt), aborted: false };
  }

  return {
    send(request: SendRequest): Promise<SendResult> {
      const startedAt = performance.now();
      let url: URL;
      try {
        url = new URL(request.url);
      } catch {
        return Promise.resolve(refuse('endpoint URL is not a valid URL', startedAt));
      }
      const isHttps = url.protocol === 'https:';
      if (!isHttps && !(options.allowPrivateUrls && url.protocol === 'http:')) {
        return Promise.resolve(refuse(`refused: ${url.protocol} endpoints are not allowed (https only)`, startedAt));
      }
      const badPort = portProblem(url, policy);
      if (badPort) return Promise.resolve(refuse(`refused: ${badPort}`, startedAt));
      const host = url.hostname.startsWith('[') ? url.hostname.slice(1, -1) : url.hostname;
      // Node connects to IP literals without a lookup, so they are checked here.
      const range = !options.allowPrivateUrls && isIP(host) ? nonPublicRange(host) : undefined;
      if (range !== undefined) return Promise.resolve(refuse(`refused: ${host} is not a public address (${range})`, startedAt));
      const body = Buffer.from(request.payload, 'utf8');
      const timestamp = Math.floor(Date.now() / 1000);
      const signed = signWebhook(request.secret, request.eventId, timestamp, request.payload, request.previousSecret);
      const headers = {
        'content-type': 'application/json',
        'content-length': String(body.length),
        'user-agent': userAgent,
        'svc-event-id': request.eventId,
        ...signed,
      };

      // A kept-alive connection the receiver closed while idle fails at once on reuse; that is not the
      // receiver's answer, so the request goes out once more on a fresh connection.
      const exchange = (retryStaleConnection: boolean): Promise<SendResult> =>
        new Promise<SendResult>((resolve) => {
          let settled = false;
          let aborted = false;
          // The status line, once it has arrived: kept when the exchange is cut afterwards (timeout), so
          // the delivery log shows that the receiver did answer, and how.
          let answer: { statusCode: number; retryAfterMs: number | null } | null = null;
          const finish = (result: Omit<SendResult, 'latencyMs' | 'aborted'>) => {
            if (settled) return;
            settled = true;
            clearTimeout(timer);
            request.signal?.removeEventListener('abort', onAbort);
            resolve({ ...result, latencyMs: Math.round(performance.now() - startedAt), aborted });
          };
          const outgoing = (isHttps ? https : http).request(url, {
            method: 'POST',
            headers,
            agent: isHttps ? httpsAgent : httpAgent,
            lookup,
          });
          const timer = setTimeout(() => outgoing.destroy(new Error(`timed out after ${timeoutMs} ms`)), timeoutMs);
          const onAbort = () => {
            aborted = true;
            outgoing.destroy(new Error('aborted: the worker stopped before a response'));
          };
          if (request.signal?.aborted) onAbort();
          else request.signal?.addEventListener('abort', onAbort, { once: true });

          outgoing.on('error', (error: NodeJS.ErrnoException) => {
            const stale = outgoing.reusedSocket && (error.code === 'ECONNRESET' || error.code === 'EPIPE');
            if (stale && retryStaleConnection && !aborted && !settled) {
              settled = true;
              clearTimeout(timer);
              request.signal?.removeEventListener('abort', onAbort);
              resolve(exchange(false));
              return;
            }
            finish(
              answer
                ? { ...answer, error: `HTTP ${answer.statusCode}; ${error.message}` }
                : { statusCode: null, retryAfterMs: null, error: error.message },
            );
          });
          outgoing.on('response', (response) => {
            const statusCode = response.statusCode ?? 0;
            const retryAfter = response.headers['retry-after'];
            const retryAfterMs = parseRetryAfter(Array.isArray(retryAfter) ? retryAfter[0] : retryAfter, Date.now());
            const location = response.headers.location;
            answer = { statusCode, retryAfterMs };
            const error =
              statusCode >= 200 && statusCode < 300
                ? null
                : statusCode >= 300 && statusCode < 400
                  ? `redirect not followed (HTTP ${statusCode}${location ? ` to ${location}` : ''})`
                  : `HTTP ${statusCode}`;
            let drained = 0;
            response.on('data', (chunk: Buffer) => {
              drained += chunk.length;
              if (drained > MAX_DRAINED_RESPONSE_BYTES) {
                response.destroy();
                finish({ statusCode, retryAfterMs, error });
              }
            });
            response.on('end', () => finish({ statusCode, retryAfterMs, error }));
            // A response that breaks off or outlives the timeout is not a success.
            response.on('error', (failure) =>
              finish({ statusCode, retryAfterMs, error: `${error ?? `HTTP ${statusCode}`}; response failed: ${failure.message}` }),
            );
            response.on('close', () => {
              if (!response.complete) finish({ statusCode, retryAfterMs, error: error ?? `HTTP ${statusCode}; response incomplete` });
            });
          });
          outgoing.end(body);
        });
      return exchange(true);
    },

    close(): void {
      httpsAgent.destroy();
      httpAgent.destroy();
    },
  };
}
