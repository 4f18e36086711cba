import type { Command } from 'commander';
import { registerWebhookCommands } from './webhooks.command.js';

/** Operator commands contributed by domain modules (kyc, aml, webhooks, templates, emails). */
export const cliCommandModules: Array<(program: Command) => void> = [registerWebhookCommands];
