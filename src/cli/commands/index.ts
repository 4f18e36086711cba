import type { Command } from 'commander';
import type { CliRunner } from '../runner.js';
import { registerAuditCommands } from './audit.command.js';
import { registerBackOfficeCommands } from './back-office.command.js';
import { registerImportCommands } from './imports.command.js';
import { registerOpenApiCommands } from './openapi.command.js';
import { registerReviewCommands } from './reviews.command.js';
import { registerTemplateCommands } from './templates.command.js';
import { registerWebhookCommands } from './webhooks.command.js';

/** Operator commands contributed by domain modules (kyc, aml, webhooks, templates, emails, openapi, audit, review, import). */
export const cliCommandModules: Array<(program: Command, cli: CliRunner) => void> = [
  registerTemplateCommands,
  registerBackOfficeCommands,
  registerWebhookCommands,
  registerOpenApiCommands,
  registerAuditCommands,
  registerReviewCommands,
  registerImportCommands,
];
