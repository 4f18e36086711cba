import { and, asc, desc, eq, getTableColumns, lte, sql } from 'drizzle-orm';
import type { Executor } from '../../db/client.js';
import { emails } from '../../db/schema.js';
import { organisationsWith } from '../../db/skip-scan.js';
import { claimFairly, createOrgRotation, dueOrganisations } from '../../shared/fair-claims.js';
import type { TextSealer } from '../../shared/text-sealer.js';

export type EmailRow = typeof emails.$inferSelect;

/**
 * An email's body and link carry a usable link token: both are sealed when queued (text-sealer.ts),
 * and opened only to send or to show an operator (`openRow`).
 */
export function createEmailsRepository(db: Executor, sealer: TextSealer) {
  // Where this repository's next claim starts looking for organisations (fair-claims.ts).
  const rotation = createOrgRotation();

  /**
   * Organisations after `after` (org_id order) with an email due now, at most `limit`: a skip scan of
   * emails_due_idx, one probe per organisation with queued emails and one to check it has a due one.
   */
  function organisationsWithDueEmails(after: string, limit: number, tx: Executor): Promise<string[]> {
    return organisationsWith(tx, {
      table: 'emails',
      pending: sql`status = 'queued'`,
      due: sql`next_attempt_at <= clock_timestamp()`,
      after,
      limit,
    });
  }

  /**
   * Claims up to `limit` due emails of one organisation in one statement (SKIP LOCKED: senders on
   * several instances share the work). The due rows are a WITH query, run once: its clock_timestamp()
   * keeps PostgreSQL from folding it into the UPDATE, where a nested loop could run the locking
   * subquery again for every row and claim more than `limit`.
   */
  async function claimIn(orgId: string, limit: number, leaseSeconds: number, tx: Executor): Promise<EmailRow[]> {
    const due = tx.$with('due').as(
      tx
        .select({ id: emails.id })
        .from(emails)
        .where(and(eq(emails.orgId, orgId), eq(emails.status, 'queued'), lte(emails.nextAttemptAt, sql`clock_timestamp()`)))
        .orderBy(asc(emails.nextAttemptAt))
        .limit(limit)
        .for('update', { skipLocked: true }),
    );
    return tx
      .with(due)
      .update(emails)
      .set({ attempts: sql`${emails.attempts} + 1`, nextAttemptAt: sql`clock_timestamp() + make_interval(secs => ${leaseSeconds})` })
      .from(due)
      .where(and(eq(emails.orgId, orgId), eq(emails.id, due.id)))
      .returning(getTableColumns(emails));
  }

  return {
    /**
     * Queues an email in the caller's transaction; the sender delivers it after commit. No NOTIFY: the
     * sender polls every second, and a NOTIFY would queue this commit behind every other notifying one.
     */
    async queue(
      values: { orgId: string; recipient: string; subject: string; body: string; link?: string; verificationId?: string },
      tx: Executor,
    ) {
      const sealed = { ...values, body: sealer.seal(values.body), link: values.link === undefined ? undefined : sealer.seal(values.link) };
      const [row] = await tx.insert(emails).values(sealed).returning();
      return row!;
    },

    /** The row with its body and link readable; throws SealedTextError under another key. */
    openRow(row: EmailRow): EmailRow {
      return { ...row, body: sealer.open(row.body), link: row.link === null ? null : sealer.open(row.link) };
    },

    /**
     * Seals a row queued before emails were sealed, once it has been delivered: such rows are read in
     * clear by the sender, and nothing readable stays behind for the retention period.
     */
    async sealLegacy(row: EmailRow, tx: Executor): Promise<void> {
      if (sealer.isSealed(row.body) && (row.link === null || sealer.isSealed(row.link))) return;
      await tx
        .update(emails)
        .set({
          body: sealer.isSealed(row.body) ? row.body : sealer.seal(row.body),
          link: row.link === null || sealer.isSealed(row.link) ? row.link : sealer.seal(row.link),
        })
        .where(and(eq(emails.orgId, row.orgId), eq(emails.id, row.id)));
    },

    async list(orgId: string, filters: { to?: string } = {}, tx: Executor): Promise<EmailRow[]> {
      return tx
        .select()
        .from(emails)
        .where(and(eq(emails.orgId, orgId), filters.to ? sql`lower(${emails.recipient}) = lower(${filters.to})` : undefined))
        .orderBy(desc(emails.createdAt), asc(emails.id));
    },

    /**
     * Claims up to `limit` due emails for one sender: finds the organisations with due emails, then
     * claims within each, an equal share first (fair-claims.ts), each organisation's claim a statement
     * of its own. The claim pushes next_attempt_at ahead, so a sender that dies mid-send only delays
     * the email.
     */
    async claimDue(limit: number, leaseSeconds: number, tx: Executor): Promise<EmailRow[]> {
      const orgIds = await dueOrganisations(rotation, limit, (after, count) => organisationsWithDueEmails(after, count, tx));
      return claimFairly(orgIds, limit, (orgId, count) => claimIn(orgId, count, leaseSeconds, tx));
    },

    async markDelivered(orgId: string, id: string, status: 'sent' | 'recorded', tx: Executor): Promise<void> {
      await tx
        .update(emails)
        .set({ status, sentAt: sql`clock_timestamp()`, lastError: null })
        .where(and(eq(emails.orgId, orgId), eq(emails.id, id)));
    },

    async scheduleRetry(orgId: string, id: string, error: string, delaySeconds: number, giveUp: boolean, tx: Executor): Promise<void> {
      await tx
        .update(emails)
        .set({
          status: giveUp ? 'failed' : 'queued',
          lastError: error.slice(0, 1000),
          nextAttemptAt: sql`clock_timestamp() + make_interval(secs => ${delaySeconds})`,
        })
        .where(and(eq(emails.orgId, orgId), eq(emails.id, id)));
    },
  };
}
export type EmailsRepository = ReturnType<typeof createEmailsRepository>;
