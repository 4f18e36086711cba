import { and, desc, eq } from 'drizzle-orm';
import type { Executor } from '../../db/client.js';
import { verificationLinkTokens, verifications } from '../../db/schema.js';

export type VerificationRow = typeof verifications.$inferSelect;

export function createVerificationRepository() {
  return {
    /**
     * The verification and, when it emails a link, its token's directory row (verification_link_tokens,
     * the token's SHA-256 only): call it in a transaction.
     */
    async insert(values: typeof verifications.$inferInsert, linkTokenHash: string | null, tx: Executor): Promise<VerificationRow> {
      const [row] = await tx.insert(verifications).values(values).returning();
      if (linkTokenHash)
        await tx.insert(verificationLinkTokens).values({ tokenHash: linkTokenHash, orgId: row!.orgId, verificationId: row!.id });
      return row!;
    },

    async latestFor(orgId: string, customerId: string, tx: Executor): Promise<VerificationRow | undefined> {
      const [row] = await tx
        .select()
        .from(verifications)
        .where(and(eq(verifications.orgId, orgId), eq(verifications.customerId, customerId)))
        .orderBy(desc(verifications.createdAt))
        .limit(1);
      return row;
    },

    async complete(orgId: string, id: string, status: string, completedAt: Date | null, tx: Executor): Promise<void> {
      await tx
        .update(verifications)
        .set({ status, completedAt, updatedAt: new Date() })
        .where(and(eq(verifications.orgId, orgId), eq(verifications.id, id)));
    },
  };
}
export type VerificationRepository = ReturnType<typeof createVerificationRepository>;
