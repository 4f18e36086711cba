/**
 * `npm run bench`: each scenario runs against the project's server and a bare baseline in the same
 * run, and reports req/s, p50/p99 latency, the project/baseline ratio, CPU per request and the
 * servers' peak RSS. Needs DATABASE_URL (a scratch database is created on that server and dropped
 * afterwards).
 *
 * The project runs as operators run it: the production build (`npm run build`, then
 * `NODE_ENV=production node bin/svc.js serve`) at its default settings, LOG_LEVEL included (info).
 * The baseline is a bare Fastify + pg server using named prepared statements (baseline-server.ts).
 * BENCH_LOG_LEVEL=warn (or any level) makes a *diagnostic* run instead: labelled as such in its
 * report, written to bench/results/diagnostic.md, and never the source of the headline figures.
 */
import type { ChildProcess } from 'node:child_process';
import { writeFileSync, mkdirSync, rmSync } from 'node:fs';
import { cpus, totalmem } from 'node:os';
import { dirname, join } from 'node:path';
import {
  BENCH_KEY_LIMITS,
  baselineServerEnv,
  build,
  buildBaseline,
  compare,
  CONNECTIONS,
  CPU_PROFILE_ARGS,
  createScratchDatabase,
  DIAGNOSTIC_LOG_LEVEL,
  DURATION,
  freeLoopbackPort,
  imageNodeOptions,
  LARGE,
  load,
  LOG_DIR,
  logVolume,
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

type Row = { scenario: string; project: Measure; baseline: Measure; diagnostic?: boolean };
type Poll = { project: Measure; baseline: Measure; explain: string };

const RESULTS = process.env.BENCH_RESULTS ?? join(root, 'bench', 'results', DIAGNOSTIC_LOG_LEVEL ? 'diagnostic.md' : 'latest.md');

async function main() {
  // Benchmark what operators run: the compiled build under NODE_ENV=production. The scratch
  // database, its organisation and the bench's key are made with that build's CLI.
  build();
  const baselineScript = buildBaseline();
  const scratch = await createScratchDatabase('svc_bench');
  const { url, pool, org, key } = scratch;

  const projectPort = await freeLoopbackPort();
  const baselinePort = await freeLoopbackPort();
  const servers: ChildProcess[] = [];
  const projectLog = 'project';
  const baselineLog = 'baseline';
  try {
    const project = await startProcess(
      [...CPU_PROFILE_ARGS, 'bin/svc.js', 'serve'],
      projectServerEnv(url, projectPort),
      `http://127.0.0.1:${projectPort}/readyz`,
      projectLog,
    );
    servers.push(project);
    const baseline = await startProcess(
      [baselineScript],
      baselineServerEnv(url, baselinePort, org.id),
      `http://127.0.0.1:${baselinePort}/healthz`,
      baselineLog,
    );
    servers.push(baseline);
    const projectUrl = `http://127.0.0.1:${projectPort}`;
    const baselineUrl = `http://127.0.0.1:${baselinePort}`;
    const auth = { authorization: `Bearer ${key}`, 'content-type': 'application/json' };
    const json = { 'content-type': 'application/json' };
    const rows: Row[] = [];
    const rss = { project: 0, baseline: 0 };
    const sampleRss = () => {
      rss.project = Math.max(rss.project, rssMb(project.pid!));
      rss.baseline = Math.max(rss.baseline, rssMb(baseline.pid!));
    };
    const sampler = setInterval(sampleRss, 250);

    try {
      // Seed one customer through the API so both servers read the same row.
      const created = await fetch(`${projectUrl}/v1/customers`, {
        method: 'POST',
        headers: auth,
        body: JSON.stringify({ externalId: 'bench-read', fullName: 'Bench Reader', email: 'reader@bench.test' }),
      });
      if (!created.ok) throw new Error(`seeding the read's customer answered ${created.status}: ${await created.text()}`);
      const seeded = (await created.json()) as { id: string };

      // Warm-up, then GET by id, among 10,000 customers of the organisation (an empty table would hide
      // a lookup that scans the organisation).
      if (SCENARIOS.has('get')) {
        await seed(pool, org.id, 10_000);
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
      if (SCENARIOS.has('upsert') || SCENARIOS.has('diagnostic')) {
        // Warm-up: creates the 1,000 records, so that every measured request is an update of one, then
        // gives the planner statistics. This machine's PostgreSQL runs without autovacuum, and statements
        // a connection prepared against a never-analysed table can keep a plan that scans the whole
        // organisation (see docs/decisions.md).
        await seed(pool, org.id, 10_000);
        await upsert(project, projectUrl, '/v1/customers', auth, 2);
        await upsert(baseline, baselineUrl, '/customers', json, 2);
        await pool.query('ANALYZE customers');
      }
      if (SCENARIOS.has('upsert')) {
        rows.push({
          scenario: 'POST /v1/customers (upsert by externalId)',
          ...(await compare(
            () => upsert(baseline, baselineUrl, '/customers', json),
            () => upsert(project, projectUrl, '/v1/customers', auth),
          )),
        });
      }
      if (SCENARIOS.has('diagnostic')) {
        // A diagnostic, not the issue's target: the same upserts against a bare server that runs the
        // write set of an audited, evented change (locking read, UPDATE, audit row, event) the plain
        // way, one named statement per round trip in a transaction. It separates the cost of the SQL
        // such an upsert must run from the cost of the server around it.
        await upsert(baseline, baselineUrl, '/customers/same-statements', json, 2);
        rows.push({
          scenario: 'POST /v1/customers upsert, against a bare server running the same write set (diagnostic)',
          diagnostic: true,
          ...(await compare(
            () => upsert(baseline, baselineUrl, '/customers/same-statements', json),
            () => upsert(project, projectUrl, '/v1/customers', auth),
          )),
        });
      }

      // Polling at 10k and LARGE rows in one organisation, seeded in bulk (not through the API).
      const polls: Record<string, Poll> = {};
      for (const size of SCENARIOS.has('poll') ? [10_000, LARGE] : []) {
        await seed(pool, org.id, size);
        const since = new Date(Date.now() - 60_000).toISOString();
        const query = `updated_since=${encodeURIComponent(since)}&limit=50`;
        const explain = await pool.query(
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
        rows.push({
          scenario: `GET /v1/customers?updated_since=…&limit=50 at ${size.toLocaleString('en')} rows`,
          project: measure.project,
          baseline: measure.baseline,
        });
      }
      sampleRss();

      const report = formatReport(rows, rss, polls, { project: logVolume(projectLog), baseline: logVolume(baselineLog) });
      process.stdout.write(report);
      mkdirSync(dirname(RESULTS), { recursive: true });
      writeFileSync(RESULTS, report);
      process.stdout.write(`Report written to ${RESULTS}\n`);
    } finally {
      clearInterval(sampler);
    }
  } finally {
    for (const server of servers) server.kill('SIGTERM');
    await scratch.drop();
    // The servers' logs can reach hundreds of MB; kept only where BENCH_LOG_DIR asked for them.
    if (!process.env.BENCH_LOG_DIR) rmSync(LOG_DIR, { recursive: true, force: true });
  }
}

const ratioOf = (row: Row) => median(row.project.ratios ?? [row.project.rps / row.baseline.rps]);

function formatReport(
  rows: Row[],
  rss: { project: number; baseline: number },
  polls: Record<string, Poll>,
  logs: Record<'project' | 'baseline', { lines: number; bytes: number }>,
): string {
  const find = (prefix: string) => rows.find((row) => !row.diagnostic && row.scenario.startsWith(prefix));
  const get = find('GET /v1/customers/{id}');
  const upsert = find('POST /v1/customers (upsert');
  const pollRows = rows.filter((row) => row.scenario.startsWith('GET /v1/customers?updated_since'));
  const sizes = Object.keys(polls);
  const pollGrowth = sizes.length === 2 ? polls[sizes[1]!]!.project.p50 / Math.max(polls[sizes[0]!]!.project.p50, 0.001) : undefined;
  const verdict = (met: boolean) => (met ? 'met' : 'missed');
  const configuration = DIAGNOSTIC_LOG_LEVEL
    ? `**DIAGNOSTIC RUN: the project at LOG_LEVEL=${DIAGNOSTIC_LOG_LEVEL}, not its default configuration. These figures are not the headline figures and do not compare with them.**`
    : 'Configuration: the default, as operators run it.';

  const lines = [
    DIAGNOSTIC_LOG_LEVEL ? `# Benchmark results (diagnostic: LOG_LEVEL=${DIAGNOSTIC_LOG_LEVEL})` : '# Benchmark results',
    '',
    configuration,
    '',
    `- Project: production build (\`npm run build\`; \`NODE_ENV=production node bin/svc.js serve\`), every setting at its default${DIAGNOSTIC_LOG_LEVEL ? ` except LOG_LEVEL=${DIAGNOSTIC_LOG_LEVEL}` : ' (LOG_LEVEL info, DATABASE_POOL_SIZE 10)'}, WEBHOOK_WORKER=off as in docker-compose.yml, NODE_OPTIONS ${imageNodeOptions() ? `\`${imageNodeOptions()}\` as in the image` : 'unset (BENCH_IMAGE_NODE_OPTIONS=off, a diagnostic)'}; stdout and stderr to a log file. The bench's API key has its own burst limit of ${BENCH_KEY_LIMITS.burst.toLocaleString('en')}/s and daily limit of ${BENCH_KEY_LIMITS.daily.toLocaleString('en')} (\`svc key create --burst-limit --daily-limit\`); the access check still runs on every request.`,
    '- Baseline: bare Fastify + pg (`bench/baseline-server.ts`), every statement a named prepared statement, pool of 10, no logging, no auth.',
    `- Log lines written during the run: project ${logs.project.lines.toLocaleString('en')} (${(logs.project.bytes / 2 ** 20).toFixed(1)} MB), baseline ${logs.baseline.lines.toLocaleString('en')}.`,
    `- Machine: ${cpus().length} × ${cpus()[0]?.model ?? 'cpu'}, ${Math.round(totalmem() / 2 ** 30)} GiB; Node ${process.version}; ${ROUNDS} rounds of ${DURATION}s per side and scenario, taking turns (ABBA), medians shown; ${CONNECTIONS} connections, no pipelining; load generator, servers and PostgreSQL on the same machine.`,
    '',
    DIAGNOSTIC_LOG_LEVEL ? '## Summary (diagnostic)' : '## Headline figures',
    '',
    '| Figure | Value | Target (issue 26) |',
    '|---|---:|---|',
  ];
  if (get) lines.push(`| GET by id, project/baseline req/s | ${ratioOf(get).toFixed(2)}× | ≥ 0.75×: ${verdict(ratioOf(get) >= 0.75)} |`);
  if (upsert)
    lines.push(`| Upsert, project/baseline req/s | ${ratioOf(upsert).toFixed(2)}× | ≥ 0.5×: ${verdict(ratioOf(upsert) >= 0.5)} |`);
  for (const row of pollRows)
    lines.push(`| Polling ${row.scenario.replace(/^.* at /, 'at ')}, project/baseline req/s | ${ratioOf(row).toFixed(2)}× | |`);
  if (pollGrowth !== undefined) {
    lines.push(
      `| Polling median latency at ${Number(sizes[1]).toLocaleString('en')} rows / at ${Number(sizes[0]).toLocaleString('en')} rows (project) | ${pollGrowth.toFixed(2)}× | ≤ 1.5× (earlier target): ${verdict(pollGrowth <= 1.5)} |`,
    );
  }
  lines.push(
    `| Peak RSS under load, project (baseline; ratio) | ${rss.project} MB (${rss.baseline} MB; ${(rss.project / Math.max(rss.baseline, 1)).toFixed(2)}×) | ≤ 200 MB: ${verdict(rss.project <= 200)} |`,
    '',
    '## All scenarios',
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
      (row) =>
        `| ${row.scenario} | ${row.project.serverCpuUs} | ${row.project.postgresCpuUs} | ${row.baseline.serverCpuUs} | ${row.baseline.postgresCpuUs} |`,
    ),
    '',
    `Peak RSS under load: project ${rss.project} MB, baseline ${rss.baseline} MB.`,
    '',
  );
  if (sizes.length === 2) {
    const [small, large] = sizes.map((size) => polls[size]!);
    lines.push(
      `Polling median latency at ${Number(sizes[1]).toLocaleString('en')} rows vs ${Number(sizes[0]).toLocaleString('en')}: ${pollGrowth!.toFixed(2)}× (project), p50 ${small!.project.p50} → ${large!.project.p50} ms.`,
      '',
    );
    lines.push(
      `EXPLAIN of the baseline's polling query at ${Number(sizes[1]).toLocaleString('en')} rows:`,
      '',
      '```',
      large!.explain,
      '```',
      '',
    );
  }
  return `${lines.join('\n')}\n`;
}

await main();
