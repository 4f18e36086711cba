import type { DataAccess, Executor } from '../../db/client.js';
import type { CustomerRow } from '../../db/schema.js';
import type { Actor } from '../../shared/actor.js';
import type { Clock } from '../../shared/clock.js';
import type { CustomerChangeRecorder } from '../customers/customer-changes.js';
import { toIndividualDto } from '../customers/customer-dto.js';
import type { CustomersRepository } from '../customers/customers.repository.js';
import { deriveReview, reviewDiff } from '../customers/review-model.js';
import type { EntitiesService } from '../entities/entities.service.js';
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
  changes: CustomerChangeRecorder;
  entities: Pick<EntitiesService, 'dtoOf'>;
  batchSize?: number;
}) {
  const { database, clock, customers, dueDiligence, changes, entities } = deps;
  const batchSize = deps.batchSize ?? REVIEW_BATCH;
  const dtoOf = (row: CustomerRow, tx: Executor) => (row.kind === 'entity' ? entities.dtoOf(row, tx) : toIndividualDto(row));

  /** Audit rows (and the review_due events) of a claimed batch, in its transaction. */
  async function recordClaimed(rows: CustomerRow[], before: Partial<CustomerRow>, action: string, tx: Executor) {
    for (const after of rows) {
      const dto = await dtoOf(after, tx);
      const diff = { reviewStatus: after.reviewStatus, reviewReasons: after.reviewReasons };
      // The review_due event carries the DTO; a customer.updated beside it would say the same twice.
      await changes.record({ actor: SYSTEM, action, before: { ...after, ...before }, after, dto, diff, fireUpdated: false }, tx);
    }
  }

  /** Claims batches until one comes back short: each batch its own transaction. */
  async function drain(claim: (tx: Executor) => Promise<CustomerRow[]>, before: Partial<CustomerRow>, action: string) {
    let total = 0;
    for (;;) {
      const claimed = await database.transaction(async (tx) => {
        const rows = await claim(tx);
        await recordClaimed(rows, before, action, tx);
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
          (tx) => customers.claimDueReviews(orgId, now, batchSize, tx),
          { reviewStatus: 'SCHEDULED', reviewReasons: [] },
          'customer.review_due',
        );
        overdue += await drain(
          (tx) => customers.claimOverdueReviews(orgId, new Date(now.getTime() - overdueAfterDays * DAY_MS), batchSize, tx),
          { reviewStatus: 'DUE' },
          'customer.review_overdue',
        );
      }
      return { due, overdue };
    },

    /**
     * Applies the organisation's policy of `generation` to each of its records, in id order, a batch
     * per transaction; stops when a newer PUT replaced the generation (its own job takes over). Each
     * moved record is audited; no customer.updated fires (the policy's own audit row says why).
     */
    async redate(orgId: string, generation: number): Promise<{ checked: number; moved: number } | undefined> {
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
          let movedHere = 0;
          for (const row of rows) {
            const diff = reviewDiff(row, deriveReview({ before: row, after: row, policy, now }));
            if (Object.keys(diff).length === 0) continue;
            movedHere += 1;
            const updated = await customers.update(orgId, row.id, diff, tx);
            const dto = await dtoOf(updated, tx);
            await changes.record(
              { actor: SYSTEM, action: 'customer.review_redated', before: row, after: updated, dto, diff, fireUpdated: false },
              tx,
            );
          }
          const finished = rows.length < batchSize;
          const current = await dueDiligence.recordRedateProgress(
            orgId,
            generation,
            { checked: rows.length, moved: movedHere, finished },
            tx,
          );
          if (!current) return undefined;
          return { rows, moved: movedHere, finished };
        });
        if (!batch) return undefined;
        checked += batch.rows.length;
        moved += batch.moved;
        if (batch.finished) return { checked, moved };
        afterId = batch.rows[batch.rows.length - 1]!.id;
      }
    },
  };
}
export type ReviewJobs = ReturnType<typeof createReviewJobs>;
