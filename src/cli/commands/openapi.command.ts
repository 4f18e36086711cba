import { mkdir, writeFile } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';
import type { Command } from 'commander';
import { generateOpenApiDocument, serializeOpenApiDocument } from '../../plugins/openapi-document.js';
import { type CliRunner } from '../runner.js';

export function registerOpenApiCommands(program: Command, cli: CliRunner): void {
  program
    .command('openapi')
    .description('Print the OpenAPI 3.1 document (or write it with --out); needs no database')
    .option('--out <file>', 'write the document to this file and print a summary instead')
    .action(async (options: { out?: string }) => {
      try {
        const document = await generateOpenApiDocument();
        if (!options.out) return cli.printJson(document);
        const file = resolve(options.out);
        await mkdir(dirname(file), { recursive: true });
        await writeFile(file, serializeOpenApiDocument(document));
        const paths = (document.paths ?? {}) as Record<string, Record<string, unknown>>;
        const operations = Object.values(paths).reduce((count, item) => count + Object.keys(item).length, 0);
        cli.printJson({ written: file, paths: Object.keys(paths).length, operations });
      } catch (error) {
        cli.fail(error);
      }
    });
}
