import type { Logger } from 'pino';
import type { Config } from './config/config.js';
import type { Database } from './db/client.js';
import { createEmailSender } from './modules/emails/email-sender.js';
import { createIdempotencyRepository } from './plugins/idempotency.repository.js';
import { createDeliveryWorker } from './modules/webhooks/delivery.worker.js';

export type BackgroundJobs = { stop(): Promise<void> };

type Job = { stop(): Promise<void> };

/** A periodic task that never overlaps itself and is stopped with the process. */
export function every(intervalMs: number, task: () => Promise<void>, onError: (error: unknown) => void): Job {
  let running: Promise<void> | undefined;
  const timer = setInterval(() => {
    if (running) return;
    running = task()
      .catch(onError)
      .finally(() => {
        running = undefined;
      });
  }, intervalMs);
  timer.unref();
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
}): BackgroundJobs {
  const { database, logger } = deps;
  const idempotency = createIdempotencyRepository(database.db);
  const emailSender = createEmailSender({ database, smtpUrl: deps.config.smtpUrl, from: deps.config.smtpFrom, logger });
  const jobs: Job[] = [
    // Expired idempotency records are ignored on lookup anyway; this only keeps the table small.
    every(
      60_000,
      async () => {
        while ((await idempotency.deleteExpired(1000)) === 1000) {
          /* keep deleting in small batches */
        }
      },
      (error) => logger.warn({ err: error }, 'idempotency cleanup failed'),
    ),
  ];
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
      await Promise.all(jobs.map((job) => job.stop()));
      emailSender.close();
    },
  };
}
