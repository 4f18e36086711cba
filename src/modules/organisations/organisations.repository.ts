import { asc, eq, sql } from 'drizzle-orm';
import type { Executor } from '../../db/client.js';
import { creditLedger, organisations, type OrganisationRow } from '../../db/schema.js';

export function createOrganisationsRepository() {
  return {
    async insert(values: typeof organisations.$inferInsert, tx: Executor): Promise<OrganisationRow> {
      const [row] = await tx.insert(organisations).values(values).returning();
      return row!;
    },

    async findById(id: string, tx: Executor): Promise<OrganisationRow | undefined> {
      const [row] = await tx.select().from(organisations).where(eq(organisations.id, id));
      return row;
    },

    /** Every organisation, oldest first (the sandbox of a first start comes first). */
    async list(tx: Executor): Promise<OrganisationRow[]> {
      return tx.select().from(organisations).orderBy(asc(organisations.createdAt), asc(organisations.id));
    },

    async count(tx: Executor): Promise<number> {
      const [row] = await tx.select({ count: sql<number>`count(*)::int` }).from(organisations);
      return row?.count ?? 0;
    },

    async update(
      id: string,
      values: Partial<Pick<OrganisationRow, 'name' | 'features' | 'defaultPayer'>>,
      tx: Executor,
    ): Promise<OrganisationRow | undefined> {
      const [row] = await tx
        .update(organisations)
        .set({ ...values, updatedAt: sql`clock_timestamp()` })
        .where(eq(organisations.id, id))
        .returning();
      return row;
    },

    /**
     * Moves the balance by `delta` and writes the ledger row in the caller's transaction. Returns
     * undefined (and changes nothing) when the balance would go negative.
     */
    async adjustCredits(
      id: string,
      delta: number,
      entry: { reason: string; verificationId?: string; documentId?: string; documentRequestId?: string },
      tx: Executor,
    ): Promise<OrganisationRow | undefined> {
      const [row] = await tx
        .update(organisations)
        .set({ credits: sql`${organisations.credits} + ${delta}`, updatedAt: sql`clock_timestamp()` })
        .where(sql`${organisations.id} = ${id} AND ${organisations.credits} + ${delta} >= 0`)
        .returning();
      if (!row) return undefined;
      await tx.insert(creditLedger).values({
        orgId: id,
        delta,
        balanceAfter: row.credits,
        reason: entry.reason,
        verificationId: entry.verificationId,
        documentId: entry.documentId,
        documentRequestId: entry.documentRequestId,
      });
      return row;
    },
  };
}
export type OrganisationsRepository = ReturnType<typeof createOrganisationsRepository>;
