import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createDatabase, type Database } from '../../src/db/client.js';
import { createTestDatabase } from '../helpers/database.js';
import { ALL_SCOPES, testServices } from '../helpers/harness.js';
import { call, startServerProcess, type ServerProcess } from './processes.js';

/**
 * Issue 26 item 5: a poller that follows the spec to the letter (updated_since = the time its
 * previous poll started, no overlap, every page walked) never misses a committed change, however late
 * a transaction commits after its write. Six writers change 72 customers of one organisation for
 * POLLING_TEST_SECONDS (default 20): four through the API (upserts, some creating, and PATCHes), two
 * straight through SQL in transactions that sleep 0–1.5 s between their writes and their COMMIT. Two
 * pollers run meanwhile: one takes each poll's start from its own clock (same host), one from the
 * first page's Date header. At the end every record's final version (id + updated_at) must be among
 * what each poller saw. A control poller follows the same pattern with the list read alone, without
 * the drain statement, and its misses are printed (not asserted: they depend on timing). So is, for
 * each poller, `lateCommits`: the slow transactions committing under 450 ms after their write (no
 * commit-time re-stamp) during whose lag the poller started a poll (`raced`); how many of those
 * versions it returned (`returned`), and how many of the others another slow transaction had
 * overwritten before that poll ended (`overwritten`: a drained poll waits for that one too, since it
 * took its keys before queueing for the row). For the two pollers these must add up.
 */

const SECONDS = Number(process.env.POLLING_TEST_SECONDS ?? 20);
const API_RECORDS = 50; // poll-0 … poll-49 exist; the API writers also create poll-50 … poll-59
const SLOW_RECORDS = 12; // slow-0 … slow-11: written only by the slow SQL writers

let database: Database;
let url: string;
let drop: () => Promise<void>;
let server: ServerProcess;
let orgId: string;
let key: string;

beforeAll(async () => {
  const testDatabase = await createTestDatabase();
  url = testDatabase.url;
  drop = testDatabase.drop;
  database = createDatabase(testDatabase.url);
  server = await startServerProcess({ DATABASE_URL: testDatabase.url });
  const org = await testServices(database).organisations.create({ name: 'Polling', credits: 0 });
  orgId = org.id;
  key = (await testServices(database).apiKeys.create({ orgId, scopes: ALL_SCOPES })).key;
  for (let i = 0; i < API_RECORDS; i += 1) {
    const response = await call(server, 'POST', '/v1/customers', { key, body: apiPerson(i, 'seed') });
    expect(response.status, response.body).toBe(201);
  }
  for (let i = 0; i < SLOW_RECORDS; i += 1) {
    const response = await call(server, 'POST', '/v1/customers', {
      key,
      body: { externalId: `slow-${i}`, fullName: `Slow Person ${i}`, email: `slow${i}@poll.test` },
    });
    expect(response.status, response.body).toBe(201);
  }
});

afterAll(async () => {
  await server?.stop();
  await database?.close();
  await drop?.();
});

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const pick = (n: number) => Math.floor(Math.random() * n);

function apiPerson(i: number, phone: string) {
  return { externalId: `poll-${i}`, fullName: `Poll Person ${i}`, email: `poll${i}@poll.test`, phone };
}

type Version = { id: string; updated_at: string };
type PollerFigures = {
  polls: number;
  pages: number;
  failedRequests: number;
  /** Distinct versions (id + updated_at) returned. */
  versionsSeen: number;
  longestPollMs: number;
};

/** A change by a slow writer that commits within 500 ms of its write (so it keeps its stamp: no commit-time re-stamp). */
type SlowCommit = { id: string; version: string; stampedAt: number; committingAt: number };

/**
 * A poller: each poll walks every page of `read(since, cursor)` with updated_since = the start of the
 * previous poll (the first poll has none); `read` reports the poll's start from its first page.
 */
function poller(
  read: (
    since: Date | undefined,
    cursor: string | undefined,
  ) => Promise<{ rows: Version[]; nextCursor: string | null; start: Date } | undefined>,
) {
  const seen = new Set<string>();
  const figures: PollerFigures = { polls: 0, pages: 0, failedRequests: 0, versionsSeen: 0, longestPollMs: 0 };
  /** When each poll began and ended, by this process's clock. */
  const polls: Array<{ began: number; ended: number }> = [];
  let since: Date | undefined;
  return {
    seen,
    figures,
    /** The late commits during whose lag this poller started a poll, and how many of them it returned. */
    raced(slowCommits: SlowCommit[]) {
      let raced = 0;
      let returned = 0;
      let overwritten = 0;
      for (const late of slowCommits.filter((commit) => commit.committingAt - commit.stampedAt < 450)) {
        const poll = polls.find((each) => each.began > late.stampedAt && each.began < late.committingAt);
        if (!poll) continue;
        raced += 1;
        if (seen.has(late.version)) returned += 1;
        else if (slowCommits.some((other) => other.id === late.id && other.stampedAt > late.stampedAt && other.committingAt < poll.ended))
          overwritten += 1;
      }
      return { raced, returned, overwritten };
    },
    async poll() {
      const pollBegan = Date.now();
      let start: Date | undefined;
      let cursor: string | undefined;
      for (;;) {
        const page = await read(since, cursor);
        if (!page) {
          // A failed request (the drain's lock wait ran out, say) is asked again: the poll goes on.
          figures.failedRequests += 1;
          await sleep(50);
          continue;
        }
        figures.pages += 1;
        start ??= page.start;
        for (const row of page.rows) seen.add(`${row.id}@${row.updated_at}`);
        if (!page.nextCursor) break;
        cursor = page.nextCursor;
      }
      since = start;
      figures.polls += 1;
      figures.versionsSeen = seen.size;
      figures.longestPollMs = Math.max(figures.longestPollMs, Date.now() - pollBegan);
      polls.push({ began: pollBegan, ended: Date.now() });
    },
  };
}

/** A poll through the API; its start is this process's clock just before the first page, or that page's Date header. */
function apiRead(startFrom: 'own clock' | 'Date header') {
  return async (since: Date | undefined, cursor: string | undefined) => {
    const before = new Date();
    const query = new URLSearchParams({ limit: '25' });
    if (since) query.set('updated_since', since.toISOString());
    if (cursor) query.set('cursor', cursor);
    const response = await call(server, 'GET', `/v1/customers?${query}`, { key });
    if (response.status !== 200) return undefined;
    const page = JSON.parse(response.body) as { data: Version[]; next_cursor: string | null };
    const start = startFrom === 'own clock' ? before : new Date(response.headers.get('date')!);
    return { rows: page.data, nextCursor: page.next_cursor, start };
  };
}

/** The control: the list's read alone (one statement, all pages at once), without the drain statement before it. */
function readWithoutDrain(client: pg.Client) {
  return async (since: Date | undefined) => {
    const start = new Date();
    const { rows } = await client.query(
      `SELECT id, updated_at FROM customers WHERE org_id = $1 AND kind = 'individual' AND ($2::timestamptz IS NULL OR updated_at > $2) ORDER BY created_at, id`,
      [orgId, since ?? null],
    );
    return {
      rows: rows.map((row) => ({ id: row.id as string, updated_at: (row.updated_at as Date).toISOString() })),
      nextCursor: null,
      start,
    };
  };
}

describe('exact polling under concurrent and late-committing writers', () => {
  it(`when 6 writers change 72 customers for ${SECONDS} s, some committing up to 1.5 s after their writes, a poller following the spec misses no final version`, async () => {
    const deadline = Date.now() + SECONDS * 1000;
    const writes = { api: 0, apiFailed: 0, slowTransactions: 0, slowFailed: 0, slowCommitLagMs: 0 };
    const slowCommits: SlowCommit[] = [];

    const apiWriter = async (writer: number) => {
      for (let n = 0; Date.now() < deadline; n += 1) {
        const i = pick(API_RECORDS + 10);
        const phone = `w${writer}-${n}`;
        const response =
          n % 2 === 0 || i >= API_RECORDS
            ? await call(server, 'POST', '/v1/customers', { key, body: apiPerson(i, phone) })
            : await call(server, 'PATCH', `/v1/customers/poll-${i}`, { key, body: { phone } });
        if (response.status === 200 || response.status === 201) writes.api += 1;
        else writes.apiFailed += 1;
        await sleep(pick(20));
      }
    };

    const slowWriter = async (writer: number) => {
      const client = new pg.Client({ connectionString: url });
      client.on('error', () => {});
      await client.connect();
      try {
        for (let n = 0; Date.now() < deadline; n += 1) {
          const i = pick(SLOW_RECORDS);
          const lag = Math.random() * 1.5;
          try {
            await client.query('BEGIN');
            const { rows } = await client.query(
              `INSERT INTO customers (org_id, kind, type, name, email, phone, kyc_status, added_via, external_id)
               VALUES ($1, 'individual', 'INDIVIDUAL', $2, $3, $4, 'NOT_REQUIRED', 'INTEGRATION', $5)
               ON CONFLICT (org_id, external_id) WHERE external_id IS NOT NULL DO UPDATE SET phone = EXCLUDED.phone
               RETURNING id, updated_at`,
              [orgId, `Slow Person ${i}`, `slow${i}@poll.test`, `s${writer}-${n}`, `slow-${i}`],
            );
            const stampedAt = (rows[0].updated_at as Date).getTime();
            await client.query('SELECT pg_sleep($1)', [lag]);
            const committingAt = Date.now();
            await client.query('COMMIT');
            writes.slowTransactions += 1;
            writes.slowCommitLagMs = Math.max(writes.slowCommitLagMs, Date.now() - stampedAt);
            slowCommits.push({
              id: rows[0].id,
              version: `${rows[0].id}@${(rows[0].updated_at as Date).toISOString()}`,
              stampedAt,
              committingAt,
            });
          } catch {
            writes.slowFailed += 1;
            await client.query('ROLLBACK').catch(() => {});
          }
        }
      } finally {
        await client.end();
      }
    };

    const ownClock = poller(apiRead('own clock'));
    const dateHeader = poller(apiRead('Date header'));
    const controlClient = new pg.Client({ connectionString: url });
    await controlClient.connect();
    const control = poller(readWithoutDrain(controlClient));
    let writing = true;
    const polling = [ownClock, dateHeader, control].map(async (each) => {
      while (writing) {
        await each.poll();
        await sleep(pick(100));
      }
      // One more poll, started after every writer has finished: what a poller does next.
      await each.poll();
    });

    await Promise.all([0, 1, 2, 3].map(apiWriter).concat([4, 5].map(slowWriter)));
    writing = false;
    await Promise.all(polling);
    await controlClient.end();

    const { rows } = await database.pool.query(`SELECT id, updated_at FROM customers WHERE org_id = $1 AND kind = 'individual'`, [orgId]);
    const finals = rows.map((row) => `${row.id}@${(row.updated_at as Date).toISOString()}`);
    const missed = (seen: Set<string>) => finals.filter((version) => !seen.has(version));
    const report = {
      seconds: SECONDS,
      records: finals.length,
      writes,
      ownClock: { ...ownClock.figures, lateCommits: ownClock.raced(slowCommits), missed: missed(ownClock.seen).length },
      dateHeader: { ...dateHeader.figures, lateCommits: dateHeader.raced(slowCommits), missed: missed(dateHeader.seen).length },
      controlWithoutDrain: { ...control.figures, lateCommits: control.raced(slowCommits), missed: missed(control.seen).length },
    };
    process.stderr.write(`polling: ${JSON.stringify(report)}\n`);

    expect(finals.length).toBe(API_RECORDS + 10 + SLOW_RECORDS);
    expect(writes.slowTransactions).toBeGreaterThan(SECONDS);
    expect(missed(ownClock.seen)).toEqual([]);
    expect(missed(dateHeader.seen)).toEqual([]);
    for (const { raced, returned, overwritten } of [report.ownClock.lateCommits, report.dateHeader.lateCommits])
      expect(returned + overwritten).toBe(raced);
    expect(ownClock.figures.polls).toBeGreaterThanOrEqual(SECONDS / 2);
    expect(dateHeader.figures.polls).toBeGreaterThanOrEqual(SECONDS / 2);
  });
});
