import { randomUUID } from 'node:crypto';
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { drizzle } from 'drizzle-orm/node-postgres';
import { migrate } from 'drizzle-orm/node-postgres/migrator';
import pg from 'pg';
import { migrationsFolder, runMigrations } from '../../src/db/migrate.js';
import { createEmptyDatabase } from '../helpers/database.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createEmailSender } from '../../src/modules/emails/email-sender.js';
import { sendQueuedEmails } from '../helpers/emails.js';
import { createTextSealer, SealedTextError } from '../../src/shared/text-sealer.js';
import { createTestContext, type TestContext, type TestOrg, testLinkSealer, testServices } from '../helpers/harness.js';
import { createEntity } from './verification-fixtures.js';

let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

/** Every token window this long is looked for: long enough that no random text holds one by chance. */
const WINDOW = 10;

/** Every row of every table in the database, as text (bytea as hex, json as text). */
async function everyRowAsText(): Promise<Array<{ table: string; row: string }>> {
  const { rows: tables } = await ctx.database.pool.query<{ name: string }>(
    `SELECT format('%I.%I', table_schema, table_name) AS name FROM information_schema.tables
      WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('pg_catalog', 'information_schema')`,
  );
  const found: Array<{ table: string; row: string }> = [];
  for (const { name } of tables) {
    const { rows } = await ctx.database.pool.query<{ row: string }>(`SELECT t::text AS row FROM ${name} t`);
    for (const { row } of rows) found.push({ table: name, row });
  }
  return found;
}

/** Where any WINDOW characters of the token appear at rest. */
async function placesHolding(token: string): Promise<string[]> {
  const windows = Array.from({ length: token.length - WINDOW + 1 }, (_, start) => token.slice(start, start + WINDOW));
  return (await everyRowAsText()).filter(({ row }) => windows.some((window) => row.includes(window))).map(({ table }) => table);
}

const tokenOf = (link: string) => link.split('/').pop()!;

/** Sends every queued email as a deployment without SMTP_URL does, with the test apps' key. */
async function deliverEmails() {
  const sender = createEmailSender({
    database: ctx.database,
    smtpUrl: undefined,
    from: 'x@example.test',
    logger: { info() {}, warn() {} },
    sealer: testLinkSealer(),
  });
  await sendQueuedEmails(ctx.database, sender);
  sender.close();
}

type LinkRoute = {
  name: string;
  issue: (org: TestOrg, idempotencyKey: string) => Promise<{ status: number; link: string; replay: () => Promise<unknown> }>;
};

async function post(org: TestOrg, url: string, body: unknown, idempotencyKey: string) {
  const send = () => ctx.request('POST', url, { key: org.key, body, headers: { 'idempotency-key': idempotencyKey } });
  const response = await send();
  return { response, replay: async () => (await send()).json() };
}

const ROUTES: LinkRoute[] = [
  {
    name: 'POST /v1/customers/{id}/kyc',
    async issue(org, key) {
      const person = await ctx.request('POST', '/v1/customers', {
        key: org.key,
        body: { fullName: 'Tess Token', email: `tess-${randomUUID()}@example.test` },
      });
      const { response, replay } = await post(org, `/v1/customers/${person.json().id}/kyc`, undefined, key);
      return { status: response.statusCode, link: response.json().verification_link, replay };
    },
  },
  {
    name: 'POST /v1/entities/{id}/kyb (the customer pays: a pay link)',
    async issue(org, key) {
      const entity = await createEntity(ctx, org);
      const { response, replay } = await post(org, `/v1/entities/${entity.id}/kyb`, { payer: 'customer' }, key);
      return { status: response.statusCode, link: response.json().verification_link, replay };
    },
  },
  {
    name: 'POST /v1/entities/{id}/ubos/{uboId}/send-link',
    async issue(org, key) {
      const entity = await createEntity(ctx, org);
      const owners = await ctx.request('POST', `/v1/entities/${entity.id}/ubos`, {
        key: org.key,
        body: {
          owners: [{ fullName: 'Owen Owner', email: `owen-${randomUUID()}@example.test`, roleTypes: ['SHAREHOLDER'], percentageHeld: 60 }],
        },
      });
      expect(owners.statusCode, owners.body).toBe(200);
      const { response, replay } = await post(org, `/v1/entities/${entity.id}/ubos/${owners.json().ubos[0].id}/send-link`, undefined, key);
      return { status: response.statusCode, link: response.json().verification_link, replay };
    },
  },
  {
    name: 'POST /v1/entities/{id}/document-requests',
    async issue(org, key) {
      const entity = await createEntity(ctx, org);
      const { response, replay } = await post(org, `/v1/entities/${entity.id}/document-requests`, { types: ['OTHER'] }, key);
      return { status: response.statusCode, link: response.json().upload_url, replay };
    },
  },
];

describe('link tokens at rest', () => {
  for (const route of ROUTES) {
    it(`when ${route.name} issues a link, no table holds any ${WINDOW} characters of its token, queued or delivered, and a replay still returns the link`, async () => {
      const org = await ctx.createOrg({ credits: 20 });
      const issued = await route.issue(org, `link-${randomUUID()}`);
      expect(issued.status).toBeLessThan(300);
      const token = tokenOf(issued.link);
      expect(token).toMatch(/^[A-Za-z0-9_-]{43}$/);

      expect(await placesHolding(token)).toEqual([]);
      await deliverEmails();
      expect(await placesHolding(token)).toEqual([]);

      const replayed = (await issued.replay()) as { verification_link?: string; upload_url?: string };
      expect(replayed.verification_link ?? replayed.upload_url).toBe(issued.link);
    });
  }

  it('when an operator lists emails (svc emails), the link is shown opened', async () => {
    const org = await ctx.createOrg({ credits: 5 });
    const entity = await createEntity(ctx, org);
    const started = await ctx.request('POST', `/v1/entities/${entity.id}/kyb`, { key: org.key, body: {} });
    const link = started.json().verification_link as string;
    const [email] = await testServices(ctx.database, { sealer: testLinkSealer() }).emails.list(org.id);
    expect(email!.link).toBe(link);
  });

  it('when the key in use is not the one that sealed an email, listing it names the key mismatch instead of showing ciphertext', async () => {
    const org = await ctx.createOrg({ credits: 5 });
    const entity = await createEntity(ctx, org);
    await ctx.request('POST', `/v1/entities/${entity.id}/kyb`, { key: org.key, body: {} });
    const otherKey = createTextSealer(Buffer.alloc(32, 7));
    await expect(testServices(ctx.database, { sealer: otherKey }).emails.list(org.id)).rejects.toThrow(SealedTextError);
    await expect(testServices(ctx.database, { sealer: otherKey }).emails.list(org.id)).rejects.toThrow(/LINK_ENCRYPTION_KEY/);
  });
});

describe('migration 0016 on existing data', () => {
  it('when emails and stored replies written before sealing hold links, delivered emails and replies lose the token, and a queued email keeps it until sent', async () => {
    const database = await createEmptyDatabase();
    const folder = mkdtempSync(join(tmpdir(), 'migrations-0015-'));
    const client = new pg.Client({ connectionString: database.url });
    try {
      cpSync(migrationsFolder(), folder, { recursive: true });
      const journalPath = join(folder, 'meta', '_journal.json');
      const journal = JSON.parse(readFileSync(journalPath, 'utf8')) as { entries: Array<{ tag: string }> };
      const upTo = journal.entries.findIndex((entry) => entry.tag.startsWith('0015_'));
      writeFileSync(journalPath, JSON.stringify({ ...journal, entries: journal.entries.slice(0, upTo + 1) }));
      await client.connect();
      await migrate(drizzle(client), { migrationsFolder: folder });

      const q = async (text: string, values: unknown[] = []) => (await client.query(text, values)).rows;
      const [org] = await q(`INSERT INTO organisations (name) VALUES ('Legacy') RETURNING id`);
      const [key] = await q(`INSERT INTO api_keys (org_id, display_prefix, key_hash, scopes) VALUES ($1, 'svc_', 'h', '{}') RETURNING id`, [
        org.id,
      ]);
      const sent = 'S'.repeat(43);
      const queued = 'Q'.repeat(43);
      const replied = 'R'.repeat(43);
      const email = (token: string, status: string) =>
        q(`INSERT INTO emails (org_id, recipient, subject, body, link, status) VALUES ($1, 'c@example.test', 's', $2, $3, $4)`, [
          org.id,
          `Start here: https://app.example.test/verify/${token}\nThis link is personal.`,
          `https://app.example.test/verify/${token}`,
          status,
        ]);
      await email(sent, 'sent');
      await email(queued, 'queued');
      await q(
        `INSERT INTO idempotency_keys (api_key_id, key, org_id, fingerprint, response_status, response_body) VALUES ($1, 'k', $2, 'f', 201, $3)`,
        [key.id, org.id, JSON.stringify({ id: 'x', upload_url: `https://app.example.test/documents/${replied}` })],
      );
      await client.end();

      await runMigrations(database.url);

      const after = new pg.Client({ connectionString: database.url });
      await after.connect();
      try {
        const emails = (await after.query(`SELECT status, body, link FROM emails ORDER BY status`)).rows;
        expect(emails).toEqual([
          { status: 'queued', body: expect.stringContaining(queued), link: `https://app.example.test/verify/${queued}` },
          { status: 'sent', body: 'Start here: https://app.example.test/verify/[link removed]\nThis link is personal.', link: null },
        ]);
        const [reply] = (await after.query(`SELECT response_body FROM idempotency_keys`)).rows;
        expect(JSON.parse(reply.response_body)).toEqual({ id: 'x', upload_url: 'https://app.example.test/documents/[link removed]' });
      } finally {
        await after.end();
      }
    } finally {
      await client.end().catch(() => undefined);
      rmSync(folder, { recursive: true, force: true });
      await database.drop();
    }
  });

  it('when a queued email written before sealing is sent, the row is sealed: its token no longer reads at rest', async () => {
    const org = await ctx.createOrg();
    const token = 'L'.repeat(43);
    await ctx.database.pool.query(
      `INSERT INTO emails (org_id, recipient, subject, body, link) VALUES ($1, 'c@example.test', 's', $2, $3)`,
      [org.id, `Start here: https://app.example.test/verify/${token}`, `https://app.example.test/verify/${token}`],
    );
    await deliverEmails();
    expect(await placesHolding(token)).toEqual([]);
    const [email] = await testServices(ctx.database, { sealer: testLinkSealer() }).emails.list(org.id);
    expect(email).toMatchObject({ status: 'recorded', link: `https://app.example.test/verify/${token}` });
  });
});
