import { createRequire } from 'node:module';
import pg from 'pg';
import { sql } from 'drizzle-orm';
import { PgBoss, fromDrizzle, type ConstructorOptions, type Job, type JobResult, type Queue } from 'pg-boss';
import { wakeAfterCommit, type Database, type Executor } from '../db/client.js';

/**
 * Background work runs on pg-boss (docs/decisions.md, "issue 44"): its jobs live in the `pgboss`
 * schema of the service's own database, which the migrations install (installJobQueues).
 */
const SCHEMA = 'pgboss';

/** Every queue the service uses, and how its jobs are retried and kept. Created by the migrations. */
export const QUEUES = {
  /** One job per queued email, enqueued in the transaction that queued it; retried with backoff. */
  emailSend: {
    name: 'email-send',
    // Ten attempts, the waits doubling from about 30 s up to an hour, as the table-driven sender had.
    retryLimit: 9,
    retryDelay: 30,
    retryBackoff: true,
    retryDelayMax: 3600,
    // An attempt whose instance died is retried after this (one SMTP exchange is bounded well inside it).
    expireInSeconds: 120,
  },
  /** The retention purge: one job per schedule tick for the whole deployment, never two at once. */
  retention: { name: 'retention-purge', policy: 'exclusive', retryLimit: 0, expireInSeconds: 3600 },
  /** Expires OPEN document requests past their due time; one at a time. */
  documentRequestExpiry: { name: 'document-request-expiry', policy: 'exclusive', retryLimit: 0, expireInSeconds: 600 },
  /** Makes reviews DUE on their date and OVERDUE after the policy's days; one sweep at a time for the deployment. */
  reviewSweep: { name: 'review-sweep', policy: 'exclusive', retryLimit: 0, expireInSeconds: 600 },
  /** Re-dates an organisation's reviews after its policy changed, in batches; retried from the start if its instance died. */
  reviewRedate: { name: 'review-redate', retryLimit: 5, retryDelay: 10, retryBackoff: true, expireInSeconds: 3600 },
  /**
   * Applies an import's rows in batches (modules/imports/import-worker.ts), one job per import, grouped by
   * organisation. A heartbeat: an attempt whose instance died is failed by the supervisor's next pass
   * (SUPERVISE_INTERVAL_SECONDS) once its heartbeat lapsed, retried after the retry delay (so within
   * about 50 s), and resumes at the first row without an outcome.
   */
  importRun: {
    name: 'import-run',
    retryLimit: 10,
    retryDelay: 5,
    retryBackoff: true,
    retryDelayMax: 300,
    expireInSeconds: 4 * 3600,
    heartbeatSeconds: 30,
  },
} as const satisfies Record<string, Queue>;

export type QueueName = (typeof QUEUES)[keyof typeof QUEUES]['name'];

/**
 * Enqueues jobs. With a transaction as `executor` the job commits with it: a rollback enqueues nothing.
 * `group` (an organisation) lets a worker bound how many of one group's jobs it holds at once.
 */
export type JobQueue = { send(executor: Executor, queue: QueueName, data: object, options?: { group?: string }): Promise<void> };

/**
 * How an instance takes jobs: `localConcurrency` workers, each polling for a batch of up to
 * `batchSize`. `groupConcurrency` caps one group's jobs in flight across the deployment: a worker
 * polling while an organisation is at its cap passes over that organisation's backlog, so it cannot
 * hold back another's.
 */
export type WorkOptions = { batchSize?: number; localConcurrency?: number; groupConcurrency?: number };

type Logger = { warn(obj: object, message: string): void; error(obj: object, message: string): void };

export type JobRunner = JobQueue & {
  /** Works `queue`'s jobs, one batch at a time per poll; a job whose result is `failed` is retried as its queue says. */
  work<T extends object>(queue: QueueName, options: WorkOptions, handler: (jobs: Job<T>[]) => Promise<JobResult[] | void>): Promise<void>;
  /** Sends a job to `queue` on every occurrence of `cron` (UTC): once per occurrence for the whole deployment. */
  schedule(queue: QueueName, cron: string): Promise<void>;
  /** Stops polling and waits for the jobs in flight (up to STOP_TIMEOUT_MS), then closes the runner's connections. */
  stop(): Promise<void>;
};

/** How long stop() waits for jobs in flight: inside the 25 s the server gives its whole shutdown. */
const STOP_TIMEOUT_MS = 20_000;
/**
 * How often an idle worker looks for jobs: what finds the jobs other processes sent. A job this
 * process sends wakes its workers after the commit (Database.onWake, as every background loop).
 */
const POLLING_INTERVAL_SECONDS = 1;

/**
 * How often a runner's supervisor looks for jobs whose instance died (a lapsed heartbeat, an expired
 * attempt) and refreshes the queues' counts: what bounds how long an interrupted import waits to resume.
 * pg-boss's default is a minute; each pass is a few indexed statements per queue.
 */
const SUPERVISE_INTERVAL_SECONDS = 15;

/** pg-boss's own pool on the connection settings of `database`'s pool (client.ts). */
function connectionOptions(database: Database): ConstructorOptions {
  const pool = database.settings;
  const settings = [
    pool.statement_timeout ? `-c statement_timeout=${pool.statement_timeout}` : '',
    pool.lock_timeout ? `-c lock_timeout=${pool.lock_timeout}` : '',
    pool.idle_in_transaction_session_timeout ? `-c idle_in_transaction_session_timeout=${pool.idle_in_transaction_session_timeout}` : '',
  ].filter(Boolean);
  return {
    connectionString: pool.connectionString!,
    application_name: `${pool.application_name ?? 'verification-api'}-jobs`,
    connectionTimeoutMillis: pool.connectionTimeoutMillis,
    ...(settings.length > 0 ? { options: settings.join(' ') } : {}),
    schema: SCHEMA,
    // The migrations install and upgrade the schema; a runner only checks it is there.
    migrate: false,
    // No instance registry: nothing reads it, and it would write a heartbeat row every 30 s.
    registerInstance: false,
  };
}

function toJobDb(executor: Executor) {
  return fromDrizzle(executor, sql);
}

function bossFor(options: ConstructorOptions, logger: Logger | undefined): PgBoss {
  const boss = new PgBoss(options);
  boss.on('error', (error) => logger?.error({ err: error }, 'job runner error'));
  boss.on('warning', (warning) => logger?.warn({ warning: warning.message }, 'job runner warning'));
  return boss;
}

/**
 * Starts the process's job runner on `database`'s PostgreSQL: it enqueues, works the queues it is
 * given work for, runs the cluster-wide schedules (`schedule`) and pg-boss's maintenance
 * (`supervise`: expiring jobs whose instance died, deleting old ones).
 */
export async function startJobRunner(
  database: Database,
  options: {
    logger?: Logger;
    schedule?: boolean;
    supervise?: boolean;
    cronMonitorIntervalSeconds?: number;
    connections?: number;
    /** How often an idle worker polls (default POLLING_INTERVAL_SECONDS). */
    pollingIntervalSeconds?: number;
  } = {},
): Promise<JobRunner> {
  const boss = bossFor(
    {
      ...connectionOptions(database),
      // Polls, maintenance and settling jobs; a job's own work runs on the app's pool.
      max: options.connections ?? 3,
      schedule: options.schedule ?? true,
      supervise: options.supervise ?? true,
      superviseIntervalSeconds: SUPERVISE_INTERVAL_SECONDS,
      monitorIntervalSeconds: SUPERVISE_INTERVAL_SECONDS,
      ...(options.cronMonitorIntervalSeconds
        ? { cronMonitorIntervalSeconds: options.cronMonitorIntervalSeconds, cronWorkerIntervalSeconds: 1 }
        : {}),
    },
    options.logger,
  );
  await boss.start();
  const unsubscribes: Array<() => void> = [];
  return {
    send: (executor, queue, data, sendOptions) => sendJob(boss, executor, queue, data, sendOptions),
    async work(queue, workOptions, handler) {
      const { batchSize = 1, localConcurrency = 1, groupConcurrency } = workOptions;
      const polling = {
        batchSize,
        localConcurrency,
        pollingIntervalSeconds: options.pollingIntervalSeconds ?? POLLING_INTERVAL_SECONDS,
        perJobResults: true as const,
      };
      const workerId = await boss.work(queue, groupConcurrency ? { ...polling, groupConcurrency } : polling, async (jobs) => {
        try {
          const results = await handler(jobs as Job<never>[]);
          return results ?? jobs.map((job) => ({ id: job.id, status: 'completed' as const }));
        } catch (error) {
          options.logger?.warn({ err: error, queue }, `job of ${queue} failed`);
          throw error;
        }
      });
      unsubscribes.push(database.onWake(queue, () => boss.notifyWorker(workerId)));
    },
    async schedule(queue, cron) {
      // Upserted: every instance states the same schedule; pg-boss sends each occurrence once.
      await boss.schedule(queue, cron, null, { tz: 'UTC' });
    },
    async stop() {
      for (const unsubscribe of unsubscribes.splice(0)) unsubscribe();
      await boss.stop({ graceful: true, timeout: STOP_TIMEOUT_MS });
    },
  };
}

/** Sends the job on `executor` and wakes this process's workers of the queue once it is committed. */
async function sendJob(boss: PgBoss, executor: Executor, queue: QueueName, data: object, options: { group?: string } = {}): Promise<void> {
  await boss.send(queue, data, { db: toJobDb(executor), ...(options.group ? { group: { id: options.group } } : {}) });
  wakeAfterCommit(executor, queue);
}

/**
 * A JobQueue that starts a send-only runner (no workers, schedules or maintenance) the first time it
 * sends: what the HTTP app enqueues with when it was given no runner (tests, tools).
 */
export function lazyJobQueue(database: Database): JobQueue & { stop(): Promise<void> } {
  let started: Promise<JobRunner> | undefined;
  return {
    async send(executor, queue, data, options) {
      // One connection: a send runs on the caller's transaction, the pool only reads the queues at start.
      started ??= startJobRunner(database, { schedule: false, supervise: false, connections: 1 });
      await (await started).send(executor, queue, data, options);
    },
    async stop() {
      const runner = started;
      started = undefined;
      if (runner) await (await runner).stop();
    },
  };
}

/** The schema version this pg-boss installs (its package's `pgboss.schema`). */
function jobSchemaVersion(): number {
  const pkg = createRequire(import.meta.url)('pg-boss/package.json') as { pgboss: { schema: number } };
  return pkg.pgboss.schema;
}

/** A job to create with the queues: work that was waiting in a table before its queue existed. */
export type FirstJob = { queue: QueueName; data: object; group?: string };

/**
 * Installs or upgrades pg-boss's schema and creates the service's queues: part of the migrations, so
 * a database (and the test template every test database is cloned from) has them before any runner
 * starts. A database already current costs pg-boss's three reads. When the queues are created, `firstJobs` (read
 * on the same database) are sent with them: the upgrade from the loops that polled their tables.
 */
export async function installJobQueues(connectionString: string, firstJobs?: (client: pg.Client) => Promise<FirstJob[]>): Promise<void> {
  const client = new pg.Client({ connectionString });
  let pending: FirstJob[] = [];
  await client.connect();
  try {
    // pg-boss's own reads, on this connection: its schema version, and which of our queues exist.
    const probe = new PgBoss({ db: { executeSql: (text, values) => client.query(text, values) }, schema: SCHEMA });
    const installed = await probe.isInstalled();
    if (installed && (await probe.schemaVersion()) === jobSchemaVersion()) {
      const queues = await probe.getQueues(Object.values(QUEUES).map((queue) => queue.name));
      if (queues.length === Object.keys(QUEUES).length) return;
    }
    if (!installed && firstJobs) pending = await firstJobs(client);
  } finally {
    await client.end();
  }
  const boss = bossFor(
    { connectionString, schema: SCHEMA, migrate: true, supervise: false, schedule: false, registerInstance: false, max: 2 },
    undefined,
  );
  // Another process installing at the same moment makes this attempt fail; the next one finds it installed.
  await boss.start({ attempts: 5 });
  try {
    for (const { name, ...queue } of Object.values(QUEUES)) await boss.createQueue(name, queue);
    for (const job of pending) await boss.send(job.queue, job.data, job.group ? { group: { id: job.group } } : {});
  } finally {
    await boss.stop();
  }
}
