import type { Command } from 'commander';
import { registerOpenApiCommands } from './openapi.command.js';

/** Operator commands contributed by domain modules (kyc, aml, webhooks, templates, emails). */
export const cliCommandModules: Array<(program: Command) => void> = [registerOpenApiCommands];
