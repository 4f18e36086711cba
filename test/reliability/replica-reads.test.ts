import type { FastifyInstance } from 'fastify';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp } from '../../src/app.js';
import { createDatabase, type Database } from '../../src/db/client.js';
import { runMigrations } from '../../src/db/migrate.js';
import { ALL_SCOPES, testConfig, testServices } from '../helpers/harness.js';
import { clusterBinariesPresent, startCluster, startStandby, type PgCluster } from '../helpers/pg-cluster.js';

/**
 * Issue 34 item 5: list pages read from a streaming replica only once it has replayed everything the
 * primary had committed when the page began (src/db/page-reads.ts), so the spec's polling pattern
 * stays exact. A private primary (initdb, wal_level replica) and a `pg_basebackup -R` hot standby of
 * it; two apps on both, one with the replay check and one without (the negative control). Writers
 * change customers through the API while the standby's replay is paused and resumed at random; three
 * pollers follow the spec (updated_since = the start of their previous poll, every page walked). At
 * the end every record's final version (id + updated_at, read on the primary) must be among what each
 * exact poller saw; the control must have missed some. The run ends with replay paused while the
 * writers finish, so the control's last poll reads a stale replica whatever the timing before.
 */

// The machine's PostgreSQL server binaries run the private clusters; without them (a machine that
// reaches PostgreSQL only through DATABASE_URL or Docker) the test cannot build a standby, and says so.
const BINARIES = clusterBinariesPresent();
if (!BINARIES) process.stderr.write('replica reads: no PostgreSQL server binaries (PG_BIN, default /usr/lib/postgresql/15/bin): skipped\n');

const SECONDS = Number(process.env.REPLICA_TEST_SECONDS ?? 15);
const RECORDS = 40;
const PAGE = '10';

let primary: PgCluster;
let standby: PgCluster;
let database: Database;
let replica: Database;
let exactApp: FastifyInstance;
let controlApp: FastifyInstance;
let standbyAdmin: pg.Client;
let orgId: string;
let key: string;

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const pick = (n: number) => Math.floor(Math.random() * n);

beforeAll(async () => {
  if (!BINARIES) return;
  primary = await startCluster({ wal_level: 'replica', max_wal_senders: 4 });
  await runMigrations(primary.url());
  standby = await startStandby(primary);
  database = createDatabase(primary.url(), { poolSize: 12 });
  replica = createDatabase(standby.url(), { poolSize: 12, connectTimeoutMs: 1_000 });
  const config = testConfig({ databaseUrl: primary.url() });
  exactApp = await buildApp({ config, database, replica, logger: false });
  controlApp = await buildApp({ config, database, replica, exactReplicaReads: false, logger: false });
  await Promise.all([exactApp.ready(), controlApp.ready()]);
  await connectStandbyAdmin();
  const org = await testServices(database).organisations.create({ name: 'Replica reads', credits: 0 });
  orgId = org.id;
  key = (await testServices(database).apiKeys.create({ orgId, scopes: ALL_SCOPES })).key;
  for (let i = 0; i < RECORDS; i += 1) {
    const response = await call(exactApp, 'POST', '/v1/customers', person(i, 'seed'));
    expect(response.statusCode, response.body).toBe(201);
  }
  await caughtUp();
}, 120_000);

afterAll(async () => {
  await standbyAdmin?.end().catch(() => {});
  await exactApp?.close();
  await controlApp?.close();
  await replica?.close();
  await database?.close();
  await standby?.stop();
  await primary?.stop();
});

function person(i: number, phone: string) {
  return { externalId: `rep-${i}`, fullName: `Replica Person ${i}`, email: `rep${i}@replica.test`, phone };
}

function call(app: FastifyInstance, method: 'GET' | 'POST' | 'PATCH', url: string, body?: object) {
  return app.inject({ method, url, headers: { authorization: `Bearer ${key}` }, ...(body ? { payload: body } : {}) });
}

async function connectStandbyAdmin(): Promise<void> {
  standbyAdmin = new pg.Client({ connectionString: standby.url() });
  // The standby is stopped on purpose in a test: its end is not this process's failure.
  standbyAdmin.on('error', () => {});
  await standbyAdmin.connect();
}

/** Waits until the standby has replayed everything the primary has written so far. */
async function caughtUp(): Promise<void> {
  const { rows } = await database.pool.query<{ lsn: string }>('SELECT pg_current_wal_insert_lsn()::text AS lsn');
  for (let attempt = 0; attempt < 300; attempt += 1) {
    const { rows: replayed } = await standbyAdmin.query<{ done: boolean }>('SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn AS done', [
      rows[0]!.lsn,
    ]);
    if (replayed[0]?.done) return;
    await sleep(50);
  }
  throw new Error(`the standby did not catch up\n${standby.log().slice(-2_000)}`);
}

/** Pages by where they were read and why, from the app's /metrics counter. */
async function pageReads(app: FastifyInstance): Promise<Record<string, number>> {
  const metric = app.metricsRegistry.getSingleMetric('list_page_reads_total');
  const counts: Record<string, number> = {};
  for (const value of (await metric!.get()).values) counts[`${value.labels.target}:${value.labels.reason}`] = value.value;
  return counts;
}

type Version = { id: string; updated_at: string };

/** A poller of GET /v1/customers that follows the spec; its poll's start is its own clock or the first page's Date header. */
function poller(app: FastifyInstance, startFrom: 'own clock' | 'Date header') {
  const seen = new Set<string>();
  const figures = { polls: 0, pages: 0, failedRequests: 0 };
  let since: Date | undefined;
  return {
    seen,
    figures,
    async poll() {
      let start: Date | undefined;
      let cursor: string | undefined;
      for (;;) {
        const before = new Date();
        const query = new URLSearchParams({ limit: PAGE });
        if (since) query.set('updated_since', since.toISOString());
        if (cursor) query.set('cursor', cursor);
        const response = await call(app, 'GET', `/v1/customers?${query}`);
        if (response.statusCode !== 200) {
          figures.failedRequests += 1;
          await sleep(50);
          continue;
        }
        figures.pages += 1;
        start ??= startFrom === 'own clock' ? before : new Date(String(response.headers.date));
        const page = response.json<{ data: Version[]; next_cursor: string | null }>();
        for (const row of page.data) seen.add(`${row.id}@${row.updated_at}`);
        if (!page.next_cursor) break;
        cursor = page.next_cursor;
      }
      since = start;
      figures.polls += 1;
    },
  };
}

/** API writers: upserts and PATCHes of random records until `until()` is false; failures counted. */
function writers(count: number, until: () => boolean, writes: { ok: number; failed: number }) {
  return Array.from({ length: count }, async (_, writer) => {
    for (let n = 0; until(); n += 1) {
      const i = pick(RECORDS);
      const phone = `w${writer}-${n}`;
      const response =
        n % 2 === 0
          ? await call(exactApp, 'POST', '/v1/customers', person(i, phone))
          : await call(exactApp, 'PATCH', `/v1/customers/rep-${i}`, { phone });
      if (response.statusCode === 200 || response.statusCode === 201) writes.ok += 1;
      else writes.failed += 1;
      await sleep(pick(15));
    }
  });
}

async function finalVersions(): Promise<string[]> {
  const { rows } = await database.pool.query(`SELECT id, updated_at FROM customers WHERE org_id = $1 AND kind = 'individual'`, [orgId]);
  return rows.map((row) => `${row.id}@${(row.updated_at as Date).toISOString()}`);
}

describe.skipIf(!BINARIES)('list pages on a streaming replica', () => {
  it(`when replay pauses at random for ${SECONDS} s while writers change customers, a poller following the spec misses no final version, and without the replay check it misses some`, async () => {
    const deadline = Date.now() + SECONDS * 1000;
    const writes = { ok: 0, failed: 0 };
    const pauses = { count: 0, pausedMs: 0 };
    let writing = true;

    // Replay paused and resumed at random; paused for good once the writers are about to stop.
    const pausing = (async () => {
      while (Date.now() < deadline - 1_500) {
        const paused = 150 + pick(1_100);
        await standbyAdmin.query('SELECT pg_wal_replay_pause()');
        pauses.count += 1;
        pauses.pausedMs += paused;
        await sleep(Math.min(paused, Math.max(0, deadline - 1_500 - Date.now())));
        await standbyAdmin.query('SELECT pg_wal_replay_resume()');
        await sleep(100 + pick(500));
      }
      await standbyAdmin.query('SELECT pg_wal_replay_pause()');
    })();

    const ownClock = poller(exactApp, 'own clock');
    const dateHeader = poller(exactApp, 'Date header');
    const control = poller(controlApp, 'own clock');
    const polling = [ownClock, dateHeader, control].map(async (each) => {
      while (writing) {
        await each.poll();
        await sleep(pick(100));
      }
    });

    await Promise.all(writers(4, () => Date.now() < deadline, writes));
    await pausing;
    writing = false;
    await Promise.all(polling);
    // A poll while replay is still paused after the last write: the control reads the stale replica.
    for (const each of [ownClock, dateHeader, control]) await each.poll();
    await standbyAdmin.query('SELECT pg_wal_replay_resume()');
    await caughtUp();
    // And one more once the replica has caught up: what a poller does next.
    for (const each of [ownClock, dateHeader, control]) await each.poll();

    const finals = await finalVersions();
    const missed = (seen: Set<string>) => finals.filter((version) => !seen.has(version));
    const exactReads = await pageReads(exactApp);
    const report = {
      seconds: SECONDS,
      records: finals.length,
      writes,
      pauses,
      exactPageReads: exactReads,
      controlPageReads: await pageReads(controlApp),
      ownClock: { ...ownClock.figures, missed: missed(ownClock.seen).length },
      dateHeader: { ...dateHeader.figures, missed: missed(dateHeader.seen).length },
      controlWithoutReplayCheck: { ...control.figures, missed: missed(control.seen).length },
    };
    process.stderr.write(`replica reads: ${JSON.stringify(report)}\n`);

    expect(finals.length).toBe(RECORDS);
    expect(writes.failed).toBe(0);
    expect(writes.ok).toBeGreaterThan(SECONDS * 10);
    expect(pauses.count).toBeGreaterThan(2);
    // Both paths were taken: pages read on the replica, and pages sent to the primary while it lagged.
    expect(exactReads['replica:replayed'] ?? 0).toBeGreaterThan(0);
    expect(exactReads['primary:lagging'] ?? 0).toBeGreaterThan(0);
    expect(ownClock.figures.failedRequests + dateHeader.figures.failedRequests).toBe(0);
    expect(missed(ownClock.seen)).toEqual([]);
    expect(missed(dateHeader.seen)).toEqual([]);
    // The negative control: the same pattern on a replica read without the check loses changes for good.
    expect(missed(control.seen).length).toBeGreaterThan(0);
  });

  it('when the standby stops mid-test, every request still succeeds from the primary, and the replica serves again once it is back', async () => {
    await caughtUp();
    const before = await pageReads(exactApp);
    const writes = { ok: 0, failed: 0 };
    const lists = { ok: 0, failed: 0 };
    let running = true;
    const exact = poller(exactApp, 'own clock');
    const polling = (async () => {
      while (running) {
        await exact.poll();
        const entities = await call(exactApp, 'GET', '/v1/entities?limit=5');
        if (entities.statusCode === 200) lists.ok += 1;
        else lists.failed += 1;
        await sleep(pick(50));
      }
    })();
    const writing = Promise.all(writers(2, () => running, writes));

    await sleep(1_500);
    await standby.halt();
    await sleep(2_500);
    const whileDown = await pageReads(exactApp);
    await standby.start();
    await connectStandbyAdmin();
    // The replica is tried again after its retry interval (5 s): wait until a page reads there.
    let back = false;
    for (let attempt = 0; attempt < 100 && !back; attempt += 1) {
      await sleep(200);
      back = ((await pageReads(exactApp))['replica:replayed'] ?? 0) > (whileDown['replica:replayed'] ?? 0);
    }
    running = false;
    await Promise.all([polling, writing]);
    await caughtUp();
    await exact.poll();

    const after = await pageReads(exactApp);
    const delta = (name: string, from: Record<string, number>, to: Record<string, number>) => (to[name] ?? 0) - (from[name] ?? 0);
    const report = { writes, lists, poller: exact.figures, whileDown, after };
    process.stderr.write(`replica outage: ${JSON.stringify(report)}\n`);

    expect(writes.failed).toBe(0);
    expect(lists.failed).toBe(0);
    expect(exact.figures.failedRequests).toBe(0);
    expect(delta('primary:replica_error', before, whileDown)).toBeGreaterThan(0);
    expect(delta('primary:replica_down', before, whileDown)).toBeGreaterThan(0);
    expect(back).toBe(true);
    const finals = await finalVersions();
    expect(finals.filter((version) => !exact.seen.has(version))).toEqual([]);
  });
});
