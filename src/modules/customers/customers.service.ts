import { randomUUID } from 'node:crypto';
import { isLockTimeout, type Executor, type DataAccess } from '../../db/client.js';
import type { PageReads } from '../../db/page-reads.js';
import type { CustomerRow, NewCustomerRow } from '../../db/schema.js';
import { AppError, isAppError } from '../../shared/app-error.js';
import type { Clock } from '../../shared/clock.js';
import { Issues, todayIso } from '../../shared/issues.js';
import type { ListPage } from '../../shared/list-envelope.js';
import type { RequestContext } from '../../shared/request-context.js';
import { normalizeServiceCodes } from '../designated-services/catalog.js';
import { checkBusinessRegister, type BusinessRegister, type BusinessRegisterStatus } from './business-register.js';
import { changedColumns, type CustomerChangeRecorder } from './customer-changes.js';
import { toAmlBlock, toIndividualDto } from './customer-dto.js';
import type { CustomerKind, CustomersRepository, KnownCount, ListFilters } from './customers.repository.js';
import type { IndividualDto, PatchCustomerBody, UpsertCustomerBody } from './customers.schemas.js';
import {
  assessmentTriggers,
  designatedFlag,
  initialStatus,
  statusAfterServicesChange,
  type KycStatus,
  type PreCommencementAssessment,
} from './due-diligence.js';
import { decodeCursor, encodeCursor, filterFingerprint, type CursorKey } from '../../shared/list-cursor.js';
import type { ReviewColumnsWriter } from './review-columns.js';
import type { ReviewStatus } from './review-model.js';
import { classifyClient, rateRisk, type RiskAnswers } from './risk-model.js';
import { timeSlicer } from '../../shared/time-slice.js';

/** Provenance ranks of structured name parts: a correction from a higher rank is never overwritten. */
export const NAME_PROVENANCE = { INTEGRATION: 10, OFFICER: 20, VERIFICATION_PROVIDER: 30 } as const;
const UPSERT_ATTEMPTS = 5;
/** The latest calendar date anywhere on Earth (UTC+14): "not in the future" for every caller. */
const LATEST_OFFSET_MS = 14 * 3_600_000;

export type ListQuery = {
  limit?: number;
  cursor?: string;
  status?: string;
  aml_status?: string;
  /** Already bounded to years 0001 to 9999 by the query schema. */
  updated_since?: Date;
  external_id?: string;
  include?: string;
  type?: string;
  /** A set, in REVIEW_STATUSES order (the query schema's output). */
  review_status?: readonly ReviewStatus[];
  review_due_before?: Date;
  edd_required?: boolean;
};

export type ListResult<T> = ListPage<T> & { total_count?: number };

/**
 * How an upsert that is not a plain API request runs (a bulk import's row): `addedVia` for a record it
 * creates (default INTEGRATION), and the business-register status when it was looked up beforehand
 * (a bulk import looks it up before its batch's transaction: no network I/O inside one).
 */
export type UpsertOptions = { addedVia?: 'INTEGRATION' | 'BULK_IMPORT'; registerStatus?: BusinessRegisterStatus };

/**
 * A list page, and for the first page of a walk the time its read began: every change of the
 * organisation stamped before `drainedAt` had committed by then, so every change this walk cannot
 * show has a later updated_at. The route sends it as the `Date` header: the time a poller passes as
 * the next poll's updated_since.
 */
export type ListRead<T> = { body: ListResult<T>; drainedAt?: Date };

/**
 * Shared by customers and entities: the list envelope, cursor and filter rules. The first page of a
 * walk (no cursor), with or without updated_since, first waits for the organisation's changes in
 * flight (drainChanges, a statement of its own); its pages are then read by statements of their own,
 * so the spec's polling pattern misses nothing (migration 0009). The later pages need no wait:
 * every change stamped before the first page's drainedAt had committed before that page was read,
 * later pages read later snapshots, so a change they cannot see is stamped after it too.
 * The page's statements (rows, DTO lookups, count) run through `pageReads`, after the drain: on a
 * replica only once it has replayed everything committed on the primary by then, which keeps both
 * promises (docs/decisions.md, "Read replicas, exact").
 */
export async function listCustomerRecords<T>(
  repository: CustomersRepository,
  pageReads: PageReads,
  cursorKey: CursorKey,
  orgId: string,
  kind: CustomerKind,
  query: ListQuery,
  toDto: (rows: CustomerRow[], executor: Executor) => Promise<T[]> | T[],
): Promise<ListRead<T>> {
  const limit = query.limit ?? 50;
  const filters: ListFilters = {
    kind,
    kycStatus: query.status,
    amlStatus: query.aml_status,
    updatedSince: query.updated_since,
    externalId: query.external_id,
    type: query.type,
    reviewStatuses: query.review_status,
    reviewDueBefore: query.review_due_before,
    eddRequired: query.edd_required,
  };
  const fingerprint = filterFingerprint({
    kind,
    status: query.status ?? null,
    aml_status: query.aml_status ?? null,
    updated_since: filters.updatedSince?.toISOString() ?? null,
    external_id: query.external_id ?? null,
    type: query.type ?? null,
    // Only when given: a walk without them keeps the fingerprint (and cursors) it had before they existed.
    ...(query.review_status ? { review_status: query.review_status.join(',') } : {}),
    ...(query.review_due_before ? { review_due_before: query.review_due_before.toISOString() } : {}),
    ...(query.edd_required !== undefined ? { edd_required: query.edd_required } : {}),
  });
  if (query.cursor) filters.after = decodeCursor(query.cursor, fingerprint, await cursorKey());
  const drainedAt = filters.after ? undefined : await drainChanges(repository, orgId);
  const key = await cursorKey();
  const result = await pageReads.read(async (executor): Promise<ListResult<T>> => {
    const known: KnownCount = {};
    const rows = await repository.list(orgId, filters, limit + 1, executor, known);
    const page = rows.slice(0, limit);
    const hasMore = rows.length > limit;
    const last = page[page.length - 1];
    const body: ListResult<T> = {
      object: 'list',
      data: await toDto(page, executor),
      has_more: hasMore,
      next_cursor: hasMore && last ? encodeCursor(last, fingerprint, key) : null,
      limit,
    };
    if (query.include?.split(',').some((part) => part.trim() === 'total_count')) {
      body.total_count = known.total ?? (await repository.count(orgId, filters, executor));
    }
    return body;
  });
  return { body: result, drainedAt };
}

/**
 * Waits for the organisation's changes in flight (see listCustomerRecords). A writer holding on past
 * lock_timeout makes the page unanswerable exactly for now: a 503 to retry, not a misleading 409 about
 * a record the caller never named.
 */
async function drainChanges(repository: CustomersRepository, orgId: string): Promise<Date> {
  try {
    return await repository.drainChanges(orgId);
  } catch (error) {
    if (!isLockTimeout(error)) throw error;
    throw new AppError('database_unavailable', 503, 'Changes in flight did not finish in time for an exact list; retry shortly.');
  }
}

/** Risk rating, classification and status after a change to services, flag or answers. */
function dueDiligenceColumns(input: {
  status: KycStatus;
  services: string[];
  preExistingServices: string[];
  flag: boolean | null;
  answers: RiskAnswers;
}): Pick<NewCustomerRow, 'riskRating' | 'clientClassification'> {
  const rating = rateRisk(input.services, input.answers, input.preExistingServices);
  return {
    riskRating: rating,
    clientClassification: classifyClient({
      rating,
      designated: input.flag === true || input.services.length > 0,
      dueDiligenceOwed: input.status !== 'NOT_REQUIRED',
    }),
  };
}

/**
 * Rules of the pre-commencement fields and the services list that hold for individuals and entities
 * alike. `answers` are the effective risk answers (stored ones overlaid with the request's).
 */
export function checkDueDiligenceInputs(
  body: {
    clientSinceDate?: string;
    preCommencementAssessment?: PreCommencementAssessment;
    preExistingServices?: string[];
    designatedServices?: string[];
    risk?: RiskAnswers;
  },
  answers: RiskAnswers,
  now: Date,
  issues: Issues,
  storedServices: readonly string[] = [],
): void {
  const existingClient = answers.isNewCustomer === false;
  const requiresExisting = 'Requires risk.isNewCustomer: false (an existing client).';
  if (body.clientSinceDate !== undefined) {
    if (!existingClient) issues.add('clientSinceDate', requiresExisting);
    if (body.clientSinceDate > todayIso(new Date(now.getTime() + LATEST_OFFSET_MS)))
      issues.add('clientSinceDate', 'Must not be in the future.');
  }
  if (body.preCommencementAssessment !== undefined) {
    if (!existingClient) issues.add('preCommencementAssessment', requiresExisting);
    if (!body.designatedServices || body.designatedServices.length === 0) {
      issues.add('preCommencementAssessment', 'Requires a non-empty designatedServices.');
    }
    const assessedAt = body.preCommencementAssessment.assessedAt;
    if (assessedAt && assessedAt > todayIso(new Date(now.getTime() + LATEST_OFFSET_MS))) {
      issues.add('preCommencementAssessment.assessedAt', 'Must not be in the future.');
    }
  }
  if (body.preExistingServices !== undefined) {
    if (!existingClient) issues.add('preExistingServices', requiresExisting);
    if ((body.designatedServices ?? storedServices).length > 0) {
      issues.add('preExistingServices', 'Cannot be combined with a non-empty designatedServices (sent or on record).');
    }
  }
  const flag = body.risk?.isDesignatedService;
  if (body.designatedServices !== undefined && flag !== undefined && flag !== body.designatedServices.length > 0) {
    issues.add(
      'risk.isDesignatedService',
      `Disagrees with designatedServices (${body.designatedServices.length > 0 ? 'non-empty' : 'empty'}); send one or make them agree.`,
    );
  }
  if (body.designatedServices === undefined && flag === false && storedServices.length > 0) {
    issues.add('risk.isDesignatedService', 'Disagrees with the designated services on record; replace them with an empty set instead.');
  }
}

/**
 * A service list is a set: the sent codes, deduplicated, or the stored list itself when it holds the
 * same codes in another order (so a reordered re-send is no change: no event, no new updated_at).
 */
function asStoredSet(sent: string[] | undefined, stored: string[]): string[] {
  if (sent === undefined) return stored;
  const codes = normalizeServiceCodes(sent);
  return codes.length === stored.length && stored.every((code) => codes.includes(code)) ? stored : codes;
}

/** The services/flag/status/risk columns after a request that may touch them. */
export function servicesUpdate(
  existing: CustomerRow | undefined,
  body: {
    designatedServices?: string[];
    preExistingServices?: string[];
    risk?: RiskAnswers;
    preCommencementAssessment?: PreCommencementAssessment;
  },
  answers: RiskAnswers,
): Pick<
  NewCustomerRow,
  'designatedServices' | 'preExistingServices' | 'isDesignatedService' | 'kycStatus' | 'riskRating' | 'clientClassification'
> {
  const services = asStoredSet(body.designatedServices, existing?.designatedServices ?? []);
  const preExisting = asStoredSet(body.preExistingServices, existing?.preExistingServices ?? []);
  const flag =
    body.designatedServices !== undefined
      ? services.length > 0
      : body.risk?.isDesignatedService !== undefined
        ? body.risk.isDesignatedService
        : designatedFlag(services, existing?.isDesignatedService);
  const status: KycStatus = existing
    ? statusAfterServicesChange({
        status: existing.kycStatus as KycStatus,
        previousServices: existing.designatedServices,
        nextServices: services,
        previousFlag: existing.isDesignatedService,
        nextFlag: flag,
        carveOut:
          answers.isNewCustomer === false &&
          body.preCommencementAssessment !== undefined &&
          !assessmentTriggers(body.preCommencementAssessment),
      })
    : initialStatus({
        designatedServices: body.designatedServices ? services : undefined,
        risk: {
          ...answers,
          ...(body.risk?.isDesignatedService !== undefined ? { isDesignatedService: body.risk.isDesignatedService } : {}),
        },
        assessment: body.preCommencementAssessment,
      });
  return {
    designatedServices: services,
    preExistingServices: preExisting,
    isDesignatedService: flag,
    kycStatus: status,
    ...dueDiligenceColumns({ status, services, preExistingServices: preExisting, flag, answers }),
  };
}

function isUniqueViolation(error: unknown): boolean {
  return (
    (error as { code?: string; cause?: { code?: string } }).code === '23505' ||
    (error as { cause?: { code?: string } }).cause?.code === '23505'
  );
}

/** The records matching may pick for an upsert body: the record holding its externalId, and the individual with its full name and email. */
type UpsertCandidates = { byExternalId?: CustomerRow; byNameAndEmail?: CustomerRow };
/** The record an upsert applies to and whether it adopts the body's externalId; undefined: a new record. */
type UpsertMatch = { row: CustomerRow; adopt: boolean };

/** The spec's matching table over the candidates found (locked) for `body`; a refused match is a 409. */
function matchAmong(body: UpsertCustomerBody, found: UpsertCandidates): UpsertMatch | undefined {
  const { byExternalId, byNameAndEmail } = found;
  if (body.externalId && byExternalId) {
    if (byExternalId.kind !== 'individual') {
      throw AppError.conflict('This externalId belongs to an entity; use POST /v1/entities for it.', { field: 'externalId' });
    }
    return { row: byExternalId, adopt: false };
  }
  if (body.fullName && body.email && byNameAndEmail) {
    // Same externalId: a concurrent request inserted it after our externalId lookup; it is a hit.
    if (body.externalId && byNameAndEmail.externalId === body.externalId) return { row: byNameAndEmail, adopt: false };
    if (body.externalId && byNameAndEmail.externalId !== null) {
      throw AppError.conflict('A customer with this full name and email already exists under another externalId.', {
        field: 'externalId',
      });
    }
    return { row: byNameAndEmail, adopt: body.externalId !== undefined };
  }
  return undefined;
}

/** The case-insensitive key of a full name + email (the individuals' unique index's expression, as far as JavaScript lowercases alike). */
export const nameAndEmailKey = (name: string, email: string) => `${name.toLowerCase()}\u0000${email.toLowerCase()}`;

/** A row of a bulk upsert: its body and the business-register status looked up for it. */
export type BulkUpsertItem = { body: UpsertCustomerBody; registerStatus?: BusinessRegisterStatus };
/** A bulk upsert row's result: what `upsert` answers (the record's id, or null for a dry run's new record), or the error it would throw. */
export type BulkUpsertResult = { created: boolean; changed: boolean; id: string | null } | { error: AppError };

/**
 * The results of a bulk upsert's rows, set as each is decided. `refuse` records a row's refusal (what
 * its request would answer 4xx) and rethrows anything else, which stops the batch. `upsertEach` runs
 * the rows left to the single upsert, in file order, with the result their requests would have.
 */
export function bulkResults(count: number) {
  const results = new Array<BulkUpsertResult | undefined>(count);
  const refuse = (index: number, error: unknown) => {
    if (!isAppError(error) || error.status >= 500) throw error;
    results[index] = { error };
  };
  return {
    set: (index: number, result: BulkUpsertResult) => void (results[index] = result),
    refuse,
    async upsertEach(
      indices: number[],
      dryRun: boolean,
      upsert: (index: number) => Promise<{ created: boolean; changed: boolean; id: string }>,
    ): Promise<void> {
      for (const index of [...indices].sort((a, b) => a - b)) {
        try {
          const upserted = await upsert(index);
          // A dry run's new record was rolled back: there is no id to give.
          results[index] = { created: upserted.created, changed: upserted.changed, id: dryRun && upserted.created ? null : upserted.id };
        } catch (error) {
          refuse(index, error);
        }
      }
    },
    all: () => results as BulkUpsertResult[],
  };
}

/**
 * Many upserts' changes to records the caller locked, written as each single upsert writes its own (the
 * diff with its review columns, the audit row, the events) in a few statements: one UPDATE per set of
 * changed columns, the audit rows in one, the events in one more (customer-changes.ts writeChanges).
 */
export async function writeLockedChanges(
  deps: { customers: CustomersRepository; changes: CustomerChangeRecorder; reviewColumns: ReviewColumnsWriter },
  ctx: RequestContext,
  change: { action: string; toDto: (row: CustomerRow) => unknown },
  updates: Array<{ row: CustomerRow; changed: Partial<NewCustomerRow> }>,
  tx: Executor,
): Promise<void> {
  const diffs: Array<{ actor: RequestContext['actor']; action: string; before: CustomerRow; diff: Partial<NewCustomerRow> }> = [];
  for (const { row, changed } of updates) {
    diffs.push({ actor: ctx.actor, action: change.action, before: row, diff: await deps.reviewColumns.withReview(row, changed, tx) });
  }
  await deps.changes.writeChanges(
    diffs,
    change.toDto,
    () =>
      deps.customers.updateManyLocked(
        ctx.orgId,
        diffs.map(({ before, diff }) => ({ id: before.id, values: diff })),
        tx,
      ),
    tx,
  );
}

export function createCustomersService(deps: {
  database: DataAccess;
  pageReads: PageReads;
  clock: Clock;
  businessRegister?: BusinessRegister;
  cursorKey: CursorKey;
  customers: CustomersRepository;
  changes: CustomerChangeRecorder;
  reviewColumns: ReviewColumnsWriter;
}) {
  const { database, pageReads, clock, cursorKey, customers: repository, changes, reviewColumns } = deps;

  async function requireIndividual(ctx: RequestContext, ref: string, tx: Executor, forUpdate = false): Promise<CustomerRow> {
    const row = await repository.findByRef(ctx.orgId, 'individual', ref, tx, { forUpdate });
    if (!row) throw AppError.notFound('Customer');
    return row;
  }

  /** Finds the record an upsert applies to, per the spec's matching table. */
  async function matchForUpsert(ctx: RequestContext, body: UpsertCustomerBody, tx: Executor) {
    const byExternalId = body.externalId
      ? await repository.findByExternalId(ctx.orgId, body.externalId, tx, { forUpdate: true })
      : undefined;
    const byNameAndEmail =
      !byExternalId && body.fullName && body.email
        ? await repository.findIndividualByNameAndEmail(ctx.orgId, body.fullName, body.email, tx, { forUpdate: true })
        : undefined;
    return matchAmong(body, { byExternalId, byNameAndEmail });
  }

  /** Column values for a create (existing undefined) or an update of `existing` from the upsert body. */
  function upsertColumns(
    ctx: RequestContext,
    existing: CustomerRow | undefined,
    body: UpsertCustomerBody,
    registerStatus: string | undefined,
    addedVia: NonNullable<UpsertOptions['addedVia']> = 'INTEGRATION',
  ) {
    const issues = new Issues();
    const now = clock.now();
    const type = body.type ?? (existing?.type as UpsertCustomerBody['type']) ?? 'INDIVIDUAL';
    const answers: RiskAnswers = { ...((existing?.riskAnswers as RiskAnswers | undefined) ?? {}), ...(body.risk ?? {}) };

    if (!existing) {
      if (!body.fullName) issues.add('fullName', 'Required when creating a customer.');
      if (!body.email) issues.add('email', 'Required when creating a customer.');
    }
    if ((body.firstName === undefined) !== (body.lastName === undefined)) {
      issues.add(body.firstName === undefined ? 'firstName' : 'lastName', 'Send firstName and lastName together, or neither.');
    }
    if (body.middleName !== undefined && body.firstName === undefined) issues.add('middleName', 'Requires firstName and lastName.');
    if (type === 'INDIVIDUAL') {
      if (body.businessName !== undefined) issues.add('businessName', 'Only for SOLE_TRADER customers.');
      if (body.abn !== undefined) issues.add('abn', 'Only for SOLE_TRADER customers.');
    }
    if (existing?.kycStatus === 'VERIFIED') {
      if (body.fullName !== undefined && body.fullName !== existing.name) issues.add('fullName', 'Frozen after KYC verification.');
      if (body.email !== undefined && body.email.toLowerCase() !== existing.email?.toLowerCase())
        issues.add('email', 'Frozen after KYC verification.');
    }
    checkDueDiligenceInputs(body, answers, now, issues, existing?.designatedServices);
    issues.throwIfAny();

    // Past the freeze check a VERIFIED record's name and email are re-sent unchanged (up to email case): keep the stored ones.
    const frozen = existing?.kycStatus === 'VERIFIED';
    const values: Partial<NewCustomerRow> = {
      type,
      name: frozen ? undefined : body.fullName,
      email: frozen ? undefined : body.email,
      phone: body.phone,
      riskAnswers: answers,
      clientSinceDate: body.clientSinceDate,
      preExistingServiceSince: body.preExistingServiceSince,
      preCommencementAssessment: body.preCommencementAssessment,
      representativeName: body.representative?.fullName,
      representativeEmail: body.representative?.email,
      ...servicesUpdate(existing, body, answers),
    };
    if (body.firstName !== undefined && (existing?.nameProvenanceRank ?? 0) <= NAME_PROVENANCE.INTEGRATION) {
      Object.assign(values, {
        firstName: body.firstName,
        middleName: body.middleName ?? null,
        lastName: body.lastName,
        nameProvenanceRank: NAME_PROVENANCE.INTEGRATION,
      });
    }
    if (type === 'SOLE_TRADER') {
      if (body.businessName !== undefined) values.businessName = body.businessName;
      if (body.abn !== undefined) Object.assign(values, { abn: body.abn, businessRegisterStatus: registerStatus ?? 'NOT_CHECKED' });
    } else if (existing && existing.type === 'SOLE_TRADER') {
      Object.assign(values, { businessName: null, abn: null, businessRegisterStatus: null });
    }
    if (!existing) {
      Object.assign(values, { orgId: ctx.orgId, kind: 'individual', externalId: body.externalId ?? null, addedVia });
    }
    return values;
  }

  /** The columns an upsert of `body` changes on the matched record (undefined: none, the upsert is a no-op), or its 422. */
  function updateOf(
    ctx: RequestContext,
    match: UpsertMatch,
    body: UpsertCustomerBody,
    registerStatus: string | undefined,
    addedVia: UpsertOptions['addedVia'],
  ): { row: CustomerRow; changed: Partial<NewCustomerRow> } | undefined {
    const values = upsertColumns(ctx, match.row, body, registerStatus, addedVia);
    if (match.adopt) values.externalId = body.externalId;
    const changed = changedColumns(match.row, values);
    return Object.keys(changed).length === 0 ? undefined : { row: match.row, changed };
  }

  /** Writes an upsert's change to its locked record with its review columns, audit row and events. */
  async function writeUpdate(ctx: RequestContext, update: { row: CustomerRow; changed: Partial<NewCustomerRow> }, tx: Executor) {
    const diff = await reviewColumns.withReview(update.row, update.changed, tx);
    const { dto } = await changes.writeChange(
      { actor: ctx.actor, action: 'customer.upserted', before: update.row, diff, toDto: toIndividualDto },
      () => repository.updateLocked(ctx.orgId, update.row.id, diff, tx),
      tx,
    );
    return dto;
  }

  /** An upsert's error as its route answers it: a taken name and email is a 409. */
  function asUpsertError(error: unknown): unknown {
    return isUniqueViolation(error) ? AppError.conflict('Another customer already has this full name and email.') : error;
  }

  /** The business-register status an upsert of `body` records, looked up now (undefined: the body has no sole trader's ABN). */
  async function registerStatusOf(body: UpsertCustomerBody): Promise<BusinessRegisterStatus | undefined> {
    return body.abn !== undefined && body.type !== 'INDIVIDUAL' ? checkBusinessRegister(deps.businessRegister, body.abn) : undefined;
  }

  const service = {
    registerStatusOf,

    /**
     * POST /customers: create or update per the matching table; never starts KYC, emails or charges.
     * `changed` tells an update from a match that changed nothing.
     */
    async upsert(
      ctx: RequestContext,
      body: UpsertCustomerBody,
      options: UpsertOptions = {},
    ): Promise<{ created: boolean; changed: boolean; customer: IndividualDto }> {
      const registerStatus = options.registerStatus ?? (await registerStatusOf(body));
      try {
        return await ctx.transaction(async (tx) => {
          for (let attempt = 0; attempt < UPSERT_ATTEMPTS; attempt += 1) {
            const match = await matchForUpsert(ctx, body, tx);
            if (match) {
              const update = updateOf(ctx, match, body, registerStatus, options.addedVia);
              if (!update) return { created: false, changed: false, customer: toIndividualDto(match.row) };
              return { created: false, changed: true, customer: await writeUpdate(ctx, update, tx) };
            }
            const values = await reviewColumns.forNewRecord(
              upsertColumns(ctx, undefined, body, registerStatus, options.addedVia) as NewCustomerRow,
              tx,
            );
            const inserted = await repository.insertIfAbsent(values, tx);
            if (inserted) {
              const dto = toIndividualDto(inserted);
              const created = { actor: ctx.actor, action: 'customer.created', before: undefined, after: inserted, dto };
              await changes.record(created, tx);
              return { created: true, changed: true, customer: dto };
            }
            // A concurrent request inserted a matching record first; match again and update it.
          }
          throw AppError.conflict('The customer changed concurrently; retry the request.');
        });
      } catch (error) {
        throw asUpsertError(error);
      }
    },

    /**
     * A bulk import's batch: each body upserted, in order, with the result `upsert` would have given
     * one after another, in the batch's transaction `tx`; `ctx.transaction` opens each row's savepoint.
     * The candidates of every row are found and locked in two statements. A row that shares no key
     * (externalId, full name + email, matched record) with an earlier row of the batch is judged on
     * them: a no-op or a refusal writes nothing, a change is written in its savepoint, and the new
     * records are inserted in one statement with their audit rows in another. A row that shares a key
     * with an earlier one, or whose insert finds its key taken, depends on what came before it: it
     * runs through `upsert` itself, after the others. Rows sharing no key commute, so the results are
     * those of the rows in file order. With `dryRun`, new records are only judged, never inserted.
     */
    async upsertMany(
      ctx: RequestContext,
      items: BulkUpsertItem[],
      options: { addedVia: 'BULK_IMPORT'; dryRun: boolean },
      tx: Executor,
    ): Promise<BulkUpsertResult[]> {
      const results = bulkResults(items.length);
      const candidates = await repository.lockUpsertCandidates(
        ctx.orgId,
        items.flatMap(({ body }) => (body.externalId ? [body.externalId] : [])),
        items.flatMap(({ body }) => (body.fullName && body.email ? [{ name: body.fullName, email: body.email }] : [])),
        tx,
      );
      const byExternalId = new Map<string, CustomerRow>();
      const byNameAndEmail = new Map<string, CustomerRow>();
      for (const row of candidates) {
        if (row.externalId !== null) byExternalId.set(row.externalId, row);
        if (row.kind === 'individual' && row.email !== null) byNameAndEmail.set(nameAndEmailKey(row.name, row.email), row);
      }

      const seen = new Set<string>();
      const afterOthers: number[] = [];
      const updates: Array<{ index: number; update: { row: CustomerRow; changed: Partial<NewCustomerRow> } }> = [];
      const creates: Array<{ index: number; values: NewCustomerRow }> = [];
      const classify = ({ body, registerStatus }: BulkUpsertItem, index: number) => {
        const pair = body.fullName && body.email ? nameAndEmailKey(body.fullName, body.email) : undefined;
        const found: UpsertCandidates = {
          byExternalId: body.externalId ? byExternalId.get(body.externalId) : undefined,
          byNameAndEmail: pair ? byNameAndEmail.get(pair) : undefined,
        };
        const keys = [
          body.externalId === undefined ? undefined : `externalId:${body.externalId}`,
          pair && `name+email:${pair}`,
          found.byExternalId && `record:${found.byExternalId.id}`,
          found.byNameAndEmail && `record:${found.byNameAndEmail.id}`,
        ].filter((key): key is string => key !== undefined);
        const shared = keys.some((key) => seen.has(key));
        for (const key of keys) seen.add(key);
        if (shared) return void afterOthers.push(index);
        try {
          const match = matchAmong(body, found);
          if (!match) {
            const values = upsertColumns(ctx, undefined, body, registerStatus, options.addedVia) as NewCustomerRow;
            return void creates.push({ index, values });
          }
          const update = updateOf(ctx, match, body, registerStatus, options.addedVia);
          if (!update) return results.set(index, { created: false, changed: false, id: match.row.id });
          // The name and email the record ends with: a later row may match (or collide with) them.
          const next = { ...match.row, ...update.changed };
          const nextPair = next.email === null ? undefined : `name+email:${nameAndEmailKey(next.name, next.email)}`;
          if (nextPair && nextPair !== (pair && `name+email:${pair}`)) {
            const collides = seen.has(nextPair);
            seen.add(nextPair);
            if (collides) return void afterOthers.push(index);
          }
          updates.push({ index, update });
        } catch (error) {
          results.refuse(index, error);
        }
      };
      const slice = timeSlicer();
      for (const [index, item] of items.entries()) {
        // The batch is judged in slices, so requests served by this process are not held behind it.
        await slice();
        classify(item, index);
      }

      // The changes together, in one savepoint. The only refusal one can meet is a name and email
      // taken by a record outside the batch's candidates (its row gave one of the two): then that
      // savepoint is rolled back and each change is written in its own, so only that row fails.
      let together = updates.length > 0;
      if (together) {
        try {
          await ctx.transaction((savepoint) =>
            writeLockedChanges(
              { customers: repository, changes, reviewColumns },
              ctx,
              { action: 'customer.upserted', toDto: toIndividualDto },
              updates.map(({ update }) => update),
              savepoint,
            ),
          );
        } catch (error) {
          if (!isUniqueViolation(error)) throw error;
          together = false;
        }
      }
      for (const { index, update } of updates) {
        try {
          if (!together) await ctx.transaction((savepoint) => writeUpdate(ctx, update, savepoint));
          results.set(index, { created: false, changed: true, id: update.row.id });
        } catch (error) {
          results.refuse(index, asUpsertError(error));
        }
      }

      if (options.dryRun) {
        for (const { index } of creates) results.set(index, { created: true, changed: true, id: null });
      } else if (creates.length > 0) {
        const rows = await reviewColumns.forNewRecords(
          creates.map((create) => ({ ...create.values, id: randomUUID() })),
          tx,
        );
        const inserted = new Map((await repository.insertManyIfAbsent(ctx.orgId, rows, tx)).map((row) => [row.id, row]));
        const recorded: Array<{ actor: RequestContext['actor']; action: string; after: CustomerRow }> = [];
        creates.forEach(({ index }, position) => {
          const row = inserted.get(rows[position]!.id!);
          // Its key was taken since the candidates were read (a concurrent request): decided by upsert, after the others.
          if (!row) return void afterOthers.push(index);
          recorded.push({ actor: ctx.actor, action: 'customer.created', after: row });
          results.set(index, { created: true, changed: true, id: row.id });
        });
        await changes.recordCreated(recorded, toIndividualDto, tx);
      }

      await results.upsertEach(afterOthers, options.dryRun, async (index) => {
        const { body, registerStatus } = items[index]!;
        const upserted = await service.upsert(ctx, body, { addedVia: options.addedVia, registerStatus });
        return { ...upserted, id: upserted.customer.id };
      });
      return results.all();
    },

    async get(ctx: RequestContext, ref: string): Promise<IndividualDto> {
      return toIndividualDto(await requireIndividual(ctx, ref, database.db));
    },

    async getAml(ctx: RequestContext, ref: string) {
      return toAmlBlock(await requireIndividual(ctx, ref, database.db));
    },

    async patch(ctx: RequestContext, ref: string, body: PatchCustomerBody): Promise<IndividualDto> {
      try {
        return await ctx.transaction(async (tx) => {
          const row = await requireIndividual(ctx, ref, tx, true);
          const issues = new Issues();
          if (row.kycStatus === 'VERIFIED') {
            if (body.fullName !== undefined && body.fullName !== row.name) issues.add('fullName', 'Frozen after KYC verification.');
            if (body.email !== undefined && body.email.toLowerCase() !== row.email?.toLowerCase())
              issues.add('email', 'Frozen after KYC verification.');
          }
          if (body.risk?.isDesignatedService === false && row.designatedServices.length > 0) {
            issues.add(
              'risk.isDesignatedService',
              'Disagrees with the designated services on record; replace them with an empty set instead.',
            );
          }
          issues.throwIfAny();
          const answers: RiskAnswers = { ...(row.riskAnswers as RiskAnswers), ...(body.risk ?? {}) };
          const frozen = row.kycStatus === 'VERIFIED';
          const values: Partial<NewCustomerRow> = {
            name: frozen ? undefined : body.fullName,
            email: frozen ? undefined : body.email,
            phone: body.phone,
            riskAnswers: answers,
            ...(body.risk ? servicesUpdate(row, { risk: body.risk }, answers) : {}),
          };
          const changed = changedColumns(row, values);
          if (Object.keys(changed).length === 0) return toIndividualDto(row);
          const diff = await reviewColumns.withReview(row, changed, tx);
          const { dto } = await changes.writeChange(
            { actor: ctx.actor, action: 'customer.patched', before: row, diff, toDto: toIndividualDto },
            () => repository.updateLocked(ctx.orgId, row.id, diff, tx),
            tx,
          );
          return dto;
        });
      } catch (error) {
        if (isUniqueViolation(error)) throw AppError.conflict('Another customer already has this full name and email.');
        throw error;
      }
    },

    /** PUT /customers/{id}/designated-services: replace, dedupe, derive the flag, re-rate, audit. */
    async replaceDesignatedServices(ctx: RequestContext, ref: string, codes: string[]): Promise<IndividualDto> {
      return ctx.transaction(async (tx) => {
        const row = await requireIndividual(ctx, ref, tx, true);
        const answers = row.riskAnswers as RiskAnswers;
        const changed = changedColumns(row, servicesUpdate(row, { designatedServices: codes }, answers));
        if (Object.keys(changed).length === 0) return { ...toIndividualDto(row), designated_services: row.designatedServices };
        const diff = await reviewColumns.withReview(row, changed, tx);
        const { row: updated, dto } = await changes.writeChange(
          { actor: ctx.actor, action: 'customer.designated_services_replaced', before: row, diff, toDto: toIndividualDto },
          () => repository.updateLocked(ctx.orgId, row.id, diff, tx),
          tx,
        );
        return { ...dto, designated_services: updated.designatedServices };
      });
    },

    async list(ctx: RequestContext, query: ListQuery): Promise<ListRead<IndividualDto>> {
      return listCustomerRecords(repository, pageReads, cursorKey, ctx.orgId, 'individual', query, (rows) => rows.map(toIndividualDto));
    },
  };
  return service;
}
