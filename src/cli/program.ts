import { Command, CommanderError } from 'commander';
import { runMigrations } from '../db/migrate.js';
import { connect } from '../db/connect.js';
import { CliExit, createCliRunner, type CliIo, type CliRunner } from './runner.js';
import { registerOrganisationCommands } from './commands/organisations.command.js';
import { registerApiKeyCommands } from './commands/api-keys.command.js';
import { cliCommandModules } from './commands/index.js';

/** The `svc` program with every command, writing to `cli`'s streams. A program parses once: build one per run. */
export function createProgram(cli: CliRunner): Command {
  const program = new Command()
    .name('svc')
    .description(
      'Customer and entity verification API: server, worker and operator commands.\nEvery operator command prints one JSON document on stdout (audit export without --out: the data itself); logs go to stderr.',
    )
    .configureOutput({
      writeOut: (text) => cli.io.stdout.write(text),
      writeErr: (text) => cli.io.stderr.write(text),
      getOutHelpWidth: () => (cli.io.stdout.isTTY ? ((cli.io.stdout as { columns?: number }).columns ?? 80) : 80),
      getErrHelpWidth: () => (cli.io.stderr.isTTY ? (cli.io.stderr.columns ?? 80) : 80),
      getOutHasColors: () => false,
      getErrHasColors: () => false,
    })
    .showHelpAfterError()
    .exitOverride();

  program
    .command('serve')
    .description('Serve the API (and the in-process webhook/email worker unless WEBHOOK_WORKER=off, imports unless IMPORT_WORKER=off)')
    .action(async () => {
      const config = cli.config();
      const logger = cli.logger({ ...config, logLevel: config.logLevel });
      try {
        // Loaded on demand: the HTTP stack is not needed by the operator commands, which start faster without it.
        const { closeOnSignals, startServer } = await import('../server.js');
        const server = await startServer(config);
        closeOnSignals(server, { info: (message) => server.app.log.info(message), error: (error) => server.app.log.error(error) });
      } catch (error) {
        logger.error({ err: error }, 'failed to start');
        cli.fail(error);
      }
    });

  program
    .command('worker')
    .description('Run only the background workers (webhooks, emails, imports, scheduled jobs)')
    .action(async () => {
      const config = cli.config();
      const logger = cli.logger(config);
      try {
        const { closeOnSignals, startWorker } = await import('../server.js');
        const worker = await startWorker(config);
        closeOnSignals(worker, { info: (message) => logger.warn(message), error: (error) => logger.error(error) });
      } catch (error) {
        cli.fail(error);
      }
    });

  program
    .command('migrate')
    .description('Apply pending database migrations and exit')
    .action(async () => {
      const config = cli.config();
      const logger = cli.logger(config);
      try {
        const connection = await connect(config, { info: (message) => logger.info(message) }, { migrate: false });
        const result = await runMigrations(connection.directUrl);
        await connection.close();
        cli.printJson({ applied: result.applied });
      } catch (error) {
        cli.fail(error);
      }
    });

  registerOrganisationCommands(program, cli);
  registerApiKeyCommands(program, cli);
  for (const register of cliCommandModules) register(program, cli);
  return program;
}

/**
 * How a run ended: its exit code, and whether the process must exit now (a failure, or commander's
 * own exit for help and usage errors) rather than once its work has drained (`serve` keeps running).
 */
export type CliOutcome = { code: number; exitNow: boolean };

/** Runs `svc <argv>` (arguments after the program name) with `io`. */
export async function runCliOutcome(argv: readonly string[], io: CliIo): Promise<CliOutcome> {
  const cli = createCliRunner(io);
  const program = createProgram(cli);
  try {
    await program.parseAsync([...argv], { from: 'user' });
    return { code: cli.exitCode, exitNow: false };
  } catch (error) {
    if (error instanceof CommanderError) return { code: error.exitCode, exitNow: true };
    if (error instanceof CliExit) return { code: error.code, exitNow: true };
    try {
      cli.fail(error);
    } catch (exit) {
      if (exit instanceof CliExit) return { code: exit.code, exitNow: true };
      throw exit;
    }
  }
  return { code: 1, exitNow: true };
}
