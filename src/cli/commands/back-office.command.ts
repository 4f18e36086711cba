import type { Command } from 'commander';
import { SCREENING_STATUSES, VERDICTS, type Verdict } from '../../modules/verification/back-office.service.js';
import type { AmlStatus } from '../../modules/customers/customers.schemas.js';
import { oneOf, type CliRunner } from '../runner.js';

/** Back-office operations: KYC portal submission and verdicts, AML screening and review, emails. */
export function registerBackOfficeCommands(program: Command, cli: CliRunner): void {
  const kyc = program.command('kyc').description('Verification back office (KYC and KYB)');
  kyc
    .command('submit')
    .description('Record that the person completed the portal step (→ IN_PROGRESS)')
    .requiredOption('--org <id>', 'organisation id')
    .requiredOption('--customer <id>', 'customer or entity UUID or external_id')
    .action((options: { org: string; customer: string }) =>
      cli.runCommand(({ services, actor }) => services.backOffice.submit(options.org, options.customer, actor)),
    );
  kyc
    .command('verdict')
    .description('Record a verdict: VERIFIED or FAILED (fires customer.kyc_completed) or RESUBMIT')
    .requiredOption('--org <id>', 'organisation id')
    .requiredOption('--customer <id>', 'customer or entity UUID or external_id')
    .requiredOption('--result <result>', VERDICTS.join(' | '), oneOf(VERDICTS))
    .option('--legal-name <name>', 'verified legal name (individuals; default: the full name)')
    .option('--country <alpha3>', 'verified country, ISO 3166-1 alpha-3 (individuals; default AUS)')
    .action((options: { org: string; customer: string; result: Verdict; legalName?: string; country?: string }) =>
      cli.runCommand(({ services, actor }) =>
        services.backOffice.verdict(
          options.org,
          options.customer,
          { result: options.result, legalName: options.legalName, country: options.country },
          actor,
        ),
      ),
    );

  const aml = program.command('aml').description('AML screening back office');
  aml
    .command('set')
    .description('Record a screening result (status and flags)')
    .requiredOption('--org <id>', 'organisation id')
    .requiredOption('--customer <id>', 'customer or entity UUID or external_id')
    .requiredOption('--status <status>', SCREENING_STATUSES.join(' | '), oneOf(SCREENING_STATUSES))
    .option('--pep', 'politically exposed person match')
    .option('--sanctions', 'sanctions match')
    .option('--adverse-media', 'adverse media match')
    .option('--terrorism', 'terrorism financing match')
    .action(
      (options: {
        org: string;
        customer: string;
        status: AmlStatus;
        pep?: boolean;
        sanctions?: boolean;
        adverseMedia?: boolean;
        terrorism?: boolean;
      }) => cli.runCommand(({ services, actor }) => services.backOffice.setAml(options.org, options.customer, options, actor)),
    );
  aml
    .command('resolve')
    .description('Complete the review of a NEEDS_REVIEW screening (→ RESOLVED, fires aml.review_completed)')
    .requiredOption('--org <id>', 'organisation id')
    .requiredOption('--customer <id>', 'customer or entity UUID or external_id')
    .action((options: { org: string; customer: string }) =>
      cli.runCommand(({ services, actor }) => services.backOffice.resolveAml(options.org, options.customer, actor)),
    );

  program
    .command('emails')
    .description('List queued and sent emails (recipient, subject, link)')
    .requiredOption('--org <id>', 'organisation id')
    .option('--to <address>', 'only emails to this address')
    .action((options: { org: string; to?: string }) =>
      cli.runCommand(({ services }) => services.emails.list(options.org, { to: options.to })),
    );
}
