import nodemailer, { type Transporter } from 'nodemailer';
import { parseConnectionUrl } from 'nodemailer/lib/shared/index.js';
import type { DataAccess } from '../../db/client.js';
import { QUEUES } from '../../shared/job-runner.js';
import type { TextSealer } from '../../shared/text-sealer.js';
import { createEmailsRepository, type EmailJob, type EmailRow } from './emails.repository.js';

/**
 * Bounds on one SMTP exchange, well inside the job's expiry (QUEUES.emailSend): nodemailer's own
 * defaults (2 min to connect, 10 min of socket silence) would let a stalled server outlive it, so the
 * job would be retried and the same email sent again.
 */
const SMTP_TIMEOUT_MS = 20_000;

type Logger = { info(obj: object, message: string): void; warn(obj: object, message: string): void };

/** What a log line says of an email: which one and what for, never its recipient, subject, body or link. */
function emailLogFields(email: EmailRow): { emailId: string; orgId: string; kind: string; verificationId?: string } {
  return email.verificationId
    ? { emailId: email.id, orgId: email.orgId, kind: 'verification', verificationId: email.verificationId }
    : { emailId: email.id, orgId: email.orgId, kind: 'other' };
}

/** Which attempt of its job an email's send is: pg-boss counts retries from 0. */
export type EmailAttempt = { retryCount: number };

/**
 * Delivers queued emails, one job each (QUEUES.emailSend, enqueued with the email). With SMTP_URL
 * they go out through nodemailer; a failed send fails its job, which pg-boss retries with backoff,
 * and after the last attempt the email stays `failed` for operators (never dropped). Without
 * SMTP_URL they are marked `recorded`, the development default: `svc emails` shows them with their
 * links (a log line names the email, never its link, which carries the verification token).
 */
export function createEmailSender(deps: {
  database: DataAccess;
  smtpUrl: string | undefined;
  from: string;
  logger: Logger;
  /** Opens the sealed body (text-sealer.ts): the key of LINK_ENCRYPTION_KEY. */
  sealer: TextSealer;
  smtpTimeoutMs?: number;
}) {
  const repository = createEmailsRepository(deps.sealer);
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

  return {
    /**
     * Sends the email of one job. Resolves when it was sent or recorded (or is no longer queued);
     * rejects when the send failed, so the job is retried, unless this was its last attempt, after
     * which the email is `failed` and this resolves `false`.
     */
    async send(job: EmailJob, attempt: EmailAttempt): Promise<boolean> {
      const email = await repository.startAttempt(job.orgId, job.emailId, deps.database.db);
      if (!email) return true;
      if (!transport) {
        // The link carries the verification token and the row the recipient: only which email it was is logged.
        deps.logger.info(emailLogFields(email), 'email recorded (SMTP_URL not set); `svc emails` lists it with its link');
        await repository.markDelivered(email.orgId, email.id, 'recorded', deps.database.db);
        await repository.sealLegacy(email, deps.database.db);
        return true;
      }
      try {
        // Opened here, per email: one that does not open (another key) is retried and named.
        const { body } = repository.openRow(email);
        await transport.sendMail({ from: deps.from, to: email.recipient, subject: email.subject, text: body });
      } catch (error) {
        const giveUp = attempt.retryCount >= QUEUES.emailSend.retryLimit;
        deps.logger.warn(
          { ...emailLogFields(email), attempt: email.attempts, err: error },
          giveUp ? 'email failed for good' : 'email send failed; will retry',
        );
        const message = error instanceof Error ? error.message : String(error);
        await repository.recordFailure(email.orgId, email.id, message, giveUp, deps.database.db);
        if (giveUp) return false;
        throw error;
      }
      await repository.markDelivered(email.orgId, email.id, 'sent', deps.database.db);
      await repository.sealLegacy(email, deps.database.db);
      return true;
    },
    close() {
      transport?.close();
    },
  };
}
