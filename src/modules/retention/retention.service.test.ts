import { randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from '../../config/config.js';
import { startServer } from '../../server.js';
import { createTestContext, testConfig, type TestContext, type TestOrg, testServices } from '../../../test/helpers/harness.js';
import { QUEUES } from '../../shared/job-runner.js';
import { createAuditChainSealer, type AuditChainSealer } from '../audit/audit-chain.sealer.js';
import { RETENTION_TABLES, type RetentionTable } from './retention.service.js';

let ctx: TestContext;
// Audit rows are purged only once sealed into the chain (behind a checkpoint): the tests seal them, aged, before a purge.
let sealer: AuditChainSealer;
beforeAll(async () => {
  ctx = await createTestContext();
  sealer = createAuditChainSealer({ database: ctx.database, pollIntervalMs: 60_000 });
});
afterAll(async () => {
  await sealer?.stop();
  await ctx?.close();
});

const query = async <R extends pg.QueryResultRow = Record<string, unknown>>(text: string, values: unknown[] = []) =>
  (await ctx.database.pool.query<R>(text, values)).rows;

/** Ages a row by setting its created_at directly: `age` is a PostgreSQL interval such as '31 days'. */
async function age(table: RetentionTable | 'outbox_events', column: string, key: unknown, interval: string): Promise<void> {
  await query(`UPDATE ${table} SET created_at = now() - $2::interval WHERE ${column} = $1`, [key, interval]);
}

const seed = {
  async audit(orgId: string, interval?: string): Promise<number> {
    const [row] = await query<{ id: number }>(
      `INSERT INTO audit_log (org_id, actor_type, action, subject_type) VALUES ($1, 'system', 'retention.test', 'test') RETURNING id`,
      [orgId],
    );
    if (interval) await age('audit_log', 'id', row!.id, interval);
    return row!.id;
  },
  async idempotencyKey(org: TestOrg, interval?: string): Promise<string> {
    const key = randomUUID();
    await query(`INSERT INTO idempotency_keys (api_key_id, key, org_id, fingerprint) VALUES ($1, $2, $3, 'f')`, [org.keyId, key, org.id]);
    if (interval) await age('idempotency_keys', 'key', key, interval);
    return key;
  },
  async event(orgId: string, interval?: string): Promise<string> {
    const [row] = await query<{ id: string }>(
      `INSERT INTO outbox_events (org_id, type, payload) VALUES ($1, 'webhook.test', '{}') RETURNING id`,
      [orgId],
    );
    if (interval) await age('outbox_events', 'id', row!.id, interval);
    return row!.id;
  },
  async endpoint(orgId: string): Promise<string> {
    const [row] = await query<{ id: string }>(
      `INSERT INTO webhook_endpoints (org_id, url, secret) VALUES ($1, 'https://hooks.example.test/in', 'whsec_test') RETURNING id`,
      [orgId],
    );
    return row!.id;
  },
  /** A delivery of `eventId` with `attempts` attempt rows, all aged by `interval`. */
  async delivery(
    orgId: string,
    eventId: string,
    endpointId: string,
    status: 'pending' | 'succeeded' | 'failed',
    interval: string,
    attempts = 2,
  ): Promise<string> {
    const [row] = await query<{ id: string }>(
      `INSERT INTO webhook_deliveries (org_id, event_id, endpoint_id, status, attempts) VALUES ($1, $2, $3, $4, $5) RETURNING id`,
      [orgId, eventId, endpointId, status, attempts],
    );
    for (let attempt = 1; attempt <= attempts; attempt += 1) {
      await query(
        `INSERT INTO webhook_attempts (org_id, delivery_id, attempt_number, status_code, started_at, created_at)
         VALUES ($1, $2, $3, 500, now() - $4::interval, now() - $4::interval)`,
        [orgId, row!.id, attempt, interval],
      );
    }
    await age('webhook_deliveries', 'id', row!.id, interval);
    return row!.id;
  },
  async entity(orgId: string): Promise<string> {
    const [row] = await query<{ id: string }>(
      `INSERT INTO customers (org_id, kind, type, name, kyc_status, added_via) VALUES ($1, 'entity', 'TRUST', $2, 'NOT_STARTED', 'INTEGRATION') RETURNING id`,
      [orgId, `Retention Trust ${randomUUID()}`],
    );
    return row!.id;
  },
  async documentRequest(orgId: string, entityId: string, status: 'OPEN' | 'FULFILLED' | 'EXPIRED', interval: string): Promise<string> {
    const [row] = await query<{ id: string }>(
      `INSERT INTO document_requests (org_id, entity_id, types, due_at, status, payer, recipient_email)
       VALUES ($1, $2, '{TRUST_DEED}', now() + interval '1 day', $3, 'organization', 'contact@example.test') RETURNING id`,
      [orgId, entityId, status],
    );
    await query(`INSERT INTO document_request_tokens (token_hash, org_id, document_request_id) VALUES ($1, $2, $3)`, [
      randomUUID(),
      orgId,
      row!.id,
    ]);
    await query(`UPDATE document_requests SET created_at = now() - $2::interval WHERE id = $1`, [row!.id, interval]);
    return row!.id;
  },
  /** A document of `chunks` chunk rows, charged on the ledger, aged by `interval`. */
  async document(
    orgId: string,
    entityId: string,
    interval: string,
    options: { chunks?: number; requestId?: string } = {},
  ): Promise<string> {
    const [row] = await query<{ id: string }>(
      `INSERT INTO entity_documents (org_id, entity_id, type, media_type, size_bytes, sha256, uploaded_by, document_request_id)
       VALUES ($1, $2, 'TRUST_DEED', 'application/pdf', 3, 'abc', 'organization', $3) RETURNING id`,
      [orgId, entityId, options.requestId ?? null],
    );
    for (let seq = 0; seq < (options.chunks ?? 2); seq += 1) {
      await query(`INSERT INTO document_chunks (org_id, document_id, seq, data) VALUES ($1, $2, $3, '\\x255044'::bytea)`, [
        orgId,
        row!.id,
        seq,
      ]);
    }
    await query(`UPDATE organisations SET credits = credits + 1 WHERE id = $1`, [orgId]);
    await query(`INSERT INTO credit_ledger (org_id, delta, balance_after, reason, document_id) VALUES ($1, -1, 0, 'document_upload', $2)`, [
      orgId,
      row!.id,
    ]);
    await query(`UPDATE entity_documents SET created_at = now() - $2::interval WHERE id = $1`, [row!.id, interval]);
    return row!.id;
  },
  /** A review recorded on `customerId`, aged by `interval`. */
  async review(orgId: string, customerId: string, interval: string): Promise<string> {
    const [row] = await query<{ id: string }>(
      `INSERT INTO customer_reviews (org_id, customer_id, outcome, reviewer, reasons, status_before, next_review_at)
       VALUES ($1, $2, 'NO_CHANGE', 'Sam Officer', '{SCHEDULED_DATE}', 'DUE', now() + interval '1 year') RETURNING id`,
      [orgId, customerId],
    );
    await age('customer_reviews', 'id', row!.id, interval);
    return row!.id;
  },
  async email(orgId: string, status: 'queued' | 'sent' | 'recorded' | 'failed', interval?: string): Promise<string> {
    const [row] = await query<{ id: string }>(
      `INSERT INTO emails (org_id, recipient, subject, body, status) VALUES ($1, 'person@example.test', 'Subject', 'Body', $2) RETURNING id`,
      [orgId, status],
    );
    if (interval) await age('emails', 'id', row!.id, interval);
    return row!.id;
  },
};

async function existing(table: string, column: string, keys: unknown[]): Promise<unknown[]> {
  const rows = await query<{ key: unknown }>(`SELECT ${column} AS key FROM ${table} WHERE ${column} = ANY($1)`, [keys]);
  return rows.map((row) => row.key);
}

/** The retention service, each purge preceded by a seal of the rows seeded so far (in created_at order, so aged rows chain first). */
const service = (options: { batchSize?: number; onPurged?: (table: RetentionTable, rows: number) => void } = {}) => {
  const retention = testServices(ctx.database, { config: ctx.config }).retention(options);
  return {
    purgeOrganisation: async (...args: Parameters<typeof retention.purgeOrganisation>) => {
      await sealer.sealOnce();
      return retention.purgeOrganisation(...args);
    },
    runOnce: async (...args: Parameters<typeof retention.runOnce>) => {
      await sealer.sealOnce();
      return retention.runOnce(...args);
    },
  };
};

describe('retention settings', () => {
  it('when nothing is set, it keeps events, deliveries and finished imports 30 days, emails 90, audit, documents and reviews 7 years and idempotency keys 24 hours', () => {
    expect(loadConfig({}).retention).toEqual({
      eventDays: 30,
      webhookDeliveryDays: 30,
      emailDays: 90,
      auditYears: 7,
      documentYears: 7,
      reviewYears: 7,
      importDays: 30,
      idempotencyHours: 24,
    });
  });

  it('when set, it uses each variable for its own table', () => {
    const retention = loadConfig({
      EVENT_RETENTION_DAYS: '7',
      WEBHOOK_DELIVERY_RETENTION_DAYS: '14',
      EMAIL_RETENTION_DAYS: '60',
      AUDIT_RETENTION_YEARS: '10',
      DOCUMENT_RETENTION_YEARS: '12',
      REVIEW_RETENTION_YEARS: '9',
      IMPORT_RETENTION_DAYS: '5',
      IDEMPOTENCY_RETENTION_HOURS: '48',
    }).retention;
    expect(retention).toEqual({
      eventDays: 7,
      webhookDeliveryDays: 14,
      emailDays: 60,
      auditYears: 10,
      documentYears: 12,
      reviewYears: 9,
      importDays: 5,
      idempotencyHours: 48,
    });
  });

  it.each([
    ['EVENT_RETENTION_DAYS', '0', /greater than zero/],
    ['EVENT_RETENTION_DAYS', '-3', /greater than zero/],
    ['WEBHOOK_DELIVERY_RETENTION_DAYS', '2.5', /whole number of days/],
    ['EMAIL_RETENTION_DAYS', 'ninety', /whole number of days/],
    ['EMAIL_RETENTION_DAYS', '100000', /at most 36500 days/],
    ['AUDIT_RETENTION_YEARS', '0', /greater than zero/],
    ['AUDIT_RETENTION_YEARS', '1000', /at most 100 years/],
    ['DOCUMENT_RETENTION_YEARS', '0', /greater than zero/],
    ['REVIEW_RETENTION_YEARS', '0', /greater than zero/],
    ['REVIEW_RETENTION_YEARS', '101', /at most 100 years/],
    ['REVIEW_RETENTION_YEARS', '7.5', /whole number of years/],
    ['IMPORT_RETENTION_DAYS', '0', /greater than zero/],
    ['IDEMPOTENCY_RETENTION_HOURS', '23', /at least 24 \(the spec's replay window\)/],
    ['IDEMPOTENCY_RETENTION_HOURS', '1.5', /whole number of hours/],
  ])('when %s=%s, it refuses to start and names the variable', (variable, value, problem) => {
    let error: unknown;
    try {
      loadConfig({ [variable]: value });
    } catch (caught) {
      error = caught;
    }
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as ConfigError).problems).toHaveLength(1);
    expect((error as ConfigError).problems[0]).toMatch(new RegExp(`^${variable}: `));
    expect((error as ConfigError).problems[0]).toMatch(problem);
  });
});

describe('the batched purge, table by table', () => {
  it('when idempotency records are past the 24 h window, it deletes them and keeps younger ones', async () => {
    const org = await ctx.createOrg();
    const expired = await seed.idempotencyKey(org, '25 hours');
    const live = await seed.idempotencyKey(org, '23 hours');
    const purged = await service().purgeOrganisation(org.id);
    expect(purged.idempotency_keys).toBe(1);
    expect(await existing('idempotency_keys', 'key', [expired, live])).toEqual([live]);
  });

  it('when audit rows are older than 7 years, it deletes them and keeps younger ones', async () => {
    const org = await ctx.createOrg();
    const expired = await seed.audit(org.id, '7 years 1 day');
    const kept = await seed.audit(org.id, '6 years 360 days');
    const purged = await service().purgeOrganisation(org.id);
    expect(purged.audit_log).toBe(1);
    expect(await existing('audit_log', 'id', [expired, kept])).toEqual([kept]);
  });

  it('when settled deliveries are older than 30 days, it deletes them with their attempts, keeps younger ones, and keeps pending ones whatever their age', async () => {
    const org = await ctx.createOrg();
    const endpoint = await seed.endpoint(org.id);
    const event = await seed.event(org.id, '10 days');
    const succeeded = await seed.delivery(org.id, event, endpoint, 'succeeded', '31 days', 1);
    const failed = await seed.delivery(org.id, event, endpoint, 'failed', '31 days', 3);
    const young = await seed.delivery(org.id, event, endpoint, 'failed', '29 days', 2);
    const pending = await seed.delivery(org.id, event, endpoint, 'pending', '45 days', 2);
    const purged = await service().purgeOrganisation(org.id);
    expect(purged.webhook_deliveries).toBe(2);
    expect(purged.webhook_attempts).toBe(4);
    expect((await existing('webhook_deliveries', 'id', [succeeded, failed, young, pending])).sort()).toEqual([young, pending].sort());
    const attempts = await query<{ delivery_id: string; n: number }>(
      `SELECT delivery_id, count(*)::int AS n FROM webhook_attempts WHERE org_id = $1 GROUP BY delivery_id`,
      [org.id],
    );
    expect(Object.fromEntries(attempts.map((row) => [row.delivery_id, row.n]))).toEqual({ [young]: 2, [pending]: 2 });
  });

  it('when events are older than 30 days, it deletes those no delivery references, after their settled deliveries in the same run, and keeps the rest', async () => {
    const org = await ctx.createOrg();
    const endpoint = await seed.endpoint(org.id);
    const bare = await seed.event(org.id, '31 days');
    const young = await seed.event(org.id, '29 days');
    const settled = await seed.event(org.id, '31 days');
    await seed.delivery(org.id, settled, endpoint, 'succeeded', '31 days', 1);
    const stillPending = await seed.event(org.id, '31 days');
    const pendingDelivery = await seed.delivery(org.id, stillPending, endpoint, 'pending', '31 days', 1);
    const recentlyResent = await seed.event(org.id, '40 days');
    const resent = await seed.delivery(org.id, recentlyResent, endpoint, 'succeeded', '2 days', 1);

    const purged = await service().purgeOrganisation(org.id);
    expect(purged.outbox_events).toBe(2);
    expect(purged.webhook_deliveries).toBe(1);
    expect((await existing('outbox_events', 'id', [bare, young, settled, stillPending, recentlyResent])).sort()).toEqual(
      [young, stillPending, recentlyResent].sort(),
    );
    // No delivery went by the event's cascade.
    expect((await existing('webhook_deliveries', 'id', [pendingDelivery, resent])).sort()).toEqual([pendingDelivery, resent].sort());
  });

  it('when emails are older than 90 days, it deletes sent, recorded and failed ones, keeps younger ones, and keeps queued ones whatever their age', async () => {
    const org = await ctx.createOrg();
    const sent = await seed.email(org.id, 'sent', '91 days');
    const recorded = await seed.email(org.id, 'recorded', '91 days');
    const failed = await seed.email(org.id, 'failed', '91 days');
    const queued = await seed.email(org.id, 'queued', '200 days');
    const young = await seed.email(org.id, 'sent', '89 days');
    const purged = await service().purgeOrganisation(org.id);
    expect(purged.emails).toBe(3);
    expect((await existing('emails', 'id', [sent, recorded, failed, queued, young])).sort()).toEqual([queued, young].sort());
  });

  it('when documents are older than 7 years, it deletes them with their bytes, keeps the ledger rows (unlinked) and younger documents', async () => {
    const org = await ctx.createOrg();
    const entity = await seed.entity(org.id);
    const old = await seed.document(org.id, entity, '7 years 1 day', { chunks: 3 });
    const young = await seed.document(org.id, entity, '6 years 360 days', { chunks: 2 });
    const purged = await service().purgeOrganisation(org.id);
    expect(purged.entity_documents).toBe(1);
    expect(purged.document_chunks).toBe(3);
    expect(await existing('entity_documents', 'id', [old, young])).toEqual([young]);
    expect(await query(`SELECT document_id FROM document_chunks WHERE org_id = $1 GROUP BY document_id`, [org.id])).toEqual([
      { document_id: young },
    ]);
    const ledger = await query<{ document_id: string | null; delta: number }>(
      `SELECT document_id, delta FROM credit_ledger WHERE org_id = $1 AND reason = 'document_upload' ORDER BY id`,
      [org.id],
    );
    expect(ledger).toEqual([
      { document_id: null, delta: -1 },
      { document_id: young, delta: -1 },
    ]);
  });

  it('when closed document requests are older than 7 years, it deletes those no document references, and keeps open ones whatever their age', async () => {
    const org = await ctx.createOrg();
    const entity = await seed.entity(org.id);
    const fulfilled = await seed.documentRequest(org.id, entity, 'FULFILLED', '8 years');
    const expired = await seed.documentRequest(org.id, entity, 'EXPIRED', '8 years');
    const open = await seed.documentRequest(org.id, entity, 'OPEN', '8 years');
    const young = await seed.documentRequest(org.id, entity, 'EXPIRED', '6 years');
    const referenced = await seed.documentRequest(org.id, entity, 'FULFILLED', '8 years');
    const keptDocument = await seed.document(org.id, entity, '6 years', { requestId: referenced });
    const purged = await service().purgeOrganisation(org.id);
    expect(purged.document_requests).toBe(2);
    expect((await existing('document_requests', 'id', [fulfilled, expired, open, young, referenced])).sort()).toEqual(
      [open, young, referenced].sort(),
    );
    expect(
      (await existing('document_request_tokens', 'document_request_id', [fulfilled, expired, open, young, referenced])).sort(),
    ).toEqual([open, young, referenced].sort());
    expect(await existing('entity_documents', 'id', [keptDocument])).toEqual([keptDocument]);
  });

  it('when reviews were recorded more than 7 years ago, it deletes them and keeps younger ones and the record itself', async () => {
    const org = await ctx.createOrg();
    const entity = await seed.entity(org.id);
    const old = await seed.review(org.id, entity, '7 years 1 day');
    const older = await seed.review(org.id, entity, '12 years');
    const young = await seed.review(org.id, entity, '6 years 360 days');
    const purged = await service().purgeOrganisation(org.id);
    expect(purged.customer_reviews).toBe(2);
    expect(await existing('customer_reviews', 'id', [old, older, young])).toEqual([young]);
    expect(await existing('customers', 'id', [entity])).toEqual([entity]);
  });

  it('when REVIEW_RETENTION_YEARS is set, reviews are kept that many years', async () => {
    const org = await ctx.createOrg();
    const entity = await seed.entity(org.id);
    const past = await seed.review(org.id, entity, '3 years 1 day');
    const within = await seed.review(org.id, entity, '2 years 360 days');
    const retention = testServices(ctx.database, {
      config: { ...ctx.config, retention: { ...ctx.config.retention, reviewYears: 3 } },
    }).retention();
    expect((await retention.purgeOrganisation(org.id)).customer_reviews).toBe(1);
    expect(await existing('customer_reviews', 'id', [past, within])).toEqual([within]);
  });

  it('when expired reviews outnumber a batch, it deletes them all in successive batches', async () => {
    const org = await ctx.createOrg();
    const entity = await seed.entity(org.id);
    const ids: string[] = [];
    for (let i = 0; i < 7; i += 1) ids.push(await seed.review(org.id, entity, '8 years'));
    const batches: number[] = [];
    const purged = await service({
      batchSize: 3,
      onPurged: (table, rows) => table === 'customer_reviews' && batches.push(rows),
    }).purgeOrganisation(org.id);
    expect(purged.customer_reviews).toBe(7);
    expect(batches).toEqual([3, 3, 1]);
    expect(await existing('customer_reviews', 'id', ids)).toEqual([]);
  });

  it('when the expired rows outnumber a batch, it deletes them all in successive batches, each committed on its own', async () => {
    const org = await ctx.createOrg();
    const ids: number[] = [];
    for (let i = 0; i < 10; i += 1) ids.push(await seed.audit(org.id, '8 years'));
    const batches: number[] = [];
    const purged = await service({
      batchSize: 3,
      onPurged: (table, rows) => table === 'audit_log' && batches.push(rows),
    }).purgeOrganisation(org.id);
    expect(purged.audit_log).toBe(10);
    expect(batches).toEqual([3, 3, 3, 1]);
    expect(await existing('audit_log', 'id', ids)).toEqual([]);
  });
});

describe('stopping', () => {
  it('when the process stops mid-run, the purge ends after the batch in flight and leaves the rest for the next run', async () => {
    const org = await ctx.createOrg();
    const ids: number[] = [];
    for (let i = 0; i < 10; i += 1) ids.push(await seed.audit(org.id, '8 years'));
    const stopping = new AbortController();
    const purged = await service({ batchSize: 3, onPurged: () => stopping.abort() }).runOnce({ signal: stopping.signal });
    expect(purged.audit_log).toBe(3);
    expect(await existing('audit_log', 'id', ids)).toHaveLength(7);
    expect((await service().purgeOrganisation(org.id)).audit_log).toBe(7);
  });
});

describe('organisations', () => {
  it("when one organisation is purged, another organisation's expired rows stay untouched, and a full run then purges every organisation", async () => {
    const [first, second] = [await ctx.createOrg(), await ctx.createOrg()];
    const rows = async (org: TestOrg) => {
      const endpoint = await seed.endpoint(org.id);
      const event = await seed.event(org.id, '31 days');
      return {
        audit: await seed.audit(org.id, '8 years'),
        key: await seed.idempotencyKey(org, '2 days'),
        event,
        delivery: await seed.delivery(org.id, event, endpoint, 'failed', '31 days', 1),
        email: await seed.email(org.id, 'sent', '100 days'),
      };
    };
    const a = await rows(first);
    const b = await rows(second);
    const remaining = async (r: typeof a) => ({
      audit: (await existing('audit_log', 'id', [r.audit])).length,
      key: (await existing('idempotency_keys', 'key', [r.key])).length,
      event: (await existing('outbox_events', 'id', [r.event])).length,
      delivery: (await existing('webhook_deliveries', 'id', [r.delivery])).length,
      attempts: (await existing('webhook_attempts', 'delivery_id', [r.delivery])).length,
      email: (await existing('emails', 'id', [r.email])).length,
    });
    const none = { audit: 0, key: 0, event: 0, delivery: 0, attempts: 0, email: 0 };
    const all = { audit: 1, key: 1, event: 1, delivery: 1, attempts: 1, email: 1 };

    await service().purgeOrganisation(first.id);
    expect(await remaining(a)).toEqual(none);
    expect(await remaining(b)).toEqual(all);

    const totals = await service().runOnce();
    expect(totals).toMatchObject({
      audit_log: 1,
      idempotency_keys: 1,
      outbox_events: 1,
      webhook_deliveries: 1,
      webhook_attempts: 1,
      emails: 1,
    });
    expect(await remaining(b)).toEqual(none);
  });
});

describe('writers are never waited on', () => {
  const lockTimeoutOfThePool = async () => (await query<{ lock_timeout: string }>('SHOW lock_timeout'))[0]!.lock_timeout;

  type Case = { table: RetentionTable; seedTwo(org: TestOrg): Promise<{ locked: unknown; other: unknown; column: string }> };
  const cases: Case[] = [
    {
      table: 'audit_log',
      seedTwo: async (org) => ({ locked: await seed.audit(org.id, '8 years'), other: await seed.audit(org.id, '8 years'), column: 'id' }),
    },
    {
      table: 'idempotency_keys',
      seedTwo: async (org) => ({
        locked: await seed.idempotencyKey(org, '2 days'),
        other: await seed.idempotencyKey(org, '2 days'),
        column: 'key',
      }),
    },
    {
      table: 'emails',
      seedTwo: async (org) => ({
        locked: await seed.email(org.id, 'sent', '100 days'),
        other: await seed.email(org.id, 'failed', '100 days'),
        column: 'id',
      }),
    },
    {
      table: 'webhook_deliveries',
      seedTwo: async (org) => {
        const endpoint = await seed.endpoint(org.id);
        const event = await seed.event(org.id, '1 day');
        return {
          locked: await seed.delivery(org.id, event, endpoint, 'failed', '31 days', 1),
          other: await seed.delivery(org.id, event, endpoint, 'succeeded', '31 days', 1),
          column: 'id',
        };
      },
    },
    {
      table: 'outbox_events',
      seedTwo: async (org) => ({ locked: await seed.event(org.id, '31 days'), other: await seed.event(org.id, '31 days'), column: 'id' }),
    },
    {
      table: 'customer_reviews',
      seedTwo: async (org) => {
        const entity = await seed.entity(org.id);
        return { locked: await seed.review(org.id, entity, '8 years'), other: await seed.review(org.id, entity, '8 years'), column: 'id' };
      },
    },
  ];

  it.each(cases)(
    'when a writer holds a row lock on an expired $table row, the purge skips it and does not wait',
    async ({ table, seedTwo }) => {
      const org = await ctx.createOrg();
      const { locked, other, column } = await seedTwo(org);
      await sealer.sealOnce(); // before the writer's lock: sealing an audit row it holds would wait on it
      const writer = new pg.Client({ connectionString: ctx.databaseUrl });
      await writer.connect();
      try {
        await writer.query('BEGIN');
        await writer.query(`SELECT 1 FROM ${table} WHERE org_id = $1 AND ${column} = $2 FOR UPDATE`, [org.id, locked]);
        // The writer holds its lock until after the purge, so a purge that waited for it would end at the
        // pool's lock_timeout with 55P03 and reject: resolving, with the other row purged, shows it never waited.
        expect(await lockTimeoutOfThePool()).not.toBe('0');
        const purged = await service().purgeOrganisation(org.id);
        expect(purged[table]).toBe(1);
        expect(await existing(table, column, [locked, other])).toEqual([locked]);
        await writer.query('ROLLBACK');
        // Once the writer is done, the next run takes it.
        expect((await service().purgeOrganisation(org.id))[table]).toBe(1);
        expect(await existing(table, column, [locked])).toEqual([]);
      } finally {
        await writer.end();
      }
    },
  );
});

describe('the retention job and /metrics', () => {
  /** The value of one sample line, e.g. `metric{a="b"} 3`; undefined when absent. */
  function sample(body: string, metric: string, labels = ''): number | undefined {
    const line = body.split('\n').find((candidate) => candidate.startsWith(`${metric}${labels} `));
    return line === undefined ? undefined : Number(line.slice(line.lastIndexOf(' ') + 1));
  }

  it('when the purge removes rows, retention_purged_rows_total{table} grows by the count removed from each table', async () => {
    const app = await ctx.buildInstance();
    const before = (await ctx.request('GET', '/metrics', {}, app)).body;
    for (const table of RETENTION_TABLES) expect(sample(before, 'retention_purged_rows_total', `{table="${table}"}`)).toBe(0);

    const org = await ctx.createOrg();
    for (let i = 0; i < 3; i += 1) await seed.audit(org.id, '8 years');
    await seed.email(org.id, 'sent', '100 days');
    await seed.audit(org.id, '1 year');
    await sealer.sealOnce();
    await testServices(ctx.database, { config: ctx.config })
      .retention({ onPurged: app.metrics!.retentionPurged })
      .purgeOrganisation(org.id);

    const after = (await ctx.request('GET', '/metrics', {}, app)).body;
    expect(sample(after, 'retention_purged_rows_total', '{table="audit_log"}')).toBe(3);
    expect(sample(after, 'retention_purged_rows_total', '{table="emails"}')).toBe(1);
    expect(sample(after, 'retention_purged_rows_total', '{table="outbox_events"}')).toBe(0);
  });

  it('when the retention job comes due, the server runs it and /metrics counts what it purged', async () => {
    const org = await ctx.createOrg();
    const expired = [await seed.audit(org.id, '8 years'), await seed.audit(org.id, '9 years')];
    await sealer.sealOnce();
    const server = await startServer(testConfig({ databaseUrl: ctx.databaseUrl, host: '127.0.0.1', port: 0, webhookWorker: false }));
    try {
      // What a tick of the schedule (RETENTION_SCHEDULE) sends.
      await server.jobs.runner.send(ctx.database.db, QUEUES.retention.name, {});
      const url = `http://127.0.0.1:${(server.app.server.address() as AddressInfo).port}/metrics`;
      let purged: number | undefined;
      for (const deadline = Date.now() + 10_000; Date.now() < deadline; await new Promise((resolve) => setTimeout(resolve, 100))) {
        purged = sample(await (await fetch(url)).text(), 'retention_purged_rows_total', '{table="audit_log"}');
        if (purged !== undefined && purged >= 2) break;
      }
      expect(purged).toBeGreaterThanOrEqual(2);
      expect(await existing('audit_log', 'id', expired)).toEqual([]);
    } finally {
      await server.close();
    }
  });
});
