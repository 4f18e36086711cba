import ipaddr from 'ipaddr.js';
import type { Database } from '../../db/client.js';
import { AppError } from '../../shared/app-error.js';
import { hashApiKey, looksLikeApiKey } from './api-key-secret.js';
import { createApiKeysRepository } from './api-keys.repository.js';

export type AuthContext = {
  apiKeyId: string;
  orgId: string;
  scopes: ReadonlySet<string>;
  features: ReadonlySet<string>;
};

export type RateLimitWindow = { name: 'burst' | 'daily'; limit: number; remaining: number; resetSeconds: number; windowSeconds: number };

export type AccessGrant = { auth: AuthContext; windows: RateLimitWindow[] };

const UNAUTHORIZED_MESSAGE = 'A valid API key is required: send it as "Authorization: Bearer <key>".';

export function unauthorized(): AppError {
  // One message for missing, malformed, unknown, expired, revoked and IP-locked keys: the response
  // must not tell a caller which of those it was.
  return new AppError('unauthorized', 401, UNAUTHORIZED_MESSAGE);
}

/**
 * Turns a socket or proxy-derived address into the form Postgres' inet compares ("::ffff:1.2.3.4" →
 * "1.2.3.4"); null when it is not an address, which no allowlist matches.
 */
function canonicalIp(ip: string | undefined): string | null {
  try {
    return ip ? ipaddr.process(ip).toString() : null;
  } catch {
    return null;
  }
}

/**
 * Authenticates a bearer header and charges the request to the key's rate-limit windows, in one
 * database round trip. Throws 401 for any authentication failure and 429 when a window is spent.
 */
export function createAccessService(deps: { database: Database; defaults: { burst: number; daily: number } }) {
  const keys = createApiKeysRepository(deps.database.db);

  return {
    async authenticate(authorization: string | undefined, clientIp: string | undefined): Promise<AccessGrant> {
      // RFC 9110 §11.1 / RFC 6750 §2.1: `Bearer 1*SP token`, the scheme name case-insensitive;
      // exactly one token must follow it.
      const match = /^Bearer +([^\s]+)$/i.exec(authorization?.trim() ?? '');
      const token = match?.[1];
      if (!token || !looksLikeApiKey(token)) throw unauthorized();
      const row = await keys.authenticate(hashApiKey(token), canonicalIp(clientIp), deps.defaults.burst);
      if (!row || !row.active || !row.ip_allowed || row.burst_count === null || row.day_count === null) {
        throw unauthorized();
      }

      const burstLimit = row.burst_limit ?? deps.defaults.burst;
      const dailyLimit = row.daily_limit ?? deps.defaults.daily;
      const now = row.now_epoch;
      const windows: RateLimitWindow[] = [
        {
          name: 'burst',
          limit: burstLimit,
          remaining: Math.max(0, burstLimit - row.burst_count),
          resetSeconds: Math.max(1, Math.ceil(Math.floor(now) + 1 - now)),
          windowSeconds: 1,
        },
        {
          name: 'daily',
          limit: dailyLimit,
          remaining: Math.max(0, dailyLimit - row.day_count),
          resetSeconds: Math.max(1, Math.ceil((Math.floor(now / 86_400) + 1) * 86_400 - now)),
          windowSeconds: 86_400,
        },
      ];
      const grant: AccessGrant = {
        auth: { apiKeyId: row.id, orgId: row.org_id, scopes: new Set(row.scopes), features: new Set(row.features) },
        windows,
      };
      const burstExceeded = row.burst_count > burstLimit;
      // A burst-refused request is not counted in the day, so a spent day then shows as day_count = limit.
      const dailyExceeded = row.day_count > dailyLimit || (burstExceeded && row.day_count >= dailyLimit);
      // The daily window is reported first: its Retry-After is the one that actually helps.
      if (dailyExceeded) throw new RateLimitedError(grant, windows[1]!);
      if (burstExceeded) throw new RateLimitedError(grant, windows[0]!);
      return grant;
    },
  };
}
export type AccessService = ReturnType<typeof createAccessService>;

export class RateLimitedError extends AppError {
  constructor(
    readonly grant: AccessGrant,
    readonly window: RateLimitWindow,
  ) {
    super('rate_limited', 429, `Rate limit exceeded: ${window.limit} requests per ${window.windowSeconds === 1 ? 'second' : 'day'}.`, {
      limit: window.limit,
      window_seconds: window.windowSeconds,
    });
  }
}
