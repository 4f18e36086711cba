import type { FastifyPluginAsync } from 'fastify';
import { groupsRoutes } from './groups/groups.routes.js';

/** The v1 route modules, each registered under /v1 and building its own services from app.deps. */
export const apiModules: FastifyPluginAsync[] = [groupsRoutes];
