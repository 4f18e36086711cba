import ipaddr from 'ipaddr.js';
import type pg from 'pg';
import type { Database } from '../../db/client.js';
import { AppError } from '../../shared/app-error.js';
import { systemClock, type Clock } from '../../shared/clock.js';
import { hashApiKey, looksLikeApiKey } from './api-key-secret.js';
import { accessCheckRowOf, createApiKeysRepository, type AccessCheckRow } from './api-keys.repository.js';

export type AuthContext = {
  apiKeyId: string;
  orgId: string;
  scopes: ReadonlySet<string>;
  features: ReadonlySet<string>;
};

/** What never changes for a key hash: its key, organisation and scopes (a key is revoked, never edited). */
type KeyIdentity = { apiKeyId: string; orgId: string; scopes: ReadonlySet<string> };

export type RateLimitWindow = { name: 'burst' | 'daily'; limit: number; remaining: number; resetSeconds: number; windowSeconds: number };

export type AccessGrant = { auth: AuthContext; windows: RateLimitWindow[] };

/** A request's access check before it is sent: its statement, and the verdict on that statement's answer. */
type PendingAccessCheck = {
  statement: pg.QueryConfig;
  /**
   * The grant, or throws the denial. Undefined only for a read-only check that found the windows had
   * moved on, or a lease refused only for its day top-up: send `fullCheck()` instead.
   */
  judge(result: pg.QueryResult): AccessGrant | undefined;
  /** The same check as the full one, which leases tokens of the current windows. */
  fullCheck(): PendingAccessCheck;
};

const UNAUTHORIZED_MESSAGE = 'A valid API key is required: send it as "Authorization: Bearer <key>".';
/** Key identities remembered per process; past this, the oldest is forgotten (it is only a shortcut). */
const MAX_KNOWN_KEYS = 10_000;

export function unauthorized(): AppError {
  // One message for missing, malformed, unknown, expired, revoked and IP-locked keys: the response
  // must not tell a caller which of those it was.
  return new AppError('unauthorized', 401, UNAUTHORIZED_MESSAGE);
}

/** `map.set`, first dropping the oldest entry when `map` already holds `max`: caches keyed by what clients send stay bounded. */
function setBounded<K, V>(map: Map<K, V>, max: number, key: K, value: V): void {
  if (map.size >= max) map.delete(map.keys().next().value!);
  map.set(key, value);
}

/** Canonical forms of recently seen client addresses: clients are few, and parsing one costs more than the lookup. */
const canonicalIps = new Map<string, string | null>();
const MAX_CANONICAL_IPS = 1_000;

/**
 * Turns a socket or proxy-derived address into the form Postgres' inet compares ("::ffff:1.2.3.4" →
 * "1.2.3.4"); null when it is not an address, which no allowlist matches.
 */
function canonicalIp(ip: string | undefined): string | null {
  if (!ip) return null;
  let canonical = canonicalIps.get(ip);
  if (canonical === undefined) {
    try {
      canonical = ipaddr.process(ip).toString();
    } catch {
      canonical = null;
    }
    setBounded(canonicalIps, MAX_CANONICAL_IPS, ip, canonical);
  }
  return canonical;
}

/**
 * Tokens of a key's windows this instance leased and has not used yet, whether a request asking for
 * a slice of a window is on its way (one at a time: the others ask for one token each, so requests
 * arriving together cannot lease a window many times over), and the instance's demand for the key.
 */
type Lease = {
  apiKeyId: string | undefined;
  orgId: string | undefined;
  burstWindow: number;
  burst: number;
  dayWindow: number;
  day: number;
  burstSliceAsked: boolean;
  daySliceAsked: boolean;
  /** The database's clock less this process's (seconds), as of the last check: predicts when the windows move on. */
  clockOffset: number;
  /** Requests this instance admitted in burst window `admittedWindow`, and in the two windows before it. */
  admittedWindow: number;
  admitted: number;
  admittedBefore: number;
  admittedTwoBefore: number;
  /** When (database clock, seconds) the first of `admitted`, and of `admittedBefore`, was admitted. */
  firstAdmittedAt: number;
  firstAdmittedBefore: number;
};
/** The tokens one request took from its instance's lease before asking the database, and what it asks for. */
type Reservation = {
  burstWindow: number;
  dayWindow: number;
  /** Burst tokens this request leases for the instance (its demand, at least 1), or 0: one token, for itself. */
  burstAsk: number;
  /** This request tops up the instance's day tokens (one top-up at a time per key). */
  dayTopUp: boolean;
  /** Tokens the instance held beyond the reserved ones when the request was sent. */
  burstHeld: number;
  dayHeld: number;
  /** Tokens of both windows were held, and by the database's clock (as last seen) they are still the current ones: the check need not write. */
  readOnly: boolean;
};

/**
 * Burst tokens to lease now: the instance's expected demand for the rest of the current second.
 * At the start of a second, the more it admitted in either of the two seconds before (the last one
 * carried to the whole second when its traffic started late in it), plus an eighth (at least one):
 * steady traffic jitters from second to second, and a second that a stall thinned out should not
 * make the next one lease twice. One write per key and second. When that is spent
 * before the second ends (demand grew, or nothing is known yet), the rate of this second so far,
 * carried to the second's end, but at most twice what was admitted in it so far: a ramp costs a few
 * writes (about log2 of the rate in a key's first second on an instance), not one per request, and
 * an estimate from two close requests cannot take the window from the other instances. Demand is
 * measured by what was admitted, so an instance cannot claim more than it served (plus the margin).
 */
function burstDemand(lease: Lease, databaseNow: number): number {
  const window = Math.floor(databaseNow);
  const current = lease.admittedWindow === window ? lease.admitted : 0;
  const [before, firstBefore, twoBefore] =
    lease.admittedWindow === window
      ? [lease.admittedBefore, lease.firstAdmittedBefore, lease.admittedTwoBefore]
      : lease.admittedWindow === window - 1
        ? [lease.admitted, lease.firstAdmittedAt, lease.admittedBefore]
        : lease.admittedWindow === window - 2
          ? [0, 0, lease.admitted]
          : [0, 0, 0];
  // The part of that second its traffic spanned, when it started in the second's last quarters
  // (traffic that began mid-second): a steady stream's first request of a second comes early in it.
  const spanned = Math.floor(firstBefore) + 1 - firstBefore;
  const rateBefore = Math.max(spanned < 0.75 ? Math.ceil(before / Math.max(0.1, spanned)) : before, twoBefore);
  const expected = rateBefore + Math.ceil(rateBefore / 8);
  if (current === 0) return Math.max(1, expected);
  const rate = current / Math.max(databaseNow - lease.firstAdmittedAt, 0.001);
  return Math.max(1, expected - current, Math.min(Math.ceil(rate * (window + 1 - databaseNow)) + 1, 2 * current));
}

/** Counts a request admitted in burst window `window` at `at` (database clock). */
function noteAdmitted(lease: Lease, window: number, at: number): void {
  if (window === lease.admittedWindow) {
    lease.admitted += 1;
    return;
  }
  if (window < lease.admittedWindow) return;
  const adjacent = window === lease.admittedWindow + 1;
  lease.admittedTwoBefore = adjacent ? lease.admittedBefore : window === lease.admittedWindow + 2 ? lease.admitted : 0;
  lease.admittedBefore = adjacent ? lease.admitted : 0;
  lease.firstAdmittedBefore = adjacent ? lease.firstAdmittedAt : 0;
  lease.admittedWindow = window;
  lease.admitted = 1;
  lease.firstAdmittedAt = at;
}

/**
 * Authenticates bearer keys and charges requests to their rate-limit windows. Each request costs
 * one statement (ACCESS_CHECK_SQL): key, revocation, expiry, IP allowlist and features are read
 * every time, so revocation is immediate on every instance. Rate limits are counted in PostgreSQL,
 * shared by all instances, through leases: the instance takes a slice of a window sized by its own
 * recent demand for the key (burstDemand; at least 1% of the limit) and admits requests from it
 * locally; the statement writes only when the slice is spent or the window has moved on, and a
 * window never hands out more than its limit. The day's tokens are topped up in the same write. While
 * the instance holds tokens of both windows that are current by the database's clock (as last seen,
 * see Lease.clockOffset), the check is a read-only variant; when the window moved on meanwhile, its
 * verdict asks the full check.
 */
export function createAccessService(deps: {
  database: Pick<Database, 'query' | 'db'>;
  defaults: { burst: number; daily: number };
  clock?: Clock;
}) {
  const clock = deps.clock ?? systemClock;
  /** This process's clock, in seconds (the database's is `now_epoch`). */
  const nowSeconds = () => clock.now().getTime() / 1000;
  const keys = createApiKeysRepository();
  const known = new Map<string, KeyIdentity>();
  const leases = new Map<string, Lease>();

  const featureSets = new Map<string, ReadonlySet<string>>();

  function identify(keyHash: string, row: AccessCheckRow): KeyIdentity {
    let identity = known.get(keyHash);
    if (!identity) {
      identity = { apiKeyId: row.id, orgId: row.org_id, scopes: new Set(row.scopes) };
      setBounded(known, MAX_KNOWN_KEYS, keyHash, identity);
    }
    return identity;
  }

  /** One shared set per distinct feature list: organisations have a handful of combinations. */
  function featureSet(features: string[]): ReadonlySet<string> {
    const key = features.join(',');
    let set = featureSets.get(key);
    if (!set) featureSets.set(key, (set = new Set(features)));
    return set;
  }

  function leaseOf(keyHash: string): Lease {
    let lease = leases.get(keyHash);
    if (!lease) {
      lease = {
        apiKeyId: undefined,
        orgId: undefined,
        burstWindow: -1,
        burst: 0,
        dayWindow: -1,
        day: 0,
        burstSliceAsked: false,
        daySliceAsked: false,
        clockOffset: 0,
        admittedWindow: -1,
        admitted: 0,
        admittedBefore: 0,
        admittedTwoBefore: 0,
        firstAdmittedAt: 0,
        firstAdmittedBefore: 0,
      };
      leases.set(keyHash, lease);
    }
    return lease;
  }

  function reserve(keyHash: string): Reservation {
    const lease = leaseOf(keyHash);
    const databaseNow = nowSeconds() + lease.clockOffset;
    // Tokens of a window that has passed are worthless: dropped here, so the first request of a new
    // second leases a whole slice instead of one token that only finds out they are stale.
    if (Math.floor(databaseNow) > lease.burstWindow) lease.burst = 0;
    if (Math.floor(databaseNow / 86_400) > lease.dayWindow) lease.day = 0;
    const reservation: Reservation = {
      burstWindow: -1,
      dayWindow: -1,
      burstAsk: 0,
      dayTopUp: false,
      burstHeld: 0,
      dayHeld: 0,
      readOnly: false,
    };
    if (lease.burst > 0) {
      lease.burst -= 1;
      reservation.burstWindow = lease.burstWindow;
    } else if (!lease.burstSliceAsked) {
      lease.burstSliceAsked = true;
      reservation.burstAsk = burstDemand(lease, databaseNow);
    }
    if (lease.day > 0) {
      lease.day -= 1;
      reservation.dayWindow = lease.dayWindow;
    }
    // The day is topped up only by a request that writes anyway: one asking a burst slice, or one
    // that needs a day token of its own.
    if (!lease.daySliceAsked && (reservation.burstAsk > 0 || reservation.dayWindow < 0)) lease.daySliceAsked = reservation.dayTopUp = true;
    reservation.burstHeld = lease.burst;
    reservation.dayHeld = lease.day;
    if (reservation.burstWindow >= 0 && reservation.dayWindow >= 0) {
      reservation.readOnly =
        Math.floor(databaseNow) === reservation.burstWindow && Math.floor(databaseNow / 86_400) === reservation.dayWindow;
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
      burstAsk: reservation.burstAsk,
      dayTopUp: reservation.dayTopUp,
      burstHeld: reservation.burstHeld,
      dayHeld: reservation.dayHeld,
      readOnly: reservation.readOnly,
    });
  }

  /** The grant, or throws the denial; undefined: send the same check again without the day's top-up. */
  function judge(keyHash: string, reservation: Reservation, row: AccessCheckRow | undefined, sentAt: number): AccessGrant | undefined {
    const lease = leaseOf(keyHash);
    if (reservation.burstAsk > 0) lease.burstSliceAsked = false;
    if (reservation.dayTopUp) lease.daySliceAsked = false;
    if (!row || !row.active) {
      // Nothing is kept for a hash that names no usable key: made-up keys cannot grow these maps.
      known.delete(keyHash);
      leases.delete(keyHash);
    }
    if (!row || !row.active || !row.ip_allowed) throw unauthorized();
    const identity = identify(keyHash, row);
    lease.apiKeyId = row.id;
    lease.orgId = row.org_id;
    // The database read its clock between sending and answering: the midpoint halves the error.
    lease.clockOffset = row.now_epoch - (sentAt + nowSeconds()) / 2;

    // wanted = 0: the token reserved from the lease is good for the current window. Otherwise the
    // database was asked: a lease is all or nothing across the two windows, so a grant admits the
    // request on its own tokens (whatever the lease meanwhile holds) and the rest joins the lease.
    // A day token asked only to top up the lease is not this request's: it holds its own.
    // When the database had nothing left, tokens that requests in flight together brought back may
    // still serve it.
    const needsBurst = row.burst_wanted > 0;
    const needsDay = row.day_wanted > 0 && reservation.dayWindow !== row.day_window;
    const granted = needsBurst ? row.burst_granted > 0 : row.day_wanted === 0 || row.day_granted > 0;
    let burstOk = true;
    let dayOk = true;
    if (granted) {
      if (needsBurst) keep(lease, 'burst', row.burst_window, row.burst_granted - 1);
      if (row.day_wanted > 0) keep(lease, 'day', row.day_window, row.day_granted - (needsDay ? 1 : 0));
    } else {
      // Refused only because the top-up found the day spent between reading its count and locking
      // its row (the burst had room, and this request holds its own day token): ask again without it.
      if (reservation.dayTopUp && needsBurst && !needsDay && row.burst_count < row.burst_limit) {
        return undefined;
      }
      burstOk = !needsBurst || (lease.burst > 0 && lease.burstWindow >= row.burst_window);
      dayOk = !needsDay || (lease.day > 0 && lease.dayWindow >= row.day_window);
      if (burstOk && dayOk) {
        if (needsBurst) lease.burst -= 1;
        if (needsDay) lease.day -= 1;
      } else {
        // A refused request uses no token: what it reserved goes back.
        if (!needsBurst && lease.burstWindow === reservation.burstWindow) lease.burst += 1;
        if (!needsDay && lease.dayWindow === reservation.dayWindow) lease.day += 1;
      }
    }
    const admitted = burstOk && dayOk;
    if (admitted) noteAdmitted(lease, row.burst_window, row.now_epoch);
    // A lease grants nothing when either window it asks for is spent: the spent one is the refusal.
    const dayRefused = !dayOk && row.day_count >= row.daily_limit;

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
      auth: { apiKeyId: identity.apiKeyId, orgId: identity.orgId, scopes: identity.scopes, features: featureSet(row.features) },
      windows,
    };
    // The daily window is reported first: its Retry-After is the one that actually helps.
    if (dayRefused) throw new RateLimitedError(grant, windows[1]!);
    if (!admitted) throw new RateLimitedError(grant, windows[0]!);
    return grant;
  }

  /**
   * A check with a token reserved from the lease: its statement, and the verdict on that statement's
   * answer (the caller sends it; answers of checks in flight together may come back in any order).
   */
  function pendingCheck(keyHash: string, clientIp: string | undefined, reservation: Reservation = reserve(keyHash)): PendingAccessCheck {
    const sentAt = nowSeconds();
    let next: Reservation = { ...reservation, readOnly: false, dayTopUp: false };
    return {
      statement: statementFor(keyHash, clientIp, reservation),
      judge(result) {
        const row = accessCheckRowOf(result);
        // The windows moved on between reserving and checking: the full check leases the new ones,
        // a whole slice by the instance's demand as of the database's clock (one token would only
        // make the next request lease again).
        if (reservation.readOnly && row && (row.burst_wanted > 0 || row.day_wanted > 0)) {
          const lease = leaseOf(keyHash);
          lease.clockOffset = row.now_epoch - (sentAt + nowSeconds()) / 2;
          if (row.burst_wanted > 0 && !lease.burstSliceAsked) {
            lease.burstSliceAsked = true;
            next = { ...next, burstAsk: burstDemand(lease, row.now_epoch) };
          }
          if (!lease.daySliceAsked) {
            lease.daySliceAsked = true;
            next = { ...next, dayTopUp: true };
          }
          return undefined;
        }
        return judge(keyHash, reservation, row, sentAt);
      },
      // Read-only check that found the window moved on, or a top-up that found the day spent (which
      // does not top up again).
      fullCheck: () => pendingCheck(keyHash, clientIp, next),
    };
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

    /** Runs the access check now. Throws 401 for any authentication failure and 429 when a window is spent. */
    async authenticate(keyHash: string, clientIp: string | undefined): Promise<AccessGrant> {
      let pending = pendingCheck(keyHash, clientIp);
      // At most three statements: a read-only check whose second moved on, its full check, and that
      // check again without a day top-up that found the day spent (neither asks again).
      for (;;) {
        const grant = pending.judge(await deps.database.query(pending.statement));
        if (grant) return grant;
        pending = pending.fullCheck();
      }
    },

    /**
     * How many keys this instance keeps lease state for. Only tests read it: a refused made-up key
     * must leave nothing behind, which nothing outside the process can see.
     */
    leasedKeys(): number {
      return leases.size;
    },

    /** Gives leased, unused tokens back (at shutdown), so a restart does not shrink anyone's day. */
    async returnLeases(): Promise<void> {
      for (const lease of leases.values()) {
        if (!lease.apiKeyId || !lease.orgId || (lease.burst === 0 && lease.day === 0)) continue;
        await keys.returnLeasedTokens({ ...lease, apiKeyId: lease.apiKeyId, orgId: lease.orgId }, deps.database.db);
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
