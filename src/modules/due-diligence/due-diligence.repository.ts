import { eq, sql } from 'drizzle-orm';
import type { Executor } from '../../db/client.js';
import { dueDiligencePolicies, type DueDiligencePolicyRow } from '../../db/schema.js';

type PolicyValues = Omit<DueDiligencePolicyRow, 'orgId' | 'createdAt' | 'updatedAt'>;

export function createDueDiligenceRepository() {
  return {
    async findPolicy(orgId: string, tx: Executor): Promise<DueDiligencePolicyRow | undefined> {
      const [row] = await tx.select().from(dueDiligencePolicies).where(eq(dueDiligencePolicies.orgId, orgId));
      return row;
    },

    /**
     * Serialises the organisation's policy writes until `tx` ends. A row lock cannot: before the first
     * PUT there is no row, and two first PUTs would each audit the defaults as what they replaced.
     */
    async lockPolicy(orgId: string, tx: Executor): Promise<void> {
      await tx.execute(sql`SELECT pg_advisory_xact_lock(hashtextextended(${`due_diligence_policy:${orgId}`}, 0))`);
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
