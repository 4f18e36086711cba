import { and, asc, desc, eq, sql } from 'drizzle-orm';
import type { Executor } from '../../db/client.js';
import { emails } from '../../db/schema.js';
import type pg from 'pg';
import { QUEUES, type FirstJob, type JobQueue } from '../../shared/job-runner.js';
import type { TextSealer } from '../../shared/text-sealer.js';

export type EmailRow = typeof emails.$inferSelect;

/** What an email's job carries: which email to send, never its content. */
export type EmailJob = { orgId: string; emailId: string };

/** A job for each email still queued when the job queues are installed: emails queued before emails had jobs. */
export async function unsentEmailJobs(client: pg.Client): Promise<FirstJob[]> {
  const exists = await client.query<{ table: string | null }>(`SELECT to_regclass('emails')::text AS table`);
  if (!exists.rows[0]?.table) return [];
  const queued = await client.query<{ org_id: string; id: string }>(
    `SELECT org_id, id FROM emails WHERE status = 'queued' ORDER BY created_at`,
  );
  return queued.rows.map((row) => ({
    queue: QUEUES.emailSend.name,
    data: { orgId: row.org_id, emailId: row.id } satisfies EmailJob,
    group: row.org_id,
  }));
}

/**
 * An email's body and link carry a usable link token: both are sealed when queued (text-sealer.ts),
 * and opened only to send or to show an operator (`openRow`). `jobs` is only needed to queue one.
 */
export function createEmailsRepository(sealer: TextSealer, jobs?: JobQueue) {
  return {
    /**
     * Queues an email and its job in the caller's transaction: a rollback leaves neither, and the sender
     * sees the job once it committed (this process's workers woken after the commit, others' by their poll).
     */
    async queue(
      values: { orgId: string; recipient: string; subject: string; body: string; link?: string; verificationId?: string },
      tx: Executor,
    ) {
      if (!jobs) throw new Error('queuing an email needs the job queue');
      const sealed = { ...values, body: sealer.seal(values.body), link: values.link === undefined ? undefined : sealer.seal(values.link) };
      const [row] = await tx.insert(emails).values(sealed).returning();
      await jobs.send(tx, QUEUES.emailSend.name, { orgId: row!.orgId, emailId: row!.id } satisfies EmailJob, { group: row!.orgId });
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
     * Counts an attempt at a queued email and returns it; undefined when it is no longer queued (sent,
     * recorded or failed: a job run again after its instance died between the send and the job's end).
     */
    async startAttempt(orgId: string, id: string, tx: Executor): Promise<EmailRow | undefined> {
      const [row] = await tx
        .update(emails)
        .set({ attempts: sql`${emails.attempts} + 1` })
        .where(and(eq(emails.orgId, orgId), eq(emails.id, id), eq(emails.status, 'queued')))
        .returning();
      return row;
    },

    async markDelivered(orgId: string, id: string, status: 'sent' | 'recorded', tx: Executor): Promise<void> {
      await tx
        .update(emails)
        .set({ status, sentAt: sql`clock_timestamp()`, lastError: null })
        .where(and(eq(emails.orgId, orgId), eq(emails.id, id)));
    },

    /** Records a failed attempt: the email stays queued for its job's retry, or ends `failed` after the last. */
    async recordFailure(orgId: string, id: string, error: string, giveUp: boolean, tx: Executor): Promise<void> {
      await tx
        .update(emails)
        .set({ status: giveUp ? 'failed' : 'queued', lastError: error.slice(0, 1000) })
        .where(and(eq(emails.orgId, orgId), eq(emails.id, id)));
    },
  };
}
export type EmailsRepository = ReturnType<typeof createEmailsRepository>;
