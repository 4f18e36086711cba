import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { migrationsAreCurrent } from '../../db/migrate.js';
import { API_SUMMARY, API_TITLE, API_VERSION, DOCS_PATH, OPENAPI_PATH } from '../../plugins/openapi.plugin.js';
import { AppError } from '../../shared/app-error.js';
import { connectionLevelMessage, sqlStateOf } from '../../shared/database-errors.js';

const READY_WITHIN_MS = 1_000;

const rootIndex = z.object({
  name: z.string(),
  version: z.string(),
  description: z.string(),
  api_base_path: z.string(),
  authentication: z.string(),
  links: z.object({ docs: z.string(), openapi: z.string() }),
});

/** What `GET /` answers: where the API, its reference page and its OpenAPI document are. */
const ROOT_INDEX: z.infer<typeof rootIndex> = {
  name: API_TITLE,
  version: API_VERSION,
  description: API_SUMMARY,
  api_base_path: '/v1',
  authentication: 'Every /v1 request needs an API key: Authorization: Bearer svc_live_…',
  // Relative, so they hold behind any proxy or host name; `/docs/` is the page itself (`/docs` redirects there).
  links: { docs: `${DOCS_PATH}/`, openapi: OPENAPI_PATH },
};

/**
 * Why the database check failed, as far as it may be told (src/shared/database-errors.ts): a
 * connection the server refused (an unknown database, a failed login, a pooler refusing a startup
 * parameter) with the server's own message after its SQLSTATE; a failed statement by its SQLSTATE
 * only (its message could quote values); anything else (no connection, no answer in time) as
 * unreachable, naming nothing of the connection (its host, port or user).
 */
export function notReady(error: unknown): AppError {
  const state = sqlStateOf(error);
  const serverMessage = connectionLevelMessage(error);
  if (serverMessage !== undefined) {
    return new AppError('database_unavailable', 503, `The database refused the connection${state ? ` (${state})` : ''}: ${serverMessage}`);
  }
  if (state !== undefined) return new AppError('database_unavailable', 503, `The database check failed (${state}).`);
  return new AppError('database_unavailable', 503, 'The database is not reachable.');
}

export async function healthRoutes(app: FastifyInstance): Promise<void> {
  // A newcomer opening the server's address finds the reference page and the document from here.
  app.get('/', { schema: { hide: true, response: { 200: rootIndex } } }, async () => ROOT_INDEX);

  app.get(
    '/healthz',
    // Probed every few seconds by orchestrators: counted in /metrics, not logged unless they fail.
    { logLevel: 'warn', schema: { hide: true, response: { 200: z.object({ status: z.literal('ok') }) } } },
    async () => ({ status: 'ok' as const }),
  );

  app.get(
    '/readyz',
    { logLevel: 'warn', schema: { hide: true, response: { 200: z.object({ status: z.literal('ready'), database: z.literal('ok') }) } } },
    async () => {
      let timer: NodeJS.Timeout | undefined;
      try {
        // Not ready while the pool cannot serve: a probe that gets no connection and answer within
        // READY_WITHIN_MS says so instead of waiting out the pool's own bound.
        const unanswered = new Promise<never>((_, reject) => {
          timer = setTimeout(() => reject(new Error('the pool did not answer in time')), READY_WITHIN_MS);
        });
        const current = await Promise.race([migrationsAreCurrent(app.deps.database.pool), unanswered]);
        if (!current) throw new AppError('service_unavailable', 503, 'Database migrations are not applied yet.');
      } catch (error) {
        if (error instanceof AppError) throw error;
        throw notReady(error);
      } finally {
        clearTimeout(timer);
      }
      return { status: 'ready' as const, database: 'ok' as const };
    },
  );
}
