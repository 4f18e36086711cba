import { InvalidArgumentError, type Command } from 'commander';
import { SCOPES } from '../../shared/scopes.js';
import { dateTimeRangeProblem } from '../../shared/dates.schema.js';
import { parseInteger, parseList, type CliRunner } from '../runner.js';

/** An operator issuing an already expired key is a mistake (the service allows it, for tests of expiry). */
function futureDateTime(value: string): Date {
  const date = new Date(value);
  if (!/^\d{4}-\d{2}-\d{2}/.test(value) || Number.isNaN(date.getTime())) {
    throw new InvalidArgumentError('must be an ISO 8601 date-time, e.g. 2027-01-31T00:00:00Z');
  }
  // The API's bounds: past them PostgreSQL refuses the value, and the command would fail on SQL.
  if (dateTimeRangeProblem(value, date)) {
    throw new InvalidArgumentError('must lie between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59.999Z, as written and in UTC');
  }
  if (date.getTime() <= Date.now()) throw new InvalidArgumentError('must be in the future');
  return date;
}

export function registerApiKeyCommands(program: Command, cli: CliRunner): void {
  const key = program.command('key').description('Manage API keys');

  key
    .command('create')
    .description('Issue an API key; its plaintext is printed only here')
    .requiredOption('--org <id>', 'organisation id')
    .requiredOption('--scopes <list>', `comma-separated scopes (${SCOPES.join(', ')})`)
    .option('--label <label>', 'a name for the key')
    .option('--expires-at <iso>', 'expiry as an ISO 8601 date-time in the future', futureDateTime)
    .option('--allow-ip <list>', 'comma-separated IPv4/IPv6 addresses or CIDR ranges')
    .option('--burst-limit <n>', 'requests per second for this key', parseInteger('--burst-limit'))
    .option('--daily-limit <n>', 'requests per UTC day for this key', parseInteger('--daily-limit'))
    .action(
      (options: {
        org: string;
        scopes: string;
        label?: string;
        expiresAt?: Date;
        allowIp?: string;
        burstLimit?: number;
        dailyLimit?: number;
      }) =>
        cli.runCommand(({ services, actor }) =>
          services.apiKeys.create(
            {
              orgId: options.org,
              scopes: parseList(options.scopes) ?? [],
              label: options.label,
              expiresAt: options.expiresAt,
              allowIps: parseList(options.allowIp),
              burstLimit: options.burstLimit,
              dailyLimit: options.dailyLimit,
            },
            actor,
          ),
        ),
    );

  key
    .command('list')
    .description('List the keys of an organisation (no secrets)')
    .requiredOption('--org <id>', 'organisation id')
    .action((options: { org: string }) => cli.runCommand(({ services }) => services.apiKeys.list(options.org)));

  key
    .command('revoke')
    .description('Revoke a key; the next request with it is refused on every instance')
    .argument('<id>', 'key id')
    .action((id: string) => cli.runCommand(({ services, actor }) => services.apiKeys.revoke(id, actor)));
}
