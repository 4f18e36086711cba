import type { DataAccess, Executor } from '../../db/client.js';
import type { CustomerRow } from '../../db/schema.js';
import type { Actor } from '../../shared/actor.js';
import type { Clock } from '../../shared/clock.js';
import type { AuditWriter } from '../../shared/audit-writer.js';
import type { OutboxRepository } from '../../shared/outbox.js';
import { auditChanges, auditSnapshot, toIndividualDto } from '../customers/customer-dto.js';
import type { CustomersRepository } from '../customers/customers.repository.js';
import { deriveReview, reviewDiff } from '../customers/review-model.js';
import { toEntityDto } from '../entities/entity-dto.js';
import { reviewPolicyOf, type DueDiligenceRepository } from './due-diligence.repository.js';

const SYSTEM: Actor = { type: 'system', id: null };
const DAY_MS = 86_400_000;
/** Records a sweep claim or a re-dating batch takes in one transaction: its locks last one batch. */
export const REVIEW_BATCH = 500;

/**
 * The background side of ongoing due diligence, run by pg-boss jobs (jobs.ts):
 * - the sweep makes each SCHEDULED review whose date passed DUE (firing `customer.review_due` once)
 *   and each DUE review past the policy's overdue_after_days OVERDUE;
 * - the re-dating applies a changed policy to every record of the organisation, in batches.
 */
export function createReviewJobs(deps: {
  database: DataAccess;
  clock: Clock;
  customers: CustomersRepository;
  dueDiligence: DueDiligenceRepository;
  audit: AuditWriter;
  outbox: OutboxRepository;
  batchSize?: number;
}) {
  const { database, clock, customers, dueDiligence, audit, outbox } = deps;
  const batchSize = deps.batchSize ?? REVIEW_BATCH;

  /** The public DTOs of a batch of one organisation's records: the entities' contacts read in one statement. */
  async function dtosOf(orgId: string, rows: CustomerRow[], tx: Executor): Promise<unknown[]> {
    const contactIds = [...new Set(rows.flatMap((row) => (row.kind === 'entity' && row.contactCustomerId ? [row.contactCustomerId] : [])))];
    const contacts = new Map((await customers.findManyByIds(orgId, contactIds, tx)).map((contact) => [contact.id, contact]));
    return rows.map((row) =>
      row.kind === 'entity'
        ? toEntityDto(row, row.contactCustomerId ? contacts.get(row.contactCustomerId) : undefined)
        : toIndividualDto(row),
    );
  }

  /** One audit row per record of a batch, each with the record before and the changed columns, in one statement. */
  function auditBatch(action: string, changes: Array<{ before: CustomerRow; diff: Partial<CustomerRow> }>, tx: Executor) {
    return audit.recordChanges(
      changes.map(({ before, diff }) => ({
        orgId: before.orgId,
        actor: SYSTEM,
        action,
        subjectType: before.kind === 'entity' ? 'entity' : 'customer',
        subjectId: before.id,
        before: auditSnapshot(before),
        changes: auditChanges(diff),
      })),
      tx,
    );
  }

  /** Claims batches until one comes back short: each batch its own transaction, with its audit rows (and events). */
  async function drain(
    orgId: string,
    claim: (tx: Executor) => Promise<CustomerRow[]>,
    before: Partial<CustomerRow>,
    action: string,
    fire: boolean,
  ) {
    let total = 0;
    for (;;) {
      const claimed = await database.transaction(async (tx) => {
        const rows = await claim(tx);
        const changes = rows.map((after) => ({
          before: { ...after, ...before },
          diff: { reviewStatus: after.reviewStatus, reviewReasons: after.reviewReasons },
        }));
        await auditBatch(action, changes, tx);
        if (fire) {
          // The review_due event carries the DTO; a customer.updated beside it would say the same twice.
          const dtos = await dtosOf(orgId, rows, tx);
          await outbox.recordMany(
            rows.map((row, index) => ({ orgId, type: 'customer.review_due' as const, customerId: row.id, customer: dtos[index] })),
            tx,
          );
        }
        return rows.length;
      });
      total += claimed;
      if (claimed < batchSize) return total;
    }
  }

  return {
    /** One sweep over every organisation with review work at the clock's now. */
    async sweep(): Promise<{ due: number; overdue: number }> {
      const now = clock.now();
      let due = 0;
      let overdue = 0;
      for (const { orgId, overdueAfterDays } of await dueDiligence.organisationsWithReviewWork(now, database.db)) {
        due += await drain(
          orgId,
          (tx) => customers.claimDueReviews(orgId, now, batchSize, tx),
          { reviewStatus: 'SCHEDULED', reviewReasons: [] },
          'customer.review_due',
          true,
        );
        overdue += await drain(
          orgId,
          (tx) => customers.claimOverdueReviews(orgId, new Date(now.getTime() - overdueAfterDays * DAY_MS), batchSize, tx),
          { reviewStatus: 'DUE' },
          'customer.review_overdue',
          false,
        );
      }
      return { due, overdue };
    },

    /**
     * Applies the organisation's policy of `generation` to each of its records, in id order, a batch
     * per transaction (its locks last one batch); stops when a newer PUT replaced the generation (its
     * own job takes over). Each moved record is audited; no customer.updated fires (the policy's own
     * audit row says why). `onBatch` (tests) runs after each batch committed.
     */
    async redate(
      orgId: string,
      generation: number,
      onBatch?: (progress: { checked: number; moved: number }) => Promise<void>,
    ): Promise<{ checked: number; moved: number } | undefined> {
      const started = await database.transaction((tx) => dueDiligence.restartRedate(orgId, generation, tx));
      if (!started) return undefined;
      let afterId: string | null = null;
      let checked = 0;
      let moved = 0;
      for (;;) {
        const batch = await database.transaction(async (tx) => {
          const policyRow = await dueDiligence.findPolicy(orgId, tx);
          if (!policyRow || policyRow.generation !== generation) return undefined;
          const policy = reviewPolicyOf(policyRow);
          const rows = await customers.lockBatchAfter(orgId, afterId, batchSize, tx);
          const now = clock.now();
          const changes = rows.flatMap((row) => {
            const derived = deriveReview({ before: row, after: row, policy, now });
            const diff = reviewDiff(row, derived);
            return Object.keys(diff).length === 0 ? [] : [{ before: row, diff, derived }];
          });
          await customers.setReviewColumns(
            orgId,
            changes.map(({ before, derived }) => ({ id: before.id, ...derived })),
            tx,
          );
          await auditBatch('customer.review_redated', changes, tx);
          const finished = rows.length < batchSize;
          const current = await dueDiligence.recordRedateProgress(
            orgId,
            generation,
            { checked: rows.length, moved: changes.length, finished },
            tx,
          );
          if (!current) return undefined;
          return { rows, moved: changes.length, finished };
        });
        if (!batch) return undefined;
        checked += batch.rows.length;
        moved += batch.moved;
        await onBatch?.({ checked, moved });
        if (batch.finished) return { checked, moved };
        afterId = batch.rows[batch.rows.length - 1]!.id;
      }
    },
  };
}
export type ReviewJobs = ReturnType<typeof createReviewJobs>;
