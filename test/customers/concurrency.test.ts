import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { countCustomers, createCustomer, person, upsert } from './customers-fixtures.js';

let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe('concurrent upserts', () => {
  let org: TestOrg;
  beforeAll(async () => {
    org = await ctx.createOrg();
  });

  it('when 20 upserts with one externalId race, they leave one record and all answer 200 or 201 with its id', async () => {
    const body = person({ externalId: 'crm-race-1', designatedServices: ['FIN-FX'] });
    const responses = await Promise.all(Array.from({ length: 20 }, () => upsert(ctx, org, body)));
    const statuses = responses.map((response) => response.statusCode);
    expect(statuses.every((status) => status === 200 || status === 201), responses.map((r) => r.body).join(',')).toBe(true);
    expect(statuses.filter((status) => status === 201)).toHaveLength(1);
    expect(new Set(responses.map((response) => response.json().id)).size).toBe(1);
    expect(await countCustomers(ctx, org.id, 'external_id = $2', ['crm-race-1'])).toBe(1);
    const { rows } = await ctx.database.pool.query(`SELECT count(*)::int AS n FROM audit_log WHERE subject_id = $1`, [responses[0]!.json().id]);
    expect(rows[0].n).toBe(1);
  });

  it('when 20 upserts with the same name and email and no externalId race, they leave one record', async () => {
    const body = person();
    const responses = await Promise.all(
      Array.from({ length: 20 }, (_, i) => upsert(ctx, org, { ...body, email: i % 2 ? String(body.email).toUpperCase() : body.email })),
    );
    const statuses = responses.map((response) => response.statusCode);
    expect(statuses.every((status) => status === 200 || status === 201), statuses.join(',')).toBe(true);
    expect(new Set(responses.map((response) => response.json().id)).size).toBe(1);
    expect(await countCustomers(ctx, org.id, 'lower(email) = lower($2)', [body.email])).toBe(1);
  });

  it('when 20 upserts race with one externalId and different phones, they all answer the one record and one of the phones is stored', async () => {
    const body = person({ externalId: 'crm-race-2' });
    const responses = await Promise.all(Array.from({ length: 20 }, (_, i) => upsert(ctx, org, { ...body, phone: `p${i}` })));
    expect(responses.every((response) => response.statusCode === 200 || response.statusCode === 201)).toBe(true);
    expect(new Set(responses.map((response) => response.json().id)).size).toBe(1);
    expect(await countCustomers(ctx, org.id, 'external_id = $2', ['crm-race-2'])).toBe(1);
    const { rows } = await ctx.database.pool.query(`SELECT phone FROM customers WHERE org_id = $1 AND external_id = 'crm-race-2'`, [org.id]);
    expect(rows[0].phone).toMatch(/^p\d+$/);
  });
});

describe('cursor walk under concurrent writes', () => {
  it('when 1,000 records are walked while others are inserted and updated, every original record is seen exactly once', async () => {
    const org = await ctx.createOrg();
    const { rows } = await ctx.database.pool.query(
      `INSERT INTO customers (org_id, kind, type, name, email, kyc_status, added_via)
       SELECT $1, 'individual', 'INDIVIDUAL', 'Walker ' || n, 'walker' || n || '@example.com', 'NOT_REQUIRED', 'INTEGRATION'
         FROM generate_series(1, 1000) AS n
       RETURNING id`,
      [org.id],
    );
    const originals = new Set(rows.map((row) => row.id as string));
    const originalIds = [...originals];

    let walking = true;
    let writes = 0;
    const writer = (async () => {
      for (let i = 0; walking; i += 1) {
        const target = originalIds[(i * 37) % originalIds.length]!;
        await Promise.all([
          upsert(ctx, org, person({ externalId: `walk-new-${i}` })),
          ctx.request('PATCH', `/v1/customers/${target}`, { key: org.key, body: { phone: `w${i}` } }),
          ctx.request('PUT', `/v1/customers/${target}/designated-services`, { key: org.key, body: { service_codes: i % 2 ? ['FIN-FX'] : [] } }),
        ]);
        writes += 3;
      }
    })();

    const seen: string[] = [];
    let cursor: string | undefined;
    let pages = 0;
    try {
      for (;;) {
        const response = await ctx.request('GET', '/v1/customers', { key: org.key, query: { limit: '37', ...(cursor ? { cursor } : {}) } });
        expect(response.statusCode, response.body).toBe(200);
        const page = response.json();
        seen.push(...page.data.map((row: { id: string }) => row.id));
        pages += 1;
        if (!page.has_more) break;
        cursor = page.next_cursor;
        await sleep(5);
      }
    } finally {
      walking = false;
      await writer;
    }

    const seenOriginals = seen.filter((id) => originals.has(id));
    expect(seenOriginals).toHaveLength(1000);
    expect(new Set(seenOriginals).size).toBe(1000);
    expect(new Set(seen).size).toBe(seen.length);
    expect(pages).toBeGreaterThanOrEqual(28);
    expect(writes).toBeGreaterThan(0);
  });
});

/**
 * The README polling recipe against a writer whose transaction sleeps `sleepSeconds` between its
 * UPDATE and its COMMIT: poll every 200 ms with updated_since = previous response Date header − 1 s,
 * deduplicating on id + updated_at, until 1.5 s after the commit.
 */
async function pollWhileSlowWriterCommits(org: TestOrg, customerId: string, sleepSeconds: number) {
  const firstPoll = await ctx.request('GET', '/v1/customers', { key: org.key, query: { limit: '100' } });
  expect(firstPoll.headers.date).toEqual(expect.any(String));
  let previousPollTime = new Date(String(firstPoll.headers.date));

  const writer = new pg.Client({ connectionString: ctx.databaseUrl });
  await writer.connect();
  const seen = new Set<string>();
  let writerDone = false;
  let writtenAt: Date | undefined;
  let aboutToCommitAt: Date | undefined;
  const writing = (async () => {
    try {
      await writer.query('BEGIN');
      const write = await writer.query(`UPDATE customers SET phone = 'late' WHERE id = $1 RETURNING updated_at`, [customerId]);
      writtenAt = write.rows[0].updated_at;
      await writer.query(`SELECT pg_sleep(${sleepSeconds})`);
      aboutToCommitAt = (await writer.query('SELECT clock_timestamp() AS now')).rows[0].now;
      await writer.query('COMMIT');
    } finally {
      writerDone = true;
    }
  })();

  let doneAt: number | undefined;
  while (doneAt === undefined || Date.now() - doneAt < 1_500) {
    const since = new Date(previousPollTime.getTime() - 1_000).toISOString();
    const response = await ctx.request('GET', '/v1/customers', { key: org.key, query: { updated_since: since, limit: '100' } });
    expect(response.statusCode).toBe(200);
    for (const row of response.json().data as { id: string; updated_at: string }[]) seen.add(`${row.id}@${row.updated_at}`);
    previousPollTime = new Date(String(response.headers.date));
    if (writerDone && doneAt === undefined) doneAt = Date.now();
    await sleep(200);
  }
  await writing;
  await writer.end();
  const final = (await ctx.request('GET', `/v1/customers/${customerId}`, { key: org.key })).json();
  return { seen, final, writtenAt: writtenAt!, aboutToCommitAt: aboutToCommitAt! };
}

describe('polling with updated_since', () => {
  it('when a writer commits 2.5 s after its update, a poller overlapping its previous Date header by 1 s still sees the change', async () => {
    const org = await ctx.createOrg();
    const customer = await createCustomer(ctx, org, person({ externalId: 'crm-poll' }));
    const { seen, final, writtenAt, aboutToCommitAt } = await pollWhileSlowWriterCommits(org, customer.id, 2.5);
    expect(seen).toContain(`${customer.id}@${final.updated_at}`);
    // The commit-time re-stamp: updated_at is not the early write time but at least the commit time.
    expect(new Date(final.updated_at).getTime()).toBeGreaterThanOrEqual(aboutToCommitAt.getTime());
    expect(new Date(final.updated_at).getTime() - writtenAt.getTime()).toBeGreaterThanOrEqual(2_400);
  });

  // Runs last in this file: it disables the re-stamp trigger on this file's own database.
  it('when the commit-time re-stamp is switched off, the same poller misses the late commit (the control for the test above)', async () => {
    const org = await ctx.createOrg();
    const customer = await createCustomer(ctx, org, person({ externalId: 'crm-poll-control' }));
    await ctx.database.pool.query('ALTER TABLE customers DISABLE TRIGGER customers_restamp_at_commit_on_update');
    try {
      const { seen, final, writtenAt } = await pollWhileSlowWriterCommits(org, customer.id, 2.5);
      expect(new Date(final.updated_at).getTime()).toBe(writtenAt.getTime());
      expect(seen).not.toContain(`${customer.id}@${final.updated_at}`);
    } finally {
      await ctx.database.pool.query('ALTER TABLE customers ENABLE TRIGGER customers_restamp_at_commit_on_update');
    }
  });
});
