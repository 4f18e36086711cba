import type { Command } from 'commander';
import { createApiKeysService } from '../../modules/api-keys/api-keys.service.js';
import { SCOPES } from '../../plugins/route-scopes.js';
import { parseInteger, parseList, runCommand } from '../runner.js';

export function registerApiKeyCommands(program: Command): void {
  const key = program.command('key').description('Manage API keys');

  key
    .command('create')
    .description('Issue an API key; its plaintext is printed only here')
    .requiredOption('--org <id>', 'organisation id')
    .requiredOption('--scopes <list>', `comma-separated scopes (${SCOPES.join(', ')})`)
    .option('--label <label>', 'a name for the key')
    .option('--expires-at <iso>', 'expiry as an ISO 8601 date-time')
    .option('--allow-ip <list>', 'comma-separated IPv4/IPv6 addresses or CIDR ranges')
    .option('--burst-limit <n>', 'requests per second for this key', parseInteger('--burst-limit'))
    .option('--daily-limit <n>', 'requests per UTC day for this key', parseInteger('--daily-limit'))
    .action(
      (options: {
        org: string;
        scopes: string;
        label?: string;
        expiresAt?: string;
        allowIp?: string;
        burstLimit?: number;
        dailyLimit?: number;
      }) =>
        runCommand(({ database, actor }) =>
          createApiKeysService({ database }).create(
            {
            orgId: options.org,
            scopes: parseList(options.scopes) ?? [],
            label: options.label,
            expiresAt: options.expiresAt !== undefined ? new Date(options.expiresAt) : undefined,
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
    .action((options: { org: string }) =>
      runCommand(({ database }) => createApiKeysService({ database }).list(options.org)),
    );

  key
    .command('revoke')
    .description('Revoke a key; the next request with it is refused on every instance')
    .argument('<id>', 'key id')
    .action((id: string) => runCommand(({ database, actor }) => createApiKeysService({ database }).revoke(id, actor)));
}
