/**
 * Who caused a change: an API key, an operator at the CLI, or the system itself; for an API request,
 * its request id and Idempotency-Key (both kept on the audit row).
 * `contact`: an entity's contact through a document request's upload link; the id is the request's.
 */
export type Actor = {
  type: 'api_key' | 'operator' | 'system' | 'contact';
  id: string | null;
  requestId?: string;
  idempotencyKey?: string;
  /** A bulk import's row made the change (modules/imports): webhook endpoints that opted out get no delivery of its events. */
  importId?: string;
};
