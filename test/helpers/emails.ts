import type { Database } from '../../src/db/client.js';
import type { createEmailSender } from '../../src/modules/emails/email-sender.js';

/**
 * Sends every queued email with `sender`, as the email worker does with each email's job (first
 * attempt); returns how many were handled.
 */
export async function sendQueuedEmails(database: Database, sender: ReturnType<typeof createEmailSender>): Promise<number> {
  const queued = await database.query<{ org_id: string; id: string }>(`SELECT org_id, id FROM emails WHERE status = 'queued'`);
  for (const row of queued.rows) await sender.send({ orgId: row.org_id, emailId: row.id }, { retryCount: 0 });
  return queued.rows.length;
}
