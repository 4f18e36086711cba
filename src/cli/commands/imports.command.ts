import { open } from 'node:fs/promises';
import type { Command } from 'commander';
import { IMPORT_KINDS, type ImportKind } from '../../modules/imports/import-columns.js';
import { readImportFile, removeSpool, type ImportFormat } from '../../modules/imports/import-parser.js';
import type { ImportDto } from '../../modules/imports/imports.schemas.js';
import { AppError } from '../../shared/app-error.js';
import type { RequestContext } from '../../shared/request-context.js';
import { createProgressBar } from '../progress.js';
import { oneOf, type CliRunner } from '../runner.js';

/** A file's format by its extension, as POST /v1/imports reads a file part's name: NDJSON for .ndjson and .jsonl, else CSV. */
export function formatOfPath(path: string): ImportFormat {
  return /\.(ndjson|jsonl)$/i.test(path) ? 'ndjson' : 'csv';
}

/** The import's file, opened before anything is stored: a missing or unreadable one is named as such. */
async function openImportFile(path: string) {
  try {
    return await open(path, 'r');
  } catch (error) {
    throw AppError.field('file', `Cannot read ${path}: ${(error as NodeJS.ErrnoException).code ?? (error as Error).message}.`);
  }
}

/**
 * `svc import`: the job POST /v1/imports queues, run to its end by this process (a worker of `svc serve`
 * that takes the same job meanwhile shares the rows, each applied once). The file is read, checked and
 * spooled exactly as an upload is (a bad file is refused before anything is stored), stored as an
 * import by the operator, then applied batch by batch with a progress bar on a terminal's stderr.
 */
export function registerImportCommands(program: Command, cli: CliRunner): void {
  program
    .command('import')
    .description(
      'Import a CSV (or .ndjson/.jsonl) file of individuals or entities as POST /v1/imports does, run it to its end and print the finished import ' +
        '{id, status, counts, …}; exits 0 once it COMPLETED (failed rows included: GET /v1/imports/{id}/rows?outcome=FAILED), 1 when the file is refused ' +
        'or the import stopped FAILED or CANCELLED. A progress bar (rows/s, ETA) on stderr when it is a terminal. Interrupted, the import is resumed by a ' +
        "`svc serve` or `svc worker` process's job runner",
    )
    .requiredOption('--org <id>', 'organisation id')
    .requiredOption('--kind <kind>', IMPORT_KINDS.join(' | '), oneOf(IMPORT_KINDS))
    .requiredOption(
      '--file <path>',
      'the file: CSV with a header row (as GET /v1/imports/templates/{kind}.csv), or NDJSON for .ndjson/.jsonl',
    )
    .option('--dry-run', 'validate and match every row and report the outcomes it would have, writing no record')
    .action((options: { org: string; kind: ImportKind; file: string; dryRun?: boolean }) =>
      cli.runCommand<ImportDto>(
        async ({ services, database, actor }) => {
          // An unknown organisation is a 404 before the file is read.
          const org = await services.organisations.show(options.org);
          const handle = await openImportFile(options.file);
          const file = await readImportFile(handle.createReadStream(), {
            format: formatOfPath(options.file),
            kind: () => options.kind,
          }).finally(() => handle.close().catch(() => undefined));
          const ctx: RequestContext = { orgId: org.id, actor, transaction: (work) => database.transaction(work) };
          let created: ImportDto;
          try {
            created = await services.imports.create(ctx, {
              kind: options.kind,
              dryRun: options.dryRun ?? false,
              fileName: options.file.split(/[\\/]/).at(-1) ?? null,
              file,
            });
          } finally {
            await removeSpool(file.spoolPath);
          }
          const progress = createProgressBar(cli.io.stderr);
          progress.start(created.rows_total);
          try {
            await services.imports.run(org.id, created.id, { onBatch: ({ rowsDone }) => progress.update(rowsDone) });
          } finally {
            progress.stop();
          }
          return services.imports.get(ctx, created.id);
        },
        {
          exitCode: (finished) => (finished.status === 'COMPLETED' ? 0 : 1),
          message: (finished) =>
            `error: the import ended ${finished.status}${finished.error ? `: ${finished.error.message}` : ''} (${finished.rows_done} of ${finished.rows_total} rows applied)`,
        },
      ),
    );
}
