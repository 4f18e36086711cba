import { z } from 'zod';
import ipaddr from 'ipaddr.js';
import { DATABASE_DEFAULTS, type DatabaseOptions } from '../db/database-options.js';
import { IDEMPOTENCY_WINDOW_HOURS } from '../plugins/idempotency.repository.js';
import { parseLinkKey } from '../shared/text-sealer.js';

const booleanFlag = (fallback: boolean) =>
  z
    .enum(['true', 'false', '1', '0', 'on', 'off', 'yes', 'no'], {
      error: 'must be one of true, false, on, off, 1, 0, yes, no',
    })
    .optional()
    .transform((value) => (value === undefined ? fallback : ['true', '1', 'on', 'yes'].includes(value)));

const positiveInt = (fallback: number) =>
  z.coerce
    .number({ error: 'must be a whole number' })
    .int('must be a whole number')
    .positive('must be greater than zero')
    .default(fallback);

/** A retention period: a whole number of `unit`s, bounded so `now - period` stays a valid timestamp. */
const retentionPeriod = (fallback: number, unit: string, max: number, min = 1) =>
  z.coerce
    .number({ error: `must be a whole number of ${unit}` })
    .int(`must be a whole number of ${unit}`)
    .min(min, min === 1 ? 'must be greater than zero' : `must be at least ${min} (the spec's replay window)`)
    .max(max, `must be at most ${max} ${unit}`)
    .default(fallback);

const trustedProxyList = z
  .string()
  .optional()
  .transform((value, ctx) => {
    if (value === undefined || value.trim() === '') return [] as string[];
    const entries = value
      .split(',')
      .map((part) => part.trim())
      .filter(Boolean);
    for (const entry of entries) {
      if (entry === 'true' || entry === '*') {
        ctx.addIssue({ code: 'custom', message: 'must list proxy addresses or CIDR ranges, never a blanket "true"' });
        return z.NEVER;
      }
      const valid = entry.includes('/') ? isCidr(entry) : ipaddr.isValid(entry);
      if (!valid) {
        ctx.addIssue({ code: 'custom', message: `"${entry}" is not an IP address or CIDR range` });
        return z.NEVER;
      }
    }
    return entries;
  });

/** A comma-separated list of TCP ports (1-65535), e.g. `8443,9443`; unset or empty: none. */
const portList = z
  .string()
  .optional()
  .transform((value, ctx) => {
    if (value === undefined) return [] as number[];
    const ports: number[] = [];
    for (const entry of value
      .split(',')
      .map((part) => part.trim())
      .filter(Boolean)) {
      const port = /^\d{1,5}$/.test(entry) ? Number(entry) : Number.NaN;
      if (!(port >= 1 && port <= 65535)) {
        ctx.addIssue({
          code: 'custom',
          message: `"${entry}" is not a port number (1-65535); give a comma-separated list such as 8443,9443`,
        });
        return z.NEVER;
      }
      if (!ports.includes(port)) ports.push(port);
    }
    return ports;
  });

function isCidr(value: string): boolean {
  try {
    ipaddr.parseCIDR(value);
    return true;
  } catch {
    return false;
  }
}

const environmentSchema = z.object({
  PORT: z.coerce.number({ error: 'must be a port number' }).int().min(0).max(65535, 'must be at most 65535').default(8080),
  // Loopback unless asked: the embedded default holds an all-scopes sandbox key, and a deployment
  // says where it listens (the container image sets HOST=0.0.0.0).
  HOST: z.string().min(1).default('127.0.0.1'),
  DATABASE_URL: z
    .string()
    .optional()
    .refine((value) => value === undefined || value === '' || /^postgres(ql)?:\/\//.test(value), {
      message: 'must be a postgres:// or postgresql:// connection URL',
    })
    .transform((value) => (value === '' ? undefined : value)),
  // A direct PostgreSQL connection for migrations, which a transaction-mode pooler at DATABASE_URL
  // cannot carry (their advisory lock needs a session).
  DATABASE_DIRECT_URL: z
    .string()
    .optional()
    .refine((value) => value === undefined || /^postgres(ql)?:\/\//.test(value), {
      message: 'must be a postgres:// or postgresql:// connection URL',
    }),
  DATA_DIR: z.string().min(1).default('./data'),
  LOG_LEVEL: z
    .enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'], {
      error: 'must be one of fatal, error, warn, info, debug, trace, silent',
    })
    .default('info'),
  LOG_FORMAT: z.enum(['auto', 'json', 'pretty'], { error: 'must be one of auto, json, pretty' }).default('auto'),
  NODE_ENV: z.string().optional(),
  CI: z.string().optional(),
  PUBLIC_BASE_URL: z.url({ protocol: /^https?$/, error: 'must be an absolute http(s) URL' }).optional(),
  TRUST_PROXY: trustedProxyList,
  // Time to receive a whole request (headers and body): Node's own default, which Fastify's 0 had turned off.
  REQUEST_TIMEOUT_MS: positiveInt(300_000),
  // A request whose body stops arriving for this long is cut (an idle upload holds a socket and a temp file).
  REQUEST_BODY_IDLE_TIMEOUT_MS: positiveInt(30_000),
  RATE_LIMIT_BURST: positiveInt(25),
  // The contact's upload page (no API key): requests per minute, per client address and per link.
  UPLOAD_PAGE_RATE_LIMIT_PER_IP: positiveInt(60),
  UPLOAD_PAGE_RATE_LIMIT_PER_LINK: positiveInt(20),
  RATE_LIMIT_DAILY: positiveInt(100_000),
  SMTP_URL: z
    .string()
    .optional()
    .refine((value) => value === undefined || value === '' || /^smtps?:\/\//.test(value), {
      message: 'must be an smtp:// or smtps:// URL',
    })
    .transform((value) => (value === '' ? undefined : value)),
  SMTP_FROM: z.string().default('Verification <no-reply@verification.local>'),
  LINK_ENCRYPTION_KEY: z
    .string()
    .optional()
    .transform((value, context) => {
      if (value === undefined) return undefined;
      const key = parseLinkKey(value);
      if (!key) {
        context.addIssue({ code: 'custom', message: 'must be 32 bytes: 64 hex digits or base64 (openssl rand -hex 32)' });
        return z.NEVER;
      }
      return key;
    }),
  WEBHOOK_WORKER: booleanFlag(true),
  IMPORT_WORKER: booleanFlag(true),
  WEBHOOK_ALLOW_PRIVATE_URLS: booleanFlag(false),
  WEBHOOK_ALLOWED_PORTS: portList,
  // At most a year: the period is compared with timestamps in SQL, and an endpoint failing for longer is long gone.
  WEBHOOK_DISABLE_AFTER_HOURS: z.coerce
    .number({ error: 'must be a whole number of hours' })
    .int('must be a whole number of hours')
    .min(1, 'must be at least 1 hour')
    .max(8_760, 'must be at most 8760 hours (a year)')
    .default(72),
  METRICS_PORT: z.coerce
    .number({ error: 'must be a port number' })
    .int('must be a port number')
    .min(0)
    .max(65535, 'must be at most 65535')
    .optional(),
  DATABASE_POOL_SIZE: positiveInt(10),
  DATABASE_STATEMENT_TIMEOUT_MS: positiveInt(DATABASE_DEFAULTS.statementTimeoutMs),
  DATABASE_LOCK_TIMEOUT_MS: positiveInt(DATABASE_DEFAULTS.lockTimeoutMs),
  DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_MS: positiveInt(DATABASE_DEFAULTS.idleInTransactionTimeoutMs),
  // Unset: a second more than the statement timeout.
  DATABASE_QUERY_TIMEOUT_MS: z.coerce
    .number({ error: 'must be a whole number' })
    .int('must be a whole number')
    .positive('must be greater than zero')
    .optional(),
  DATABASE_CONNECT_TIMEOUT_MS: positiveInt(DATABASE_DEFAULTS.connectTimeoutMs),
  DATABASE_PREPARED_STATEMENTS: booleanFlag(true),
  // Retention (docs/decisions.md, "Retention and batched purges"): rows older than this are purged.
  EVENT_RETENTION_DAYS: retentionPeriod(30, 'days', 36_500),
  WEBHOOK_DELIVERY_RETENTION_DAYS: retentionPeriod(30, 'days', 36_500),
  EMAIL_RETENTION_DAYS: retentionPeriod(90, 'days', 36_500),
  AUDIT_RETENTION_YEARS: retentionPeriod(7, 'years', 100),
  // Entity documents and closed document requests: AML/CTF records, kept as long as the audit trail by default.
  DOCUMENT_RETENTION_YEARS: retentionPeriod(7, 'years', 100),
  // The review history (customer_reviews): AML/CTF records of ongoing due diligence, kept 7 years by default.
  REVIEW_RETENTION_YEARS: retentionPeriod(7, 'years', 100),
  // Bulk imports and their rows, from when each import finished (the records an import created stay).
  IMPORT_RETENTION_DAYS: retentionPeriod(30, 'days', 36_500),
  // Diagnostic only (bench/audit-sealing.bench.ts measures the upsert without the sealer): off leaves
  // the chain unsealed on this instance, so the trail is not verifiable until some instance seals it.
  AUDIT_SEALING: booleanFlag(true),
  // Shorter than the replay window would forget keys the spec still honours.
  IDEMPOTENCY_RETENTION_HOURS: retentionPeriod(IDEMPOTENCY_WINDOW_HOURS, 'hours', 876_000, IDEMPOTENCY_WINDOW_HOURS),
  // Read replicas: a streaming standby that list pages read from once it has replayed far enough.
  DATABASE_REPLICA_URL: z
    .string()
    .optional()
    .refine((value) => value === undefined || value === '' || /^postgres(ql)?:\/\//.test(value), {
      message: 'must be a postgres:// or postgresql:// connection URL',
    })
    .transform((value) => (value === '' ? undefined : value)),
});

export type Config = {
  port: number;
  host: string;
  databaseUrl: string | undefined;
  /** DATABASE_DIRECT_URL: where migrations go when DATABASE_URL is a pooler; unset: DATABASE_URL. */
  databaseDirectUrl: string | undefined;
  dataDir: string;
  logLevel: z.infer<typeof environmentSchema>['LOG_LEVEL'];
  /**
   * Pretty (human) log lines are allowed: LOG_FORMAT=pretty, or auto outside production and CI.
   * They are used only when the output is also a terminal and pino-pretty is installed.
   */
  logPretty: boolean;
  publicBaseUrl: string;
  trustProxy: string[];
  rateLimit: { burst: number; daily: number };
  /** Requests per minute the contact's upload page takes from one client address and for one link, on each instance. */
  uploadPageRateLimit: { perIp: number; perLink: number };
  /** How long a client may take to send a request, and to pause while sending its body (src/plugins/request-timeouts.plugin.ts). */
  requestTimeouts: RequestTimeouts;
  smtpUrl: string | undefined;
  smtpFrom: string;
  /**
   * LINK_ENCRYPTION_KEY: seals link-bearing text at rest (queued emails, stored idempotent replies).
   * Unset: a key drawn once into DATA_DIR (src/shared/text-sealer.ts), fine for one machine only.
   */
  linkEncryptionKey: Buffer | undefined;
  webhookWorker: boolean;
  /** Whether `svc serve` also works imports' rows (IMPORT_WORKER); `svc worker` always does. */
  importWorker: boolean;
  /** Development only: webhook endpoints may be http, on private addresses and on any port. */
  webhookAllowPrivateUrls: boolean;
  /** Webhook endpoint ports allowed besides 443 (WEBHOOK_ALLOWED_PORTS). */
  webhookAllowedPorts: number[];
  /** An endpoint whose every attempt has failed for this long is disabled at its next failed attempt (WEBHOOK_DISABLE_AFTER_HOURS). */
  webhookDisableAfterHours: number;
  /** A separate listener that alone serves /metrics; unset: /metrics is on the public port. */
  metricsPort: number | undefined;
  databasePoolSize: number;
  /** Pool size, timeouts and the prepared-statement switch of every connection (see DATABASE_DEFAULTS). */
  database: Required<Omit<DatabaseOptions, 'applicationName'>>;
  /** A physical streaming standby of DATABASE_URL for list pages (src/db/page-reads.ts); unset: everything reads the primary. */
  databaseReplicaUrl: string | undefined;
  /** How long each growing table keeps its rows (the retention job purges older ones). */
  retention: RetentionSettings;
  /**
   * AUDIT_SEALING: whether this instance runs the audit chain sealer (default on). A diagnostic
   * switch: off, rows written here are sealed only by another instance, or by this one once back on.
   */
  auditSealing: boolean;
};

export type RequestTimeouts = {
  /** REQUEST_TIMEOUT_MS: the whole request (headers and body) must have arrived within this; else 408. */
  requestTimeoutMs: number;
  /** REQUEST_BODY_IDLE_TIMEOUT_MS: a body that stops arriving for this long is cut; 408 when no answer has begun. */
  bodyIdleTimeoutMs: number;
};

export type RetentionSettings = {
  /** outbox_events (EVENT_RETENTION_DAYS; the events feed shares it). */
  eventDays: number;
  /** webhook_deliveries and their webhook_attempts. */
  webhookDeliveryDays: number;
  emailDays: number;
  auditYears: number;
  /** entity_documents (with their bytes) and closed document_requests, from their creation. */
  documentYears: number;
  /** customer_reviews (the review history), from when each review was recorded. */
  reviewYears: number;
  /** imports (with their import_rows), from when each import finished. */
  importDays: number;
  /** At least the spec's 24 h replay window. */
  idempotencyHours: number;
};

export class ConfigError extends Error {
  constructor(readonly problems: string[]) {
    super(`Invalid configuration:\n${problems.map((problem) => `  - ${problem}`).join('\n')}`);
    this.name = 'ConfigError';
  }
}

/** Parses the environment once; every bad variable is named with what is wrong with it. */
export function loadConfig(environment: NodeJS.ProcessEnv = process.env): Config {
  // `PORT=` in a compose file or shell means "not set", not "port 0" or "an empty host".
  const present = Object.fromEntries(Object.entries(environment).filter(([, value]) => value !== undefined && value.trim() !== ''));
  const parsed = environmentSchema.safeParse(present);
  if (!parsed.success) {
    throw new ConfigError(parsed.error.issues.map((issue) => `${issue.path.join('.') || 'environment'}: ${issue.message}`));
  }
  const env = parsed.data;
  const queryTimeoutMs = env.DATABASE_QUERY_TIMEOUT_MS ?? env.DATABASE_STATEMENT_TIMEOUT_MS + 1_000;
  const timeoutProblems: string[] = [];
  if (env.DATABASE_LOCK_TIMEOUT_MS * 2 >= env.DATABASE_STATEMENT_TIMEOUT_MS) {
    // A write can wait for two locks in turn (the row's tuple lock, then its holder): 409 record_locked must come first.
    timeoutProblems.push(
      `DATABASE_LOCK_TIMEOUT_MS: must be less than half of DATABASE_STATEMENT_TIMEOUT_MS (${env.DATABASE_STATEMENT_TIMEOUT_MS})`,
    );
  }
  if (queryTimeoutMs <= env.DATABASE_STATEMENT_TIMEOUT_MS) {
    // The client's bound is the fallback for when the server cannot enforce its own: it must not fire first.
    timeoutProblems.push(
      `DATABASE_QUERY_TIMEOUT_MS: must be greater than DATABASE_STATEMENT_TIMEOUT_MS (${env.DATABASE_STATEMENT_TIMEOUT_MS})`,
    );
  }
  if (env.REQUEST_BODY_IDLE_TIMEOUT_MS > env.REQUEST_TIMEOUT_MS) {
    // The whole request would be cut first: the idle bound could never apply.
    timeoutProblems.push(`REQUEST_BODY_IDLE_TIMEOUT_MS: must be at most REQUEST_TIMEOUT_MS (${env.REQUEST_TIMEOUT_MS})`);
  }
  if (timeoutProblems.length > 0) throw new ConfigError(timeoutProblems);
  if (env.DATABASE_DIRECT_URL !== undefined && env.DATABASE_URL === undefined) {
    // The embedded database has no pooler in front of it: a direct URL beside it would be a second database.
    throw new ConfigError(['DATABASE_DIRECT_URL: set only together with DATABASE_URL (the embedded database needs none)']);
  }
  if (env.METRICS_PORT !== undefined && env.METRICS_PORT !== 0 && env.METRICS_PORT === env.PORT) {
    // One port cannot be both the public listener and the one that keeps /metrics off it.
    throw new ConfigError([`METRICS_PORT: must differ from PORT (${env.PORT})`]);
  }
  return {
    port: env.PORT,
    host: env.HOST,
    databaseUrl: env.DATABASE_URL,
    databaseDirectUrl: env.DATABASE_DIRECT_URL,
    dataDir: env.DATA_DIR,
    logLevel: env.LOG_LEVEL,
    logPretty:
      env.LOG_FORMAT === 'pretty' || (env.LOG_FORMAT === 'auto' && env.NODE_ENV !== 'production' && !['true', '1'].includes(env.CI ?? '')),
    publicBaseUrl: (env.PUBLIC_BASE_URL ?? `http://localhost:${env.PORT}`).replace(/\/+$/, ''),
    trustProxy: env.TRUST_PROXY,
    rateLimit: { burst: env.RATE_LIMIT_BURST, daily: env.RATE_LIMIT_DAILY },
    uploadPageRateLimit: { perIp: env.UPLOAD_PAGE_RATE_LIMIT_PER_IP, perLink: env.UPLOAD_PAGE_RATE_LIMIT_PER_LINK },
    requestTimeouts: { requestTimeoutMs: env.REQUEST_TIMEOUT_MS, bodyIdleTimeoutMs: env.REQUEST_BODY_IDLE_TIMEOUT_MS },
    smtpUrl: env.SMTP_URL,
    smtpFrom: env.SMTP_FROM,
    linkEncryptionKey: env.LINK_ENCRYPTION_KEY,
    webhookWorker: env.WEBHOOK_WORKER,
    importWorker: env.IMPORT_WORKER,
    // Only the variable says so: the embedded database is no proof of a developer's machine.
    webhookAllowPrivateUrls: env.WEBHOOK_ALLOW_PRIVATE_URLS,
    webhookAllowedPorts: env.WEBHOOK_ALLOWED_PORTS,
    webhookDisableAfterHours: env.WEBHOOK_DISABLE_AFTER_HOURS,
    metricsPort: env.METRICS_PORT,
    databasePoolSize: env.DATABASE_POOL_SIZE,
    database: {
      poolSize: env.DATABASE_POOL_SIZE,
      statementTimeoutMs: env.DATABASE_STATEMENT_TIMEOUT_MS,
      lockTimeoutMs: env.DATABASE_LOCK_TIMEOUT_MS,
      idleInTransactionTimeoutMs: env.DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_MS,
      queryTimeoutMs,
      connectTimeoutMs: env.DATABASE_CONNECT_TIMEOUT_MS,
      preparedStatements: env.DATABASE_PREPARED_STATEMENTS,
    },
    retention: {
      eventDays: env.EVENT_RETENTION_DAYS,
      webhookDeliveryDays: env.WEBHOOK_DELIVERY_RETENTION_DAYS,
      emailDays: env.EMAIL_RETENTION_DAYS,
      auditYears: env.AUDIT_RETENTION_YEARS,
      documentYears: env.DOCUMENT_RETENTION_YEARS,
      reviewYears: env.REVIEW_RETENTION_YEARS,
      importDays: env.IMPORT_RETENTION_DAYS,
      idempotencyHours: env.IDEMPOTENCY_RETENTION_HOURS,
    },
    databaseReplicaUrl: env.DATABASE_REPLICA_URL,
    auditSealing: env.AUDIT_SEALING,
  };
}
