import type { DataAccess, Executor } from '../../db/client.js';
import type { CustomerReviewRow, CustomerRow, NewCustomerRow } from '../../db/schema.js';
import type { Actor } from '../../shared/actor.js';
import { AppError } from '../../shared/app-error.js';
import type { Clock } from '../../shared/clock.js';
import { isUuid } from '../../shared/ids.js';
import { decodeCursor, encodeCursor, filterFingerprint, type CursorKey } from '../../shared/list-cursor.js';
import { listPage, type ListPage } from '../../shared/list-envelope.js';
import type { OutboxRepository } from '../../shared/outbox.js';
import type { RequestContext } from '../../shared/request-context.js';
import type { CustomerChangeRecorder } from '../customers/customer-changes.js';
import { toIndividualDto } from '../customers/customer-dto.js';
import type { CustomerKind, CustomersRepository } from '../customers/customers.repository.js';
import type { IndividualDto } from '../customers/customers.schemas.js';
import { afterReviewRecorded, type ReviewReason, type ReviewStatus } from '../customers/review-model.js';
import type { DueDiligenceRepository } from '../due-diligence/due-diligence.repository.js';
import type { EntitiesService } from '../entities/entities.service.js';
import type { EntityDto } from '../entities/entities.schemas.js';
import type { OrganisationsRepository } from '../organisations/organisations.repository.js';
import type { ReviewsRepository } from './reviews.repository.js';
import type { ListReviewsQuery, RecordReviewBody, ReviewDto } from './reviews.schemas.js';

const DEFAULT_PAGE = 50;
/** `svc review due`: records printed by default, and at most. */
const DEFAULT_DUE_LIMIT = 100;
const MAX_DUE_LIMIT = 1000;

const iso = (value: Date | null) => (value ? value.toISOString() : null);

export function toReviewDto(row: CustomerReviewRow): ReviewDto {
  return {
    object: 'review',
    id: row.id,
    customer_id: row.customerId,
    outcome: row.outcome,
    notes: row.notes,
    reviewer: row.reviewer,
    reasons: row.reasons as ReviewReason[],
    status_before: row.statusBefore as ReviewStatus,
    next_review_at: iso(row.nextReviewAt),
    created_at: row.createdAt.toISOString(),
  };
}

/** Whether a record's review has come due (by its date or a trigger) and not been recorded since. */
const isDue = (status: string) => status === 'DUE' || status === 'OVERDUE';
/** The audit action of `what` done to a record: entity.… for an entity, customer.… for an individual. */
const actionOf = (row: CustomerRow, what: string) => `${row.kind === 'entity' ? 'entity' : 'customer'}.${what}`;
const notFound = (kind: CustomerKind) => AppError.notFound(kind === 'entity' ? 'Entity' : 'Customer');

/**
 * Ongoing due diligence, the record's side (issue 45, items 5 and 8): recording a completed review
 * (POST …/reviews), its history (GET …/reviews), and the operator's `svc review due` and
 * `svc review simulate-due`. Each write changes the record through the customers repository and
 * records the change (audit row, events) in its own transaction.
 */
export function createReviewsService(deps: {
  database: DataAccess;
  clock: Clock;
  cursorKey: CursorKey;
  customers: CustomersRepository;
  entities: Pick<EntitiesService, 'dtoOf'>;
  dueDiligence: Pick<DueDiligenceRepository, 'reviewPolicy'>;
  organisations: Pick<OrganisationsRepository, 'findById'>;
  changes: CustomerChangeRecorder;
  outbox: OutboxRepository;
  reviews: ReviewsRepository;
}) {
  const { database, clock, cursorKey, customers, entities, dueDiligence, organisations, changes, outbox, reviews } = deps;

  const dtoOf = async (row: CustomerRow, tx: Executor): Promise<IndividualDto | EntityDto> =>
    row.kind === 'entity' ? entities.dtoOf(row, tx) : toIndividualDto(row);

  async function requireOrg(orgId: string): Promise<void> {
    if (!isUuid(orgId) || !(await organisations.findById(orgId, database.db))) throw AppError.notFound('Organisation');
  }

  /** `--customer` of the CLI: an individual's or an entity's UUID or external_id, locked for the change. */
  async function requireAnyRecord(orgId: string, ref: string, tx: Executor): Promise<CustomerRow> {
    const row =
      (await customers.findByRef(orgId, 'individual', ref, tx, { forUpdate: true })) ??
      (await customers.findByRef(orgId, 'entity', ref, tx, { forUpdate: true }));
    if (!row) throw AppError.notFound('Customer or entity');
    return row;
  }

  return {
    /**
     * POST /customers/{id}/reviews and /entities/{id}/reviews: the review is recorded, the record's
     * reasons clear, last_completed_at is now and the next review is scheduled from now by the policy;
     * audited, with `customer.review_completed` (and `customer.updated`, as for any change) in the same
     * transaction. A record never verified has no review to record (409).
     */
    async record(ctx: RequestContext, kind: CustomerKind, ref: string, body: RecordReviewBody): Promise<ReviewDto> {
      return ctx.transaction(async (tx) => {
        const row = await customers.findByRef(ctx.orgId, kind, ref, tx, { forUpdate: true });
        if (!row) throw notFound(kind);
        if (row.reviewStatus === 'NOT_SCHEDULED') {
          throw AppError.conflict(
            'This record has no review to record: a review is scheduled only once verification reaches VERIFIED (review.status is NOT_SCHEDULED).',
            { review_status: row.reviewStatus },
          );
        }
        const policy = await dueDiligence.reviewPolicy(ctx.orgId, tx);
        const now = clock.now();
        const columns = afterReviewRecorded(row, policy, now);
        const values: Partial<NewCustomerRow> = { ...columns, reviewCompletedAt: now };
        const updated = await customers.update(ctx.orgId, row.id, values, tx);
        const review = await reviews.insert(
          {
            orgId: ctx.orgId,
            customerId: row.id,
            outcome: body.outcome,
            notes: body.notes ? body.notes : null,
            reviewer: body.reviewer,
            reasons: isDue(row.reviewStatus) ? row.reviewReasons : [],
            statusBefore: row.reviewStatus,
            nextReviewAt: columns.nextReviewAt,
            // The record's last_completed_at: the review and the record name the same instant.
            createdAt: now,
          },
          tx,
        );
        const dto = await dtoOf(updated, tx);
        await changes.record({ actor: ctx.actor, action: actionOf(row, 'review_recorded'), before: row, after: updated, dto }, tx);
        await outbox.record({ orgId: ctx.orgId, type: 'customer.review_completed', customerId: row.id, customer: dto }, tx);
        return toReviewDto(review);
      });
    },

    /** GET /customers/{id}/reviews and /entities/{id}/reviews: newest first, cursor paged; a cursor continues only its record's walk. */
    async list(ctx: Pick<RequestContext, 'orgId'>, kind: CustomerKind, ref: string, query: ListReviewsQuery): Promise<ListPage<ReviewDto>> {
      const limit = query.limit ?? DEFAULT_PAGE;
      const record = await customers.findByRef(ctx.orgId, kind, ref, database.db);
      if (!record) throw notFound(kind);
      const fingerprint = filterFingerprint({ list: 'customer_reviews', customer: record.id });
      const key = await cursorKey();
      const before = query.cursor ? decodeCursor(query.cursor, fingerprint, key) : undefined;
      const rows = await reviews.history(ctx.orgId, record.id, { before, limit: limit + 1 }, database.db);
      return listPage(rows, limit, toReviewDto, (last) => encodeCursor(last, fingerprint, key));
    },

    /**
     * `svc review due`: the organisation's individuals and entities whose review is DUE or OVERDUE,
     * the longest due first (next_review_at, then created_at and id), as their DTOs, read from one snapshot.
     */
    async due(orgId: string, options: { limit?: number } = {}): Promise<Array<IndividualDto | EntityDto>> {
      const limit = options.limit ?? DEFAULT_DUE_LIMIT;
      if (!Number.isInteger(limit) || limit < 1 || limit > MAX_DUE_LIMIT) {
        throw AppError.field('limit', `Must be a whole number from 1 to ${MAX_DUE_LIMIT}.`);
      }
      await requireOrg(orgId);
      return database.transaction(
        async (tx) => {
          const [individuals, entityRows] = [
            await reviews.due(orgId, 'individual', limit, tx),
            await reviews.due(orgId, 'entity', limit, tx),
          ];
          const rows = [...individuals, ...entityRows].sort(dueOrder).slice(0, limit);
          const dtos: Array<IndividualDto | EntityDto> = [];
          for (const row of rows) dtos.push(await dtoOf(row, tx));
          return dtos;
        },
        { isolationLevel: 'repeatable read', accessMode: 'read only' },
      );
    },

    /**
     * `svc review simulate-due`: the record's review made due now (DUE, next_review_at now, reason
     * SCHEDULED_DATE), as the review sweep would on its date, so an integrator sees `customer.review_due`
     * without waiting; audited. A record never verified has no review to make due (refused); one already
     * DUE or OVERDUE is left as it is (its event was sent when it became due) and printed unchanged.
     */
    async simulateDue(orgId: string, ref: string, actor: Actor): Promise<IndividualDto | EntityDto> {
      await requireOrg(orgId);
      return database.transaction(async (tx) => {
        const row = await requireAnyRecord(orgId, ref, tx);
        if (row.reviewStatus === 'NOT_SCHEDULED') {
          throw AppError.conflict('This record has no review to make due: a review is scheduled only once verification reaches VERIFIED.', {
            review_status: row.reviewStatus,
          });
        }
        // Already due (by its date or a trigger): customer.review_due was sent then, and is sent once per due review.
        if (isDue(row.reviewStatus)) return dtoOf(row, tx);
        const values: Partial<NewCustomerRow> = { reviewStatus: 'DUE', nextReviewAt: clock.now(), reviewReasons: ['SCHEDULED_DATE'] };
        const updated = await customers.update(orgId, row.id, values, tx);
        const dto = await dtoOf(updated, tx);
        // The recorder sends customer.review_due (the review became DUE in this change), and only that, as
        // the review sweep does on a review's date: no customer.updated carrying the same DTO beside it.
        await changes.record(
          { actor, action: actionOf(row, 'review_due_simulated'), before: row, after: updated, dto, fireUpdated: false },
          tx,
        );
        return dto;
      });
    },
  };
}
export type ReviewsService = ReturnType<typeof createReviewsService>;

/** Oldest due first; ties in creation order. */
function dueOrder(a: CustomerRow, b: CustomerRow): number {
  return (
    (a.nextReviewAt?.getTime() ?? 0) - (b.nextReviewAt?.getTime() ?? 0) ||
    a.createdAt.getTime() - b.createdAt.getTime() ||
    (a.id < b.id ? -1 : a.id > b.id ? 1 : 0)
  );
}
