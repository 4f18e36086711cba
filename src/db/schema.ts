import { sql } from 'drizzle-orm';
import {
  bigint,
  bigserial,
  boolean,
  customType,
  date,
  foreignKey,
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
const createdAt = () =>
  timestamptz('created_at')
    .notNull()
    .default(sql`clock_timestamp()`);
const updatedAt = () =>
  timestamptz('updated_at')
    .notNull()
    .default(sql`clock_timestamp()`);
const orgId = () =>
  uuid('org_id')
    .notNull()
    .references(() => organisations.id, { onDelete: 'cascade' });
/**
 * A tenant table's id: unique only with its org_id (the primary key is (org_id, id)), so
 * every row is addressed within one organisation and the table can be distributed by org_id.
 */
const tenantId = () => uuid('id').notNull().defaultRandom();

// ---------------------------------------------------------------------------------------------
// Organisations, API keys, audit
// ---------------------------------------------------------------------------------------------

export const organisations = pgTable('organisations', {
  id: uuid('id').primaryKey().defaultRandom(),
  name: text('name').notNull(),
  features: text('features')
    .array()
    .notNull()
    .default(sql`'{}'::text[]`),
  credits: integer('credits').notNull().default(0),
  defaultPayer: text('default_payer', { enum: ['organization', 'customer'] })
    .notNull()
    .default('organization'),
  isSandbox: boolean('is_sandbox').notNull().default(false),
  createdAt: createdAt(),
  updatedAt: updatedAt(),
});

export const apiKeys = pgTable(
  'api_keys',
  {
    id: tenantId(),
    orgId: orgId(),
    label: text('label'),
    /** First characters of the key, safe to display ("svc_live_AbCd…"). */
    displayPrefix: text('display_prefix').notNull(),
    /**
     * Hex SHA-256 of the plaintext key; the plaintext is never stored. Unique and looked up through
     * api_key_hashes, the directory that finds a key before its organisation is known.
     */
    keyHash: text('key_hash').notNull(),
    scopes: text('scopes').array().notNull(),
    /** Normalized IPv4/IPv6 CIDR ranges; empty means any address. */
    allowedIps: text('allowed_ips')
      .array()
      .notNull()
      .default(sql`'{}'::text[]`),
    burstLimit: integer('burst_limit'),
    dailyLimit: integer('daily_limit'),
    expiresAt: timestamptz('expires_at'),
    revokedAt: timestamptz('revoked_at'),
    lastUsedAt: timestamptz('last_used_at'),
    createdAt: createdAt(),
  },
  (table) => [primaryKey({ name: 'api_keys_pkey', columns: [table.orgId, table.id] })],
);

/**
 * The directory of key hashes: the access check finds a key by its hash before it knows the
 * organisation. Written in the transaction that creates the key. Keyed by the hash alone, so under
 * Citus it is distributed by key_hash (or a reference table), not by org_id (docs/decisions.md).
 */
export const apiKeyHashes = pgTable(
  'api_key_hashes',
  {
    keyHash: text('key_hash').primaryKey(),
    orgId: uuid('org_id').notNull(),
    apiKeyId: uuid('api_key_id').notNull(),
  },
  (table) => [
    foreignKey({
      name: 'api_key_hashes_api_key_fk',
      columns: [table.orgId, table.apiKeyId],
      foreignColumns: [apiKeys.orgId, apiKeys.id],
    }).onDelete('cascade'),
  ],
);

/** One row per key: the current burst (1 s) and daily (UTC day) windows, shared by every instance. */
export const apiKeyUsage = pgTable(
  'api_key_usage',
  {
    apiKeyId: uuid('api_key_id').notNull(),
    orgId: orgId(),
    burstWindow: bigint('burst_window', { mode: 'number' }).notNull(),
    burstCount: integer('burst_count').notNull(),
    dayWindow: integer('day_window').notNull(),
    dayCount: integer('day_count').notNull(),
  },
  (table) => [
    primaryKey({ name: 'api_key_usage_pkey', columns: [table.orgId, table.apiKeyId] }),
    foreignKey({
      name: 'api_key_usage_api_key_fk',
      columns: [table.orgId, table.apiKeyId],
      foreignColumns: [apiKeys.orgId, apiKeys.id],
    }).onDelete('cascade'),
  ],
);

export const idempotencyKeys = pgTable(
  'idempotency_keys',
  {
    apiKeyId: uuid('api_key_id').notNull(),
    key: text('key').notNull(),
    orgId: orgId(),
    fingerprint: text('fingerprint').notNull(),
    responseStatus: integer('response_status'),
    responseBody: text('response_body'),
    createdAt: createdAt(),
  },
  (table) => [
    primaryKey({ name: 'idempotency_keys_pkey', columns: [table.orgId, table.apiKeyId, table.key] }),
    foreignKey({
      name: 'idempotency_keys_api_key_fk',
      columns: [table.orgId, table.apiKeyId],
      foreignColumns: [apiKeys.orgId, apiKeys.id],
    }).onDelete('cascade'),
    // The retention purge's batches, per organisation.
    index('idempotency_keys_org_created_idx').on(table.orgId, table.createdAt),
  ],
);

export const auditLog = pgTable(
  'audit_log',
  {
    // A tiebreak only, never an order of its own: it comes from a global sequence.
    id: bigserial('id', { mode: 'number' }).notNull(),
    // No foreign key: the audit trail outlives whatever it records, and every row is written in the
    // transaction of a change to a record of this organisation (migration 0008).
    orgId: uuid('org_id').notNull(),
    actorType: text('actor_type', { enum: ['api_key', 'operator', 'system', 'contact'] }).notNull(),
    actorId: text('actor_id'),
    action: text('action').notNull(),
    subjectType: text('subject_type').notNull(),
    subjectId: uuid('subject_id'),
    before: jsonb('before'),
    after: jsonb('after'),
    requestId: text('request_id'),
    createdAt: createdAt(),
    /** The Idempotency-Key header of the request that made the change, when it had one. */
    idempotencyKey: text('idempotency_key'),
    /**
     * The row's place in its organisation's hash chain, in the order the transactions committed: null
     * when written, assigned after the commit by the audit sealer (audit-chain.sealer.ts), never changed.
     */
    sequence: bigint('sequence', { mode: 'number' }),
    /** Hex SHA-256 over the previous row's hash and this row's canonical content (audit-chain.ts); set with `sequence`. */
    hash: text('hash'),
  },
  (table) => [
    primaryKey({ name: 'audit_log_pkey', columns: [table.orgId, table.id] }),
    // Also the subject filter of GET /v1/audit-events, walked in chain order.
    index('audit_log_subject_idx').on(table.orgId, table.subjectId, table.sequence),
    index('audit_log_org_created_idx').on(table.orgId, table.createdAt),
    // Sealed rows only: a row enters it once, when sealed, not also on the write path.
    uniqueIndex('audit_log_chain_idx')
      .on(table.orgId, table.sequence)
      .where(sql`sequence IS NOT NULL`),
    // The sealer's work: small, since a row leaves it within a second of its commit.
    index('audit_log_unsealed_idx')
      .on(table.orgId, table.createdAt, table.id)
      .where(sql`sequence IS NULL`),
  ],
);

/**
 * Per organisation, the end of its audit hash chain: the last sequence and hash the sealer assigned.
 * Its row lock serialises the sealers of one organisation; verify compares the chain's tail with it
 * (a truncated tail is otherwise invisible). Kept when rows are purged, so sequences are never reused.
 */
export const auditChainHeads = pgTable('audit_chain_heads', {
  orgId: uuid('org_id')
    .primaryKey()
    .references(() => organisations.id, { onDelete: 'cascade' }),
  lastSequence: bigint('last_sequence', { mode: 'number' }).notNull().default(0),
  /** Null until the first row is sealed (the chain starts from the genesis value). */
  lastHash: text('last_hash'),
  updatedAt: updatedAt(),
});

/**
 * A signed statement that the chain of an organisation reached `sequence` with `hash`, written by the
 * audit purge before it removes the rows up to it, so the rows after it still verify.
 */
export const auditCheckpoints = pgTable(
  'audit_checkpoints',
  {
    orgId: uuid('org_id')
      .notNull()
      .references(() => organisations.id, { onDelete: 'cascade' }),
    sequence: bigint('sequence', { mode: 'number' }).notNull(),
    hash: text('hash').notNull(),
    signature: text('signature').notNull(),
    createdAt: createdAt(),
  },
  (table) => [primaryKey({ name: 'audit_checkpoints_pkey', columns: [table.orgId, table.sequence] })],
);

// ---------------------------------------------------------------------------------------------
// Customers (individuals and entities share one table)
// ---------------------------------------------------------------------------------------------

/** A change more than a second after the record's creation (the partial list indexes' predicate). */
export const LATE_CHANGE = sql`(updated_at - created_at) > interval '1 second'`;

export const customers = pgTable(
  'customers',
  {
    id: tenantId(),
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
    designatedServices: text('designated_services')
      .array()
      .notNull()
      .default(sql`'{}'::text[]`),
    preExistingServices: text('pre_existing_services')
      .array()
      .notNull()
      .default(sql`'{}'::text[]`),
    preExistingServiceSince: date('pre_existing_service_since', { mode: 'string' }),
    clientSinceDate: date('client_since_date', { mode: 'string' }),
    preCommencementAssessment: jsonb('pre_commencement_assessment'),
    riskAnswers: jsonb('risk_answers')
      .notNull()
      .default(sql`'{}'::jsonb`),
    riskRating: text('risk_rating', { enum: ['LOW', 'MEDIUM', 'HIGH'] })
      .notNull()
      .default('LOW'),
    clientClassification: text('client_classification').notNull().default('NOT_DESIGNATED'),
    // Ongoing due diligence (modules/customers/review-model.ts): derived in each change's transaction
    // from the record and its organisation's policy; the review sweep moves SCHEDULED → DUE → OVERDUE.
    reviewStatus: text('review_status', { enum: ['NOT_SCHEDULED', 'SCHEDULED', 'DUE', 'OVERDUE'] })
      .notNull()
      .default('NOT_SCHEDULED'),
    /** When the review falls (or fell) due: its scheduled date, or the moment a trigger brought it forward. */
    nextReviewAt: timestamptz('next_review_at'),
    reviewCompletedAt: timestamptz('review_completed_at'),
    reviewReasons: text('review_reasons')
      .array()
      .notNull()
      .default(sql`'{}'::text[]`),
    eddRequired: boolean('edd_required').notNull().default(false),
    eddReasons: text('edd_reasons')
      .array()
      .notNull()
      .default(sql`'{}'::text[]`),
    createdAt: createdAt(),
    updatedAt: updatedAt(),
  },
  (table) => [
    primaryKey({ name: 'customers_pkey', columns: [table.orgId, table.id] }),
    uniqueIndex('customers_org_external_id_key')
      .on(table.orgId, table.externalId)
      .where(sql`external_id IS NOT NULL`),
    uniqueIndex('customers_individual_name_email_key')
      .on(table.orgId, sql`lower(${table.email})`, sql`lower(${table.name})`)
      .where(sql`kind = 'individual' AND email IS NOT NULL`),
    uniqueIndex('customers_entity_abn_key')
      .on(table.orgId, table.abn)
      .where(sql`kind = 'entity' AND abn IS NOT NULL`),
    uniqueIndex('customers_entity_acn_key')
      .on(table.orgId, table.acn)
      .where(sql`kind = 'entity' AND acn IS NOT NULL`),
    uniqueIndex('customers_entity_name_type_key')
      .on(table.orgId, sql`lower(${table.name})`, table.type)
      .where(sql`kind = 'entity'`),
    // List pages (docs/decisions.md, "Lists at a million records"). Every list walks (created_at, id)
    // within an organisation and kind; each filter the spec allows has an index that yields its rows in
    // that order, so a page reads its own rows and no more. Every index ends with the filtered columns,
    // so a page's rows are chosen by an index-only scan and only the page itself is read from the table.
    index('customers_list_idx').on(
      table.orgId,
      table.kind,
      table.createdAt,
      table.id,
      table.updatedAt,
      table.kycStatus,
      table.amlStatus,
      table.type,
    ),
    index('customers_status_list_idx').on(
      table.orgId,
      table.kind,
      table.kycStatus,
      table.createdAt,
      table.id,
      table.updatedAt,
      table.amlStatus,
      table.type,
    ),
    index('customers_aml_list_idx').on(
      table.orgId,
      table.kind,
      table.amlStatus,
      table.createdAt,
      table.id,
      table.updatedAt,
      table.kycStatus,
      table.type,
    ),
    // The review work queues: by review status, by review date (also the review sweep's claim), and
    // the records that need enhanced due diligence.
    index('customers_review_list_idx').on(
      table.orgId,
      table.kind,
      table.reviewStatus,
      table.createdAt,
      table.id,
      table.nextReviewAt,
      table.updatedAt,
      table.kycStatus,
      table.amlStatus,
      table.type,
    ),
    index('customers_review_due_idx')
      .on(table.orgId, table.kind, table.nextReviewAt, table.createdAt, table.id, table.reviewStatus)
      .where(sql`next_review_at IS NOT NULL`),
    // The review sweep's claims: the scheduled reviews whose date passed, and the due ones that became overdue.
    index('customers_review_scheduled_idx')
      .on(table.orgId, table.nextReviewAt)
      .where(sql`review_status = 'SCHEDULED'`),
    index('customers_review_pending_idx')
      .on(table.orgId, table.nextReviewAt)
      .where(sql`review_status = 'DUE'`),
    index('customers_edd_list_idx')
      .on(table.orgId, table.kind, table.createdAt, table.id, table.updatedAt, table.kycStatus, table.amlStatus, table.type)
      .where(sql`edd_required`),
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
    reviewStatus: text('review_status').notNull().default('NOT_SCHEDULED'),
    eddRequired: boolean('edd_required').notNull().default(false),
    slot: integer('slot').notNull(),
    records: bigint('records', { mode: 'number' }).notNull(),
  },
  (table) => [
    primaryKey({
      name: 'customer_counts_pkey',
      columns: [table.orgId, table.kind, table.type, table.kycStatus, table.amlStatus, table.reviewStatus, table.eddRequired, table.slot],
    }),
  ],
);

// ---------------------------------------------------------------------------------------------
// Beneficial owners, verification, credits, emails
// ---------------------------------------------------------------------------------------------

export const beneficialOwners = pgTable(
  'beneficial_owners',
  {
    id: tenantId(),
    orgId: orgId(),
    entityId: uuid('entity_id').notNull(),
    customerId: uuid('customer_id').notNull(),
    holderType: text('holder_type').notNull(),
    roleTypes: text('role_types').array().notNull(),
    percentageHeld: numeric('percentage_held', { precision: 7, scale: 4, mode: 'number' }).notNull().default(0),
    kycRequired: boolean('kyc_required').notNull().default(true),
    addedVia: text('added_via').notNull(),
    createdAt: createdAt(),
    updatedAt: updatedAt(),
  },
  (table) => [
    primaryKey({ name: 'beneficial_owners_pkey', columns: [table.orgId, table.id] }),
    foreignKey({
      name: 'beneficial_owners_entity_fk',
      columns: [table.orgId, table.entityId],
      foreignColumns: [customers.orgId, customers.id],
    }).onDelete('cascade'),
    foreignKey({
      name: 'beneficial_owners_customer_fk',
      columns: [table.orgId, table.customerId],
      foreignColumns: [customers.orgId, customers.id],
    }),
    uniqueIndex('beneficial_owners_entity_customer_key').on(table.orgId, table.entityId, table.customerId),
  ],
);

export const verifications = pgTable(
  'verifications',
  {
    id: tenantId(),
    orgId: orgId(),
    customerId: uuid('customer_id').notNull(),
    beneficialOwnerId: uuid('beneficial_owner_id'),
    kind: text('kind', { enum: ['KYC', 'KYB'] }).notNull(),
    lane: text('lane').notNull(),
    payer: text('payer', { enum: ['organization', 'customer'] }).notNull(),
    status: text('status').notNull(),
    cost: integer('cost').notNull().default(0),
    recipientEmail: text('recipient_email'),
    customMessage: text('custom_message'),
    eddCheckTypes: text('edd_check_types')
      .array()
      .notNull()
      .default(sql`'{}'::text[]`),
    startedAt: timestamptz('started_at')
      .notNull()
      .default(sql`clock_timestamp()`),
    completedAt: timestamptz('completed_at'),
    createdAt: createdAt(),
    updatedAt: updatedAt(),
  },
  (table) => [
    primaryKey({ name: 'verifications_pkey', columns: [table.orgId, table.id] }),
    foreignKey({
      name: 'verifications_customer_fk',
      columns: [table.orgId, table.customerId],
      foreignColumns: [customers.orgId, customers.id],
    }).onDelete('cascade'),
    foreignKey({
      name: 'verifications_beneficial_owner_fk',
      columns: [table.orgId, table.beneficialOwnerId],
      foreignColumns: [beneficialOwners.orgId, beneficialOwners.id],
    }),
    index('verifications_customer_idx').on(table.orgId, table.customerId),
  ],
);

/**
 * The directory of verification link tokens: a link is opened before its organisation is known.
 * Written in the transaction that starts the verification; keyed by the token's hash alone, so under Citus
 * it is distributed by token (or a reference table), not by org_id (docs/decisions.md).
 */
export const verificationLinkTokens = pgTable(
  'verification_link_tokens',
  {
    /** SHA-256 (hex) of the token: the database never holds a usable link. */
    tokenHash: text('token_hash').primaryKey(),
    orgId: uuid('org_id').notNull(),
    verificationId: uuid('verification_id').notNull(),
  },
  (table) => [
    foreignKey({
      name: 'verification_link_tokens_verification_fk',
      columns: [table.orgId, table.verificationId],
      foreignColumns: [verifications.orgId, verifications.id],
    }).onDelete('cascade'),
  ],
);

export const creditLedger = pgTable(
  'credit_ledger',
  {
    // A tiebreak only, never an order of its own: it comes from a global sequence.
    id: bigserial('id', { mode: 'number' }).notNull(),
    orgId: orgId(),
    delta: integer('delta').notNull(),
    balanceAfter: integer('balance_after').notNull(),
    reason: text('reason').notNull(),
    verificationId: uuid('verification_id'),
    /** The document upload (reason document_upload) or document request (document_request) charged. */
    documentId: uuid('document_id'),
    documentRequestId: uuid('document_request_id'),
    createdAt: createdAt(),
  },
  (table) => [
    primaryKey({ name: 'credit_ledger_pkey', columns: [table.orgId, table.id] }),
    foreignKey({
      name: 'credit_ledger_verification_fk',
      columns: [table.orgId, table.verificationId],
      foreignColumns: [verifications.orgId, verifications.id],
    }),
    foreignKey({
      name: 'credit_ledger_document_fk',
      columns: [table.orgId, table.documentId],
      foreignColumns: [entityDocuments.orgId, entityDocuments.id],
    }),
    foreignKey({
      name: 'credit_ledger_document_request_fk',
      columns: [table.orgId, table.documentRequestId],
      foreignColumns: [documentRequests.orgId, documentRequests.id],
    }),
    index('credit_ledger_org_idx').on(table.orgId, table.createdAt),
  ],
);

export const emails = pgTable(
  'emails',
  {
    id: tenantId(),
    orgId: orgId(),
    recipient: text('recipient').notNull(),
    subject: text('subject').notNull(),
    body: text('body').notNull(),
    link: text('link'),
    status: text('status', { enum: ['queued', 'sent', 'recorded', 'failed'] })
      .notNull()
      .default('queued'),
    attempts: integer('attempts').notNull().default(0),
    lastError: text('last_error'),
    sentAt: timestamptz('sent_at'),
    verificationId: uuid('verification_id'),
    createdAt: createdAt(),
  },
  (table) => [
    primaryKey({ name: 'emails_pkey', columns: [table.orgId, table.id] }),
    foreignKey({
      name: 'emails_verification_fk',
      columns: [table.orgId, table.verificationId],
      foreignColumns: [verifications.orgId, verifications.id],
    }),
    index('emails_org_idx').on(table.orgId, table.createdAt),
  ],
);

// ---------------------------------------------------------------------------------------------
// Entity documents: requests to the contact, the documents, their bytes
// ---------------------------------------------------------------------------------------------

/** PostgreSQL bytea as a Buffer (drizzle-orm has no built-in bytea column). */
const bytea = customType<{ data: Buffer; driverData: Buffer }>({ dataType: () => 'bytea' });

/**
 * A request emailed to an entity's contact for documents of the listed types, answered on the upload
 * page its link opens. OPEN until every requested type has a document (FULFILLED) or due_at passes (EXPIRED).
 */
export const documentRequests = pgTable(
  'document_requests',
  {
    id: tenantId(),
    orgId: orgId(),
    entityId: uuid('entity_id').notNull(),
    /** Document type codes (src/modules/documents/document-types.ts), distinct. */
    types: text('types').array().notNull(),
    message: text('message'),
    dueAt: timestamptz('due_at').notNull(),
    status: text('status', { enum: ['OPEN', 'FULFILLED', 'EXPIRED'] })
      .notNull()
      .default('OPEN'),
    payer: text('payer', { enum: ['organization', 'customer'] }).notNull(),
    cost: integer('cost').notNull().default(0),
    recipientEmail: text('recipient_email').notNull(),
    /** The API key that made the request (null when an operator did). */
    apiKeyId: uuid('api_key_id'),
    fulfilledAt: timestamptz('fulfilled_at'),
    expiredAt: timestamptz('expired_at'),
    createdAt: createdAt(),
    updatedAt: updatedAt(),
  },
  (table) => [
    primaryKey({ name: 'document_requests_pkey', columns: [table.orgId, table.id] }),
    foreignKey({
      name: 'document_requests_entity_fk',
      columns: [table.orgId, table.entityId],
      foreignColumns: [customers.orgId, customers.id],
    }).onDelete('cascade'),
    index('document_requests_entity_idx').on(table.orgId, table.entityId, table.createdAt, table.id),
    // The expiry job's work: open requests by due time.
    index('document_requests_open_due_idx')
      .on(table.orgId, table.dueAt)
      .where(sql`status = 'OPEN'`),
  ],
);

/**
 * The directory of upload-page tokens: the page is opened before its organisation is known.
 * Keyed by the SHA-256 of the token, so the database never holds a usable link token; written in the
 * request's transaction.
 */
export const documentRequestTokens = pgTable(
  'document_request_tokens',
  {
    tokenHash: text('token_hash').primaryKey(),
    orgId: uuid('org_id').notNull(),
    documentRequestId: uuid('document_request_id').notNull(),
  },
  (table) => [
    foreignKey({
      name: 'document_request_tokens_request_fk',
      columns: [table.orgId, table.documentRequestId],
      foreignColumns: [documentRequests.orgId, documentRequests.id],
    }).onDelete('cascade'),
  ],
);

/** An entity's document: its metadata. The bytes live in the document storage (storage names which). */
export const entityDocuments = pgTable(
  'entity_documents',
  {
    id: tenantId(),
    orgId: orgId(),
    entityId: uuid('entity_id').notNull(),
    /** A document type code (src/modules/documents/document-types.ts). */
    type: text('type').notNull(),
    description: text('description'),
    /** The name the uploader's file had, for Content-Disposition; never trusted for the media type. */
    fileName: text('file_name'),
    /** Sniffed from the content: application/pdf, image/png or image/jpeg. */
    mediaType: text('media_type').notNull(),
    sizeBytes: integer('size_bytes').notNull(),
    /** Lower-case hex SHA-256 of the bytes; also the ETag. */
    sha256: text('sha256').notNull(),
    uploadedBy: text('uploaded_by', { enum: ['organization', 'contact'] }).notNull(),
    /** The API key that uploaded it (null for the contact, or an operator). */
    apiKeyId: uuid('api_key_id'),
    /** The request the contact answered with it. */
    documentRequestId: uuid('document_request_id'),
    /** Where the bytes are: `postgres` (document_chunks) today; an object store later. */
    storage: text('storage').notNull().default('postgres'),
    createdAt: createdAt(),
  },
  (table) => [
    primaryKey({ name: 'entity_documents_pkey', columns: [table.orgId, table.id] }),
    foreignKey({
      name: 'entity_documents_entity_fk',
      columns: [table.orgId, table.entityId],
      foreignColumns: [customers.orgId, customers.id],
    }).onDelete('cascade'),
    foreignKey({
      name: 'entity_documents_request_fk',
      columns: [table.orgId, table.documentRequestId],
      foreignColumns: [documentRequests.orgId, documentRequests.id],
    }),
    index('entity_documents_entity_idx').on(table.orgId, table.entityId, table.createdAt, table.id),
  ],
);

/**
 * The bytes of documents kept in PostgreSQL: fixed-size chunks in order, written and read one at a
 * time so no document is ever held whole in memory. Storage EXTERNAL (migration 0015): the media types
 * are already compressed, so TOAST does not try again.
 */
export const documentChunks = pgTable(
  'document_chunks',
  {
    orgId: uuid('org_id').notNull(),
    documentId: uuid('document_id').notNull(),
    seq: integer('seq').notNull(),
    data: bytea('data').notNull(),
  },
  (table) => [
    primaryKey({ name: 'document_chunks_pkey', columns: [table.orgId, table.documentId, table.seq] }),
    foreignKey({
      name: 'document_chunks_document_fk',
      columns: [table.orgId, table.documentId],
      foreignColumns: [entityDocuments.orgId, entityDocuments.id],
    }).onDelete('cascade'),
  ],
);

// ---------------------------------------------------------------------------------------------
// Webhooks: outbox, endpoints, deliveries, attempts
// ---------------------------------------------------------------------------------------------

export const outboxEvents = pgTable(
  'outbox_events',
  {
    id: tenantId(),
    // No foreign key, as audit_log: written only in the transaction of a change in this organisation (migration 0008).
    orgId: uuid('org_id').notNull(),
    type: text('type').notNull(),
    customerId: uuid('customer_id'),
    /** The exact JSON document delivered; signed byte for byte. */
    payload: text('payload').notNull(),
    createdAt: createdAt(),
    /**
     * The event's place in its organisation's feed (GET /v1/events), in the order the transactions
     * committed: null when written, assigned after the commit by the feed sealer (events-feed.sealer.ts),
     * never reused, never changed.
     */
    position: bigint('position', { mode: 'number' }),
  },
  (table) => [
    primaryKey({ name: 'outbox_events_pkey', columns: [table.orgId, table.id] }),
    index('outbox_events_org_idx').on(table.orgId, table.createdAt),
    // Sealed events only: an event is indexed here once, by the sealer, not also while it waits (the write path stays lean).
    uniqueIndex('outbox_events_feed_idx')
      .on(table.orgId, table.position)
      .where(sql`position IS NOT NULL`),
    index('outbox_events_customer_feed_idx')
      .on(table.orgId, table.customerId, table.position)
      .where(sql`customer_id IS NOT NULL AND position IS NOT NULL`),
    // The sealer's work: small, since a row leaves it within a second of its commit.
    index('outbox_events_unsealed_idx')
      .on(table.orgId, table.createdAt, table.id)
      .where(sql`position IS NULL`),
  ],
);

/** Per organisation, the last feed position the sealer assigned; its row lock serialises the sealers of one organisation. */
export const eventFeedHeads = pgTable('event_feed_heads', {
  orgId: uuid('org_id')
    .primaryKey()
    .references(() => organisations.id, { onDelete: 'cascade' }),
  lastPosition: bigint('last_position', { mode: 'number' }).notNull().default(0),
  updatedAt: updatedAt(),
});

export const webhookEndpoints = pgTable(
  'webhook_endpoints',
  {
    id: tenantId(),
    orgId: orgId(),
    url: text('url').notNull(),
    secret: text('secret').notNull(),
    eventTypes: text('event_types')
      .array()
      .notNull()
      .default(sql`'{}'::text[]`),
    description: text('description'),
    enabled: boolean('enabled').notNull().default(true),
    disabledReason: text('disabled_reason'),
    /** After a rotation, deliveries are signed with this secret too until previous_secret_expires_at. */
    previousSecret: text('previous_secret'),
    previousSecretExpiresAt: timestamptz('previous_secret_expires_at'),
    /** Since when every attempt to this endpoint has failed (null after a success); 3 days of it disable the endpoint. */
    failingSince: timestamptz('failing_since'),
    /** When true, events caused by an import's rows (customer.updated, …) are not delivered here; the feed still has them. */
    skipImportRows: boolean('skip_import_rows').notNull().default(false),
    createdAt: createdAt(),
    updatedAt: updatedAt(),
  },
  (table) => [primaryKey({ name: 'webhook_endpoints_pkey', columns: [table.orgId, table.id] })],
);

export const webhookDeliveries = pgTable(
  'webhook_deliveries',
  {
    id: tenantId(),
    orgId: orgId(),
    eventId: uuid('event_id').notNull(),
    endpointId: uuid('endpoint_id').notNull(),
    status: text('status', { enum: ['pending', 'succeeded', 'failed'] })
      .notNull()
      .default('pending'),
    attempts: integer('attempts').notNull().default(0),
    nextAttemptAt: timestamptz('next_attempt_at')
      .notNull()
      .default(sql`clock_timestamp()`),
    /** Set while a worker holds the delivery; another worker may take it once this passes. */
    lockedUntil: timestamptz('locked_until'),
    lockedBy: text('locked_by'),
    lastStatusCode: integer('last_status_code'),
    lastError: text('last_error'),
    createdAt: createdAt(),
    updatedAt: updatedAt(),
  },
  (table) => [
    primaryKey({ name: 'webhook_deliveries_pkey', columns: [table.orgId, table.id] }),
    foreignKey({
      name: 'webhook_deliveries_event_fk',
      columns: [table.orgId, table.eventId],
      foreignColumns: [outboxEvents.orgId, outboxEvents.id],
    }).onDelete('cascade'),
    foreignKey({
      name: 'webhook_deliveries_endpoint_fk',
      columns: [table.orgId, table.endpointId],
      foreignColumns: [webhookEndpoints.orgId, webhookEndpoints.id],
    }).onDelete('cascade'),
    // The worker's claim: the organisations with pending deliveries (skipping from one to the next),
    // then each one's due deliveries in order (delivery.repository.ts).
    index('webhook_deliveries_due_idx')
      .on(table.orgId, table.nextAttemptAt)
      .where(sql`status = 'pending'`),
    index('webhook_deliveries_org_idx').on(table.orgId, table.eventId),
    index('webhook_deliveries_org_created_idx').on(table.orgId, table.createdAt),
    index('webhook_deliveries_endpoint_idx').on(table.orgId, table.endpointId, table.createdAt, table.id),
  ],
);

export const webhookAttempts = pgTable(
  'webhook_attempts',
  {
    // A tiebreak only, never an order of its own: it comes from a global sequence.
    id: bigserial('id', { mode: 'number' }).notNull(),
    orgId: orgId(),
    deliveryId: uuid('delivery_id').notNull(),
    attemptNumber: integer('attempt_number').notNull(),
    workerId: text('worker_id'),
    statusCode: integer('status_code'),
    latencyMs: integer('latency_ms'),
    error: text('error'),
    startedAt: timestamptz('started_at').notNull(),
    createdAt: createdAt(),
  },
  (table) => [
    primaryKey({ name: 'webhook_attempts_pkey', columns: [table.orgId, table.id] }),
    foreignKey({
      name: 'webhook_attempts_delivery_fk',
      columns: [table.orgId, table.deliveryId],
      foreignColumns: [webhookDeliveries.orgId, webhookDeliveries.id],
    }).onDelete('cascade'),
    index('webhook_attempts_delivery_idx').on(table.orgId, table.deliveryId),
    index('webhook_attempts_org_created_idx').on(table.orgId, table.createdAt),
  ],
);

// ---------------------------------------------------------------------------------------------
// Groups and templates
// ---------------------------------------------------------------------------------------------

export type TemplateRole = { role_label: string; party_type: string; required: boolean; check_trigger: string };

export const groupTemplates = pgTable(
  'group_templates',
  {
    id: tenantId(),
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
  (table) => [
    primaryKey({ name: 'group_templates_pkey', columns: [table.orgId, table.id] }),
    uniqueIndex('group_templates_org_code_key').on(table.orgId, table.code),
  ],
);

export const groups = pgTable(
  'groups',
  {
    id: tenantId(),
    orgId: orgId(),
    name: text('name').notNull(),
    reference: text('reference'),
    status: text('status', { enum: ['ACTIVE', 'ON_HOLD', 'COMPLETE', 'ARCHIVED'] })
      .notNull()
      .default('ACTIVE'),
    templateId: uuid('template_id'),
    industry: text('industry'),
    createdAt: createdAt(),
    updatedAt: updatedAt(),
  },
  (table) => [
    primaryKey({ name: 'groups_pkey', columns: [table.orgId, table.id] }),
    foreignKey({
      name: 'groups_template_fk',
      columns: [table.orgId, table.templateId],
      foreignColumns: [groupTemplates.orgId, groupTemplates.id],
    }),
    uniqueIndex('groups_active_reference_key')
      .on(table.orgId, table.reference)
      .where(sql`status = 'ACTIVE' AND reference IS NOT NULL`),
  ],
);

export const groupParties = pgTable(
  'group_parties',
  {
    id: tenantId(),
    orgId: orgId(),
    groupId: uuid('group_id').notNull(),
    position: integer('position').notNull(),
    roleLabel: text('role_label').notNull(),
    partyType: text('party_type').notNull(),
    required: boolean('required').notNull(),
    checkTrigger: text('check_trigger'),
    customerId: uuid('customer_id'),
    createdAt: createdAt(),
  },
  (table) => [
    primaryKey({ name: 'group_parties_pkey', columns: [table.orgId, table.id] }),
    foreignKey({
      name: 'group_parties_group_fk',
      columns: [table.orgId, table.groupId],
      foreignColumns: [groups.orgId, groups.id],
    }).onDelete('cascade'),
    foreignKey({
      name: 'group_parties_customer_fk',
      columns: [table.orgId, table.customerId],
      foreignColumns: [customers.orgId, customers.id],
    }),
    index('group_parties_group_idx').on(table.orgId, table.groupId, table.position),
  ],
);

// ---------------------------------------------------------------------------------------------
// The service's own secrets
// ---------------------------------------------------------------------------------------------

/**
 * Keys of the service itself, one row per purpose (`list_cursor_hmac`: the HMAC key of list cursors),
 * seeded by the migration that creates the table. Every instance on the database reads the same row,
 * so a cursor issued by one verifies on another with no configuration. Not an organisation's data:
 * The org_id-first rule of tenant tables does not apply, and the table never grows.
 */
export const serviceSecrets = pgTable('service_secrets', {
  name: text('name').primaryKey(),
  value: text('value').notNull(),
  createdAt: createdAt(),
});

/**
 * An organisation's ongoing due diligence policy: how often a customer's review falls due by risk
 * rating, and what counts for enhanced due diligence. One row per organisation, written by its first
 * PUT /v1/due-diligence-policy; until then the defaults apply (modules/due-diligence). It never grows.
 */
export const dueDiligencePolicies = pgTable(
  'due_diligence_policies',
  {
    orgId: orgId(),
    reviewMonthsLow: integer('review_months_low').notNull(),
    reviewMonthsMedium: integer('review_months_medium').notNull(),
    reviewMonthsHigh: integer('review_months_high').notNull(),
    eddUsesHighInterval: boolean('edd_uses_high_interval').notNull(),
    highRiskJurisdictions: text('high_risk_jurisdictions').array().notNull(),
    overdueAfterDays: integer('overdue_after_days').notNull(),
    /** Raised by every PUT: a re-dating run of an older generation stops, the newer one takes over. */
    generation: integer('generation').notNull().default(1),
    /** The re-dating run of this generation: records to check (counted at the PUT), checked so far, dates moved. */
    redateScheduled: integer('redate_scheduled').notNull().default(0),
    redateTotal: integer('redate_total').notNull().default(0),
    redateChecked: integer('redate_checked').notNull().default(0),
    redateMoved: integer('redate_moved').notNull().default(0),
    redateFinishedAt: timestamptz('redate_finished_at'),
    createdAt: createdAt(),
    updatedAt: updatedAt(),
  },
  (table) => [primaryKey({ name: 'due_diligence_policies_pkey', columns: [table.orgId] })],
);

/**
 * The reviews recorded of a customer or entity (POST …/reviews), newest first. Grows with every
 * review: purged after REVIEW_RETENTION_YEARS (7 by default).
 */
export const customerReviews = pgTable(
  'customer_reviews',
  {
    orgId: orgId(),
    id: tenantId(),
    customerId: uuid('customer_id').notNull(),
    outcome: text('outcome', { enum: ['NO_CHANGE', 'UPDATED', 'ESCALATED', 'EXITED'] }).notNull(),
    notes: text('notes'),
    reviewer: text('reviewer').notNull(),
    /** Why the review was due when it was recorded (empty when recorded ahead of its date). */
    reasons: text('reasons').array().notNull(),
    /** The review status when it was recorded. */
    statusBefore: text('status_before').notNull(),
    nextReviewAt: timestamptz('next_review_at'),
    createdAt: createdAt(),
  },
  (table) => [
    primaryKey({ name: 'customer_reviews_pkey', columns: [table.orgId, table.id] }),
    foreignKey({
      name: 'customer_reviews_customer_fk',
      columns: [table.orgId, table.customerId],
      foreignColumns: [customers.orgId, customers.id],
    }).onDelete('cascade'),
    index('customer_reviews_history_idx').on(table.orgId, table.customerId, table.createdAt, table.id),
    index('customer_reviews_created_idx').on(table.orgId, table.createdAt),
  ],
);

/**
 * Bulk imports (POST /v1/imports): one row per uploaded file of individuals or entities, its progress
 * and its counts per outcome. Grows with every upload: purged, with its rows, IMPORT_RETENTION_DAYS
 * (30 by default) after it finished; the records it created stay.
 */
export const imports = pgTable(
  'imports',
  {
    orgId: orgId(),
    id: tenantId(),
    kind: text('kind', { enum: ['individuals', 'entities'] }).notNull(),
    format: text('format', { enum: ['csv', 'ndjson'] }).notNull(),
    status: text('status', { enum: ['QUEUED', 'RUNNING', 'COMPLETED', 'FAILED', 'CANCELLED'] })
      .notNull()
      .default('QUEUED'),
    dryRun: boolean('dry_run').notNull(),
    fileName: text('file_name'),
    fileBytes: bigint('file_bytes', { mode: 'number' }).notNull(),
    fileSha256: text('file_sha256').notNull(),
    /** The file's columns in its order (CSV: its header); what the rows download repeats. */
    columns: text('columns').array().notNull(),
    rowsTotal: integer('rows_total').notNull(),
    rowsDone: integer('rows_done').notNull().default(0),
    createdCount: integer('created_count').notNull().default(0),
    updatedCount: integer('updated_count').notNull().default(0),
    unchangedCount: integer('unchanged_count').notNull().default(0),
    failedCount: integer('failed_count').notNull().default(0),
    /** Why a FAILED import stopped: the error envelope's `{code, message}`. */
    error: jsonb('error'),
    /** Who uploaded it: the audit rows of the records it changes name them. */
    actorType: text('actor_type', { enum: ['api_key', 'operator', 'system', 'contact'] }).notNull(),
    actorId: text('actor_id'),
    requestId: text('request_id'),
    idempotencyKey: text('idempotency_key'),
    createdAt: createdAt(),
    startedAt: timestamptz('started_at'),
    finishedAt: timestamptz('finished_at'),
    cancelRequestedAt: timestamptz('cancel_requested_at'),
  },
  (table) => [
    primaryKey({ name: 'imports_pkey', columns: [table.orgId, table.id] }),
    // GET /v1/imports, newest first.
    index('imports_list_idx').on(table.orgId, table.createdAt, table.id),
    // The retention purge: finished imports only.
    index('imports_finished_idx')
      .on(table.orgId, table.finishedAt)
      .where(sql`finished_at IS NOT NULL`),
  ],
);

/**
 * The rows of an import as parsed (CSV: column → cell text; NDJSON: the line's object), and each
 * row's outcome once the worker applied it (null until then). Deleted with their import.
 */
export const importRows = pgTable(
  'import_rows',
  {
    orgId: uuid('org_id').notNull(),
    importId: uuid('import_id').notNull(),
    /** 1 for the first data row (the header is not a row). */
    rowNumber: integer('row_number').notNull(),
    data: jsonb('data').notNull(),
    outcome: text('outcome', { enum: ['CREATED', 'UPDATED', 'UNCHANGED', 'FAILED'] }),
    customerId: uuid('customer_id'),
    /** A FAILED row's error envelope body (`{code, message, details?}`), as the single-record route answers it. */
    error: jsonb('error'),
  },
  (table) => [
    primaryKey({ name: 'import_rows_pkey', columns: [table.orgId, table.importId, table.rowNumber] }),
    foreignKey({
      name: 'import_rows_import_fk',
      columns: [table.orgId, table.importId],
      foreignColumns: [imports.orgId, imports.id],
    }).onDelete('cascade'),
  ],
);

export type OrganisationRow = typeof organisations.$inferSelect;
export type DueDiligencePolicyRow = typeof dueDiligencePolicies.$inferSelect;
export type CustomerReviewRow = typeof customerReviews.$inferSelect;
export type ApiKeyRow = typeof apiKeys.$inferSelect;
export type CustomerRow = typeof customers.$inferSelect;
export type BeneficialOwnerRow = typeof beneficialOwners.$inferSelect;
export type NewCustomerRow = typeof customers.$inferInsert;
export type EntityDocumentRow = typeof entityDocuments.$inferSelect;
export type DocumentRequestRow = typeof documentRequests.$inferSelect;
export type ImportRow = typeof imports.$inferSelect;
export type ImportRowRow = typeof importRows.$inferSelect;
