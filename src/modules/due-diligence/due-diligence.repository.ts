import { eq, sql } from 'drizzle-orm';
import type { Executor } from '../../db/client.js';
import { dueDiligencePolicies, type DueDiligencePolicyRow } from '../../db/schema.js';

type PolicyValues = Omit<DueDiligencePolicyRow, 'orgId' | 'createdAt' | 'updatedAt'>;

export function createDueDiligenceRepository() {
  return {
    async findPolicy(orgId: string, tx: Executor, lock: { forUpdate?: boolean } = {}): Promise<DueDiligencePolicyRow | undefined> {
      const query = tx.select().from(dueDiligencePolicies).where(eq(dueDiligencePolicies.orgId, orgId));
      const [row] = lock.forUpdate ? await query.for('update') : await query;
      return row;
    },

    /** Sets the organisation's policy, creating its row on the first call. */
    async savePolicy(orgId: string, values: PolicyValues, tx: Executor): Promise<DueDiligencePolicyRow> {
      const [row] = await tx
        .insert(dueDiligencePolicies)
        .values({ orgId, ...values })
        .onConflictDoUpdate({ target: dueDiligencePolicies.orgId, set: { ...values, updatedAt: sql`clock_timestamp()` } })
        .returning();
      return row!;
    },
  };
}
export type DueDiligenceRepository = ReturnType<typeof createDueDiligenceRepository>;
