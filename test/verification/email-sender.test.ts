import { createServer, type AddressInfo, type Socket } from 'node:net';
import { eq } from 'drizzle-orm';
import { SMTPServer } from 'smtp-server';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { emails } from '../../src/db/schema.js';
import { createEmailSender } from '../../src/modules/emails/email-sender.js';
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

/** A real SMTP server on a free local port that keeps every message it accepts. */
async function startSmtpServer() {
  const received: Received[] = [];
  const server = new SMTPServer({
    authOptional: true,
    disabledCommands: ['STARTTLS', 'AUTH'],
    logger: false,
    onData(stream, session, callback) {
      const chunks: Buffer[] = [];
      stream.on('data', (chunk: Buffer) => chunks.push(chunk));
      stream.on('end', () => {
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

/** Makes a waiting retry due now, as time passing would. */
async function makeDue(id: string) {
  await ctx.database.db
    .update(emails)
    .set({ nextAttemptAt: new Date(Date.now() - 1000) })
    .where(eq(emails.id, id));
}

describe('email sender', () => {
  it('when SMTP_URL is not set, it marks queued emails recorded', async () => {
    const { email } = await queueOneEmail();
    const sender = senderTo(undefined);
    expect(await sender.runOnce()).toBeGreaterThanOrEqual(1);
    const row = await emailRow(email.id);
    expect(row.status).toBe('recorded');
    expect(row.sentAt).not.toBeNull();
    expect(await sender.runOnce()).toBe(0);
  });

  it('when SMTP_URL points at a live server, the email arrives with the link and is marked sent', async () => {
    const smtp = await startSmtpServer();
    const sender = senderTo(smtp.url);
    try {
      const { email, link, entity } = await queueOneEmail();
      await sender.runOnce();
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

  it('when the SMTP server is unreachable, the email stays queued with attempts, last_error and a later retry time', async () => {
    const port = await closedPort();
    const sender = senderTo(`smtp://127.0.0.1:${port}`);
    try {
      const { email } = await queueOneEmail();
      const before = Date.now();
      await sender.runOnce();
      const row = await emailRow(email.id);
      expect(row.status).toBe('queued');
      expect(row.attempts).toBe(1);
      expect(row.lastError).toMatch(/ECONNREFUSED|connect/i);
      expect(row.sentAt).toBeNull();
      expect(row.nextAttemptAt.getTime()).toBeGreaterThan(before + 20_000);
      expect(await sender.runOnce()).toBe(0);
    } finally {
      sender.close();
    }
  });

  it('when a failed email is retried after the SMTP server comes back, it is delivered, not lost', async () => {
    const port = await closedPort();
    const broken = senderTo(`smtp://127.0.0.1:${port}`);
    const smtp = await startSmtpServer();
    const working = senderTo(smtp.url);
    try {
      const { email, link } = await queueOneEmail();
      await broken.runOnce();
      await makeDue(email.id);
      await broken.runOnce();
      const failedTwice = await emailRow(email.id);
      expect(failedTwice).toMatchObject({ status: 'queued', attempts: 2 });

      await makeDue(email.id);
      await working.runOnce();
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
    const sender = senderTo(`smtp://127.0.0.1:${port}`);
    try {
      const { email } = await queueOneEmail();
      const waits: number[] = [];
      for (let attempt = 0; attempt < 3; attempt++) {
        const started = Date.now();
        await sender.runOnce();
        waits.push((await emailRow(email.id)).nextAttemptAt.getTime() - started);
        await makeDue(email.id);
      }
      expect(waits[1]!).toBeGreaterThan(waits[0]!);
      expect(waits[2]!).toBeGreaterThan(waits[1]!);
    } finally {
      sender.close();
    }
  });

  it('when every attempt fails, the email ends failed with its error and stays listed for operators', async () => {
    const port = await closedPort();
    const sender = senderTo(`smtp://127.0.0.1:${port}`);
    try {
      const { email, org } = await queueOneEmail();
      for (let attempt = 0; attempt < 10; attempt++) {
        await makeDue(email.id);
        await sender.runOnce();
      }
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
      await sender.runOnce();
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
    const pino = (await import('pino')).default;
    const { startBackgroundJobs } = await import('../../src/jobs.js');
    const jobs = startBackgroundJobs({
      config: { ...ctx.config, smtpUrl: smtp.url, smtpFrom: FROM },
      database: ctx.database,
      logger: pino({ level: 'silent' }),
      webhookWorker: true,
    });
    try {
      const { email, link, entity } = await queueOneEmail();
      const deadline = Date.now() + 15_000;
      while ((await emailRow(email.id)).status === 'queued' && Date.now() < deadline) {
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      expect((await emailRow(email.id)).status).toBe('sent');
      const message = smtp.received.find((received) => received.to.includes(entity.contactEmail));
      expect(message?.raw).toContain(link);
    } finally {
      await jobs.stop();
      await smtp.close();
    }
  });
});
