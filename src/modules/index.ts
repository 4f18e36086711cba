import type { FastifyPluginAsync } from 'fastify';
import { auditRoutes } from './audit/audit.routes.js';
import { customersRoutes } from './customers/customers.routes.js';
import { documentsRoutes } from './documents/documents.routes.js';
import { dueDiligenceRoutes } from './due-diligence/due-diligence.routes.js';
import { documentRequestsRoutes } from './document-requests/document-requests.routes.js';
import { designatedServicesRoutes } from './designated-services/designated-services.routes.js';
import { entitiesRoutes } from './entities/entities.routes.js';
import { eventsRoutes } from './events/events.routes.js';
import { groupsRoutes } from './groups/groups.routes.js';
import { importsRoutes } from './imports/imports.routes.js';
import { reviewsRoutes } from './reviews/reviews.routes.js';
import { verificationRoutes } from './verification/verification.routes.js';
import { webhooksRoutes } from './webhooks/webhooks.routes.js';

/** The v1 route modules, each registered under /v1 and serving through app.services. */
export const apiModules: FastifyPluginAsync[] = [
  customersRoutes,
  entitiesRoutes,
  groupsRoutes,
  verificationRoutes,
  designatedServicesRoutes,
  documentsRoutes,
  documentRequestsRoutes,
  eventsRoutes,
  webhooksRoutes,
  auditRoutes,
  dueDiligenceRoutes,
  reviewsRoutes,
  importsRoutes,
];
