/**
 * `npm run bench:events` (issue 34, item 2): upserts per second that write an event, against the same
 * upserts with events off, side by side in one run on one server. The gap must stay at most 15%.
 *
 * One project server (production build, default configuration, WEBHOOK_WORKER=off as docker-compose.yml
 * runs the API) serves three organisations, each with 1,000 records seeded alike, upserted by
 * externalId with a changing phone (every measured request is an update):
 *
 * - `events on`: the records belong to the integration (added_via INTEGRATION) and the organisation
 *   has one enabled endpoint for every event type: each upsert writes its `customer.updated` event, one
 *   pending delivery, and wakes the delivery workers.
 * - `event row only`: the same records, no endpoint: the event is written (the events feed keeps it)
 *   but no delivery is queued and nobody is woken.
 * - `events off`: the records were not created by the integration (added_via BULK_IMPORT), so an
 *   upsert fires no `customer.updated` at all: no event row, no delivery, no wake.
 *
 * The three take turns (ABC, CBA, …) for BENCH_ROUNDS rounds (10) of BENCH_DURATION seconds (4); the
 * report gives medians, each round's on/off ratio (the gap is the median of those), CPU per request
 * of the server and of the scratch database's backends, and the rows each side wrote (a check that
 * the sides did what they are named for).
 */
import type { ChildProcess } from 'node:child_process';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { dirname, join } from 'node:path';
import type pg from 'pg';
import {
  build,
  cpuTicks,
  createBenchOrganisation,
  createScratchDatabase,
  freeLoopbackPort,
  LOG_DIR,
  logVolume,
  median,
  projectServerEnv,
  root,
  startProcess,
  svc,
  upsertLoad,
  upsertsSent,
  type Measure,
} from './harness.js';

const RESULTS = process.env.BENCH_RESULTS ?? join(root, 'bench', 'results', 'events.md');
const MAX_GAP = 0.15;
/**
 * More, shorter turns than `npm run bench` (6 of 5 s by default): on a shared machine the load of
 * other processes drifts over tens of seconds, and short alternating turns spread it over the sides.
 */
const ROUNDS = Math.max(1, Number(process.env.BENCH_ROUNDS ?? 10));
const DURATION = Number(process.env.BENCH_DURATION ?? 4);
const TICK_US = 1_000_000 / 100; // USER_HZ is 100 on Linux
const SIDES = ['events on', 'event row only', 'events off'] as const;
type Side = (typeof SIDES)[number];

/** 1,000 records the upserts update (bench-0 … bench-999, its names and emails), owned as `addedVia` says. */
async function seedUpsertTargets(pool: pg.Pool, orgId: string, addedVia: 'INTEGRATION' | 'BULK_IMPORT'): Promise<void> {
  await pool.query(
    `INSERT INTO customers (org_id, kind, external_id, type, name, email, kyc_status, added_via)
     SELECT $1, 'individual', 'bench-' || g, 'INDIVIDUAL', 'Bench Person ' || g, 'p' || g || '@bench.test', 'NOT_REQUIRED', $2
       FROM generate_series(0, 999) AS g`,
    [orgId, addedVia],
  );
}

/** CPU ticks of the PostgreSQL backends connected to the scratch database (not the whole machine's PostgreSQL, which other work shares). */
async function backendTicks(pool: pg.Pool): Promise<Map<number, number>> {
  const { rows } = await pool.query<{ pid: number }>('SELECT pid FROM pg_stat_activity WHERE datname = current_database()');
  return new Map(rows.map((row) => [row.pid, cpuTicks(row.pid)]));
}

async function backendTicksSince(pool: pg.Pool, before: Map<number, number>): Promise<number> {
  let spent = 0;
  for (const [pid, ticks] of await backendTicks(pool)) spent += ticks - (before.get(pid) ?? 0);
  return spent;
}

async function writtenRows(pool: pg.Pool, orgId: string): Promise<{ events: number; deliveries: number }> {
  const { rows } = await pool.query<{ events: number; deliveries: number }>(
    `SELECT (SELECT count(*)::int FROM outbox_events WHERE org_id = $1) AS events,
            (SELECT count(*)::int FROM webhook_deliveries WHERE org_id = $1) AS deliveries`,
    [orgId],
  );
  return rows[0]!;
}

async function main() {
  build();
  const scratch = await createScratchDatabase('svc_events');
  const { url, pool } = scratch;
  let server: ChildProcess | undefined;
  try {
    const orgs: Record<Side, { id: string; key: string }> = {
      'events on': { id: scratch.org.id, key: scratch.key },
      'event row only': createBenchOrganisation(url, 'Bench, no endpoint'),
      'events off': createBenchOrganisation(url, "Bench, records not the integration's"),
    };
    // The endpoint is never called (no worker runs): its deliveries stay pending. A private URL needs
    // the CLI's WEBHOOK_ALLOW_PRIVATE_URLS; the server itself runs at its defaults.
    svc(url, ['webhook', 'add', '--org', orgs['events on'].id, '--url', 'http://127.0.0.1:9/bench'], {
      WEBHOOK_ALLOW_PRIVATE_URLS: 'true',
    });
    await seedUpsertTargets(pool, orgs['events on'].id, 'INTEGRATION');
    await seedUpsertTargets(pool, orgs['event row only'].id, 'INTEGRATION');
    await seedUpsertTargets(pool, orgs['events off'].id, 'BULK_IMPORT');
    await pool.query('ANALYZE');

    const port = await freeLoopbackPort();
    server = await startProcess(['bin/svc.js', 'serve'], projectServerEnv(url, port), `http://127.0.0.1:${port}/readyz`, 'project');
    const run = (side: Side, duration?: number) =>
      upsertLoad(
        server!,
        `http://127.0.0.1:${port}/v1/customers`,
        { authorization: `Bearer ${orgs[side].key}`, 'content-type': 'application/json' },
        duration ?? DURATION,
      );

    for (const side of SIDES) await run(side, 2); // warm-up: JIT, prepared statements, caches
    const before = Object.fromEntries(
      await Promise.all(SIDES.map(async (side) => [side, await writtenRows(pool, orgs[side].id)] as const)),
    ) as Record<Side, { events: number; deliveries: number }>;
    const measures: Record<Side, Measure[]> = { 'events on': [], 'event row only': [], 'events off': [] };
    const requests: Record<Side, number> = { 'events on': 0, 'event row only': 0, 'events off': 0 };
    const databaseCpu: Record<Side, number[]> = { 'events on': [], 'event row only': [], 'events off': [] };
    for (let round = 0; round < ROUNDS; round += 1) {
      const order = round % 2 === 0 ? SIDES : [...SIDES].reverse();
      for (const side of order) {
        const sentBefore = upsertsSent();
        const ticksBefore = await backendTicks(pool);
        measures[side].push(await run(side));
        const count = Math.max(1, upsertsSent() - sentBefore);
        databaseCpu[side].push(Math.round(((await backendTicksSince(pool, ticksBefore)) * TICK_US) / count));
        requests[side] += count;
      }
    }
    const after = Object.fromEntries(
      await Promise.all(SIDES.map(async (side) => [side, await writtenRows(pool, orgs[side].id)] as const)),
    ) as Record<Side, { events: number; deliveries: number }>;

    const rps = (side: Side) => median(measures[side].map((measure) => measure.rps));
    // Each round's sides ran within seconds of each other: the median of the rounds' ratios is what
    // the load of other processes on a shared machine moves least.
    const perRound = measures['events on'].map((measure, index) => measure.rps / measures['events off'][index]!.rps);
    const gap = 1 - median(perRound);
    const cpu = (side: Side) => median(measures[side].map((measure) => measure.serverCpuUs)) + median(databaseCpu[side]);
    const lines = [
      '# Upserts with events on and off (issue 34, item 2)',
      '',
      `Production build, default configuration (LOG_LEVEL info, pool of 10), WEBHOOK_WORKER=off; one server for all three sides; ${ROUNDS} rounds of ${DURATION} s per side, taking turns; medians. ${cpus().length} × ${cpus()[0]?.model ?? 'cpu'}, Node ${process.version}.`,
      '',
      "| Side | Upserts/s (median) | Per round | p50 / p99 ms | CPU µs per request: server / this database's backends | Rows written per request: events, deliveries | Errors/non-2xx |",
      '|---|---:|---|---|---|---|---:|',
      ...SIDES.map((side) => {
        const sideMeasures = measures[side];
        const written = { events: after[side].events - before[side].events, deliveries: after[side].deliveries - before[side].deliveries };
        const per = (count: number) => (count / Math.max(1, requests[side])).toFixed(2);
        return `| ${side} | ${Math.round(rps(side))} | ${sideMeasures.map((measure) => measure.rps).join(', ')} | ${median(sideMeasures.map((m) => m.p50))} / ${median(sideMeasures.map((m) => m.p99))} | ${median(sideMeasures.map((m) => m.serverCpuUs))} / ${median(databaseCpu[side])} | ${per(written.events)}, ${per(written.deliveries)} | ${sideMeasures.reduce((sum, m) => sum + m.errors + m.non2xx, 0)} |`;
      }),
      '',
      `Events on / events off, upserts/s, median of the rounds' ratios: ${(1 - gap).toFixed(3)} (per round: ${perRound.map((ratio) => ratio.toFixed(2)).join(', ')}); the gap is ${(gap * 100).toFixed(1)}% against at most ${MAX_GAP * 100}%: ${gap <= MAX_GAP ? 'met' : 'MISSED'}.`,
      `CPU per upsert (server + this database's backends): events on ${cpu('events on')} µs, event row only ${cpu('event row only')} µs, events off ${cpu('events off')} µs: events cost ${((cpu('events on') / cpu('events off') - 1) * 100).toFixed(1)}% more CPU per upsert (the delivery row and the wake ${((cpu('events on') / cpu('event row only') - 1) * 100).toFixed(1)}%).`,
      '',
      `Log lines written by the server: ${logVolume('project').lines.toLocaleString('en')}.`,
      '',
    ];
    const report = `${lines.join('\n')}\n`;
    process.stdout.write(report);
    mkdirSync(dirname(RESULTS), { recursive: true });
    writeFileSync(RESULTS, report);
    process.stdout.write(`Report written to ${RESULTS}\n`);
  } finally {
    server?.kill('SIGTERM');
    await scratch.drop();
    if (!process.env.BENCH_LOG_DIR) rmSync(LOG_DIR, { recursive: true, force: true });
  }
}

await main();
