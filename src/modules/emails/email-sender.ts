import nodemailer, { type Transporter } from 'nodemailer';
import { parseConnectionUrl } from 'nodemailer/lib/shared/index.js';
import type { Database } from '../../db/client.js';
import type { TextSealer } from '../../shared/text-sealer.js';
import { createEmailsRepository, type EmailRow } from './emails.repository.js';

const BATCH = 20;
const LEASE_SECONDS = 120;
const MAX_ATTEMPTS = 10;
/**
 * Bounds on one SMTP exchange, well inside the claim lease: nodemailer's own defaults (2 min to
 * connect, 10 min of socket silence) would let a stalled server outlive the lease, so another sender
 * would claim and send the same email again, and the stalled batch would block the job meanwhile.
 */
const SMTP_TIMEOUT_MS = 20_000;

type Logger = { info(obj: object, message: string): void; warn(obj: object, message: string): void };

/** What a log line says of an email: which one and what for, never its recipient, subject, body or link. */
function emailLogFields(email: EmailRow): { emailId: string; orgId: string; kind: string; verificationId?: string } {
  return email.verificationId
    ? { emailId: email.id, orgId: email.orgId, kind: 'verification', verificationId: email.verificationId }
    : { emailId: email.id, orgId: email.orgId, kind: 'other' };
}

/**
 * Delivers queued emails. With SMTP_URL they go out through nodemailer and are retried with
 * backoff on failure (never dropped: after the last attempt they stay as `failed` for operators);
 * without it they are marked `recorded`, which is the development default: `svc emails` shows them
 * with their links (a log line names the email, never its link, which carries the verification token).
 */
export function createEmailSender(deps: {
  database: Database;
  smtpUrl: string | undefined;
  from: string;
  logger: Logger;
  /** Opens the sealed body (text-sealer.ts): the key of LINK_ENCRYPTION_KEY. */
  sealer: TextSealer;
  smtpTimeoutMs?: number;
}) {
  const repository = createEmailsRepository(deps.database.db, deps.sealer);
  const timeout = deps.smtpTimeoutMs ?? SMTP_TIMEOUT_MS;
  const transport: Transporter | undefined = deps.smtpUrl
    ? // Parsed here because nodemailer ignores every other option given next to `url`; the URL's own query options still win.
      nodemailer.createTransport({
        connectionTimeout: timeout,
        greetingTimeout: timeout,
        socketTimeout: timeout,
        ...parseConnectionUrl(deps.smtpUrl),
      })
    : undefined;

  async function deliver(email: EmailRow): Promise<void> {
    if (!transport) {
      // The link carries the verification token and the row the recipient: only which email it was is logged.
      deps.logger.info(emailLogFields(email), 'email recorded (SMTP_URL not set); `svc emails` lists it with its link');
      await repository.markDelivered(email.orgId, email.id, 'recorded', deps.database.db);
      await repository.sealLegacy(email, deps.database.db);
      return;
    }
    try {
      // Opened here, per email: one that does not open (another key) is retried and named, never blocks the batch.
      const { body } = repository.openRow(email);
      await transport.sendMail({ from: deps.from, to: email.recipient, subject: email.subject, text: body });
      await repository.markDelivered(email.orgId, email.id, 'sent', deps.database.db);
      await repository.sealLegacy(email, deps.database.db);
    } catch (error) {
      const giveUp = email.attempts >= MAX_ATTEMPTS;
      const delay = Math.min(3600, 30 * 2 ** (email.attempts - 1));
      deps.logger.warn(
        { ...emailLogFields(email), attempt: email.attempts, err: error },
        giveUp ? 'email failed for good' : 'email send failed; will retry',
      );
      await repository.scheduleRetry(
        email.orgId,
        email.id,
        error instanceof Error ? error.message : String(error),
        delay,
        giveUp,
        deps.database.db,
      );
    }
  }

  return {
    /** Sends everything due now; returns how many emails were handled. */
    async runOnce(): Promise<number> {
      let handled = 0;
      for (;;) {
        // Each organisation's claim commits on its own: no transaction spans organisations.
        const batch = await repository.claimDue(BATCH, LEASE_SECONDS, deps.database.db);
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
