import type { Command } from 'commander';

/** Operator commands contributed by domain modules (kyc, aml, webhooks, templates, emails). */
export const cliCommandModules: Array<(program: Command) => void> = [];
