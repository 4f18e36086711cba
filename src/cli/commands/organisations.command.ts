import { InvalidArgumentError, type Command } from 'commander';
import { FEATURES, PAYERS, type Feature, type Payer } from '../../modules/organisations/organisations.schemas.js';
import { oneOf, parseInteger, parseList, type CliRunner } from '../runner.js';

function features(value: string): Feature[] {
  const list = parseList(value) ?? [];
  const unknown = list.filter((feature) => !FEATURES.includes(feature as Feature));
  if (unknown.length) throw new InvalidArgumentError(`unknown feature(s) ${unknown.join(', ')}; valid: ${FEATURES.join(', ')}`);
  return list as Feature[];
}

const payer = oneOf(PAYERS);

export function registerOrganisationCommands(program: Command, cli: CliRunner): void {
  const org = program.command('org').description('Manage organisations');

  org
    .command('create')
    .description('Create an organisation')
    .requiredOption('--name <name>', 'organisation name')
    .option('--features <list>', `comma-separated features (${FEATURES.join(', ')})`, features)
    .option('--credits <n>', 'initial credit balance', parseInteger('--credits'))
    .option('--default-payer <payer>', 'who pays for checks by default (organization | customer)', payer)
    .action((options: { name: string; features?: Feature[]; credits?: number; defaultPayer?: Payer }) =>
      cli.runCommand(({ services, actor }) =>
        services.organisations.create(
          {
            name: options.name,
            features: options.features ?? [],
            credits: options.credits ?? 0,
            defaultPayer: options.defaultPayer ?? 'organization',
          },
          actor,
        ),
      ),
    );

  org
    .command('list')
    .description("List the organisations, oldest first (the first start's sandbox among them)")
    .action(() => cli.runCommand(({ services }) => services.organisations.list()));

  org
    .command('show')
    .description('Show an organisation')
    .argument('<id>', 'organisation id')
    .action((id: string) => cli.runCommand(({ services }) => services.organisations.show(id)));

  org
    .command('update')
    .description('Update an organisation')
    .argument('<id>', 'organisation id')
    .option('--name <name>', 'new name')
    .option('--features <list>', `replace the feature set (${FEATURES.join(', ')}); "" clears it`, features)
    .option('--add-credits <n>', 'add (or, negative, remove) credits', parseInteger('--add-credits'))
    .option('--default-payer <payer>', 'organization | customer', payer)
    .action((id: string, options: { name?: string; features?: Feature[]; addCredits?: number; defaultPayer?: Payer }) =>
      cli.runCommand(({ services, actor }) => services.organisations.update(id, options, actor)),
    );
}
