import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { migrationsAreCurrent } from '../../db/migrate.js';
import { AppError } from '../../shared/app-error.js';

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
      try {
        const current = await migrationsAreCurrent(app.deps.database.pool);
        if (!current) throw new AppError('service_unavailable', 503, 'Database migrations are not applied yet.');
      } catch (error) {
        if (error instanceof AppError) throw error;
        throw new AppError('service_unavailable', 503, 'The database is not reachable.');
      }
      return { status: 'ready' as const, database: 'ok' as const };
    },
  );
}
