import { readFile } from 'node:fs/promises';
import type { Command } from 'commander';
import { AppError } from '../../shared/app-error.js';
import { type CliRunner } from '../runner.js';

async function readTemplateFile(path: string): Promise<unknown> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (error) {
    throw AppError.field('file', `Cannot read ${path}: ${(error as NodeJS.ErrnoException).code ?? (error as Error).message}.`);
  }
  try {
    return JSON.parse(text) as unknown;
  } catch (error) {
    throw AppError.field('file', `${path} is not valid JSON: ${(error as Error).message}.`);
  }
}

export function registerTemplateCommands(program: Command, cli: CliRunner): void {
  const template = program.command('template').description('Manage group templates');

  template
    .command('create')
    .description(
      'Add a custom group template to an organisation from a JSON file:\n' +
        '{"code", "name", "description"?, "industry", "roles": [{"roleLabel", "partyType"?: INDIVIDUAL|ENTITY|EITHER,\n' +
        ' "required"?: boolean, "checkTrigger"?: ON_ADD|BEFORE_SETTLEMENT|MANUAL}]}',
    )
    .requiredOption('--org <id>', 'organisation id')
    .requiredOption('--file <path>', 'template JSON file')
    .action((options: { org: string; file: string }) =>
      cli.runCommand(async ({ services, actor }) => {
        const file = await readTemplateFile(options.file);
        return services.groups.createCustomTemplate(options.org, file, actor);
      }),
    );
}
