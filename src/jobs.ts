import type { Logger } from 'pino';
import type { Config } from './config/config.js';
import type { Database } from './db/client.js';
import { createAuditChainSealer } from './modules/audit/audit-chain.sealer.js';
import { createEmailSender } from './modules/emails/email-sender.js';
import { createEventsFeedSealer } from './modules/events/events-feed.sealer.js';
import { createDeliveryWorker } from './modules/webhooks/delivery.worker.js';
import { createRetentionService, type RetentionTable } from './modules/retention/retention.service.js';
import { createDocumentRequestsService } from './modules/document-requests/document-requests.service.js';
import { systemClock } from './shared/clock.js';
import { linkSealerFor } from './shared/text-sealer.js';

export type BackgroundJobs = { stop(): Promise<void> };

type Job = { stop(): Promise<void> };

/** How often the retention purge runs (and once at start); each run is a pass over every organisation. */
const RETENTION_INTERVAL_MS = 10 * 60_000;
/** How often OPEN document requests past their due time are expired (the page also expires one it sees at once). */
const DOCUMENT_REQUEST_EXPIRY_INTERVAL_MS = 60_000;

/** A periodic task that never overlaps itself and is stopped with the process. */
export function every(
  intervalMs: number,
  task: () => Promise<void>,
  onError: (error: unknown) => void,
  options: { atStart?: boolean } = {},
): Job {
  let running: Promise<void> | undefined;
  const tick = () => {
    if (running) return;
    running = task()
      .catch(onError)
      .finally(() => {
        running = undefined;
      });
  };
  const timer = setInterval(tick, intervalMs);
  timer.unref();
  if (options.atStart) tick();
  return {
    async stop() {
      clearInterval(timer);
      await running;
    },
  };
}

export function startBackgroundJobs(deps: {
  config: Config;
  database: Database;
  logger: Logger;
  webhookWorker: boolean;
  /** The app's metrics, when this process serves them (`svc worker` has none). */
  metrics?: { retentionPurged(table: RetentionTable, rows: number): void } | undefined;
}): BackgroundJobs {
  const { database, logger } = deps;
  const retention = createRetentionService({
    database,
    settings: deps.config.retention,
    onPurged: (table, rows) => deps.metrics?.retentionPurged(table, rows),
    onOrganisationFailed: (orgId, error) => logger.warn({ err: error, orgId }, 'retention purge of an organisation failed'),
  });
  // A run over many organisations may be long: stopping ends it after the batch in flight.
  const stopping = new AbortController();
  const linkSealer = linkSealerFor(deps.config);
  const documentRequests = createDocumentRequestsService({
    database,
    publicBaseUrl: deps.config.publicBaseUrl,
    clock: systemClock,
    sealer: linkSealer,
  });
  const emailSender = createEmailSender({ database, smtpUrl: deps.config.smtpUrl, from: deps.config.smtpFrom, logger, sealer: linkSealer });
  const jobs: Job[] = [
    // Every growing table is bounded (docs/decisions.md, "Retention and batched purges"). Every
    // instance runs it: SKIP LOCKED makes concurrent runs share the rows instead of waiting.
    every(
      RETENTION_INTERVAL_MS,
      async () => {
        const purged = await retention.runOnce({ signal: stopping.signal });
        const rows = Object.values(purged).reduce((sum, count) => sum + count, 0);
        if (rows > 0) logger.info({ purged }, `retention: purged ${rows} rows`);
      },
      (error) => logger.warn({ err: error }, 'retention purge failed'),
      { atStart: true },
    ),
    // Every instance: claims per organisation with SKIP LOCKED, so instances share the due requests.
    every(
      DOCUMENT_REQUEST_EXPIRY_INTERVAL_MS,
      async () => {
        const expired = await documentRequests.expireDue();
        if (expired > 0) logger.info({ expired }, `document requests: expired ${expired}`);
      },
      (error) => logger.warn({ err: error }, 'document request expiry failed'),
      { atStart: true },
    ),
  ];
  // Every instance, worker or not: the feed shows an event only once it is sealed, so sealing must
  // not depend on how deliveries are deployed. Instances racing for one organisation skip each other.
  const sealer = createEventsFeedSealer({ database, logger: logger.child({ component: 'events-feed-sealer' }) });
  const sealing = sealer.start().catch((error: unknown) => logger.error({ err: error }, 'events feed sealer failed to start'));
  jobs.push({
    async stop() {
      await sealing;
      await sealer.stop();
    },
  });
  // Every instance, worker or not: audit rows are chained within seconds of their commit however the
  // service is deployed. Instances racing for one organisation skip each other.
  if (deps.config.auditSealing) {
    const auditSealer = createAuditChainSealer({ database, logger: logger.child({ component: 'audit-chain-sealer' }) });
    const auditSealing = auditSealer.start().catch((error: unknown) => logger.error({ err: error }, 'audit chain sealer failed to start'));
    jobs.push({
      async stop() {
        await auditSealing;
        await auditSealer.stop();
      },
    });
  } else {
    // Said at every start: an instance left this way by mistake would quietly hold the chain back.
    logger.warn(
      'AUDIT_SEALING=off: this instance does not seal the audit chain (a diagnostic setting); its rows wait for an instance that does',
    );
  }
  if (deps.webhookWorker) {
    // Queued emails go out after their transaction committed; a failed send is retried, never lost.
    jobs.push(
      every(
        1_000,
        async () => {
          await emailSender.runOnce();
        },
        (error) => logger.warn({ err: error }, 'email sending failed'),
      ),
    );
    const worker = createDeliveryWorker({
      database,
      logger: logger.child({ component: 'webhook-worker' }),
      allowPrivateUrls: deps.config.webhookAllowPrivateUrls,
      allowedPorts: deps.config.webhookAllowedPorts,
      disableEndpointAfterMs: deps.config.webhookDisableAfterHours * 3_600_000,
    });
    const started = worker.start().catch((error: unknown) => logger.error({ err: error }, 'webhook worker failed to start'));
    jobs.push({
      async stop() {
        await started;
        await worker.stop();
      },
    });
  }
  return {
    async stop() {
      stopping.abort();
      await Promise.all(jobs.map((job) => job.stop()));
      emailSender.close();
    },
  };
}
