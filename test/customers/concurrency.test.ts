import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { createCustomersRepository } from '../../src/modules/customers/customers.repository.js';
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
    expect(
      statuses.every((status) => status === 200 || status === 201),
      responses.map((r) => r.body).join(','),
    ).toBe(true);
    expect(statuses.filter((status) => status === 201)).toHaveLength(1);
    expect(new Set(responses.map((response) => response.json().id)).size).toBe(1);
    expect(await countCustomers(ctx, org.id, 'external_id = $2', ['crm-race-1'])).toBe(1);
    const { rows } = await ctx.database.pool.query(`SELECT count(*)::int AS n FROM audit_log WHERE subject_id = $1`, [
      responses[0]!.json().id,
    ]);
    expect(rows[0].n).toBe(1);
  });

  it('when 20 upserts with the same name and email and no externalId race, they leave one record', async () => {
    const body = person();
    const responses = await Promise.all(
      Array.from({ length: 20 }, (_, i) => upsert(ctx, org, { ...body, email: i % 2 ? String(body.email).toUpperCase() : body.email })),
    );
    const statuses = responses.map((response) => response.statusCode);
    expect(
      statuses.every((status) => status === 200 || status === 201),
      statuses.join(','),
    ).toBe(true);
    expect(new Set(responses.map((response) => response.json().id)).size).toBe(1);
    expect(await countCustomers(ctx, org.id, 'lower(email) = lower($2)', [body.email])).toBe(1);
  });

  it('when 20 upserts race with one externalId and different phones, they all answer the one record and one of the phones is stored', async () => {
    const body = person({ externalId: 'crm-race-2' });
    const responses = await Promise.all(Array.from({ length: 20 }, (_, i) => upsert(ctx, org, { ...body, phone: `p${i}` })));
    expect(responses.every((response) => response.statusCode === 200 || response.statusCode === 201)).toBe(true);
    expect(new Set(responses.map((response) => response.json().id)).size).toBe(1);
    expect(await countCustomers(ctx, org.id, 'external_id = $2', ['crm-race-2'])).toBe(1);
    const { rows } = await ctx.database.pool.query(`SELECT phone FROM customers WHERE org_id = $1 AND external_id = 'crm-race-2'`, [
      org.id,
    ]);
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
          ctx.request('PUT', `/v1/customers/${target}/designated-services`, {
            key: org.key,
            body: { service_codes: i % 2 ? ['FIN-FX'] : [] },
          }),
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

/** The first SQLSTATE along an error's cause chain. */
/** The messages of an error and its `cause` chain, one a line. */
function messagesOf(error: unknown): string {
  const messages: string[] = [];
  for (let current = error as { message?: unknown; cause?: unknown } | undefined; current; current = current.cause as typeof current) {
    if (typeof current.message === 'string') messages.push(current.message);
  }
  return messages.join('\n');
}

function sqlStateOf(error: unknown): string | undefined {
  for (let current = error as { code?: unknown; cause?: unknown } | undefined; current; current = current.cause as typeof current) {
    if (typeof current.code === 'string' && /^[0-9A-Z]{5}$/.test(current.code)) return current.code;
  }
  return undefined;
}

/**
 * A transaction on a connection of its own that changes the customer's phone now and commits only
 * when told: its change is stamped long before it becomes visible.
 */
async function openSlowWrite(customerId: string, phone: string) {
  const client = new pg.Client({ connectionString: ctx.databaseUrl });
  await client.connect();
  await client.query('BEGIN');
  const { rows } = await client.query(`UPDATE customers SET phone = $2 WHERE id = $1 RETURNING updated_at`, [customerId, phone]);
  return {
    writtenAt: rows[0].updated_at as Date,
    async commit() {
      const committingAt = Date.now();
      await client.query('COMMIT');
      await client.end();
      return committingAt;
    },
  };
}

type Seen = { id: string; updated_at: string; phone?: string | null };
/** One poll: what it returned and the time it started, as the poller will pass it to the next poll. */
type Poll = { rows: Seen[]; start: Date };

/**
 * The race of issue 26 on one record, as a poller following the spec lives it: a poll runs; a
 * transaction stamps a change; 100 ms later the next poll starts (updated_since = the start of the
 * one before); 400 ms after the write (before the 500 ms commit-time re-stamp would apply) the
 * transaction commits; then one more poll runs, again from the start of the one before. Returns what
 * the poll during the transaction and the one after saw, and whether the first settled before the
 * commit was sent (checked just before sending it, and when it settled).
 */
async function raceOnePoll(org: TestOrg, read: (since: Date) => Promise<Poll>) {
  const customer = await createCustomer(ctx, org, person());
  await sleep(5);
  const previous = await read(new Date(0));
  const write = await openSlowWrite(customer.id, `late-${Math.random()}`);
  await sleep(100);
  const pollStart = new Date();
  let settled = false;
  let committing = false;
  let settledAfterCommitSent = false;
  const polling = read(previous.start).then((result) => {
    settled = true;
    settledAfterCommitSent = committing;
    return result;
  });
  await sleep(300);
  const settledBeforeCommit = settled;
  committing = true;
  await write.commit();
  const poll = await polling;
  const next = await read(poll.start);
  const final = (await ctx.request('GET', `/v1/customers/${customer.id}`, { key: org.key })).json();
  const saw = (rows: Seen[]) => rows.some((row) => row.id === customer.id && row.updated_at === final.updated_at);
  return {
    final,
    writtenAt: write.writtenAt,
    pollStart,
    settledBeforeCommit,
    settledAfterCommitSent,
    pollSawIt: saw(poll.rows),
    nextPollSawIt: saw(next.rows),
  };
}

/** A poll through the API; its start is the poller's clock just before sending, or the response's Date header. */
function apiPoll(org: TestOrg, startFrom: 'own clock' | 'Date header') {
  return async (since: Date): Promise<Poll> => {
    const start = new Date();
    const response = await ctx.request('GET', '/v1/customers', {
      key: org.key,
      query: { updated_since: since.toISOString(), limit: '100' },
    });
    expect(response.statusCode, response.body).toBe(200);
    return { rows: response.json().data, start: startFrom === 'own clock' ? start : new Date(String(response.headers.date)) };
  };
}

describe('polling with updated_since (the spec: updated_since = the time the previous poll started)', () => {
  it('when a transaction has written a customer and a poll starts before it commits, the poll waits for the commit and returns the change', async () => {
    const org = await ctx.createOrg();
    const race = await raceOnePoll(org, apiPoll(org, 'own clock'));
    expect(race.settledBeforeCommit).toBe(false);
    expect(race.settledAfterCommitSent).toBe(true);
    expect(race.pollSawIt).toBe(true);
    // No commit-time re-stamp here (the commit lagged less than 500 ms): the change carries the
    // write's stamp, from before the poll started: only the wait let this poller see it.
    expect(new Date(race.final.updated_at).getTime()).toBe(race.writtenAt.getTime());
    expect(race.writtenAt.getTime()).toBeLessThan(race.pollStart.getTime());
  });

  it('when the poller passes the previous response Date header instead of its own clock, the poll waits and returns the change too', async () => {
    const org = await ctx.createOrg();
    const race = await raceOnePoll(org, apiPoll(org, 'Date header'));
    expect(race.settledBeforeCommit).toBe(false);
    expect(race.pollSawIt).toBe(true);
  });

  it('when the list is read without the drain statement, the same poller misses the late commit (the control)', async () => {
    const org = await ctx.createOrg();
    const repository = createCustomersRepository(ctx.database.db);
    const readWithoutDrain = async (since: Date): Promise<Poll> => {
      const start = new Date();
      return {
        rows: (await repository.list(org.id, { kind: 'individual', updatedSince: since }, 100, ctx.database.db)).map(asSeen),
        start,
      };
    };
    const race = await raceOnePoll(org, readWithoutDrain);
    expect(race.settledBeforeCommit).toBe(true);
    expect(race.pollSawIt).toBe(false);
    expect(race.nextPollSawIt).toBe(false);
    expect(new Date(race.final.updated_at).getTime()).toBeLessThan(race.pollStart.getTime());

    // The same read preceded by the drain, in the same race: it waits, and sees the change.
    const drained = await raceOnePoll(org, async (since) => {
      const start = new Date();
      await repository.drainChanges(org.id);
      return { ...(await readWithoutDrain(since)), start };
    });
    expect(drained.settledBeforeCommit).toBe(false);
    expect(drained.pollSawIt).toBe(true);
  });

  it('when a transaction holds its change longer than lock_timeout, the poll waits for it until lock_timeout ends the wait with 55P03, and writers of the organisation are not held up by the waiting poll', async () => {
    const org = await ctx.createOrg();
    const held = await createCustomer(ctx, org, person());
    const other = await createCustomer(ctx, org, person());
    const { rows } = await ctx.database.pool.query(`SELECT extract(epoch FROM current_setting('lock_timeout')::interval) * 1000 AS ms`);
    const lockTimeoutMs = Number(rows[0].ms);
    expect(lockTimeoutMs).toBeGreaterThan(0);
    const write = await openSlowWrite(held.id, 'held');
    const repository = createCustomersRepository(ctx.database.db);
    let pollSettled = false;
    const poll = repository.drainChanges(org.id).then(
      () => ({ failedWith: undefined as string | undefined, message: '' }),
      (error: unknown) => ({ failedWith: sqlStateOf(error), message: messagesOf(error) }),
    );
    void poll.then(() => (pollSettled = true));
    // The poll's statement waits for the held change's lock (how long it waits is bounded in
    // test/reliability/service-timing.test.ts).
    await vi.waitFor(
      async () => {
        const { rows: waiting } = await ctx.database.pool.query(
          `SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()`,
        );
        expect(waiting).toHaveLength(1);
      },
      { timeout: lockTimeoutMs, interval: 10 },
    );
    // Writers of the same organisation arriving while the poll waits go straight through: updates and an insert.
    const [patched, created] = await Promise.all([
      Promise.all(
        ['a', 'b', 'c'].map((phone) =>
          ctx.request('PATCH', `/v1/customers/${other.id}`, { key: org.key, body: { phone: `queued-${phone}` } }),
        ),
      ),
      upsert(ctx, org, person()),
    ]);
    const pollStillWaiting = !pollSettled;
    const outcome = await poll;
    await write.commit();
    expect(patched.map((response) => response.statusCode)).toEqual([200, 200, 200]);
    expect(created.statusCode).toBe(201);
    // The writers were done while the poll still waited: they did not queue behind it.
    expect(pollStillWaiting).toBe(true);
    // Ended by lock_timeout after waiting, not refused at once (NOWAIT's 55P03 says "could not obtain lock").
    expect(outcome.failedWith).toBe('55P03');
    expect(outcome.message).toMatch(/lock timeout/);
  });

  it('when a transaction holds its change longer than lock_timeout, a list of that organisation answers 503 database_unavailable with Retry-After, not 409', async () => {
    const org = await ctx.createOrg();
    const held = await createCustomer(ctx, org, person());
    const write = await openSlowWrite(held.id, 'held-list');
    try {
      const response = await ctx.request('GET', '/v1/customers', { key: org.key });
      expect(response.statusCode).toBe(503);
      expect(response.headers['retry-after']).toBe('1');
      expect(response.json().error.code).toBe('database_unavailable');
    } finally {
      await write.commit();
    }
    expect((await ctx.request('GET', '/v1/customers', { key: org.key })).statusCode).toBe(200);
  });

  it('when the poller overlaps its previous Date header by 1 s (the README recipe for pollers on other hosts), it sees a commit 0.8 s after the write, re-stamped at commit', async () => {
    const org = await ctx.createOrg();
    const customer = await createCustomer(ctx, org, person());
    const first = await ctx.request('GET', '/v1/customers', { key: org.key, query: { limit: '100' } });
    let previousDate = new Date(String(first.headers.date));
    const seen = new Set<string>();
    const write = await openSlowWrite(customer.id, 'overlap');
    let committed = false;
    const committing = sleep(800)
      .then(() => write.commit())
      .then((at) => {
        committed = true;
        return at;
      });
    for (let afterCommit = 0; afterCommit < 3;) {
      const since = new Date(previousDate.getTime() - 1_000).toISOString();
      const response = await ctx.request('GET', '/v1/customers', { key: org.key, query: { updated_since: since, limit: '100' } });
      expect(response.statusCode, response.body).toBe(200);
      for (const row of response.json().data as Seen[]) seen.add(`${row.id}@${row.updated_at}`);
      previousDate = new Date(String(response.headers.date));
      if (committed) afterCommit += 1;
      await sleep(200);
    }
    const committingAt = await committing;
    const final = (await ctx.request('GET', `/v1/customers/${customer.id}`, { key: org.key })).json();
    expect(seen).toContain(`${customer.id}@${final.updated_at}`);
    // The commit-time re-stamp (migrations 0005, 0008) still applies past 500 ms; harmless to pollers.
    expect(new Date(final.updated_at).getTime()).toBeGreaterThanOrEqual(committingAt - 5);
    expect(new Date(final.updated_at).getTime() - write.writtenAt.getTime()).toBeGreaterThanOrEqual(700);
  });
});

describe('updated_at stamps (migration 0009)', () => {
  it('when a record is inserted or changed, its updated_at is a whole millisecond after the clock, and a no-op write keeps it', async () => {
    const org = await ctx.createOrg();
    const customer = await createCustomer(ctx, org, person());
    const client = new pg.Client({ connectionString: ctx.databaseUrl });
    await client.connect();
    try {
      // Stamped with the next whole millisecond after the trigger's clock reading, so strictly later
      // than the statement's start; rounding to the nearest millisecond would often land at or before it.
      for (let i = 0; i < 50; i += 1) {
        const { rows } = await client.query(
          `UPDATE customers SET phone = $2 WHERE id = $1 RETURNING updated_at, statement_timestamp() AS started`,
          [customer.id, `stamp-${i}`],
        );
        const { updated_at: stamped, started } = rows[0] as { updated_at: Date; started: Date };
        expect(stamped.getTime()).toBeGreaterThan(started.getTime());
      }
      const { rows: noop } = await client.query(`UPDATE customers SET phone = phone WHERE id = $1 RETURNING updated_at`, [customer.id]);
      const { rows: again } = await client.query(`UPDATE customers SET phone = phone WHERE id = $1 RETURNING updated_at`, [customer.id]);
      expect(again[0].updated_at.getTime()).toBe(noop[0].updated_at.getTime());
      const { rows: inserted } = await client.query(
        `INSERT INTO customers (org_id, kind, type, name, kyc_status, added_via, updated_at)
         VALUES ($1, 'individual', 'INDIVIDUAL', 'Stamped on insert', 'NOT_REQUIRED', 'INTEGRATION', '2001-01-01')
         RETURNING updated_at, clock_timestamp() AS now`,
        [org.id],
      );
      // The database owns updated_at on insert as on update.
      expect(Math.abs(inserted[0].updated_at.getTime() - inserted[0].now.getTime())).toBeLessThan(1_000);
    } finally {
      await client.end();
    }
  });
});

function asSeen(row: { id: string; updatedAt: Date; phone: string | null }): Seen {
  return { id: row.id, updated_at: row.updatedAt.toISOString(), phone: row.phone };
}
