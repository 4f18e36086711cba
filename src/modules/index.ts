import type { FastifyPluginAsync } from 'fastify';

/** The v1 route modules, each registered under /v1 and building its own services from app.deps. */
export const apiModules: FastifyPluginAsync[] = [];
