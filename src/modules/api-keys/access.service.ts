import ipaddr from 'ipaddr.js';
import type pg from 'pg';
import type { Database } from '../../db/client.js';
import { AppError } from '../../shared/app-error.js';
import { hashApiKey, looksLikeApiKey } from './api-key-secret.js';
import { createApiKeysRepository, type AccessCheckRow } from './api-keys.repository.js';

export type AuthContext = {
  apiKeyId: string;
  orgId: string;
  scopes: ReadonlySet<string>;
  features: ReadonlySet<string>;
};

/** What never changes for a key hash: its key, organisation and scopes (a key is revoked, never edited). */
export type KeyIdentity = { apiKeyId: string; orgId: string; scopes: ReadonlySet<string> };

export type RateLimitWindow = { name: 'burst' | 'daily'; limit: number; remaining: number; resetSeconds: number; windowSeconds: number };

export type AccessGrant = { auth: AuthContext; windows: RateLimitWindow[] };

/** A request's access check before it is sent: its statement, and the verdict on that statement's result. */
export type PendingAccessCheck = { statement: pg.QueryConfig; judge(result: pg.QueryResult): AccessGrant };

const UNAUTHORIZED_MESSAGE = 'A valid API key is required: send it as "Authorization: Bearer <key>".';
/** Key identities remembered per process; past this, the oldest is forgotten (it is only a shortcut). */
const MAX_KNOWN_KEYS = 10_000;

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

/** Tokens of a key's windows this instance leased and has not used yet. */
type Lease = { burstWindow: number; burst: number; dayWindow: number; day: number };
/** The tokens one request took from its instance's lease before asking the database. */
type Reservation = { apiKeyId: string | undefined; burstWindow: number; dayWindow: number };

/**
 * Authenticates bearer keys and charges requests to their rate-limit windows. Each request costs
 * one statement (ACCESS_CHECK_SQL): key, revocation, expiry, IP allowlist and features are read
 * every time, so revocation is immediate on every instance. Rate limits are counted in PostgreSQL,
 * shared by all instances, through leases: the instance takes a slice of a window (1% of the
 * limit, at least one token) and admits requests from it locally; the statement writes only when
 * the slice is spent or the window has moved on, and a window never hands out more than its limit.
 */
export function createAccessService(deps: { database: Database; defaults: { burst: number; daily: number } }) {
  const keys = createApiKeysRepository(deps.database.db);
  const known = new Map<string, KeyIdentity>();
  const leases = new Map<string, Lease>();

  function remember(keyHash: string, identity: KeyIdentity): void {
    if (known.has(keyHash)) return;
    if (known.size >= MAX_KNOWN_KEYS) known.delete(known.keys().next().value!);
    known.set(keyHash, identity);
  }

  function reserve(apiKeyId: string | undefined): Reservation {
    const lease = apiKeyId ? leases.get(apiKeyId) : undefined;
    const reservation: Reservation = { apiKeyId, burstWindow: -1, dayWindow: -1 };
    if (lease && lease.burst > 0) {
      lease.burst -= 1;
      reservation.burstWindow = lease.burstWindow;
    }
    if (lease && lease.day > 0) {
      lease.day -= 1;
      reservation.dayWindow = lease.dayWindow;
    }
    return reservation;
  }

  /** Adds tokens granted for `window`; tokens of an older window are worthless and dropped. */
  function keep(lease: Lease, kind: 'burst' | 'day', window: number, tokens: number): void {
    const windowKey = kind === 'burst' ? 'burstWindow' : 'dayWindow';
    if (lease[windowKey] === window) lease[kind] += tokens;
    else if (window > lease[windowKey]) {
      lease[windowKey] = window;
      lease[kind] = tokens;
    }
  }

  function statementFor(keyHash: string, clientIp: string | undefined, reservation: Reservation): pg.QueryConfig {
    return keys.accessCheckStatement({
      keyHash,
      clientIp: canonicalIp(clientIp),
      defaultBurstLimit: deps.defaults.burst,
      defaultDailyLimit: deps.defaults.daily,
      heldBurstWindow: reservation.burstWindow,
      heldDayWindow: reservation.dayWindow,
    });
  }

  function judge(keyHash: string, reservation: Reservation, row: AccessCheckRow | undefined): AccessGrant {
    if (!row || !row.active) known.delete(keyHash);
    if (!row || !row.active || !row.ip_allowed) throw unauthorized();
    remember(keyHash, { apiKeyId: row.id, orgId: row.org_id, scopes: new Set(row.scopes) });

    let lease = leases.get(row.id);
    if (!lease) leases.set(row.id, (lease = { burstWindow: -1, burst: 0, dayWindow: -1, day: 0 }));
    // wanted = 0: the token reserved from the lease is good for the current window. A lease grants
    // nothing when either window it asks for is spent; the spent one is the one refusing.
    const admitted = (row.burst_wanted === 0 || row.burst_granted > 0) && (row.day_wanted === 0 || row.day_granted > 0);
    const dayRefused = !admitted && row.day_wanted > 0 && row.day_count >= row.daily_limit;
    if (row.burst_wanted > 0) keep(lease, 'burst', row.burst_window, row.burst_granted - (admitted ? 1 : 0));
    if (row.day_wanted > 0) keep(lease, 'day', row.day_window, row.day_granted - (admitted ? 1 : 0));
    if (!admitted) {
      // A refused request uses no token: what it reserved goes back.
      if (row.burst_wanted === 0 && lease.burstWindow === reservation.burstWindow) lease.burst += 1;
      if (row.day_wanted === 0 && lease.dayWindow === reservation.dayWindow) lease.day += 1;
    }

    const now = row.now_epoch;
    const held = (window: number, leased: number, tokens: number) => (window === leased ? tokens : 0);
    const windows: RateLimitWindow[] = [
      {
        name: 'burst',
        limit: row.burst_limit,
        remaining: Math.max(0, row.burst_limit - row.burst_count) + held(row.burst_window, lease.burstWindow, lease.burst),
        resetSeconds: Math.max(1, Math.ceil(Math.floor(now) + 1 - now)),
        windowSeconds: 1,
      },
      {
        name: 'daily',
        limit: row.daily_limit,
        remaining: Math.max(0, row.daily_limit - row.day_count) + held(row.day_window, lease.dayWindow, lease.day),
        resetSeconds: Math.max(1, Math.ceil((Math.floor(now / 86_400) + 1) * 86_400 - now)),
        windowSeconds: 86_400,
      },
    ];
    const grant: AccessGrant = {
      auth: { apiKeyId: row.id, orgId: row.org_id, scopes: new Set(row.scopes), features: new Set(row.features) },
      windows,
    };
    // The daily window is reported first: its Retry-After is the one that actually helps.
    if (dayRefused) throw new RateLimitedError(grant, windows[1]!);
    if (!admitted) throw new RateLimitedError(grant, windows[0]!);
    return grant;
  }

  return {
    /**
     * The key hash of a bearer header. RFC 9110 §11.1 / RFC 6750 §2.1: `Bearer 1*SP token`, the
     * scheme name case-insensitive; exactly one token must follow it. Throws 401 otherwise.
     */
    keyHashOf(authorization: string | undefined): string {
      const token = /^Bearer +([^\s]+)$/i.exec(authorization?.trim() ?? '')?.[1];
      if (!token || !looksLikeApiKey(token)) throw unauthorized();
      return hashApiKey(token);
    },

    /** The key, organisation and scopes of a hash this process has seen authenticate, if any. */
    identityOf(keyHash: string): KeyIdentity | undefined {
      return known.get(keyHash);
    },

    /** Runs the access check now. Throws 401 for any authentication failure and 429 when a window is spent. */
    async authenticate(keyHash: string, clientIp: string | undefined): Promise<AccessGrant> {
      const reservation = reserve(known.get(keyHash)?.apiKeyId);
      const result = await deps.database.pool.query<AccessCheckRow>(statementFor(keyHash, clientIp, reservation));
      return judge(keyHash, reservation, result.rows[0]);
    },

    /**
     * The access check of a known key, to be sent ahead of the request's first statement. Its
     * verdict throws like `authenticate`.
     */
    pendingCheck(keyHash: string, clientIp: string | undefined): PendingAccessCheck {
      const reservation = reserve(known.get(keyHash)?.apiKeyId);
      return {
        statement: statementFor(keyHash, clientIp, reservation),
        judge: (result) => judge(keyHash, reservation, result.rows[0] as AccessCheckRow | undefined),
      };
    },

    /** Gives leased, unused tokens back (at shutdown), so a restart does not shrink anyone's day. */
    async returnLeases(): Promise<void> {
      for (const [apiKeyId, lease] of leases) {
        if (lease.burst === 0 && lease.day === 0) continue;
        await keys.returnLeasedTokens({ apiKeyId, ...lease });
      }
      leases.clear();
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
