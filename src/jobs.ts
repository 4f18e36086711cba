import type { Logger } from 'pino';
import type { Config } from './config/config.js';
import type { Database } from './db/client.js';
import { createAuditChainSealer } from './modules/audit/audit-chain.sealer.js';
import { createEmailSender } from './modules/emails/email-sender.js';
import type { EmailJob } from './modules/emails/emails.repository.js';
import { createEventsFeedSealer } from './modules/events/events-feed.sealer.js';
import { createDeliveryWorker } from './modules/webhooks/delivery.worker.js';
import type { RetentionTable } from './modules/retention/retention.service.js';
import { QUEUES, startJobRunner, type JobRunner } from './shared/job-runner.js';
import { linkSealerFor } from './shared/text-sealer.js';
import { createServices } from './services.js';

export type BackgroundJobs = {
  /** The process's job runner: what the HTTP app enqueues with too. */
  runner: JobRunner;
  stop(): Promise<void>;
};

/** A background loop that is not a job (docs/decisions.md): the sealers and the delivery worker. */
type Loop = { start(): Promise<void>; stop(): Promise<void> };

/** When the retention purge runs: a pass over every organisation, once per tick for the whole deployment. */
export const RETENTION_SCHEDULE = '*/10 * * * *';
/** When OPEN document requests past their due time are expired (the page also expires one it sees at once). */
export const DOCUMENT_REQUEST_EXPIRY_SCHEDULE = '* * * * *';
/** When the review sweep runs: every minute, once per tick for the whole deployment. */
export const REVIEW_SWEEP_SCHEDULE = '* * * * *';
/**
 * Up to 20 emails in flight per instance, in two workers' batches; at most 5 of one organisation at
 * a time in the deployment, so the other worker's poll passes over a large backlog to the others'.
 */
export const EMAIL_WORK = { batchSize: 10, localConcurrency: 2, groupConcurrency: 5 };
/**
 * Imports: two at a time per instance, at most one of an organisation at a time in the deployment,
 * so another organisation's import is taken by the other worker while a large one runs.
 */
export const IMPORT_WORK = { batchSize: 1, localConcurrency: 2, groupConcurrency: 1 };

export async function startBackgroundJobs(deps: {
  config: Config;
  database: Database;
  logger: Logger;
  webhookWorker: boolean;
  /**
   * Whether this process works imports' rows (default: it does). `svc serve` with IMPORT_WORKER=off
   * leaves them to `svc worker` instances, so an import's batches never share the API's event loop.
   */
  importWorker?: boolean;
  /** The app's metrics, when this process serves them (`svc worker` has none). */
  metrics?: { retentionPurged(table: RetentionTable, rows: number): void } | undefined;
  /** The job runner to work on (stopped with the jobs); default: one started here. */
  runner?: JobRunner;
}): Promise<BackgroundJobs> {
  const { database, logger } = deps;
  const runner = deps.runner ?? (await startJobRunner(database, { logger }));
  // A run over many organisations may be long: stopping ends it after the batch in flight.
  const stopping = new AbortController();
  const linkSealer = linkSealerFor(deps.config);
  const services = createServices({ config: deps.config, database, sealer: linkSealer, jobs: runner });
  const { documentRequests, reviewJobs, imports } = services;
  const retention = services.retention({
    onPurged: (table, rows) => deps.metrics?.retentionPurged(table, rows),
    onOrganisationFailed: (orgId, error) => logger.warn({ err: error, orgId }, 'retention purge of an organisation failed'),
  });
  const emailSender = createEmailSender({ database, smtpUrl: deps.config.smtpUrl, from: deps.config.smtpFrom, logger, sealer: linkSealer });
  const loops: Loop[] = [];
  try {
    // Every growing table is bounded (docs/decisions.md, "Retention and batched purges"). The schedule
    // is the deployment's: each tick sends one job, which one instance works; SKIP LOCKED keeps the
    // batches off writers' rows.
    await runner.work(QUEUES.retention.name, {}, async () => {
      const purged = await retention.runOnce({ signal: stopping.signal });
      const rows = Object.values(purged).reduce((sum, count) => sum + count, 0);
      if (rows > 0) logger.info({ purged }, `retention: purged ${rows} rows`);
    });
    await runner.schedule(QUEUES.retention.name, RETENTION_SCHEDULE);
    await runner.work(QUEUES.documentRequestExpiry.name, {}, async () => {
      const expired = await documentRequests.expireDue();
      if (expired > 0) logger.info({ expired }, `document requests: expired ${expired}`);
    });
    await runner.schedule(QUEUES.documentRequestExpiry.name, DOCUMENT_REQUEST_EXPIRY_SCHEDULE);
    // Reviews fall due within a minute of their date; the sweep sent at start catches up after downtime
    // without waiting for the next tick. Claims skip each other's rows, so each review fires once.
    await runner.work(QUEUES.reviewSweep.name, {}, async () => {
      const swept = await reviewJobs.sweep();
      if (swept.due + swept.overdue > 0) logger.info(swept, `reviews: ${swept.due} due, ${swept.overdue} overdue`);
    });
    await runner.schedule(QUEUES.reviewSweep.name, REVIEW_SWEEP_SCHEDULE);
    await runner.send(database.db, QUEUES.reviewSweep.name, {});
    await runner.work<{ orgId: string; generation: number }>(QUEUES.reviewRedate.name, {}, async ([job]) => {
      if (!job) return;
      const redated = await reviewJobs.redate(job.data.orgId, job.data.generation);
      if (redated) logger.info({ orgId: job.data.orgId, ...redated }, `reviews: re-dated ${redated.moved} of ${redated.checked} records`);
    });
    // An import's rows, in batches; a run stopped by shutdown (or a dead instance's, after its heartbeat
    // lapsed) is retried and resumes at its first row without an outcome.
    if (deps.importWorker ?? true) {
      await runner.work<{ orgId: string; importId: string }>(QUEUES.importRun.name, IMPORT_WORK, async (batch) =>
        Promise.all(
          batch.map(async (job) => {
            const { orgId, importId } = job.data;
            try {
              const ended = await imports.run(orgId, importId, {
                signal: stopping.signal,
                onFailed: (error) => logger.error({ err: error, orgId, importId }, 'import failed'),
                onStatisticsFailed: (error) =>
                  logger.warn({ err: error, orgId, importId }, 'import: ANALYZE failed; lookups may plan poorly'),
              });
              if (ended)
                logger.info({ orgId, importId, status: ended.status, rows: ended.rowsDone }, `import ${ended.status.toLowerCase()}`);
              return { id: job.id, status: 'completed' as const };
            } catch (error) {
              logger.warn({ err: error, orgId, importId }, 'import interrupted; it resumes on retry');
              return { id: job.id, status: 'failed' as const, output: { message: error instanceof Error ? error.message : String(error) } };
            }
          }),
        ),
      );
    }
    if (deps.webhookWorker) {
      // Queued emails go out after their transaction committed (their job commits with them); a failed
      // send fails its job, which pg-boss retries with backoff.
      await runner.work<EmailJob>(QUEUES.emailSend.name, EMAIL_WORK, async (batch) =>
        Promise.all(
          batch.map(async (job) => {
            try {
              const sent = await emailSender.send(job.data, job);
              return { id: job.id, status: sent ? ('completed' as const) : ('failed' as const) };
            } catch (error) {
              return { id: job.id, status: 'failed' as const, output: { message: error instanceof Error ? error.message : String(error) } };
            }
          }),
        ),
      );
    }
  } catch (error) {
    if (!deps.runner) await runner.stop();
    throw error;
  }
  // Every instance, worker or not, seals the events feed and the audit chain: the feed shows an event,
  // and the chain a row, only once sealed, so neither may depend on how deliveries are deployed.
  // Instances racing for one organisation skip each other.
  loops.push(createEventsFeedSealer({ database, logger: logger.child({ component: 'events-feed-sealer' }) }));
  if (deps.config.auditSealing) {
    loops.push(createAuditChainSealer({ database, logger: logger.child({ component: 'audit-chain-sealer' }) }));
  } else {
    // Said at every start: an instance left this way by mistake would quietly hold the chain back.
    logger.warn(
      'AUDIT_SEALING=off: this instance does not seal the audit chain (a diagnostic setting); its rows wait for an instance that does',
    );
  }
  if (deps.webhookWorker) {
    loops.push(
      createDeliveryWorker({
        database,
        logger: logger.child({ component: 'webhook-worker' }),
        allowPrivateUrls: deps.config.webhookAllowPrivateUrls,
        allowedPorts: deps.config.webhookAllowedPorts,
        disableEndpointAfterMs: deps.config.webhookDisableAfterHours * 3_600_000,
      }),
    );
  }
  await Promise.all(loops.map((loop) => loop.start()));
  return {
    runner,
    async stop() {
      stopping.abort();
      // The runner waits for the jobs in flight (a retention run ends after its batch in flight).
      await Promise.all([runner.stop(), ...loops.map((loop) => loop.stop())]);
      emailSender.close();
    },
  };
}
