import { InvalidArgumentError, type Command } from 'commander';
import type { ChainVerdict } from '../../modules/audit/audit-chain.verifier.js';
import { createAuditService } from '../../modules/audit/audit.service.js';
import { runCommand } from '../runner.js';

/** `svc audit verify`'s exit code when the chain is broken (1 stays "the command failed": nothing on stdout). */
export const CHAIN_BROKEN_EXIT_CODE = 2;

/** A day (midnight UTC) or a date-time with its zone: a purge boundary must not depend on the operator's TZ. */
function purgeDate(value: string): Date {
  const date = new Date(value);
  if (!/^\d{4}-\d{2}-\d{2}(?:T\d{2}:\d{2}(?::\d{2}(?:\.\d{1,3})?)?(?:Z|[+-]\d{2}:\d{2}))?$/.test(value) || Number.isNaN(date.getTime())) {
    throw new InvalidArgumentError('must be a date (2018-01-31, midnight UTC) or an ISO 8601 date-time with its zone (2018-01-31T12:00:00Z)');
  }
  return date;
}

export function registerAuditCommands(program: Command): void {
  const audit = program.command('audit').description("Inspect an organisation's audit trail and its hash chain");

  audit
    .command('head')
    .description('Print the last sealed sequence and hash of the chain (publish it elsewhere, e.g. daily, to detect a truncation later)')
    .requiredOption('--org <id>', 'organisation id')
    .action((options: { org: string }) => runCommand(({ database }) => createAuditService({ database }).head(options.org)));

  audit
    .command('verify')
    .description(
      `Recompute the chain in a read-only transaction and name the first broken row (edited, deleted, inserted, reordered, truncated); exits ${CHAIN_BROKEN_EXIT_CODE} when broken`,
    )
    .requiredOption('--org <id>', 'organisation id')
    .action((options: { org: string }) =>
      runCommand<ChainVerdict>(({ database }) => createAuditService({ database }).verify(options.org), {
        // It writes nothing, so it runs on a read-only connection too (a read-only role or a standby).
        migrate: false,
        exitCode: (verdict) => (verdict.ok ? 0 : CHAIN_BROKEN_EXIT_CODE),
        message: (verdict) =>
          verdict.ok ? '' : `audit chain broken at sequence ${verdict.broken_at.sequence} (${verdict.broken_at.problem}): ${verdict.broken_at.detail}`,
      }),
    );

  audit
    .command('purge')
    .description(
      'Delete the sealed audit rows created before DATE behind a signed checkpoint, so the rest still verifies; refused for a DATE inside AUDIT_RETENTION_YEARS',
    )
    .requiredOption('--org <id>', 'organisation id')
    .requiredOption('--before <date>', 'rows created before this are deleted: 2018-01-31 (midnight UTC) or 2018-01-31T12:00:00Z', purgeDate)
    .action((options: { org: string; before: Date }) =>
      runCommand(({ database, config, actor }) =>
        createAuditService({ database }).purge(options.org, options.before, { actor, retentionYears: config.retention.auditYears }),
      ),
    );
}
