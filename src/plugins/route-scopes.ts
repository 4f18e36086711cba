import type { Scope } from '../shared/scopes.js';

/**
 * The single table of which scope each v1 route needs (the spec's Scopes table, and ours for the routes it leaves open).
 * `null` means any valid key. A v1 route missing from this table fails at startup.
 */
export const ROUTE_SCOPES: Readonly<Record<string, Scope | null>> = {
  'POST /v1/customers': 'customers:write',
  'GET /v1/customers': 'customers:read',
  'GET /v1/customers/:id': 'customers:read',
  'PATCH /v1/customers/:id': 'customers:write',
  'PUT /v1/customers/:id/designated-services': 'customers:write',
  'GET /v1/customers/:id/aml': 'aml:read',
  'POST /v1/customers/:id/kyc': 'verification:write',
  'POST /v1/entities': 'customers:write',
  'GET /v1/entities': 'customers:read',
  'GET /v1/entities/:id': 'customers:read',
  'PATCH /v1/entities/:id': 'customers:write',
  'GET /v1/entities/:id/aml': 'aml:read',
  'GET /v1/entities/:id/ubos': 'customers:read',
  'POST /v1/entities/:id/ubos': 'customers:write',
  'POST /v1/entities/:id/ubos/:uboId/send-link': 'verification:write',
  'POST /v1/entities/:id/kyb': 'verification:write',
  'POST /v1/entities/:id/documents': 'verification:write',
  'GET /v1/entities/:id/documents': 'customers:read',
  'GET /v1/entities/:id/documents/:documentId/content': 'customers:read',
  'GET /v1/document-types': null,
  'POST /v1/entities/:id/document-requests': 'verification:write',
  'GET /v1/entities/:id/document-requests': 'customers:read',
  'POST /v1/groups': 'groups:write',
  'GET /v1/group-templates': 'groups:read',
  'GET /v1/designated-services': null,
  'GET /v1/events': 'events:read',
  'GET /v1/events/:id': 'events:read',
  'POST /v1/webhook-endpoints': 'webhooks:write',
  'GET /v1/webhook-endpoints': 'webhooks:write',
  'GET /v1/webhook-endpoints/:id': 'webhooks:write',
  'PATCH /v1/webhook-endpoints/:id': 'webhooks:write',
  'DELETE /v1/webhook-endpoints/:id': 'webhooks:write',
  'POST /v1/webhook-endpoints/:id/rotate-secret': 'webhooks:write',
  'POST /v1/webhook-endpoints/:id/test': 'webhooks:write',
  'GET /v1/webhook-endpoints/:id/deliveries': 'webhooks:write',
  'POST /v1/webhook-deliveries/:id/retry': 'webhooks:write',
  'GET /v1/audit-events': 'audit:read',
  'GET /v1/due-diligence-policy': 'policy:read',
  'PUT /v1/due-diligence-policy': 'policy:write',
  'POST /v1/customers/:id/reviews': 'verification:write',
  'GET /v1/customers/:id/reviews': 'customers:read',
  'POST /v1/entities/:id/reviews': 'verification:write',
  'GET /v1/entities/:id/reviews': 'customers:read',
  'POST /v1/imports': 'imports:write',
  'GET /v1/imports': 'imports:read',
  'GET /v1/imports/templates/:file': 'imports:read',
  'GET /v1/imports/:id': 'imports:read',
  'GET /v1/imports/:id/rows': 'imports:read',
  'POST /v1/imports/:id/cancel': 'imports:write',
};

export function routeKey(method: string, url: string): string {
  return `${method.toUpperCase()} ${url}`;
}
