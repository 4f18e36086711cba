import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { migrationsAreCurrent } from '../../db/migrate.js';
import { AppError } from '../../shared/app-error.js';

const READY_WITHIN_MS = 1_000;

export async function healthRoutes(app: FastifyInstance): Promise<void> {
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
        throw new AppError('database_unavailable', 503, 'The database is not reachable.');
      } finally {
        clearTimeout(timer);
      }
      return { status: 'ready' as const, database: 'ok' as const };
    },
  );
}
