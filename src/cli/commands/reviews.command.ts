import type { Command } from 'commander';
import { parseInteger, type CliRunner } from '../runner.js';

/** Ongoing due diligence: the records whose review is due, and the sandbox's way to make one due now. */
export function registerReviewCommands(program: Command, cli: CliRunner): void {
  const review = program.command('review').description('Ongoing due diligence reviews');

  review
    .command('due')
    .description('List the individuals and entities whose review is DUE or OVERDUE, the longest due first (their DTOs)')
    .requiredOption('--org <id>', 'organisation id')
    .option('--limit <n>', 'at most this many (1 to 1000, default 100)', parseInteger('--limit'))
    .action((options: { org: string; limit?: number }) =>
      cli.runCommand(({ services }) => services.reviews.due(options.org, { limit: options.limit })),
    );

  review
    .command('simulate-due')
    .description("Make a verified record's review due now (DUE, reason SCHEDULED_DATE; fires customer.review_due) and print its DTO")
    .requiredOption('--org <id>', 'organisation id')
    .requiredOption('--customer <id>', 'customer or entity UUID or external_id')
    .action((options: { org: string; customer: string }) =>
      cli.runCommand(({ services, actor }) => services.reviews.simulateDue(options.org, options.customer, actor)),
    );
}
