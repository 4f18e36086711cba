import { and, asc, desc, eq, sql } from 'drizzle-orm';
import type { Executor } from '../../db/client.js';
import { emails } from '../../db/schema.js';

export type EmailRow = typeof emails.$inferSelect;

export function createEmailsRepository(db: Executor) {
  return {
    /**
     * Queues an email in the caller's transaction; the sender delivers it after commit. No NOTIFY: the
     * sender polls every second, and a NOTIFY would queue this commit behind every other notifying one.
     */
    async queue(values: { orgId: string; recipient: string; subject: string; body: string; link?: string; verificationId?: string }, tx: Executor = db) {
      const [row] = await tx.insert(emails).values(values).returning();
      return row!;
    },

    async list(orgId: string, filters: { to?: string } = {}, tx: Executor = db): Promise<EmailRow[]> {
      return tx
        .select()
        .from(emails)
        .where(and(eq(emails.orgId, orgId), filters.to ? sql`lower(${emails.recipient}) = lower(${filters.to})` : undefined))
        .orderBy(desc(emails.createdAt), asc(emails.id));
    },

    /**
     * Claims due emails for one sender (short transaction, SKIP LOCKED so senders on several
     * instances share the work): the claim pushes next_attempt_at ahead, so a sender that dies
     * mid-send only delays the email.
     */
    async claimDue(limit: number, leaseSeconds: number, tx: Executor = db): Promise<EmailRow[]> {
      const result = await tx.execute<{ id: string }>(sql`
        UPDATE emails SET attempts = attempts + 1,
               next_attempt_at = clock_timestamp() + make_interval(secs => ${leaseSeconds})
         WHERE id IN (
           SELECT id FROM emails
            WHERE status = 'queued' AND next_attempt_at <= clock_timestamp()
            ORDER BY next_attempt_at
            LIMIT ${limit}
            FOR UPDATE SKIP LOCKED)
        RETURNING id`);
      const ids = result.rows.map((row) => row.id);
      if (ids.length === 0) return [];
      return tx.select().from(emails).where(sql`${emails.id} IN (${sql.join(ids.map((id) => sql`${id}`), sql`, `)})`);
    },

    async markDelivered(id: string, status: 'sent' | 'recorded', tx: Executor = db): Promise<void> {
      await tx.update(emails).set({ status, sentAt: sql`clock_timestamp()`, lastError: null }).where(eq(emails.id, id));
    },

    async scheduleRetry(id: string, error: string, delaySeconds: number, giveUp: boolean, tx: Executor = db): Promise<void> {
      await tx
        .update(emails)
        .set({
          status: giveUp ? 'failed' : 'queued',
          lastError: error.slice(0, 1000),
          nextAttemptAt: sql`clock_timestamp() + make_interval(secs => ${delaySeconds})`,
        })
        .where(eq(emails.id, id));
    },
  };
}
export type EmailsRepository = ReturnType<typeof createEmailsRepository>;
