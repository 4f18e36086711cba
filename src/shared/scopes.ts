/**
 * The scopes an API key can hold. The list is shared rather than kept with the route table
 * (plugins/route-scopes.ts) because keys are issued and checked outside the HTTP layer too: the
 * api-keys module, the CLI and the first start.
 */
export const SCOPES = [
  'customers:read',
  'customers:write',
  'aml:read',
  'verification:write',
  'groups:read',
  'groups:write',
  'events:read',
  'webhooks:write',
  'audit:read',
  'policy:read',
  'policy:write',
  'imports:read',
  'imports:write',
] as const;
export type Scope = (typeof SCOPES)[number];
