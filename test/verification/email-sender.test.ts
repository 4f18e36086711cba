import { createServer, type AddressInfo, type Socket } from 'node:net';
import { eq } from 'drizzle-orm';
import { SMTPServer } from 'smtp-server';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { emails } from '../../src/db/schema.js';
import { PgBoss } from 'pg-boss';
import pino from 'pino';
import { startBackgroundJobs } from '../../src/jobs.js';
import { createEmailSender } from '../../src/modules/emails/email-sender.js';
import { createEmailsRepository } from '../../src/modules/emails/emails.repository.js';
import { QUEUES } from '../../src/shared/job-runner.js';
import { createTestContext, type TestContext, testLinkSealer } from '../helpers/harness.js';
import { createEntity, emailsOf } from './verification-fixtures.js';

let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

const FROM = 'Verification <no-reply@verification.test>';
const quiet = { info() {}, warn() {} };

/** A sender through `smtpUrl` (undefined: recorded, not sent), opening emails with the test apps' key. */
const senderTo = (smtpUrl: string | undefined) =>
  createEmailSender({ database: ctx.database, sealer: testLinkSealer(), smtpUrl, from: FROM, logger: quiet });

/** Undoes the quoted-printable transfer encoding nodemailer applies to long text lines. */
function decodeQuotedPrintable(raw: string): string {
  return raw.replace(/=\r?\n/g, '').replace(/=([0-9A-F]{2})/g, (_, hex: string) => String.fromCharCode(parseInt(hex, 16)));
}

type Received = { from: string | undefined; to: string[]; raw: string };

/** A real SMTP server on a free local port that keeps every message it accepts; it refuses the first `refuse` messages. */
async function startSmtpServer(options: { refuse?: number } = {}) {
  const received: Received[] = [];
  let refused = 0;
  const server = new SMTPServer({
    authOptional: true,
    disabledCommands: ['STARTTLS', 'AUTH'],
    logger: false,
    onData(stream, session, callback) {
      const chunks: Buffer[] = [];
      stream.on('data', (chunk: Buffer) => chunks.push(chunk));
      stream.on('end', () => {
        if (refused < (options.refuse ?? 0)) {
          refused += 1;
          callback(Object.assign(new Error('try again later'), { responseCode: 451 }));
          return;
        }
        received.push({
          from: session.envelope.mailFrom ? session.envelope.mailFrom.address : undefined,
          to: session.envelope.rcptTo.map((address) => address.address),
          raw: decodeQuotedPrintable(Buffer.concat(chunks).toString('utf8')),
        });
        callback();
      });
    },
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.server.address() as AddressInfo).port;
  return { url: `smtp://127.0.0.1:${port}`, received, close: () => new Promise<void>((resolve) => server.close(() => resolve())) };
}

/** A port nothing listens on. */
async function closedPort(): Promise<number> {
  const probe = createServer();
  await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve));
  const port = (probe.address() as AddressInfo).port;
  await new Promise<void>((resolve) => probe.close(() => resolve()));
  return port;
}

/** Queues one verification email through the API and returns its row id and link. */
async function queueOneEmail() {
  const org = await ctx.createOrg({ credits: 10 });
  const entity = await createEntity(ctx, org);
  const response = await ctx.request('POST', `/v1/entities/${entity.id}/kyb`, { key: org.key, body: { customMessage: 'See you soon.' } });
  expect(response.statusCode, response.body).toBe(200);
  const [email] = await emailsOf(ctx, org.id);
  expect(email!.status).toBe('queued');
  return { org, entity, email: email!, link: response.json<{ verification_link: string }>().verification_link };
}

async function emailRow(id: string) {
  const [row] = await ctx.database.db.select().from(emails).where(eq(emails.id, id));
  return row!;
}

/** One attempt at the email, as its job's `retryCount`-th retry would make it. */
const attempt = (sender: ReturnType<typeof createEmailSender>, email: { orgId: string; id: string }, retryCount = 0) =>
  sender.send({ orgId: email.orgId, emailId: email.id }, { retryCount });

/** Waits until `read` returns something (polling), or fails after 15 s. */
async function until<T>(read: () => Promise<T | undefined>): Promise<T> {
  for (const deadline = Date.now() + 15_000; Date.now() < deadline; await new Promise((resolve) => setTimeout(resolve, 50))) {
    const value = await read();
    if (value !== undefined) return value;
  }
  throw new Error('condition not met within 15 s');
}

/** pg-boss's own view of the test database's jobs (public API only: findJobs, update). */
async function jobsView() {
  const boss = new PgBoss({
    connectionString: ctx.databaseUrl,
    supervise: false,
    schedule: false,
    migrate: false,
    registerInstance: false,
    max: 2,
  });
  await boss.start();
  return {
    async emailJobs(emailId: string) {
      return boss.findJobs<{ emailId: string }>(QUEUES.emailSend.name, { data: { emailId } });
    },
    /** Makes a waiting retry due now, as time passing would. */
    async makeDue(jobId: string) {
      await boss.update(QUEUES.emailSend.name, undefined, { id: jobId, startAfter: new Date() });
    },
    stop: () => boss.stop(),
  };
}

/** The background jobs of a running instance with the worker on, sending through `smtpUrl`. */
function jobsSendingTo(smtpUrl: string) {
  return startBackgroundJobs({
    config: { ...ctx.config, smtpUrl, smtpFrom: FROM },
    database: ctx.database,
    logger: pino({ level: 'silent' }),
    webhookWorker: true,
  });
}
describe('email sender', () => {
  it('when SMTP_URL is not set, it marks queued emails recorded', async () => {
    const { email } = await queueOneEmail();
    const sender = senderTo(undefined);
    expect(await attempt(sender, email)).toBe(true);
    const row = await emailRow(email.id);
    expect(row.status).toBe('recorded');
    expect(row.sentAt).not.toBeNull();
    // A job run again (its instance died after the send) finds nothing queued: nothing is sent twice.
    expect(await attempt(sender, email, 1)).toBe(true);
    expect(await emailRow(email.id)).toMatchObject({ status: 'recorded', attempts: 1 });
  });

  it('when SMTP_URL points at a live server, the email arrives with the link and is marked sent', async () => {
    const smtp = await startSmtpServer();
    const sender = senderTo(smtp.url);
    try {
      const { email, link, entity } = await queueOneEmail();
      await attempt(sender, email);
      const row = await emailRow(email.id);
      expect(row.status).toBe('sent');
      expect(row.lastError).toBeNull();
      expect(smtp.received).toHaveLength(1);
      const [message] = smtp.received;
      expect(message!.to).toEqual([entity.contactEmail]);
      expect(message!.from).toBe('no-reply@verification.test');
      expect(message!.raw).toContain(link);
      expect(message!.raw).toContain('See you soon.');
      const unfoldedHeaders = message!.raw.replace(/\r?\n[ \t]+/g, ' ');
      expect(unfoldedHeaders).toContain(`Subject: ${email.subject}`);
    } finally {
      sender.close();
      await smtp.close();
    }
  });

  it('when the SMTP server is unreachable, the email stays queued with attempts and last_error, and its job is retried later', async () => {
    const port = await closedPort();
    const sender = senderTo(`smtp://127.0.0.1:${port}`);
    const view = await jobsView();
    try {
      const { email } = await queueOneEmail();
      await expect(attempt(sender, email)).rejects.toThrow(/ECONNREFUSED|connect/i);
      const row = await emailRow(email.id);
      expect(row.status).toBe('queued');
      expect(row.attempts).toBe(1);
      expect(row.lastError).toMatch(/ECONNREFUSED|connect/i);
      expect(row.sentAt).toBeNull();
      // The rejection fails the job; the queue retries it with backoff from about 30 s.
      expect(QUEUES.emailSend).toMatchObject({ retryLimit: 9, retryDelay: 30, retryBackoff: true });
    } finally {
      sender.close();
      await view.stop();
    }
  });

  it('when a failed email is retried after the SMTP server comes back, it is delivered, not lost', async () => {
    const port = await closedPort();
    const broken = senderTo(`smtp://127.0.0.1:${port}`);
    const smtp = await startSmtpServer();
    const working = senderTo(smtp.url);
    try {
      const { email, link } = await queueOneEmail();
      await expect(attempt(broken, email, 0)).rejects.toThrow();
      await expect(attempt(broken, email, 1)).rejects.toThrow();
      const failedTwice = await emailRow(email.id);
      expect(failedTwice).toMatchObject({ status: 'queued', attempts: 2 });

      expect(await attempt(working, email, 2)).toBe(true);
      const row = await emailRow(email.id);
      expect(row).toMatchObject({ status: 'sent', attempts: 3, lastError: null });
      expect(smtp.received.filter((message) => message.raw.includes(link))).toHaveLength(1);
    } finally {
      broken.close();
      working.close();
      await smtp.close();
    }
  });

  it('when retries back off, each wait is longer than the one before', async () => {
    const port = await closedPort();
    const jobs = await jobsSendingTo(`smtp://127.0.0.1:${port}`);
    const view = await jobsView();
    try {
      const { email } = await queueOneEmail();
      const waits: number[] = [];
      for (let failures = 1; failures <= 3; failures++) {
        // The job failed `failures` times and waits for its next attempt (pg-boss counts a retry when it claims it).
        const job = await until(async () =>
          (await view.emailJobs(email.id)).find((found) => found.state === 'retry' && found.retryCount === failures - 1),
        );
        waits.push(job.startAfter.getTime() - Date.now());
        await view.makeDue(job.id);
      }
      expect(waits[0]!).toBeGreaterThan(20_000);
      expect(waits[1]!).toBeGreaterThan(waits[0]!);
      expect(waits[2]!).toBeGreaterThan(waits[1]!);
    } finally {
      await jobs.stop();
      await view.stop();
    }
  });

  it('when every attempt fails, the email ends failed with its error and stays listed for operators', async () => {
    const port = await closedPort();
    const sender = senderTo(`smtp://127.0.0.1:${port}`);
    try {
      const { email, org } = await queueOneEmail();
      for (let retryCount = 0; retryCount < 9; retryCount++) await expect(attempt(sender, email, retryCount)).rejects.toThrow();
      // The last attempt (its job's last retry) gives up instead of failing the job for another.
      expect(await attempt(sender, email, 9)).toBe(false);
      const row = await emailRow(email.id);
      expect(row.status).toBe('failed');
      expect(row.attempts).toBe(10);
      expect(row.lastError).not.toBeNull();
      expect(await emailsOf(ctx, org.id)).toHaveLength(1);
    } finally {
      sender.close();
    }
  });

  it('when the SMTP server accepts the connection but never answers, the attempt times out and the email is retried later', async () => {
    const sockets: Socket[] = [];
    const silent = createServer((socket) => sockets.push(socket));
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
    const port = (silent.address() as AddressInfo).port;
    const sender = createEmailSender({
      database: ctx.database,
      sealer: testLinkSealer(),
      smtpUrl: `smtp://127.0.0.1:${port}`,
      from: FROM,
      logger: quiet,
      smtpTimeoutMs: 300,
    });
    try {
      const { email } = await queueOneEmail();
      await expect(attempt(sender, email)).rejects.toThrow(/timeout/i);
      const row = await emailRow(email.id);
      expect(row).toMatchObject({ status: 'queued', attempts: 1 });
      expect(row.lastError).toMatch(/timeout/i);
    } finally {
      sender.close();
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => silent.close(() => resolve()));
    }
  });
});

describe('email sending in the running service', () => {
  it("when background jobs run with the worker on, a start's queued email is sent through SMTP_URL without anyone calling the sender", async () => {
    const smtp = await startSmtpServer();
    const jobs = await jobsSendingTo(smtp.url);
    try {
      const { email, link, entity } = await queueOneEmail();
      expect(await until(async () => ((await emailRow(email.id)).status === 'sent' ? true : undefined))).toBe(true);
      const message = smtp.received.find((received) => received.to.includes(entity.contactEmail));
      expect(message?.raw).toContain(link);
    } finally {
      await jobs.stop();
      await smtp.close();
    }
  });

  it('when an email whose send fails comes due again, it is retried and sent', async () => {
    const smtp = await startSmtpServer({ refuse: 1 });
    const jobs = await jobsSendingTo(smtp.url);
    const view = await jobsView();
    try {
      const { email, link } = await queueOneEmail();
      const failed = await until(async () => (await view.emailJobs(email.id)).find((job) => job.state === 'retry'));
      expect(await emailRow(email.id)).toMatchObject({
        status: 'queued',
        attempts: 1,
        lastError: expect.stringMatching(/try again later/),
      });
      expect(smtp.received).toHaveLength(0);

      await view.makeDue(failed.id);
      await until(async () => ((await emailRow(email.id)).status === 'sent' ? true : undefined));
      expect(await emailRow(email.id)).toMatchObject({ status: 'sent', attempts: 2, lastError: null });
      expect(smtp.received.filter((message) => message.raw.includes(link))).toHaveLength(1);
      // The job completes once the handler returned, a moment after the row says sent.
      await until(async () => ((await view.emailJobs(email.id)).map((job) => job.state).join() === 'completed' ? true : undefined));
    } finally {
      await jobs.stop();
      await view.stop();
      await smtp.close();
    }
  });

  it('when an email is queued in a transaction that rolls back, no email and no job remain, and nothing is sent', async () => {
    const smtp = await startSmtpServer();
    const jobs = await jobsSendingTo(smtp.url);
    const view = await jobsView();
    const repository = createEmailsRepository(testLinkSealer(), jobs.runner);
    const org = await ctx.createOrg();
    const values = { orgId: org.id, recipient: 'rolled-back@example.test', subject: 'Rolled back', body: 'Never sent.' };
    try {
      let queuedId: string | undefined;
      await expect(
        ctx.database.transaction(async (tx) => {
          queuedId = (await repository.queue(values, tx)).id;
          expect(await view.emailJobs(queuedId)).toEqual([]); // not visible before commit
          throw new Error('the business transaction fails');
        }),
      ).rejects.toThrow('the business transaction fails');
      // One that commits, after it: once it is sent, the worker has passed the rolled-back one's place.
      const committed = await repository.queue({ ...values, recipient: 'committed@example.test', subject: 'Committed' }, ctx.database.db);
      await until(async () => ((await emailRow(committed.id)).status === 'sent' ? true : undefined));

      expect(await emailsOf(ctx, org.id)).toHaveLength(1);
      expect(await view.emailJobs(queuedId!)).toEqual([]);
      expect(smtp.received.map((message) => message.to)).toEqual([['committed@example.test']]);
    } finally {
      await jobs.stop();
      await view.stop();
      await smtp.close();
    }
  });
});
