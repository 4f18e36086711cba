/**
 * `npm run bench`: each scenario runs against the project's server and a bare baseline in the same
 * run, and reports req/s, p50/p99 latency, the project/baseline ratio and the servers' RSS.
 * Needs DATABASE_URL (a scratch database is created on that server and dropped afterwards).
 */
import type { ChildProcess } from 'node:child_process';
import { writeFileSync, mkdirSync } from 'node:fs';
import { cpus, totalmem } from 'node:os';
import { join } from 'node:path';
import { freeLoopbackPort } from '../src/db/embedded-postgres.js';
import {
  build,
  compare,
  CONNECTIONS,
  createScratchDatabase,
  DURATION,
  LARGE,
  load,
  median,
  projectServerEnv,
  root,
  ROUNDS,
  rssMb,
  SCENARIOS,
  seed,
  startProcess,
  upsertLoad,
  type Measure,
} from './harness.js';

async function main() {
  const scratch = await createScratchDatabase('svc_bench');
  const { url, database, org, key } = scratch;

  // Benchmark what operators run: the compiled build under NODE_ENV=production.
  build();
  const projectPort = await freeLoopbackPort();
  const baselinePort = await freeLoopbackPort();
  // BENCH_CPU_PROF=DIR writes a V8 CPU profile of the project's server there (open it in Chrome DevTools).
  const profile = process.env.BENCH_CPU_PROF ? ['--cpu-prof', `--cpu-prof-dir=${process.env.BENCH_CPU_PROF}`] : [];
  const project = await startProcess([...profile, 'bin/svc.js', 'serve'], projectServerEnv(url, projectPort), `http://127.0.0.1:${projectPort}/readyz`);
  const baseline = await startProcess(['--import', 'tsx', 'bench/baseline-server.ts'], { DATABASE_URL: url, PORT: String(baselinePort), BENCH_ORG_ID: org.id }, `http://127.0.0.1:${baselinePort}/healthz`);
  const projectUrl = `http://127.0.0.1:${projectPort}`;
  const baselineUrl = `http://127.0.0.1:${baselinePort}`;
  const auth = { authorization: `Bearer ${key}`, 'content-type': 'application/json' };
  const rows: Array<{ scenario: string; project: Measure; baseline: Measure }> = [];
  const rss = { project: 0, baseline: 0 };
  const sampleRss = () => {
    rss.project = Math.max(rss.project, rssMb(project.pid!));
    rss.baseline = Math.max(rss.baseline, rssMb(baseline.pid!));
  };
  const sampler = setInterval(sampleRss, 250);

  try {
    // Seed one customer through the API so both servers read the same row.
    const seeded = await fetch(`${projectUrl}/v1/customers`, {
      method: 'POST',
      headers: auth,
      body: JSON.stringify({ externalId: 'bench-read', fullName: 'Bench Reader', email: 'reader@bench.test' }),
    }).then((response) => response.json() as Promise<{ id: string }>);

    // Warm-up, then GET by id, among 10,000 customers of the organisation (an empty table would hide
    // a lookup that scans the organisation).
    if (SCENARIOS.has('get')) {
      await seed(database, org.id, 10_000);
      await load(baseline, { url: `${baselineUrl}/customers/${seeded.id}`, duration: 2 });
      await load(project, { url: `${projectUrl}/v1/customers/${seeded.id}`, headers: auth, duration: 2 });
      rows.push({
        scenario: 'GET /v1/customers/{id}',
        ...(await compare(
          () => load(baseline, { url: `${baselineUrl}/customers/${seeded.id}` }),
          () => load(project, { url: `${projectUrl}/v1/customers/${seeded.id}`, headers: auth }),
        )),
      });
    }

    const upsert = (server: ChildProcess, base: string, path: string, headers: Record<string, string>, duration = DURATION) =>
      upsertLoad(server, `${base}${path}`, headers, duration);
    if (SCENARIOS.has('upsert')) {
      // Warm-up: creates the 1,000 records, so that every measured request is an update of one, then
      // gives the planner statistics. This machine's PostgreSQL runs without autovacuum, and statements
      // a connection prepared against a never-analysed table can keep a plan that scans the whole
      // organisation (an upsert-only run measured 0.44 that way; see docs/decisions.md).
      await seed(database, org.id, 10_000);
      await upsert(project, projectUrl, '/v1/customers', auth, 2);
      await upsert(baseline, baselineUrl, '/customers', { 'content-type': 'application/json' }, 2);
      await database.pool.query('ANALYZE customers');
      rows.push({
        scenario: 'POST /v1/customers (upsert by externalId)',
        ...(await compare(
          () => upsert(baseline, baselineUrl, '/customers', { 'content-type': 'application/json' }),
          () => upsert(project, projectUrl, '/v1/customers', auth),
        )),
      });
      // A diagnostic, not the target: the same upserts against a baseline running the
      // project's own statements (lock, UPDATE, audit row, event, in one transaction), which separates
      // the cost of the SQL the upsert must run from the cost of the server around it.
      rows.push({
        scenario: 'POST /v1/customers upsert, against a baseline running the same statements (diagnostic)',
        ...(await compare(
          () => upsert(baseline, baselineUrl, '/customers/same-statements', { 'content-type': 'application/json' }),
          () => upsert(project, projectUrl, '/v1/customers', auth),
        )),
      });
    }

    // Polling at 10k and LARGE rows in one organisation, seeded in bulk (not through the API).
    const polls: Record<string, { project: Measure; baseline: Measure; explain: string }> = {};
    for (const size of SCENARIOS.has('poll') ? [10_000, LARGE] : []) {
      await seed(database, org.id, size);
      const since = new Date(Date.now() - 60_000).toISOString();
      const query = `updated_since=${encodeURIComponent(since)}&limit=50`;
      const explain = await database.pool.query(
        `EXPLAIN (ANALYZE, BUFFERS) SELECT * FROM customers WHERE org_id = $1 AND kind = 'individual' AND updated_at > $2 ORDER BY created_at, id LIMIT 51`,
        [org.id, since],
      );
      const measure = {
        ...(await compare(
          () => load(baseline, { url: `${baselineUrl}/customers?${query}` }),
          () => load(project, { url: `${projectUrl}/v1/customers?${query}`, headers: auth }),
        )),
        explain: explain.rows.map((row) => row['QUERY PLAN']).join('\n'),
      };
      polls[String(size)] = measure;
      rows.push({ scenario: `GET /v1/customers?updated_since=…&limit=50 at ${size.toLocaleString('en')} rows`, project: measure.project, baseline: measure.baseline });
    }
    sampleRss();

    const report = formatReport(rows, rss, polls);
    process.stdout.write(report);
    mkdirSync(join(root, 'bench', 'results'), { recursive: true });
    writeFileSync(join(root, 'bench', 'results', 'latest.md'), report);
  } finally {
    clearInterval(sampler);
    project.kill('SIGTERM');
    baseline.kill('SIGTERM');
    await scratch.drop();
  }
}

function formatReport(
  rows: Array<{ scenario: string; project: Measure; baseline: Measure }>,
  rss: { project: number; baseline: number },
  polls: Record<string, { project: Measure; baseline: Measure; explain: string }>,
): string {
  const lines = [
    `# Benchmark results`,
    '',
    `Machine: ${cpus().length} × ${cpus()[0]?.model ?? 'cpu'}, ${Math.round(totalmem() / 2 ** 30)} GiB; Node ${process.version}; ${ROUNDS} rounds of ${DURATION}s per side and scenario, taking turns (ABBA), medians shown; ${CONNECTIONS} connections, no pipelining; load generator, servers and PostgreSQL on the same machine.`,
    '',
    '| Scenario | Project req/s | p50 ms | p99 ms | Baseline req/s | p50 ms | p99 ms | Ratio (median of rounds) | Ratio per round | Errors/non-2xx |',
    '|---|---:|---:|---:|---:|---:|---:|---:|---|---:|',
    ...rows.map((row) => {
      const ratios = row.project.ratios ?? [row.project.rps / row.baseline.rps];
      return `| ${row.scenario} | ${row.project.rps} | ${row.project.p50} | ${row.project.p99} | ${row.baseline.rps} | ${row.baseline.p50} | ${row.baseline.p99} | ${median(ratios).toFixed(2)} | ${ratios.map((ratio) => ratio.toFixed(2)).join(', ')} | ${row.project.errors + row.project.non2xx}/${row.baseline.errors + row.baseline.non2xx} |`;
    }),
    '',
    'CPU time per request (µs), from /proc: the server process and all PostgreSQL processes.',
    '',
    '| Scenario | Project server | Project PostgreSQL | Baseline server | Baseline PostgreSQL |',
    '|---|---:|---:|---:|---:|',
    ...rows.map(
      (row) => `| ${row.scenario} | ${row.project.serverCpuUs} | ${row.project.postgresCpuUs} | ${row.baseline.serverCpuUs} | ${row.baseline.postgresCpuUs} |`,
    ),
    '',
    `Peak RSS under load: project ${rss.project} MB, baseline ${rss.baseline} MB.`,
    '',
  ];
  const sizes = Object.keys(polls);
  if (sizes.length === 2) {
    const [small, large] = sizes.map((size) => polls[size]!);
    lines.push(`Polling median latency at ${Number(sizes[1]).toLocaleString('en')} rows vs ${Number(sizes[0]).toLocaleString('en')}: ${(large!.project.p50 / Math.max(small!.project.p50, 0.001)).toFixed(2)}× (project), p50 ${small!.project.p50} → ${large!.project.p50} ms.`, '');
    lines.push(`EXPLAIN at ${Number(sizes[1]).toLocaleString('en')} rows:`, '', '```', large!.explain, '```', '');
  }
  return `${lines.join('\n')}\n`;
}

await main();
