import type { Command } from 'commander';
import { registerTemplateCommands } from './templates.command.js';

/** Operator commands contributed by domain modules (kyc, aml, webhooks, templates, emails). */
export const cliCommandModules: Array<(program: Command) => void> = [registerTemplateCommands];
