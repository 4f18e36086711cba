import { Command, CommanderError } from 'commander';
import { loadConfig, type Config } from '../config/config.js';
import { runMigrations } from '../db/migrate.js';
import { cliLogger, fail, printJson } from './runner.js';
import { connect } from '../db/connect.js';
import { registerOrganisationCommands } from './commands/organisations.command.js';
import { registerApiKeyCommands } from './commands/api-keys.command.js';
import { cliCommandModules } from './commands/index.js';

function configOrExit(): Config {
  try {
    return loadConfig();
  } catch (error) {
    return fail(error);
  }
}

const program = new Command()
  .name('svc')
  .description(
    'Customer and entity verification API: server, worker and operator commands.\nEvery operator command prints one JSON document on stdout (audit export without --out: the data itself); logs go to stderr.',
  )
  .showHelpAfterError()
  .exitOverride();

program
  .command('serve')
  .description('Serve the API (and the in-process webhook/email worker unless WEBHOOK_WORKER=off)')
  .action(async () => {
    const config = configOrExit();
    const logger = cliLogger({ ...config, logLevel: config.logLevel });
    try {
      // Loaded on demand: the HTTP stack is not needed by the operator commands, which start faster without it.
      const { closeOnSignals, startServer } = await import('../server.js');
      const server = await startServer(config);
      closeOnSignals(server, { info: (message) => server.app.log.info(message), error: (error) => server.app.log.error(error) });
    } catch (error) {
      logger.error({ err: error }, 'failed to start');
      fail(error);
    }
  });

program
  .command('worker')
  .description('Run only the background delivery worker (webhooks, emails)')
  .action(async () => {
    const config = configOrExit();
    const logger = cliLogger(config);
    try {
      const { closeOnSignals, startWorker } = await import('../server.js');
      const worker = await startWorker(config);
      closeOnSignals(worker, { info: (message) => logger.warn(message), error: (error) => logger.error(error) });
    } catch (error) {
      fail(error);
    }
  });

program
  .command('migrate')
  .description('Apply pending database migrations and exit')
  .action(async () => {
    const config = configOrExit();
    const logger = cliLogger(config);
    try {
      const connection = await connect(config, { info: (message) => logger.info(message) }, { migrate: false });
      const result = await runMigrations(connection.directUrl);
      await connection.close();
      printJson({ applied: result.applied });
    } catch (error) {
      fail(error);
    }
  });

registerOrganisationCommands(program);
registerApiKeyCommands(program);
for (const register of cliCommandModules) register(program);

try {
  await program.parseAsync(process.argv);
} catch (error) {
  if (error instanceof CommanderError) {
    process.exit(error.exitCode);
  }
  fail(error);
}
