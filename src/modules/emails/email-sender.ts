import nodemailer, { type Transporter } from 'nodemailer';
import type { Database } from '../../db/client.js';
import { createEmailsRepository, type EmailRow } from './emails.repository.js';

const BATCH = 20;
const LEASE_SECONDS = 120;
const MAX_ATTEMPTS = 10;

type Logger = { info(obj: object, message: string): void; warn(obj: object, message: string): void };

/**
 * Delivers queued emails. With SMTP_URL they go out through nodemailer and are retried with
 * backoff on failure (never dropped: after the last attempt they stay as `failed` for operators);
 * without it they are marked `recorded` and logged, which is the development default.
 */
export function createEmailSender(deps: { database: Database; smtpUrl: string | undefined; from: string; logger: Logger }) {
  const repository = createEmailsRepository(deps.database.db);
  const transport: Transporter | undefined = deps.smtpUrl ? nodemailer.createTransport(deps.smtpUrl) : undefined;

  async function deliver(email: EmailRow): Promise<void> {
    if (!transport) {
      deps.logger.info({ emailId: email.id, link: email.link }, 'email recorded (SMTP_URL not set)');
      await repository.markDelivered(email.id, 'recorded');
      return;
    }
    try {
      await transport.sendMail({ from: deps.from, to: email.recipient, subject: email.subject, text: email.body });
      await repository.markDelivered(email.id, 'sent');
    } catch (error) {
      const giveUp = email.attempts >= MAX_ATTEMPTS;
      const delay = Math.min(3600, 30 * 2 ** (email.attempts - 1));
      deps.logger.warn({ emailId: email.id, attempt: email.attempts, err: error }, giveUp ? 'email failed for good' : 'email send failed; will retry');
      await repository.scheduleRetry(email.id, error instanceof Error ? error.message : String(error), delay, giveUp);
    }
  }

  return {
    /** Sends everything due now; returns how many emails were handled. */
    async runOnce(): Promise<number> {
      let handled = 0;
      for (;;) {
        const batch = await deps.database.transaction((tx) => repository.claimDue(BATCH, LEASE_SECONDS, tx));
        if (batch.length === 0) return handled;
        await Promise.all(batch.map(deliver));
        handled += batch.length;
      }
    },
    close() {
      transport?.close();
    },
  };
}
