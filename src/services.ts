import type { Config } from './config/config.js';
import type { DataAccess } from './db/client.js';
import { createPageReads, type PageReads } from './db/page-reads.js';
import { createApiKeysRepository } from './modules/api-keys/api-keys.repository.js';
import { createApiKeysService } from './modules/api-keys/api-keys.service.js';
import { createAuditPurge } from './modules/audit/audit-purge.js';
import { createAuditRepository } from './modules/audit/audit.repository.js';
import { createAuditService } from './modules/audit/audit.service.js';
import type { BusinessRegister } from './modules/customers/business-register.js';
import { createCustomerChangeRecorder } from './modules/customers/customer-changes.js';
import { createCustomersRepository } from './modules/customers/customers.repository.js';
import { createCustomersService } from './modules/customers/customers.service.js';
import { createReviewColumns } from './modules/customers/review-columns.js';
import { createDocumentRequestsRepository } from './modules/document-requests/document-requests.repository.js';
import { createDocumentRequestsService } from './modules/document-requests/document-requests.service.js';
import { createDueDiligenceRepository } from './modules/due-diligence/due-diligence.repository.js';
import { createDueDiligenceService } from './modules/due-diligence/due-diligence.service.js';
import { createReviewJobs } from './modules/due-diligence/review-jobs.js';
import { createDocumentsRepository } from './modules/documents/documents.repository.js';
import { createDocumentsService } from './modules/documents/documents.service.js';
import { createEmailsRepository } from './modules/emails/emails.repository.js';
import { createEmailsService } from './modules/emails/emails.service.js';
import { createEntitiesRepository } from './modules/entities/entities.repository.js';
import { createEntitiesService } from './modules/entities/entities.service.js';
import { createEventsRepository } from './modules/events/events.repository.js';
import { createEventsService } from './modules/events/events.service.js';
import type { CuratedTemplate } from './modules/groups/curated-templates.js';
import { createGroupsRepository } from './modules/groups/groups.repository.js';
import { createGroupsService } from './modules/groups/groups.service.js';
import { createImportsRepository } from './modules/imports/imports.repository.js';
import { createImportsService } from './modules/imports/imports.service.js';
import { createCreditCharger, createPayerResolver } from './modules/organisations/credits.service.js';
import { createOrganisationsRepository } from './modules/organisations/organisations.repository.js';
import { createOrganisationsService } from './modules/organisations/organisations.service.js';
import { createRetentionRepository } from './modules/retention/retention.repository.js';
import { createReviewsRepository } from './modules/reviews/reviews.repository.js';
import { createReviewsService } from './modules/reviews/reviews.service.js';
import { createRetentionService, type RetentionOptions } from './modules/retention/retention.service.js';
import { cursorKeyLoader } from './modules/service-secrets/cursor-key.js';
import { createServiceSecretsRepository } from './modules/service-secrets/service-secrets.repository.js';
import { createBackOfficeService } from './modules/verification/back-office.service.js';
import { createVerificationRepository } from './modules/verification/verification.repository.js';
import { createVerificationService } from './modules/verification/verification.service.js';
import { webhookTargetPolicy, type ResolveHost } from './modules/webhooks/endpoint-url.js';
import { createWebhooksRepository } from './modules/webhooks/webhooks.repository.js';
import { createEndpointDisabler, createWebhooksService } from './modules/webhooks/webhooks.service.js';
import { createAuditWriter } from './shared/audit-writer.js';
import { systemClock, type Clock } from './shared/clock.js';
import type { JobQueue } from './shared/job-runner.js';
import { createOutboxRepository } from './shared/outbox.js';
import type { TextSealer } from './shared/text-sealer.js';

export type ServiceDeps = {
  config: Pick<Config, 'publicBaseUrl' | 'webhookAllowPrivateUrls' | 'webhookAllowedPorts' | 'retention'>;
  database: DataAccess;
  /** Seals link-bearing text at rest (emails). */
  sealer: TextSealer;
  /** Where writes enqueue their background jobs (emails). */
  jobs: JobQueue;
  clock?: Clock;
  /** Where list pages read; default: `database`. */
  pageReads?: PageReads;
  businessRegister?: BusinessRegister;
  resolveHost?: ResolveHost;
  /** Tests only: records per review sweep claim and re-dating batch (default REVIEW_BATCH). */
  reviewBatchSize?: number;
  /** Tests only: another curated template set, to simulate a deploy. */
  curatedTemplates?: readonly CuratedTemplate[];
  /** Tests only: rows per batch of an import's worker (default IMPORT_BATCH). */
  importBatchSize?: number;
};

/**
 * The composition root. Each repository and writer is built once here, and each service receives the
 * ones it uses, so no module builds another module's repository or service. The app, the CLI, the
 * background jobs and the tests build their services here.
 */
export function createServices(deps: ServiceDeps) {
  const { database, config } = deps;
  // What several services use, each taking the parts its own deps name.
  const clock = deps.clock ?? systemClock;
  const dueDiligence = createDueDiligenceRepository();
  const shared = {
    database,
    clock,
    pageReads: deps.pageReads ?? createPageReads({ primary: database }),
    cursorKey: cursorKeyLoader(database),
    publicBaseUrl: config.publicBaseUrl,
    audit: createAuditWriter(),
    outbox: createOutboxRepository(),
    changes: createCustomerChangeRecorder(),
    charge: createCreditCharger(),
    payerFor: createPayerResolver(),
    keys: createApiKeysRepository(),
    customers: createCustomersRepository(database.db),
    emails: createEmailsRepository(deps.sealer, deps.jobs),
    entityOwners: createEntitiesRepository(),
    organisations: createOrganisationsRepository(),
    verifications: createVerificationRepository(),
    secrets: createServiceSecretsRepository(),
    dueDiligence,
    reviewColumns: createReviewColumns({ policies: dueDiligence, clock }),
  };
  const entities = createEntitiesService({ ...shared, entities: shared.entityOwners });
  const documents = createDocumentsService({ ...shared, documents: createDocumentsRepository() });
  const customers = createCustomersService({ ...shared, businessRegister: deps.businessRegister });
  return {
    organisations: createOrganisationsService(shared),
    apiKeys: createApiKeysService(shared),
    customers,
    entities,
    documents,
    verification: createVerificationService({ ...shared, entities }),
    backOffice: createBackOfficeService({ ...shared, entities }),
    documentRequests: createDocumentRequestsService({ ...shared, requests: createDocumentRequestsRepository(), documents }),
    emails: createEmailsService(shared),
    events: createEventsService({ ...shared, events: createEventsRepository() }),
    webhooks: createWebhooksService({
      ...shared,
      policy: webhookTargetPolicy(config),
      resolveHost: deps.resolveHost,
      webhooks: createWebhooksRepository(),
      disabler: createEndpointDisabler(),
    }),
    audit: createAuditService({ ...shared, audit: createAuditRepository(), auditPurge: createAuditPurge(shared) }),
    dueDiligence: createDueDiligenceService({ ...shared, jobs: deps.jobs }),
    reviewJobs: createReviewJobs({ ...shared, batchSize: deps.reviewBatchSize }),
    groups: createGroupsService({ ...shared, groups: createGroupsRepository(), curatedTemplates: deps.curatedTemplates }),
    reviews: createReviewsService({ ...shared, entities, reviews: createReviewsRepository() }),
    imports: createImportsService({
      ...shared,
      jobs: deps.jobs,
      customers,
      entities,
      imports: createImportsRepository(),
      importBatchSize: deps.importBatchSize,
    }),
    /** The retention purge, with a run's batch size and hooks (the job's metrics and log). */
    retention: (options: RetentionOptions = {}) =>
      createRetentionService({
        ...shared,
        ...options,
        settings: config.retention,
        retention: createRetentionRepository(),
        auditPurge: createAuditPurge({
          ...shared,
          batchSize: options.batchSize,
          onPurged: (rows) => options.onPurged?.('audit_log', rows),
        }),
      }),
  };
}

export type Services = ReturnType<typeof createServices>;
