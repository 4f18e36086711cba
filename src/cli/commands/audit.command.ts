import { InvalidArgumentError, type Command } from 'commander';
import { once } from 'node:events';
import { createWriteStream } from 'node:fs';
import { rename, rm } from 'node:fs/promises';
import type { Writable } from 'node:stream';
import type { ChainVerdict } from '../../modules/audit/audit-chain.verifier.js';
import { EXPORT_FORMATS, type ExportFormat, type ExportManifest } from '../../modules/audit/audit-export.js';
import { verifyExportFile } from '../../modules/audit/audit-export.verifier.js';
import { type ExportSink } from '../../modules/audit/audit.service.js';
import { createProgressBar } from '../progress.js';
import { dateTimeRangeProblem } from '../../shared/dates.schema.js';
import { oneOf, type CliRunner } from '../runner.js';

/** `svc audit verify`'s exit code when the chain is broken (1 stays "the command failed": nothing on stdout). */
const CHAIN_BROKEN_EXIT_CODE = 2;

export function registerAuditCommands(program: Command, cli: CliRunner): void {
  const audit = program.command('audit').description("Inspect an organisation's audit trail and its hash chain");

  audit
    .command('head')
    .description('Print the last sealed sequence and hash of the chain (publish it elsewhere, e.g. daily, to detect a truncation later)')
    .requiredOption('--org <id>', 'organisation id')
    .action((options: { org: string }) => cli.runCommand(({ services }) => services.audit.head(options.org)));

  audit
    .command('export')
    .description(
      'Stream the sealed rows (in sequence order, at constant memory) and a closing manifest that `audit verify --file` checks offline. Without --out, stdout carries only the data; with --out, stdout gets the manifest as one JSON document',
    )
    .requiredOption('--org <id>', 'organisation id')
    .option('--from <date>', 'rows created at or after this instant (ISO 8601; a bare date is midnight UTC)', parseInstant('--from'))
    .option('--to <date>', 'rows created before this instant (exclusive)', parseInstant('--to'))
    .option('--format <format>', `${EXPORT_FORMATS.join(' or ')}`, oneOf(EXPORT_FORMATS), 'ndjson')
    .option('--out <file>', 'write to this file (via FILE.partial, renamed once complete) instead of stdout')
    .action((options: { org: string; from?: Date; to?: Date; format: ExportFormat; out?: string }) =>
      cli.runCommand<ExportManifest>(
        async ({ services }) => {
          if (options.from && options.to && options.from >= options.to) throw new InvalidArgumentError('--from must be before --to');
          const partial = options.out === undefined ? undefined : `${options.out}.partial`;
          const stream: Writable = partial === undefined ? cli.io.stdout : createWriteStream(partial, { flags: 'w' });
          const progress = createProgressBar(cli.io.stderr);
          const sink: ExportSink = {
            async write(chunk) {
              if (!stream.write(chunk)) await once(stream, 'drain');
            },
            start: (total) => progress.start(total),
            progress: (rows) => progress.update(rows),
          };
          try {
            const manifest = await services.audit.export(options.org, { format: options.format, from: options.from, to: options.to }, sink);
            progress.stop();
            if (partial !== undefined) {
              stream.end();
              await once(stream, 'finish');
              await rename(partial, options.out!);
            }
            return manifest;
          } catch (error) {
            if (partial !== undefined) {
              stream.destroy();
              await rm(partial, { force: true });
            }
            throw error;
          }
        },
        // Reads only, in one read-only snapshot: a read-only role or a standby serves.
        { migrate: false, print: () => options.out !== undefined },
      ),
    );

  audit
    .command('verify')
    .description(
      `Recompute the chain in a read-only transaction (--org) or of an export file offline, without a database (--file), and name the first broken row (edited, deleted, inserted, reordered, truncated; manifest for a file whose manifest contradicts its rows); exits ${CHAIN_BROKEN_EXIT_CODE} when broken`,
    )
    .option('--org <id>', 'organisation id')
    .option('--file <file>', 'an export of `svc audit export`')
    .option('--format <format>', `the file's format, ${EXPORT_FORMATS.join(' or ')} (default: read from the file)`, oneOf(EXPORT_FORMATS))
    .action(async (options: { org?: string; file?: string; format?: ExportFormat }) => {
      if ((options.org === undefined) === (options.file === undefined)) return cli.fail(new Error('give either --org or --file'));
      if (options.file !== undefined) return verifyFile(cli, options.file, options.format);
      const org = options.org!;
      return cli.runCommand<ChainVerdict>(({ services }) => services.audit.verify(org), {
        // It writes nothing, so it runs on a read-only connection too (a read-only role or a standby).
        migrate: false,
        exitCode: (verdict) => (verdict.ok ? 0 : CHAIN_BROKEN_EXIT_CODE),
        message: (verdict) =>
          verdict.ok
            ? ''
            : `audit chain broken at sequence ${verdict.broken_at.sequence} (${verdict.broken_at.problem}): ${verdict.broken_at.detail}`,
      });
    });

  audit
    .command('purge')
    .description(
      'Delete the sealed audit rows created before DATE behind a signed checkpoint, so the rest still verifies; refused for a DATE inside AUDIT_RETENTION_YEARS',
    )
    .requiredOption('--org <id>', 'organisation id')
    .requiredOption(
      '--before <date>',
      'rows created before this are deleted: 2018-01-31 (midnight UTC) or 2018-01-31T12:00:00Z',
      parseInstant('--before'),
    )
    .action((options: { org: string; before: Date }) =>
      cli.runCommand(({ services, config, actor }) =>
        services.audit.purge(options.org, options.before, { actor, retentionYears: config.retention.auditYears }),
      ),
    );
}

/** `svc audit verify --file`: no configuration and no database, so it runs on any machine the file is given to. */
async function verifyFile(cli: CliRunner, file: string, format: ExportFormat | undefined): Promise<void> {
  let verdict;
  try {
    verdict = await verifyExportFile(file, format);
  } catch (error) {
    return cli.fail(error);
  }
  cli.printJson(verdict);
  if (!verdict.ok) {
    cli.io.stderr.write(
      `audit export broken at sequence ${verdict.broken_at.sequence} (${verdict.broken_at.problem}): ${verdict.broken_at.detail}\n`,
    );
    cli.setExitCode(CHAIN_BROKEN_EXIT_CODE);
  }
}

/** An instant in ISO 8601 with its offset; a bare date (2026-01-31) is midnight UTC. */
function parseInstant(name: string) {
  return (value: string): Date => {
    const text = /^\d{4}-\d{2}-\d{2}$/.test(value) ? `${value}T00:00:00Z` : value;
    const instant = new Date(text);
    // A date-time without its offset would be read in the machine's zone: ask for it.
    if (!/^\d{4}-\d{2}-\d{2}(T.*(Z|[+-]\d{2}:?\d{2}))?$/.test(value) || Number.isNaN(instant.getTime())) {
      throw new InvalidArgumentError(
        `${name} must be an ISO 8601 date (2026-01-31) or date-time with its offset (2026-01-31T09:00:00Z), got "${value}"`,
      );
    }
    // The API's bounds (years 0001 to 9999), so a date PostgreSQL cannot hold is refused here, by name.
    const problem = dateTimeRangeProblem(value, instant);
    if (problem) throw new InvalidArgumentError(`${name}: ${problem} Got "${value}".`);
    return instant;
  };
}
