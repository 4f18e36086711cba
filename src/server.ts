import closeWithGrace from 'close-with-grace';
import type { FastifyInstance } from 'fastify';
import pino from 'pino';
import { buildApp, loggerOptions } from './app.js';
import type { Config } from './config/config.js';
import { connect, type Connection } from './db/connect.js';
import { leaveSignalsToCaller } from './db/embedded-postgres.js';
import { bootstrapSandbox } from './modules/organisations/sandbox.service.js';
import { startBackgroundJobs, type BackgroundJobs } from './jobs.js';

export type RunningServer = { app: FastifyInstance; connection: Connection; jobs: BackgroundJobs; close(): Promise<void> };

/** `svc serve`: database, migrations, first-start sandbox, HTTP server and (optionally) the workers. */
export async function startServer(config: Config, options: { worker?: boolean } = {}): Promise<RunningServer> {
  const logger = pino({ level: config.logLevel }, pino.destination(2));
  const connection = await connect(config, { info: (message) => logger.info(message) });
  const { database } = connection;

  let sandbox: Awaited<ReturnType<typeof bootstrapSandbox>>;
  let app: FastifyInstance | undefined;
  let jobs: BackgroundJobs | undefined;
  try {
    sandbox = await bootstrapSandbox({ database });
    app = await buildApp({ config, database, logger: loggerOptions(config) });
    jobs = startBackgroundJobs({ config, database, logger, webhookWorker: options.worker ?? config.webhookWorker });
    await app.listen({ port: config.port, host: config.host });
  } catch (error) {
    // The sandbox key, if just created, is valid: this is the only chance to show it.
    if (sandbox) printSandboxKey(sandbox, config.port);
    // A failed start (port in use, …) must not leave the embedded PostgreSQL running.
    await app?.close().catch(() => {});
    await jobs?.stop().catch(() => {});
    await connection.close().catch(() => {});
    throw error;
  }
  const address = app.server.address();
  const port = typeof address === 'object' && address ? address.port : config.port;
  if (sandbox) printSandboxKey(sandbox, port);

  let closing: Promise<void> | undefined;
  const close = () =>
    (closing ??= (async () => {
      // Stops accepting and lets in-flight requests finish. A keep-alive connection busy at that
      // moment would otherwise stay open after its response (until the client's idle timeout) and
      // hold the shutdown, so idle connections are closed as they appear.
      const sweep = setInterval(() => app.server.closeIdleConnections(), 100);
      await app.close().finally(() => clearInterval(sweep));
      await jobs.stop(); // finishes or releases claimed work
      await connection.close(); // pool, then the embedded server if this process started it
    })());
  return { app, jobs, connection, close };
}

/** `svc worker`: background delivery only, no HTTP. */
export async function startWorker(config: Config): Promise<{ close(): Promise<void> }> {
  const logger = pino({ level: config.logLevel }, pino.destination(2));
  const connection = await connect(config, { info: (message) => logger.info(message) });
  const jobs = startBackgroundJobs({ config, database: connection.database, logger, webhookWorker: true });
  logger.info('worker started');
  return {
    async close() {
      await jobs.stop();
      await connection.close();
    },
  };
}

function printSandboxKey(sandbox: { orgId: string; key: string }, port: number): void {
  const lines = [
    '',
    'First start: created a sandbox organisation (every feature on, 100 credits) and an all-scopes API key.',
    'The key is shown only this once; keep it somewhere safe:',
    '',
    `  ${sandbox.key}`,
    '',
    'Try it:',
    '',
    `  curl -H "Authorization: Bearer ${sandbox.key}" http://localhost:${port}/v1/customers`,
    '',
  ];
  process.stdout.write(`${lines.join('\n')}\n`);
}

/** Runs until SIGINT/SIGTERM, then shuts down gracefully (in-flight requests finish first). */
export function closeOnSignals(target: { close(): Promise<void> }, logger: { info(message: string): void; error(error: unknown): void }): void {
  closeWithGrace({ delay: 15_000 }, async ({ signal, err }) => {
    if (err) logger.error(err);
    logger.info(`shutting down${signal ? ` on ${signal}` : ''}`);
    await target.close();
  });
  leaveSignalsToCaller(); // from here on, this handler stops the embedded database, after the drain
}
