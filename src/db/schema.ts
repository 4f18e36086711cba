import { sql } from 'drizzle-orm';
import {
  bigint,
  bigserial,
  boolean,
  date,
  index,
  integer,
  jsonb,
  numeric,
  pgTable,
  primaryKey,
  text,
  timestamp,
  uniqueIndex,
  uuid,
} from 'drizzle-orm/pg-core';

// Millisecond precision everywhere: a JS Date holds milliseconds, so cursors and columns agree exactly.
const timestamptz = (name: string) => timestamp(name, { withTimezone: true, precision: 3, mode: 'date' });
const createdAt = () => timestamptz('created_at').notNull().default(sql`clock_timestamp()`);
const updatedAt = () => timestamptz('updated_at').notNull().default(sql`clock_timestamp()`);
const orgId = () =>
  uuid('org_id')
    .notNull()
    .references(() => organisations.id, { onDelete: 'cascade' });

// ---------------------------------------------------------------------------------------------
// Organisations, API keys, audit
// ---------------------------------------------------------------------------------------------

export const organisations = pgTable('organisations', {
  id: uuid('id').primaryKey().defaultRandom(),
  name: text('name').notNull(),
  features: text('features').array().notNull().default(sql`'{}'::text[]`),
  credits: integer('credits').notNull().default(0),
  defaultPayer: text('default_payer', { enum: ['organization', 'customer'] }).notNull().default('organization'),
  isSandbox: boolean('is_sandbox').notNull().default(false),
  createdAt: createdAt(),
  updatedAt: updatedAt(),
});

export const apiKeys = pgTable(
  'api_keys',
  {
    id: uuid('id').primaryKey().defaultRandom(),
    orgId: orgId(),
    label: text('label'),
    /** First characters of the key, safe to display ("svc_live_AbCd…"). */
    displayPrefix: text('display_prefix').notNull(),
    /** Hex SHA-256 of the plaintext key; the plaintext is never stored. */
    keyHash: text('key_hash').notNull(),
    scopes: text('scopes').array().notNull(),
    /** Normalized IPv4/IPv6 CIDR ranges; empty means any address. */
    allowedIps: text('allowed_ips').array().notNull().default(sql`'{}'::text[]`),
    burstLimit: integer('burst_limit'),
    dailyLimit: integer('daily_limit'),
    expiresAt: timestamptz('expires_at'),
    revokedAt: timestamptz('revoked_at'),
    lastUsedAt: timestamptz('last_used_at'),
    createdAt: createdAt(),
  },
  (table) => [uniqueIndex('api_keys_key_hash_key').on(table.keyHash), index('api_keys_org_idx').on(table.orgId)],
);

/** One row per key: the current burst (1 s) and daily (UTC day) windows, shared by every instance. */
export const apiKeyUsage = pgTable('api_key_usage', {
  apiKeyId: uuid('api_key_id')
    .primaryKey()
    .references(() => apiKeys.id, { onDelete: 'cascade' }),
  orgId: orgId(),
  burstWindow: bigint('burst_window', { mode: 'number' }).notNull(),
  burstCount: integer('burst_count').notNull(),
  dayWindow: integer('day_window').notNull(),
  dayCount: integer('day_count').notNull(),
});

export const idempotencyKeys = pgTable(
  'idempotency_keys',
  {
    apiKeyId: uuid('api_key_id')
      .notNull()
      .references(() => apiKeys.id, { onDelete: 'cascade' }),
    key: text('key').notNull(),
    orgId: orgId(),
    fingerprint: text('fingerprint').notNull(),
    responseStatus: integer('response_status'),
    responseBody: text('response_body'),
    createdAt: createdAt(),
  },
  (table) => [primaryKey({ columns: [table.apiKeyId, table.key] }), index('idempotency_keys_created_idx').on(table.createdAt)],
);

export const auditLog = pgTable(
  'audit_log',
  {
    id: bigserial('id', { mode: 'number' }).primaryKey(),
    // No foreign key: the audit trail outlives whatever it records, and every row is written in the
    // transaction of a change to a record of this organisation (migration 0008).
    orgId: uuid('org_id').notNull(),
    actorType: text('actor_type', { enum: ['api_key', 'operator', 'system'] }).notNull(),
    actorId: text('actor_id'),
    action: text('action').notNull(),
    subjectType: text('subject_type').notNull(),
    subjectId: uuid('subject_id'),
    before: jsonb('before'),
    after: jsonb('after'),
    requestId: text('request_id'),
    createdAt: createdAt(),
  },
  (table) => [index('audit_log_subject_idx').on(table.orgId, table.subjectId)],
);

// ---------------------------------------------------------------------------------------------
// Customers (individuals and entities share one table)
// ---------------------------------------------------------------------------------------------

/** A change more than a second after the record's creation (the partial list indexes' predicate). */
export const LATE_CHANGE = sql`(updated_at - created_at) > interval '1 second'`;

export const customers = pgTable(
  'customers',
  {
    id: uuid('id').primaryKey().defaultRandom(),
    orgId: orgId(),
    kind: text('kind', { enum: ['individual', 'entity'] }).notNull(),
    externalId: text('external_id'),
    /** INDIVIDUAL | SOLE_TRADER for individuals; COMPANY | TRUST | PARTNERSHIP | SMSF | OTHER for entities. */
    type: text('type').notNull(),
    /** Individual's full name or the entity's legal name. */
    name: text('name').notNull(),
    email: text('email'),
    phone: text('phone'),
    firstName: text('first_name'),
    middleName: text('middle_name'),
    lastName: text('last_name'),
    /** Provenance rank of the structured name parts: a higher-ranked source is never overwritten by a lower one. */
    nameProvenanceRank: integer('name_provenance_rank'),
    businessName: text('business_name'),
    abn: text('abn'),
    acn: text('acn'),
    businessRegisterStatus: text('business_register_status'),
    origin: text('origin', { enum: ['AUSTRALIAN', 'INTERNATIONAL'] }),
    address: text('address'),
    countryOfFormation: text('country_of_formation'),
    registrationNumber: text('registration_number'),
    representativeName: text('representative_name'),
    representativeEmail: text('representative_email'),
    contactCustomerId: uuid('contact_customer_id'),
    contactKycRequired: boolean('contact_kyc_required'),
    /** Whether this individual was created as an entity's contact person rather than a customer. */
    isContactOnly: boolean('is_contact_only').notNull().default(false),
    defaultPayer: text('default_payer', { enum: ['organization', 'customer'] }),
    kycStatus: text('kyc_status').notNull(),
    kycStartedAt: timestamptz('kyc_started_at'),
    kycCompletedAt: timestamptz('kyc_completed_at'),
    verifiedLegalName: text('verified_legal_name'),
    verifiedCountry: text('verified_country'),
    amlStatus: text('aml_status').notNull().default('NOT_SCREENED'),
    amlScreenedAt: timestamptz('aml_screened_at'),
    amlLastReviewedAt: timestamptz('aml_last_reviewed_at'),
    amlPep: boolean('aml_pep').notNull().default(false),
    amlSanctions: boolean('aml_sanctions').notNull().default(false),
    amlAdverseMedia: boolean('aml_adverse_media').notNull().default(false),
    amlTerrorism: boolean('aml_terrorism').notNull().default(false),
    addedVia: text('added_via').notNull(),
    isDesignatedService: boolean('is_designated_service'),
    designatedServices: text('designated_services').array().notNull().default(sql`'{}'::text[]`),
    preExistingServices: text('pre_existing_services').array().notNull().default(sql`'{}'::text[]`),
    preExistingServiceSince: date('pre_existing_service_since', { mode: 'string' }),
    clientSinceDate: date('client_since_date', { mode: 'string' }),
    preCommencementAssessment: jsonb('pre_commencement_assessment'),
    riskAnswers: jsonb('risk_answers').notNull().default(sql`'{}'::jsonb`),
    riskRating: text('risk_rating', { enum: ['LOW', 'MEDIUM', 'HIGH'] }).notNull().default('LOW'),
    clientClassification: text('client_classification').notNull().default('NOT_DESIGNATED'),
    createdAt: createdAt(),
    updatedAt: updatedAt(),
  },
  (table) => [
    uniqueIndex('customers_org_external_id_key').on(table.orgId, table.externalId).where(sql`external_id IS NOT NULL`),
    uniqueIndex('customers_individual_name_email_key')
      .on(table.orgId, sql`lower(${table.email})`, sql`lower(${table.name})`)
      .where(sql`kind = 'individual' AND email IS NOT NULL`),
    uniqueIndex('customers_entity_abn_key').on(table.orgId, table.abn).where(sql`kind = 'entity' AND abn IS NOT NULL`),
    uniqueIndex('customers_entity_acn_key').on(table.orgId, table.acn).where(sql`kind = 'entity' AND acn IS NOT NULL`),
    uniqueIndex('customers_entity_name_type_key')
      .on(table.orgId, sql`lower(${table.name})`, table.type)
      .where(sql`kind = 'entity'`),
    // List pages (docs/decisions.md, "Lists at a million records"). Every list walks (created_at, id)
    // within an organisation and kind; each filter the spec allows has an index that yields its rows in
    // that order, so a page reads its own rows and no more. Every index ends with the filtered columns,
    // so a page's rows are chosen by an index-only scan and only the page itself is read from the table.
    index('customers_list_idx').on(table.orgId, table.kind, table.createdAt, table.id, table.updatedAt, table.kycStatus, table.amlStatus, table.type),
    index('customers_status_list_idx').on(table.orgId, table.kind, table.kycStatus, table.createdAt, table.id, table.updatedAt, table.amlStatus, table.type),
    index('customers_aml_list_idx').on(table.orgId, table.kind, table.amlStatus, table.createdAt, table.id, table.updatedAt, table.kycStatus, table.type),
    index('customers_entity_type_list_idx')
      .on(table.orgId, table.type, table.createdAt, table.id, table.updatedAt, table.kycStatus, table.amlStatus)
      .where(sql`kind = 'entity'`),
    // `updated_since`: the rows changed more than a second after they were created ("late"), in both
    // orders. A row created before updated_since that changed after it is one of them, or was created
    // within the second before it.
    index('customers_late_list_idx')
      .on(table.orgId, table.kind, table.createdAt, table.id, table.updatedAt, table.kycStatus, table.amlStatus, table.type)
      .where(LATE_CHANGE),
    index('customers_late_updated_idx')
      .on(table.orgId, table.kind, table.updatedAt, table.createdAt, table.id, table.kycStatus, table.amlStatus, table.type)
      .where(LATE_CHANGE),
  ],
);

/**
 * Exact list counts without counting rows (migration 0011): the customers of each organisation, kind,
 * type, KYC/KYB status and AML status, kept by triggers on customers in the same transaction as each
 * change. Each is split over SLOTS rows, one per backend slot, so concurrent writers of one
 * organisation seldom wait on one counter row; a count is the sum of its slots. Bounded: at most one
 * row per status combination and slot per organisation, so no retention applies.
 */
export const customerCounts = pgTable(
  'customer_counts',
  {
    orgId: orgId(),
    kind: text('kind', { enum: ['individual', 'entity'] }).notNull(),
    type: text('type').notNull(),
    kycStatus: text('kyc_status').notNull(),
    amlStatus: text('aml_status').notNull(),
    slot: integer('slot').notNull(),
    records: bigint('records', { mode: 'number' }).notNull(),
  },
  (table) => [primaryKey({ columns: [table.orgId, table.kind, table.type, table.kycStatus, table.amlStatus, table.slot] })],
);

// ---------------------------------------------------------------------------------------------
// Beneficial owners, verification, credits, emails
// ---------------------------------------------------------------------------------------------

export const beneficialOwners = pgTable(
  'beneficial_owners',
  {
    id: uuid('id').primaryKey().defaultRandom(),
    orgId: orgId(),
    entityId: uuid('entity_id')
      .notNull()
      .references(() => customers.id, { onDelete: 'cascade' }),
    customerId: uuid('customer_id')
      .notNull()
      .references(() => customers.id),
    holderType: text('holder_type').notNull(),
    roleTypes: text('role_types').array().notNull(),
    percentageHeld: numeric('percentage_held', { precision: 7, scale: 4, mode: 'number' }).notNull().default(0),
    kycRequired: boolean('kyc_required').notNull().default(true),
    addedVia: text('added_via').notNull(),
    createdAt: createdAt(),
    updatedAt: updatedAt(),
  },
  (table) => [uniqueIndex('beneficial_owners_entity_customer_key').on(table.orgId, table.entityId, table.customerId)],
);

export const verifications = pgTable(
  'verifications',
  {
    id: uuid('id').primaryKey().defaultRandom(),
    orgId: orgId(),
    customerId: uuid('customer_id')
      .notNull()
      .references(() => customers.id, { onDelete: 'cascade' }),
    beneficialOwnerId: uuid('beneficial_owner_id').references(() => beneficialOwners.id),
    kind: text('kind', { enum: ['KYC', 'KYB'] }).notNull(),
    lane: text('lane').notNull(),
    payer: text('payer', { enum: ['organization', 'customer'] }).notNull(),
    status: text('status').notNull(),
    cost: integer('cost').notNull().default(0),
    linkToken: text('link_token'),
    recipientEmail: text('recipient_email'),
    customMessage: text('custom_message'),
    eddCheckTypes: text('edd_check_types').array().notNull().default(sql`'{}'::text[]`),
    startedAt: timestamptz('started_at').notNull().default(sql`clock_timestamp()`),
    completedAt: timestamptz('completed_at'),
    createdAt: createdAt(),
    updatedAt: updatedAt(),
  },
  (table) => [
    uniqueIndex('verifications_link_token_key').on(table.linkToken).where(sql`link_token IS NOT NULL`),
    index('verifications_customer_idx').on(table.orgId, table.customerId),
  ],
);

export const creditLedger = pgTable(
  'credit_ledger',
  {
    id: bigserial('id', { mode: 'number' }).primaryKey(),
    orgId: orgId(),
    delta: integer('delta').notNull(),
    balanceAfter: integer('balance_after').notNull(),
    reason: text('reason').notNull(),
    verificationId: uuid('verification_id').references(() => verifications.id),
    createdAt: createdAt(),
  },
  (table) => [index('credit_ledger_org_idx').on(table.orgId, table.createdAt)],
);

export const emails = pgTable(
  'emails',
  {
    id: uuid('id').primaryKey().defaultRandom(),
    orgId: orgId(),
    recipient: text('recipient').notNull(),
    subject: text('subject').notNull(),
    body: text('body').notNull(),
    link: text('link'),
    status: text('status', { enum: ['queued', 'sent', 'recorded', 'failed'] }).notNull().default('queued'),
    attempts: integer('attempts').notNull().default(0),
    lastError: text('last_error'),
    nextAttemptAt: timestamptz('next_attempt_at').notNull().default(sql`clock_timestamp()`),
    sentAt: timestamptz('sent_at'),
    verificationId: uuid('verification_id').references(() => verifications.id),
    createdAt: createdAt(),
  },
  (table) => [index('emails_due_idx').on(table.status, table.nextAttemptAt), index('emails_org_idx').on(table.orgId, table.createdAt)],
);

// ---------------------------------------------------------------------------------------------
// Webhooks: outbox, endpoints, deliveries, attempts
// ---------------------------------------------------------------------------------------------

export const outboxEvents = pgTable(
  'outbox_events',
  {
    id: uuid('id').primaryKey().defaultRandom(),
    // No foreign key, as audit_log: written only in the transaction of a change in this organisation (migration 0008).
    orgId: uuid('org_id').notNull(),
    type: text('type').notNull(),
    customerId: uuid('customer_id'),
    /** The exact JSON document delivered; signed byte for byte. */
    payload: text('payload').notNull(),
    createdAt: createdAt(),
  },
  (table) => [index('outbox_events_org_idx').on(table.orgId, table.createdAt)],
);

export const webhookEndpoints = pgTable(
  'webhook_endpoints',
  {
    id: uuid('id').primaryKey().defaultRandom(),
    orgId: orgId(),
    url: text('url').notNull(),
    secret: text('secret').notNull(),
    eventTypes: text('event_types').array().notNull().default(sql`'{}'::text[]`),
    enabled: boolean('enabled').notNull().default(true),
    disabledReason: text('disabled_reason'),
    createdAt: createdAt(),
    updatedAt: updatedAt(),
  },
  (table) => [index('webhook_endpoints_org_idx').on(table.orgId)],
);

export const webhookDeliveries = pgTable(
  'webhook_deliveries',
  {
    id: uuid('id').primaryKey().defaultRandom(),
    orgId: orgId(),
    eventId: uuid('event_id')
      .notNull()
      .references(() => outboxEvents.id, { onDelete: 'cascade' }),
    endpointId: uuid('endpoint_id')
      .notNull()
      .references(() => webhookEndpoints.id, { onDelete: 'cascade' }),
    status: text('status', { enum: ['pending', 'succeeded', 'failed'] }).notNull().default('pending'),
    attempts: integer('attempts').notNull().default(0),
    nextAttemptAt: timestamptz('next_attempt_at').notNull().default(sql`clock_timestamp()`),
    /** Set while a worker holds the delivery; another worker may take it once this passes. */
    lockedUntil: timestamptz('locked_until'),
    lockedBy: text('locked_by'),
    lastStatusCode: integer('last_status_code'),
    lastError: text('last_error'),
    createdAt: createdAt(),
    updatedAt: updatedAt(),
  },
  (table) => [
    index('webhook_deliveries_due_idx').on(table.nextAttemptAt).where(sql`status = 'pending'`),
    index('webhook_deliveries_org_idx').on(table.orgId, table.eventId),
  ],
);

export const webhookAttempts = pgTable(
  'webhook_attempts',
  {
    id: bigserial('id', { mode: 'number' }).primaryKey(),
    orgId: orgId(),
    deliveryId: uuid('delivery_id')
      .notNull()
      .references(() => webhookDeliveries.id, { onDelete: 'cascade' }),
    attemptNumber: integer('attempt_number').notNull(),
    workerId: text('worker_id'),
    statusCode: integer('status_code'),
    latencyMs: integer('latency_ms'),
    error: text('error'),
    startedAt: timestamptz('started_at').notNull(),
    createdAt: createdAt(),
  },
  (table) => [index('webhook_attempts_delivery_idx').on(table.deliveryId)],
);

// ---------------------------------------------------------------------------------------------
// Groups and templates
// ---------------------------------------------------------------------------------------------

export type TemplateRole = { role_label: string; party_type: string; required: boolean; check_trigger: string };

export const groupTemplates = pgTable(
  'group_templates',
  {
    id: uuid('id').primaryKey().defaultRandom(),
    orgId: orgId(),
    code: text('code').notNull(),
    name: text('name').notNull(),
    description: text('description').notNull(),
    industry: text('industry').notNull(),
    source: text('source', { enum: ['PRE_BUILT', 'CUSTOM'] }).notNull(),
    isVerified: boolean('is_verified').notNull(),
    roles: jsonb('roles').$type<TemplateRole[]>().notNull(),
    createdAt: createdAt(),
    updatedAt: updatedAt(),
  },
  (table) => [uniqueIndex('group_templates_org_code_key').on(table.orgId, table.code)],
);

export const groups = pgTable(
  'groups',
  {
    id: uuid('id').primaryKey().defaultRandom(),
    orgId: orgId(),
    name: text('name').notNull(),
    reference: text('reference'),
    status: text('status', { enum: ['ACTIVE', 'ON_HOLD', 'COMPLETE', 'ARCHIVED'] }).notNull().default('ACTIVE'),
    templateId: uuid('template_id').references(() => groupTemplates.id),
    industry: text('industry'),
    createdAt: createdAt(),
    updatedAt: updatedAt(),
  },
  (table) => [
    uniqueIndex('groups_active_reference_key')
      .on(table.orgId, table.reference)
      .where(sql`status = 'ACTIVE' AND reference IS NOT NULL`),
  ],
);

export const groupParties = pgTable(
  'group_parties',
  {
    id: uuid('id').primaryKey().defaultRandom(),
    orgId: orgId(),
    groupId: uuid('group_id')
      .notNull()
      .references(() => groups.id, { onDelete: 'cascade' }),
    position: integer('position').notNull(),
    roleLabel: text('role_label').notNull(),
    partyType: text('party_type').notNull(),
    required: boolean('required').notNull(),
    checkTrigger: text('check_trigger'),
    customerId: uuid('customer_id').references(() => customers.id),
    createdAt: createdAt(),
  },
  (table) => [index('group_parties_group_idx').on(table.groupId, table.position)],
);

// ---------------------------------------------------------------------------------------------
// The service's own secrets
// ---------------------------------------------------------------------------------------------

/**
 * Keys of the service itself, one row per purpose (`list_cursor_hmac`: the HMAC key of list cursors),
 * seeded by the migration that creates the table. Every instance on the database reads the same row,
 * so a cursor issued by one verifies on another with no configuration. Not an organisation's data:
 * DESIGN §9's org_id rule does not apply, and the table never grows.
 */
export const serviceSecrets = pgTable('service_secrets', {
  name: text('name').primaryKey(),
  value: text('value').notNull(),
  createdAt: createdAt(),
});

export type OrganisationRow = typeof organisations.$inferSelect;
export type ApiKeyRow = typeof apiKeys.$inferSelect;
export type CustomerRow = typeof customers.$inferSelect;
export type NewCustomerRow = typeof customers.$inferInsert;
