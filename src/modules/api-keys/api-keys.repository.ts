import { and, asc, eq, sql } from 'drizzle-orm';
import type pg from 'pg';
import type { Executor } from '../../db/client.js';
import { apiKeyHashes, apiKeys, apiKeyUsage, type ApiKeyRow } from '../../db/schema.js';

/** Every column but the hash: repositories never hand out secret material by default. */
const publicColumns = {
  id: apiKeys.id,
  orgId: apiKeys.orgId,
  label: apiKeys.label,
  displayPrefix: apiKeys.displayPrefix,
  scopes: apiKeys.scopes,
  allowedIps: apiKeys.allowedIps,
  burstLimit: apiKeys.burstLimit,
  dailyLimit: apiKeys.dailyLimit,
  expiresAt: apiKeys.expiresAt,
  revokedAt: apiKeys.revokedAt,
  lastUsedAt: apiKeys.lastUsedAt,
  createdAt: apiKeys.createdAt,
};
export type ApiKeyRecord = Omit<ApiKeyRow, 'keyHash'>;

/** One row of the access check (see ACCESS_CHECK_SQL); no row when no key has the hash. */
export type AccessCheckRow = {
  id: string;
  org_id: string;
  scopes: string[];
  features: string[];
  /** The effective limits: the key's own, else the configured defaults. */
  burst_limit: number;
  daily_limit: number;
  active: boolean;
  ip_allowed: boolean;
  now_epoch: number;
  /** The windows counted in, and the tokens handed out in them to all instances. */
  burst_window: number;
  day_window: number;
  burst_count: number;
  day_count: number;
  /** Tokens this statement asked for (0: the instance's own were still good) and got. */
  burst_wanted: number;
  day_wanted: number;
  burst_granted: number;
  day_granted: number;
};

/** What the access check is asked: the key, the client, and which leased windows the instance holds tokens of. */
export type AccessCheckInput = {
  keyHash: string;
  clientIp: string | null;
  defaultBurstLimit: number;
  defaultDailyLimit: number;
  /** The window this instance still holds leased tokens of (one is reserved for this request), or -1. */
  heldBurstWindow: number;
  heldDayWindow: number;
  /**
   * Burst tokens to lease when the instance holds none of the current second: the instance's demand
   * (at least 1; the statement raises it to 1% of the limit and caps it at the limit). 0: one token
   * only (a slice is already on its way).
   */
  burstAsk: number;
  /** Whether this check may top up the instance's day tokens to cover the burst tokens it will hold. */
  dayTopUp: boolean;
  /** Tokens the instance holds beyond the one reserved for this request, of the held windows. */
  burstHeld: number;
  dayHeld: number;
  /** The instance holds tokens of both current windows: the check reads only (ACCESS_READ_SQL). */
  readOnly?: boolean;
};

/**
 * The key by hash with its organisation's features, whether it is active and the client address
 * allowed, the effective limits, and the current windows by the database's clock: both access checks
 * start with it. Parameters: $1 key hash, $2 client address (inet or null), $3/$4 default limits.
 */
const KEY_LOOKUP = `
  WITH clock AS (
    SELECT extract(epoch FROM clock_timestamp())::float8 AS epoch
  ),
  key AS (
    SELECT k.id, k.org_id, k.scopes, o.features, k.last_used_at,
           coalesce(k.burst_limit, $3::int) AS burst_limit,
           coalesce(k.daily_limit, $4::int) AS daily_limit,
           (k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > clock_timestamp())) AS active,
           (cardinality(k.allowed_ips) = 0 OR coalesce($2::inet <<= ANY (k.allowed_ips::inet[]), false)) AS ip_allowed,
           clock.epoch,
           floor(clock.epoch)::bigint AS burst_window,
           floor(clock.epoch / 86400)::int AS day_window
      FROM api_key_hashes h
      JOIN api_keys k ON k.org_id = h.org_id AND k.id = h.api_key_id
      JOIN organisations o ON o.id = k.org_id
      CROSS JOIN clock
     WHERE h.key_hash = $1::text
  )`;

/**
 * The access check in one statement: finds the key by hash with its organisation's features, decides
 * whether it is active and whether the client address is allowed, and, for an active and allowed key
 * whose instance holds no usable tokens of a window, leases tokens of that window
 * (`api_key_usage_lease`, migration 0006). How many is the instance's call (access.service.ts: its
 * own recent demand for the key), raised to 1% of the limit; whenever it leases, the day's tokens are
 * topped up in the same write to cover the burst tokens the instance will hold (it never holds more
 * than 1% of the day), so the day costs no write of its own. The top-up is capped by the day's free
 * tokens as read here (without the row's lock): a top-up must never turn a grantable burst lease into
 * a refusal, which the function's all-or-nothing grant would do when a window it is asked for is spent. `last_used_at` is written at
 * most once a minute. Nothing is cached, so a revocation is seen by the very next request on every
 * instance. An instance that holds tokens of both current windows sends ACCESS_READ_SQL instead.
 * Parameters: $1 key hash, $2 client address (inet or null), $3/$4 default burst/daily limits,
 * $5/$6 the burst/day windows the instance holds tokens of (-1: none), $7 the burst tokens to lease
 * (0: one), $8 whether to top up the day, $9/$10 the burst/day tokens the instance holds beyond this
 * request's.
 */
const ACCESS_CHECK_SQL = `${KEY_LOOKUP},
  burst AS (
    SELECT key.id,
           CASE WHEN key.burst_window = $5::bigint THEN 0
                WHEN $7::int > 0 THEN least(key.burst_limit, greatest($7::int, key.burst_limit / 100))
                ELSE 1 END AS wanted,
           -- The day token of this request itself, unless it holds one of the current day.
           CASE WHEN key.day_window = $6::int THEN 0 ELSE 1 END AS own_day,
           key.daily_limit - coalesce(CASE WHEN usage.day_window = key.day_window THEN usage.day_count END, 0) AS day_free
      FROM key
      LEFT JOIN api_key_usage usage ON usage.org_id = key.org_id AND usage.api_key_id = key.id
     WHERE key.active AND key.ip_allowed
  ),
  wanted AS (
    SELECT key.id,
           burst.wanted AS burst_wanted,
           burst.own_day + CASE WHEN $8::boolean THEN greatest(0, least(
             -- The burst tokens the instance will hold after this request, less the day tokens it holds.
             CASE WHEN key.burst_window = $5::bigint THEN $9::int WHEN $7::int > 0 THEN burst.wanted - 1 ELSE 0 END - $10::int,
             burst.day_free - burst.own_day,
             -- The instance holds at most 1% of the day (none under 100 a day: counted exactly).
             key.daily_limit / 100 - burst.own_day - $10::int)) ELSE 0 END AS day_wanted
      FROM key
      JOIN burst ON burst.id = key.id
  ),
  lease AS (
    SELECT lease.*
      FROM key
      JOIN wanted ON wanted.id = key.id
     CROSS JOIN LATERAL api_key_usage_lease(key.id, key.org_id, key.burst_window, key.burst_limit, wanted.burst_wanted,
                                            key.day_window, key.daily_limit, wanted.day_wanted) AS lease
     WHERE wanted.burst_wanted > 0 OR wanted.day_wanted > 0
  ),
  touch AS (
    UPDATE api_keys SET last_used_at = clock_timestamp()
      FROM key
     WHERE api_keys.org_id = key.org_id AND api_keys.id = key.id AND key.active AND key.ip_allowed
       AND (key.last_used_at IS NULL OR key.last_used_at < clock_timestamp() - interval '1 minute')
    RETURNING 1
  )
  SELECT key.id, key.org_id, key.scopes, key.features, key.burst_limit, key.daily_limit, key.active, key.ip_allowed,
         key.epoch AS now_epoch,
         coalesce(lease.burst_window, key.burst_window) AS burst_window,
         coalesce(lease.day_window, key.day_window) AS day_window,
         coalesce(lease.burst_total, CASE WHEN usage.burst_window = key.burst_window THEN usage.burst_count END, 0) AS burst_count,
         coalesce(lease.day_total, CASE WHEN usage.day_window = key.day_window THEN usage.day_count END, 0) AS day_count,
         coalesce(wanted.burst_wanted, 0) AS burst_wanted,
         coalesce(wanted.day_wanted, 0) AS day_wanted,
         coalesce(lease.burst_granted, 0) AS burst_granted,
         coalesce(lease.day_granted, 0) AS day_granted
    FROM key
    LEFT JOIN wanted ON true
    LEFT JOIN lease ON true
    LEFT JOIN api_key_usage usage ON usage.org_id = key.org_id AND usage.api_key_id = key.id`;

/**
 * The access check of a request whose instance holds tokens of both current windows: ACCESS_CHECK_SQL
 * without its writes. No lease is needed, and `last_used_at` loses nothing: the first request of
 * every second leases, so the full check still runs (and touches) at least once a second. Writing
 * nothing, it locks no usage row: a key's concurrent requests do not wait on each other. Parameters:
 * $1–$6 as ACCESS_CHECK_SQL's.
 * wanted = 1: the windows moved on since the tokens were leased, and the full check must be asked.
 */
const ACCESS_READ_SQL = `${KEY_LOOKUP}
  SELECT key.id, key.org_id, key.scopes, key.features, key.burst_limit, key.daily_limit, key.active, key.ip_allowed,
         key.epoch AS now_epoch, key.burst_window, key.day_window,
         coalesce(CASE WHEN usage.burst_window = key.burst_window THEN usage.burst_count END, 0) AS burst_count,
         coalesce(CASE WHEN usage.day_window = key.day_window THEN usage.day_count END, 0) AS day_count,
         CASE WHEN key.burst_window = $5::bigint THEN 0 ELSE 1 END AS burst_wanted,
         CASE WHEN key.day_window = $6::int THEN 0 ELSE 1 END AS day_wanted,
         0 AS burst_granted,
         0 AS day_granted
    FROM key
    LEFT JOIN api_key_usage usage ON usage.org_id = key.org_id AND usage.api_key_id = key.id`;

/** The access check's row (undefined: no key has the hash), from its array-mode result, keyed by the result's own column names. */
export function accessCheckRowOf(result: pg.QueryResult): AccessCheckRow | undefined {
  const values = result.rows[0] as unknown[] | undefined;
  if (!values) return undefined;
  const names = columnNamesOf(result.fields);
  const row: Record<string, unknown> = {};
  for (let index = 0; index < names.length; index++) row[names[index]!] = values[index];
  return row as AccessCheckRow;
}

/**
 * The result's column names, as the strings kept from the last result with the same names: pg
 * decodes fresh strings for every result, and keying a row by them costs a string-table lookup per
 * column, against a pointer comparison with the kept ones.
 */
let keptColumnNames: string[] = [];
function columnNamesOf(fields: pg.FieldDef[]): string[] {
  const kept = keptColumnNames;
  if (kept.length === fields.length && fields.every((field, index) => field.name === kept[index])) return kept;
  return (keptColumnNames = fields.map((field) => field.name));
}

export function createApiKeysRepository() {
  return {
    /** The key and its hash's directory row (api_key_hashes): call it in a transaction, so both or neither are written. */
    async insert(values: typeof apiKeys.$inferInsert, tx: Executor): Promise<ApiKeyRecord> {
      const [row] = await tx.insert(apiKeys).values(values).returning(publicColumns);
      await tx.insert(apiKeyHashes).values({ keyHash: values.keyHash, orgId: row!.orgId, apiKeyId: row!.id });
      return row!;
    },

    /**
     * By id alone, for the operator's `svc api-key revoke ID`, which names no organisation: the one
     * lookup not routed to an organisation (under Citus, a read of every shard); what follows is.
     */
    async findById(id: string, tx: Executor): Promise<ApiKeyRecord | undefined> {
      const [row] = await tx.select(publicColumns).from(apiKeys).where(eq(apiKeys.id, id));
      return row;
    },

    async listByOrg(orgId: string, tx: Executor): Promise<ApiKeyRecord[]> {
      return tx.select(publicColumns).from(apiKeys).where(eq(apiKeys.orgId, orgId)).orderBy(asc(apiKeys.createdAt));
    },

    async revoke(orgId: string, id: string, tx: Executor): Promise<ApiKeyRecord | undefined> {
      const [row] = await tx
        .update(apiKeys)
        .set({ revokedAt: sql`coalesce(${apiKeys.revokedAt}, clock_timestamp())` })
        .where(and(eq(apiKeys.orgId, orgId), eq(apiKeys.id, id)))
        .returning(publicColumns);
      return row;
    },

    /**
     * The access check as a named prepared statement (PostgreSQL parses and plans it once per
     * connection): ACCESS_READ_SQL when `readOnly`, else ACCESS_CHECK_SQL. The caller sends it on the
     * pool as a statement of its own (Database.query), before the request's own statements.
     */
    accessCheckStatement(input: AccessCheckInput): pg.QueryArrayConfig {
      const values = [
        input.keyHash,
        input.clientIp,
        input.defaultBurstLimit,
        input.defaultDailyLimit,
        input.heldBurstWindow,
        input.heldDayWindow,
      ];
      // Read as an array: pg then makes no per-result object of the column names.
      if (input.readOnly) return { name: 'api_keys_access_read', text: ACCESS_READ_SQL, rowMode: 'array', values };
      return {
        name: 'api_keys_access_check',
        text: ACCESS_CHECK_SQL,
        rowMode: 'array',
        values: [...values, input.burstAsk, input.dayTopUp, input.burstHeld, input.dayHeld],
      };
    },

    /** Hands back leased tokens an instance did not use, while their window is still current. */
    async returnLeasedTokens(
      returned: { orgId: string; apiKeyId: string; burstWindow: number; burst: number; dayWindow: number; day: number },
      tx: Executor,
    ): Promise<void> {
      await tx
        .update(apiKeyUsage)
        .set({
          burstCount: sql`CASE WHEN ${apiKeyUsage.burstWindow} = ${returned.burstWindow} THEN greatest(0, ${apiKeyUsage.burstCount} - ${returned.burst}) ELSE ${apiKeyUsage.burstCount} END`,
          dayCount: sql`CASE WHEN ${apiKeyUsage.dayWindow} = ${returned.dayWindow} THEN greatest(0, ${apiKeyUsage.dayCount} - ${returned.day}) ELSE ${apiKeyUsage.dayCount} END`,
        })
        .where(and(eq(apiKeyUsage.orgId, returned.orgId), eq(apiKeyUsage.apiKeyId, returned.apiKeyId)));
    },
  };
}
export type ApiKeysRepository = ReturnType<typeof createApiKeysRepository>;
