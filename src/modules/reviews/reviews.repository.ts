import { and, asc, desc, eq, inArray, sql, type SQL } from 'drizzle-orm';
import type { Executor } from '../../db/client.js';
import { customerReviews, customers, type CustomerReviewRow, type CustomerRow } from '../../db/schema.js';
import type { CustomerKind } from '../customers/customers.repository.js';

export type NewReview = typeof customerReviews.$inferInsert;
type Position = { createdAt: Date; id: string };

/** The review history (customer_reviews) and the due-review work list of the operator CLI. */
export function createReviewsRepository() {
  return {
    async insert(values: NewReview, tx: Executor): Promise<CustomerReviewRow> {
      const [row] = await tx.insert(customerReviews).values(values).returning();
      return row!;
    },

    /**
     * A record's reviews, newest first (created_at, then id, descending), a page strictly before
     * `before`: a range of customer_reviews_history_idx read backwards.
     */
    async history(
      orgId: string,
      customerId: string,
      page: { before?: Position; limit: number },
      tx: Executor,
    ): Promise<CustomerReviewRow[]> {
      const conditions: SQL[] = [eq(customerReviews.orgId, orgId), eq(customerReviews.customerId, customerId)];
      if (page.before) {
        conditions.push(
          sql`(${customerReviews.createdAt}, ${customerReviews.id}) < (${page.before.createdAt.toISOString()}::timestamptz, ${page.before.id}::uuid)`,
        );
      }
      return tx
        .select()
        .from(customerReviews)
        .where(and(...conditions))
        .orderBy(desc(customerReviews.createdAt), desc(customerReviews.id))
        .limit(page.limit);
    },

    /**
     * Records of one kind whose review is DUE or OVERDUE, the longest due first (next_review_at, then
     * created_at and id): a range of customers_review_due_idx, whose rows carry review_status.
     */
    async due(orgId: string, kind: CustomerKind, limit: number, tx: Executor): Promise<CustomerRow[]> {
      return tx
        .select()
        .from(customers)
        .where(
          and(
            eq(customers.orgId, orgId),
            eq(customers.kind, kind),
            sql`${customers.nextReviewAt} IS NOT NULL`,
            inArray(customers.reviewStatus, ['DUE', 'OVERDUE']),
          ),
        )
        .orderBy(asc(customers.nextReviewAt), asc(customers.createdAt), asc(customers.id))
        .limit(limit);
    },
  };
}
export type ReviewsRepository = ReturnType<typeof createReviewsRepository>;
