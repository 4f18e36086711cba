import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { drizzle } from 'drizzle-orm/node-postgres';
import { migrate } from 'drizzle-orm/node-postgres/migrator';
import pg from 'pg';
import { PgBoss } from 'pg-boss';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { migrationsFolder, runMigrations } from '../../src/db/migrate.js';
import { EMAIL_WORK } from '../../src/jobs.js';
import { createEmailsRepository, type EmailJob } from '../../src/modules/emails/emails.repository.js';
import { QUEUES, startJobRunner, type JobQueue } from '../../src/shared/job-runner.js';
import { createDeliveryRepository } from '../../src/modules/webhooks/delivery.repository.js';
import { createEmptyDatabase, type TestDatabase } from '../helpers/database.js';
import { createTestContext, type TestContext, type TestOrg, testLinkSealer } from '../helpers/harness.js';
import { createEntity } from '../verification/verification-fixtures.js';
import { linkTokenHash } from '../../src/shared/link-tokens.js';

// DESIGN §9 and docs/decisions.md, "Tenant keys: org_id first (issue 34, item 6)".

let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

async function rows<T extends pg.QueryResultRow>(text: string, values: unknown[] = []): Promise<T[]> {
  return (await ctx.database.pool.query<T>(text, values)).rows;
}

/** The database error code of a statement that must fail. */
async function errorCodeOf(text: string, values: unknown[]): Promise<string | undefined> {
  try {
    await ctx.database.pool.query(text, values);
    return undefined;
  } catch (error) {
    return (error as { code?: string }).code;
  }
}

async function insertCustomer(orgId: string, kind: 'individual' | 'entity' = 'individual'): Promise<string> {
  const [row] = await rows<{ id: string }>(
    `INSERT INTO customers (org_id, kind, type, name, kyc_status, added_via)
     VALUES ($1, $2, $3, 'Person ' || gen_random_uuid(), 'NOT_STARTED', 'INTEGRATION') RETURNING id`,
    [orgId, kind, kind === 'entity' ? 'COMPANY' : 'INDIVIDUAL'],
  );
  return row!.id;
}

describe('tenant keys in the catalog', () => {
  /** Tables with an org_id column, but organisations themselves (the tenant, keyed by id). */
  const TENANT_TABLES = `SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                          WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')
                            AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'org_id' AND NOT a.attisdropped)`;

  it('when the schema is migrated, the primary key and every unique index of every table with org_id start with org_id', async () => {
    const keys = await rows<{ table: string; index: string; first: string }>(
      `SELECT i.indrelid::regclass::text AS table, i.indexrelid::regclass::text AS index, a.attname AS first
         FROM pg_index i
         LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
        WHERE (i.indisunique OR i.indisprimary) AND i.indrelid IN (${TENANT_TABLES})
        ORDER BY 1, 2`,
    );
    // The directories are keyed by the hash or token they exist to look up.
    const directories = new Set(['api_key_hashes_pkey', 'verification_link_tokens_pkey', 'document_request_tokens_pkey']);
    expect(keys.length).toBeGreaterThan(20);
    expect(keys.filter((key) => key.first !== 'org_id' && !directories.has(key.index))).toEqual([]);
  });

  it('when the schema is migrated, every foreign key between tables with org_id is composite and pairs org_id with org_id', async () => {
    const foreignKeys = await rows<{ name: string; columns: string[]; referenced: string[] }>(
      `SELECT con.conname AS name,
              array(SELECT attname FROM unnest(con.conkey) WITH ORDINALITY k(num, ord) JOIN pg_attribute ON attrelid = con.conrelid AND attnum = k.num ORDER BY ord)::text[] AS columns,
              array(SELECT attname FROM unnest(con.confkey) WITH ORDINALITY k(num, ord) JOIN pg_attribute ON attrelid = con.confrelid AND attnum = k.num ORDER BY ord)::text[] AS referenced
         FROM pg_constraint con
        WHERE con.contype = 'f' AND con.conrelid IN (${TENANT_TABLES}) AND con.confrelid IN (${TENANT_TABLES})`,
    );
    expect(foreignKeys.length).toBeGreaterThanOrEqual(16);
    expect(foreignKeys.filter((key) => key.columns.length < 2 || key.columns[0] !== 'org_id' || key.referenced[0] !== 'org_id')).toEqual(
      [],
    );
  });
});

describe('tenant isolation by the database', () => {
  let a: TestOrg;
  let b: TestOrg;
  beforeAll(async () => {
    a = await ctx.createOrg();
    b = await ctx.createOrg();
  });

  it("when a beneficial owner of one organisation names another organisation's customer, the database rejects it; within one organisation it is accepted", async () => {
    const entityOfA = await insertCustomer(a.id, 'entity');
    const personOfA = await insertCustomer(a.id);
    const personOfB = await insertCustomer(b.id);
    const insertOwner = `INSERT INTO beneficial_owners (org_id, entity_id, customer_id, holder_type, role_types, added_via)
                         VALUES ($1, $2, $3, 'INDIVIDUAL', '{DIRECTOR}', 'INTEGRATION')`;
    expect(await errorCodeOf(insertOwner, [a.id, entityOfA, personOfB])).toBe('23503');
    expect(await errorCodeOf(insertOwner, [a.id, entityOfA, personOfA])).toBeUndefined();
  });

  it("when a verification, a group party or a webhook delivery points at another organisation's record, the database rejects it", async () => {
    const customerOfB = await insertCustomer(b.id);
    expect(
      await errorCodeOf(
        `INSERT INTO verifications (org_id, customer_id, kind, lane, payer, status) VALUES ($1, $2, 'KYC', 'link', 'organization', 'PENDING')`,
        [a.id, customerOfB],
      ),
    ).toBe('23503');

    const [group] = await rows<{ id: string }>(`INSERT INTO groups (org_id, name) VALUES ($1, 'Deal') RETURNING id`, [a.id]);
    const insertParty = `INSERT INTO group_parties (org_id, group_id, position, role_label, party_type, required, customer_id) VALUES ($1, $2, 0, 'Buyer', 'EITHER', true, $3)`;
    expect(await errorCodeOf(insertParty, [a.id, group!.id, customerOfB])).toBe('23503');
    expect(await errorCodeOf(insertParty, [b.id, group!.id, customerOfB])).toBe('23503');

    const [endpointOfB] = await rows<{ id: string }>(
      `INSERT INTO webhook_endpoints (org_id, url, secret) VALUES ($1, 'https://b.example.test/hook', 's') RETURNING id`,
      [b.id],
    );
    const [eventOfA] = await rows<{ id: string }>(
      `INSERT INTO outbox_events (org_id, type, payload) VALUES ($1, 'webhook.test', '{}') RETURNING id`,
      [a.id],
    );
    expect(
      await errorCodeOf(`INSERT INTO webhook_deliveries (org_id, event_id, endpoint_id) VALUES ($1, $2, $3)`, [
        a.id,
        eventOfA!.id,
        endpointOfB!.id,
      ]),
    ).toBe('23503');
  });

  it("when an idempotency record names another organisation's API key, the database rejects it", async () => {
    expect(
      await errorCodeOf(`INSERT INTO idempotency_keys (org_id, api_key_id, key, fingerprint) VALUES ($1, $2, 'k', 'f')`, [a.id, b.keyId]),
    ).toBe('23503');
  });
});

describe('directories for lookups before the organisation is known', () => {
  it('when a key is created, its hash goes into api_key_hashes, and the access check finds the key only through it', async () => {
    const org = await ctx.createOrg();
    const [entry] = await rows<{ org_id: string; api_key_id: string; same: boolean }>(
      `SELECT h.org_id, h.api_key_id, h.key_hash = k.key_hash AS same FROM api_key_hashes h JOIN api_keys k ON k.org_id = h.org_id AND k.id = h.api_key_id WHERE h.api_key_id = $1`,
      [org.keyId],
    );
    expect(entry).toEqual({ org_id: org.id, api_key_id: org.keyId, same: true });
    expect((await ctx.request('GET', '/v1/customers', { key: org.key })).statusCode).toBe(200);

    await rows('DELETE FROM api_key_hashes WHERE org_id = $1 AND api_key_id = $2', [org.id, org.keyId]);
    // Another app instance: nothing this key did before is remembered there.
    const fresh = await ctx.buildInstance();
    expect((await ctx.request('GET', '/v1/customers', { key: org.key }, fresh)).statusCode).toBe(401);
  });

  it('when a verification with a link is started, its token goes into verification_link_tokens in the same transaction', async () => {
    const org = await ctx.createOrg({ credits: 10 });
    const entity = await createEntity(ctx, org);
    const response = await ctx.request('POST', `/v1/entities/${entity.id}/kyb`, { key: org.key, body: {} });
    expect(response.statusCode, response.body).toBe(200);
    const link = response.json<{ verification_link: string }>().verification_link;
    const entries = await rows<{ token_hash: string; org_id: string; kind: string }>(
      `SELECT t.token_hash, t.org_id, v.kind
         FROM verification_link_tokens t JOIN verifications v ON v.org_id = t.org_id AND v.id = t.verification_id
        WHERE t.org_id = $1`,
      [org.id],
    );
    expect(entries).toEqual([{ token_hash: linkTokenHash(link.split('/').pop()!), org_id: org.id, kind: 'KYB' }]);
  });
});

describe('claims per organisation', () => {
  /** Queues `count` emails of `orgId`, each with its job, oldest first. */
  async function queueEmails(jobs: JobQueue, orgId: string, count: number): Promise<void> {
    const repository = createEmailsRepository(testLinkSealer(), jobs);
    for (let n = 1; n <= count; n++)
      await repository.queue({ orgId, recipient: `r${n}@example.test`, subject: 'Subject', body: 'Body' }, ctx.database.db);
  }

  /**
   * Works the email queue as an instance does (EMAIL_WORK) with a handler that holds the first batch
   * until the end (a slow SMTP exchange) and completes the others at once, and waits until the email
   * of `awaited` is in hand: returns the organisations of the emails taken so far, in the order taken.
   */
  async function takenUntil(awaited: string, queue: (jobs: JobQueue) => Promise<void>): Promise<string[]> {
    // Only this test's emails: the jobs an earlier test left queued go.
    const boss = new PgBoss({ connectionString: ctx.databaseUrl, supervise: false, schedule: false, registerInstance: false, max: 1 });
    await boss.start();
    await boss.deleteQueuedJobs(QUEUES.emailSend.name);
    await boss.stop();
    const runner = await startJobRunner(ctx.database, { schedule: false, supervise: false });
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    try {
      await queue(runner);
      const taken: string[] = [];
      let reached!: () => void;
      const reachedAwaited = new Promise<void>((resolve) => (reached = resolve));
      let holding = false;
      await runner.work<EmailJob>(QUEUES.emailSend.name, EMAIL_WORK, async (jobs) => {
        taken.push(...jobs.map((job) => job.data.orgId));
        if (taken.includes(awaited)) reached();
        if (holding) return;
        holding = true;
        await held;
      });
      await reachedAwaited;
      return taken;
    } finally {
      release();
      await runner.stop();
    }
  }

  it('when one organisation has a large backlog of older queued emails, the worker takes the email of another organisation before most of it', async () => {
    const busy = await ctx.createOrg();
    const quiet = await ctx.createOrg();

    const taken = await takenUntil(quiet.id, async (jobs) => {
      await queueEmails(jobs, busy.id, 60);
      await queueEmails(jobs, quiet.id, 1);
    });

    // While busy's share is in flight, the other worker's poll passes over its backlog (each worker's
    // first poll, at the same moment, may take a share).
    expect(taken.filter((orgId) => orgId === busy.id).length).toBeLessThanOrEqual(
      EMAIL_WORK.localConcurrency * EMAIL_WORK.groupConcurrency,
    );
  });

  it("when two organisations have large backlogs and the earlier one's emails are slow, the later one's go out meanwhile", async () => {
    const [earlier, later] = await Promise.all([1, 2].map(() => ctx.createOrg()));

    const taken = await takenUntil(later!.id, async (jobs) => {
      await queueEmails(jobs, earlier!.id, 30);
      await queueEmails(jobs, later!.id, 30);
    });

    expect(taken.filter((orgId) => orgId === earlier!.id).length).toBeLessThanOrEqual(
      EMAIL_WORK.localConcurrency * EMAIL_WORK.groupConcurrency,
    );
  });

  it('when one organisation has many older due deliveries, a worker claim still takes the due delivery of another organisation', async () => {
    const busy = await ctx.createOrg();
    const quiet = await ctx.createOrg();
    for (const [org, count, ageSeconds] of [
      [busy, 30, 3600],
      [quiet, 1, 1],
    ] as const) {
      const [endpoint] = await rows<{ id: string }>(
        `INSERT INTO webhook_endpoints (org_id, url, secret) VALUES ($1, 'https://hooks.example.test/x', 's') RETURNING id`,
        [org.id],
      );
      const [event] = await rows<{ id: string }>(
        `INSERT INTO outbox_events (org_id, type, payload) VALUES ($1, 'webhook.test', '{}') RETURNING id`,
        [org.id],
      );
      await rows(
        `INSERT INTO webhook_deliveries (org_id, event_id, endpoint_id, next_attempt_at)
         SELECT $1, $2, $3, clock_timestamp() - make_interval(secs => $5) FROM generate_series(1, $4::int)`,
        [org.id, event!.id, endpoint!.id, count, ageSeconds],
      );
    }

    const claimed = await createDeliveryRepository().claim('fair-worker', 10, 60_000, ctx.database.db);

    expect(claimed).toHaveLength(10);
    expect(claimed.filter((delivery) => delivery.orgId === quiet.id)).toHaveLength(1);
    expect(claimed.every((delivery) => delivery.orgId === busy.id || delivery.orgId === quiet.id)).toBe(true);
  });
});

describe('migration 0012 on existing data', () => {
  let database: TestDatabase;
  let client: pg.Client;
  let folder: string;
  afterAll(async () => {
    await client?.end();
    await database?.drop();
    if (folder) rmSync(folder, { recursive: true, force: true });
  });

  it('when a database at migration 0011 holds data of two organisations, 0012 keeps every row, backfills both directories and keeps the counters and list indexes of 0011', async () => {
    database = await createEmptyDatabase();
    // The migrations up to 0011, as an existing deployment has applied them.
    folder = mkdtempSync(join(tmpdir(), 'migrations-0011-'));
    cpSync(migrationsFolder(), folder, { recursive: true });
    const journalPath = join(folder, 'meta', '_journal.json');
    const journal = JSON.parse(readFileSync(journalPath, 'utf8')) as { entries: Array<{ tag: string }> };
    const upTo = journal.entries.findIndex((entry) => entry.tag.startsWith('0011_'));
    writeFileSync(journalPath, JSON.stringify({ ...journal, entries: journal.entries.slice(0, upTo + 1) }));
    client = new pg.Client({ connectionString: database.url });
    await client.connect();
    await migrate(drizzle(client), { migrationsFolder: folder });

    const q = async (text: string, values: unknown[] = []) => (await client.query(text, values)).rows;
    const [orgA, orgB] = (await q(`INSERT INTO organisations (name) VALUES ('A'), ('B') RETURNING id`)).map((row) => row.id as string);
    for (const org of [orgA, orgB]) {
      const [key] = await q(
        `INSERT INTO api_keys (org_id, display_prefix, key_hash, scopes) VALUES ($1, 'svc_', $2, '{customers:read}') RETURNING id`,
        [org, `hash-${org}`],
      );
      await q(
        `INSERT INTO api_key_usage (api_key_id, org_id, burst_window, burst_count, day_window, day_count) VALUES ($1, $2, 1, 1, 1, 1)`,
        [key.id, org],
      );
      await q(`INSERT INTO idempotency_keys (api_key_id, key, org_id, fingerprint) VALUES ($1, 'idem', $2, 'f')`, [key.id, org]);
      const [entity] = await q(
        `INSERT INTO customers (org_id, kind, type, name, kyc_status, added_via) VALUES ($1, 'entity', 'COMPANY', 'E', 'PENDING', 'INTEGRATION') RETURNING id`,
        [org],
      );
      const [person] = await q(
        `INSERT INTO customers (org_id, kind, type, name, kyc_status, added_via) VALUES ($1, 'individual', 'INDIVIDUAL', 'P', 'NOT_STARTED', 'INTEGRATION') RETURNING id`,
        [org],
      );
      const [owner] = await q(
        `INSERT INTO beneficial_owners (org_id, entity_id, customer_id, holder_type, role_types, added_via) VALUES ($1, $2, $3, 'INDIVIDUAL', '{DIRECTOR}', 'INTEGRATION') RETURNING id`,
        [org, entity.id, person.id],
      );
      const [verification] = await q(
        `INSERT INTO verifications (org_id, customer_id, beneficial_owner_id, kind, lane, payer, status, link_token) VALUES ($1, $2, $3, 'KYC', 'link', 'organization', 'PENDING', $4) RETURNING id`,
        [org, person.id, owner.id, `token-${org}`],
      );
      await q(
        `INSERT INTO verifications (org_id, customer_id, kind, lane, payer, status) VALUES ($1, $2, 'KYB', 'manual', 'organization', 'IN_PROGRESS')`,
        [org, entity.id],
      );
      await q(`INSERT INTO credit_ledger (org_id, delta, balance_after, reason, verification_id) VALUES ($1, -1, 0, 'kyc_start', $2)`, [
        org,
        verification.id,
      ]);
      await q(`INSERT INTO emails (org_id, recipient, subject, body, verification_id) VALUES ($1, 'r@example.test', 's', 'b', $2)`, [
        org,
        verification.id,
      ]);
      const [event] = await q(
        `INSERT INTO outbox_events (org_id, type, customer_id, payload) VALUES ($1, 'customer.updated', $2, '{}') RETURNING id`,
        [org, person.id],
      );
      const [endpoint] = await q(
        `INSERT INTO webhook_endpoints (org_id, url, secret) VALUES ($1, 'https://hooks.example.test/x', 's') RETURNING id`,
        [org],
      );
      const [delivery] = await q(`INSERT INTO webhook_deliveries (org_id, event_id, endpoint_id) VALUES ($1, $2, $3) RETURNING id`, [
        org,
        event.id,
        endpoint.id,
      ]);
      await q(`INSERT INTO webhook_attempts (org_id, delivery_id, attempt_number, started_at) VALUES ($1, $2, 1, now())`, [
        org,
        delivery.id,
      ]);
      const [template] = await q(
        `INSERT INTO group_templates (org_id, code, name, description, industry, source, is_verified, roles) VALUES ($1, 'T', 'T', 'd', 'LEGAL', 'CUSTOM', false, '[]') RETURNING id`,
        [org],
      );
      const [group] = await q(`INSERT INTO groups (org_id, name, template_id) VALUES ($1, 'G', $2) RETURNING id`, [org, template.id]);
      await q(
        `INSERT INTO group_parties (org_id, group_id, position, role_label, party_type, required, customer_id) VALUES ($1, $2, 0, 'R', 'EITHER', true, $3)`,
        [org, group.id, person.id],
      );
      await q(`INSERT INTO audit_log (org_id, actor_type, action, subject_type) VALUES ($1, 'system', 'x', 'customer')`, [org]);
    }
    const TABLES = [
      'api_keys',
      'api_key_usage',
      'idempotency_keys',
      'customers',
      'beneficial_owners',
      'verifications',
      'credit_ledger',
      'emails',
      'outbox_events',
      'webhook_endpoints',
      'webhook_deliveries',
      'webhook_attempts',
      'group_templates',
      'groups',
      'group_parties',
      'audit_log',
    ];
    const countAll = async () =>
      Object.fromEntries(
        await Promise.all(TABLES.map(async (table) => [table, (await q(`SELECT count(*)::int AS n FROM ${table}`))[0].n])),
      );
    const countersOf = () =>
      q(
        'SELECT org_id, kind, type, kyc_status, aml_status, sum(records)::int AS records FROM customer_counts GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2, 3, 4, 5',
      );
    const listIndexes = () =>
      q(
        `SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'customers' AND indexname LIKE 'customers\\_%list\\_idx' OR indexname = 'customers_late_updated_idx' ORDER BY 1`,
      );
    const before = { counts: await countAll(), counters: await countersOf(), indexes: await listIndexes() };
    await client.end();

    expect(await runMigrations(database.url)).toEqual({ applied: journal.entries.length - (upTo + 1) });

    client = new pg.Client({ connectionString: database.url });
    await client.connect();
    expect(await countAll()).toEqual(before.counts);
    expect(await countersOf()).toEqual(before.counters);
    expect(before.indexes).toHaveLength(6);
    // Later migrations add list indexes (0019: the review work queues); those of 0011 stay as they were.
    const kept = new Set(before.indexes.map((index: { indexname: string }) => index.indexname));
    expect((await listIndexes()).filter((index: { indexname: string }) => kept.has(index.indexname))).toEqual(before.indexes);
    expect(await q('SELECT key_hash, org_id FROM api_key_hashes ORDER BY org_id')).toEqual(
      [orgA, orgB].sort().map((org) => ({ key_hash: `hash-${org}`, org_id: org })),
    );
    // Migration 0016 then keeps only each token's SHA-256.
    expect(await q('SELECT token_hash, org_id FROM verification_link_tokens ORDER BY org_id')).toEqual(
      [orgA, orgB].sort().map((org) => ({ token_hash: linkTokenHash(`token-${org}`), org_id: org })),
    );
    const [primaryKey] = await q(`SELECT pg_get_constraintdef(oid) AS def FROM pg_constraint WHERE conname = 'customers_pkey'`);
    expect(primaryKey.def).toBe('PRIMARY KEY (org_id, id)');
    // The lease function now addresses (org_id, api_key_id): it still counts in the migrated rows.
    const [key] = await q('SELECT id FROM api_keys WHERE org_id = $1', [orgA]);
    const [lease] = await q('SELECT * FROM api_key_usage_lease($1, $2, 1, 10, 1, 1, 10, 1)', [key.id, orgA]);
    expect(lease).toMatchObject({ burst_total: 2, day_total: 2 });
  });
});
