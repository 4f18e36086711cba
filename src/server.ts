import { performance } from 'node:perf_hooks';
import closeWithGrace from 'close-with-grace';
import type { FastifyInstance } from 'fastify';
import type { FastifyServerOptions } from 'fastify';
import pino from 'pino';
import { buildApp } from './app.js';
import { createLogger, loggerOptions, prettyLogsWanted } from './shared/logging.js';
import { secondsSince } from './shared/clock.js';
import { resolveLinkKey } from './shared/text-sealer.js';
import type { Config } from './config/config.js';
import { connect, type Connection } from './db/connect.js';
import { leaveSignalsToCaller } from './embedded/embedded-postgres.js';
import { bootstrapSandbox, hasNoOrganisation, printOrganisationHint, printSandboxKey } from './embedded/first-start.js';
import { listenForMetrics, type MetricsListener } from './plugins/metrics.plugin.js';
import { startBackgroundJobs, type BackgroundJobs } from './jobs.js';
import { startJobRunner, type JobRunner } from './shared/job-runner.js';

export type RunningServer = {
  app: FastifyInstance;
  connection: Connection;
  jobs: BackgroundJobs;
  /** The METRICS_PORT listener, when configured. */
  metrics: MetricsListener | undefined;
  close(): Promise<void>;
};

/**
 * `svc serve`: database, migrations, the first-start sandbox (embedded database) or hint (DATABASE_URL),
 * HTTP server, the METRICS_PORT listener and (optionally) the workers.
 */
export async function startServer(config: Config, options: { worker?: boolean } = {}): Promise<RunningServer> {
  const starting = performance.now();
  const logger = createLogger(config, 2);
  const connection = await connect(config, { info: (message) => logger.info(message) }, { replica: true });
  const { database, replica } = connection;

  let app: FastifyInstance | undefined;
  let runner: JobRunner | undefined;
  let jobs: BackgroundJobs | undefined;
  let metrics: MetricsListener | undefined;
  let closing: Promise<void> | undefined;
  // One order for a signal and for a failed start alike: stop accepting and let in-flight requests
  // finish, then stop the workers (they finish or release their claims), then the metrics listener
  // (a scrape reads the pool), then close the pool, and last stop the embedded PostgreSQL if this
  // process started it. A failing step does not skip the later ones: the pool and the embedded
  // server still close.
  const close = () =>
    (closing ??= inOrder([() => app?.close(), () => jobs?.stop() ?? runner?.stop(), () => metrics?.close(), () => connection.close()]));

  let sandbox: Awaited<ReturnType<typeof bootstrapSandbox>>;
  try {
    // Only the embedded (development) database gets a sandbox and a printed key; on DATABASE_URL a
    // key would land in the deployment's logs, so an empty database gets instructions instead.
    sandbox = connection.embedded ? await bootstrapSandbox({ database }) : undefined;
    const noOrganisation = !connection.embedded && (await hasNoOrganisation({ database }));
    warnOfLocalLinkKey(config, connection.embedded, logger);
    // One job runner for the process: requests enqueue on it, the background jobs work on it.
    runner = await startJobRunner(database, { logger });
    app = await buildApp({ config, database, replica, logger: httpLoggerOptions(config), jobs: runner });
    jobs = await startBackgroundJobs({
      config,
      database,
      logger,
      webhookWorker: options.worker ?? config.webhookWorker,
      importWorker: config.importWorker,
      metrics: app.metrics,
      runner,
    });
    await app.listen({ port: config.port, host: config.host });
    if (config.metricsPort !== undefined) metrics = await listenForMetrics(app, { port: config.metricsPort, host: config.host });
    const address = app.server.address();
    const port = typeof address === 'object' && address ? address.port : config.port;
    logger.info(`ready on ${app.listeningOrigin} in ${secondsSince(starting)}; API reference: ${app.listeningOrigin}/docs`);
    // On a terminal, pretty log lines go out through a worker thread, after whatever is written
    // meanwhile: without this the block below lands in the middle of the start-up steps.
    if (sandbox || noOrganisation) await flushed(logger);
    if (sandbox) printSandboxKey(sandbox, port);
    if (noOrganisation) printOrganisationHint();
    return { app, connection, jobs, metrics, close };
  } catch (error) {
    // The sandbox key, if just created, is valid: this is the only chance to show it.
    if (sandbox) printSandboxKey(sandbox, config.port);
    // A start that fails (port taken, bad sandbox) must not leave the embedded database running.
    await close().catch((closeError: unknown) => logger.error({ err: closeError }, 'cleanup after a failed start failed'));
    throw error;
  }
}

/** `svc worker`: background work only (deliveries, emails, imports, scheduled jobs), no HTTP. */
export async function startWorker(config: Config): Promise<{ close(): Promise<void> }> {
  const logger = createLogger(config, 2);
  const connection = await connect(config, { info: (message) => logger.info(message) });
  warnOfLocalLinkKey(config, connection.embedded, logger);
  const jobs = await startBackgroundJobs({ config, database: connection.database, logger, webhookWorker: true }).catch(
    async (error: unknown) => {
      await connection.close();
      throw error;
    },
  );
  logger.info('worker started');
  let closing: Promise<void> | undefined;
  return { close: () => (closing ??= inOrder([() => jobs.stop(), () => connection.close()])) };
}

/**
 * Without LINK_ENCRYPTION_KEY the key is a file in DATA_DIR: right for the embedded database, which
 * lives there too, but on a shared database every instance (and `svc`) needs the same key.
 */
function warnOfLocalLinkKey(config: Config, embedded: boolean, logger: { warn(message: string): void }): void {
  const { source, path } = resolveLinkKey({ key: config.linkEncryptionKey, dataDir: config.dataDir });
  if (source === 'file' && !embedded) {
    logger.warn(
      `LINK_ENCRYPTION_KEY is not set: links at rest are sealed with the key in ${path}; set LINK_ENCRYPTION_KEY so every instance and svc command on this database uses the same key`,
    );
  }
}

function flushed(logger: { flush(done?: (error?: Error) => void): void }): Promise<void> {
  return new Promise((resolve) => logger.flush(() => resolve()));
}

/** Runs every step, one after the other, even when an earlier one fails; rethrows the first failure. */
async function inOrder(steps: Array<() => Promise<unknown> | undefined>): Promise<void> {
  let failure: unknown;
  for (const step of steps) {
    try {
      await step();
    } catch (error) {
      failure ??= error;
    }
  }
  if (failure !== undefined) throw failure;
}

/**
 * JSON lines on stderr (stdout carries only what a person or script reads: the first-start key);
 * human-readable ones only on a terminal in development (never in production or CI).
 */
function httpLoggerOptions(config: Config): FastifyServerOptions['logger'] {
  const options = loggerOptions(config);
  if (!prettyLogsWanted(config, process.stderr)) return { ...options, stream: pino.destination(2) };
  return { ...options, transport: { target: 'pino-pretty', options: { destination: 2, translateTime: 'SYS:HH:MM:ss.l' } } };
}

const SHUTDOWN_SIGNALS = ['SIGINT', 'SIGTERM'] as const;
/**
 * One Ctrl-C can arrive twice: the terminal signals its whole foreground process group, and under
 * `npm start` npm forwards the one it got to the server as well, a few milliseconds later.
 */
const REPEATED_SIGNAL_MS = 1_000;

/** Runs until SIGINT/SIGTERM, then shuts down gracefully (in-flight requests finish first). */
export function closeOnSignals(
  target: { close(): Promise<void> },
  logger: { info(message: string): void; error(error: unknown): void },
): void {
  let shutdownSignal: { signal: NodeJS.Signals; at: number } | undefined;
  // Under compose's 30 s stop_grace_period (and Kubernetes' default 30 s), so the orderly path
  // finishes before the orchestrator's SIGKILL. SIGINT and SIGTERM are handled below rather than by
  // close-with-grace, whose second signal exits at once: the repeat of one Ctrl-C must not.
  const grace = closeWithGrace({ delay: 25_000, skip: [...SHUTDOWN_SIGNALS] }, async ({ signal, err }) => {
    if (err) logger.error(err);
    const cause = signal ?? shutdownSignal?.signal;
    logger.info(`shutting down${cause ? ` on ${cause}` : ''}`);
    await target.close();
  });
  const onSignal = (signal: NodeJS.Signals) => {
    if (shutdownSignal === undefined) {
      shutdownSignal = { signal, at: performance.now() };
      void grace.close();
    } else if (signal !== shutdownSignal.signal || performance.now() - shutdownSignal.at >= REPEATED_SIGNAL_MS) {
      logger.error(`second ${signal}, exiting`);
      process.exit(1);
    }
  };
  for (const signal of SHUTDOWN_SIGNALS) process.on(signal, onSignal);
  leaveSignalsToCaller(); // from here on, this handler stops the embedded database, after the drain
}
