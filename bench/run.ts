/**
 * `npm run bench`: each scenario runs against the project's server and a bare baseline in the same
 * run, and reports req/s, p50/p99 latency, the project/baseline ratio and the servers' RSS.
 * Needs DATABASE_URL (a scratch database is created on that server and dropped afterwards).
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { readFileSync, readdirSync, writeFileSync, mkdirSync } from 'node:fs';
import { cpus, totalmem } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import autocannon from 'autocannon';
import pg from 'pg';
import { createDatabase } from '../src/db/client.js';
import { runMigrations } from '../src/db/migrate.js';
import { createApiKeysService } from '../src/modules/api-keys/api-keys.service.js';
import { createOrganisationsService } from '../src/modules/organisations/organisations.service.js';
import { freeLoopbackPort } from '../src/db/embedded-postgres.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const DURATION = Number(process.env.BENCH_DURATION ?? 10);
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 10);
const LARGE = Number(process.env.BENCH_LARGE_ROWS ?? 1_000_000);
/**
 * Rounds per scenario: the baseline and the project take turns (ABBA order, so a drift of the
 * machine over the scenario weighs on both alike), and the report gives the medians. One run of each,
 * back to back, swung the GET ratio between 0.52 and 0.80 on this VM.
 */
const ROUNDS = Math.max(1, Number(process.env.BENCH_ROUNDS ?? 3));
/** Which scenarios to run: `get`, `upsert`, `poll` (comma-separated; all by default). */
const SCENARIOS = new Set((process.env.BENCH_SCENARIOS ?? 'get,upsert,poll').split(',').map((name) => name.trim()));

type Measure = {
  rps: number;
  /** The project/baseline ratio of each round (set on the project's side only), and its spread. */
  ratios?: number[];
  p50: number;
  p99: number;
  errors: number;
  non2xx: number;
  /** CPU time per request, in microseconds, of the server under test and of all PostgreSQL processes. */
  serverCpuUs: number;
  postgresCpuUs: number;
};

const TICK_US = 1_000_000 / 100; // USER_HZ is 100 on Linux

/** utime + stime of a process, in clock ticks (0 once it has gone). */
function cpuTicks(pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return Number(fields[11]) + Number(fields[12]);
  } catch {
    return 0;
  }
}

/** CPU ticks of every PostgreSQL process on this machine (the bench is its only load), by pid. */
function postgresTicks(): Map<number, number> {
  const ticks = new Map<number, number>();
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      if (stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')')) === 'postgres') ticks.set(Number(entry), cpuTicks(Number(entry)));
    } catch {
      // the process ended while we looked
    }
  }
  return ticks;
}

/** CPU ticks PostgreSQL spent since `before` (a process that ended meanwhile is left out, not subtracted). */
function postgresTicksSince(before: Map<number, number>): number {
  let spent = 0;
  for (const [pid, ticks] of postgresTicks()) spent += ticks - (before.get(pid) ?? 0);
  return spent;
}

function withDatabase(url: string, database: string): string {
  const parsed = new URL(url);
  parsed.pathname = `/${database}`;
  return parsed.toString();
}

function rssMb(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? 0);
  return Math.round(kb / 1024);
}

async function startProcess(args: string[], env: NodeJS.ProcessEnv, readyUrl: string): Promise<ChildProcess> {
  const child = spawn(process.execPath, args, { cwd: root, env: { ...process.env, ...env }, stdio: ['ignore', 'ignore', 'inherit'] });
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`${args.join(' ')} exited with ${child.exitCode}`);
    const up = await fetch(readyUrl).then((response) => response.ok, () => false);
    if (up) return child;
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  child.kill('SIGKILL');
  throw new Error(`timeout waiting for ${args.join(' ')}`);
}

/** Drives `options.url` and measures the throughput, latency and CPU cost per request of `server`. */
async function load(server: ChildProcess, options: autocannon.Options): Promise<Measure> {
  const before = { server: cpuTicks(server.pid!), postgres: postgresTicks() };
  const result = await autocannon({ duration: DURATION, connections: CONNECTIONS, pipelining: 1, ...options });
  const requests = Math.max(1, result.requests.total);
  return {
    rps: Math.round(result.requests.average),
    p50: result.latency.p50,
    p99: result.latency.p99,
    errors: result.errors,
    non2xx: result.non2xx,
    serverCpuUs: Math.round(((cpuTicks(server.pid!) - before.server) * TICK_US) / requests),
    postgresCpuUs: Math.round((postgresTicksSince(before.postgres) * TICK_US) / requests),
  };
}

const median = (values: number[]) => {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[middle]! : (sorted[middle - 1]! + sorted[middle]!) / 2;
};

/** The median of each figure over the rounds; errors and non-2xx answers of all rounds added up. */
function medianOf(measures: Measure[]): Measure {
  const pick = (key: keyof Omit<Measure, 'ratios'>) => Math.round(median(measures.map((measure) => measure[key])) * 100) / 100;
  const total = (key: 'errors' | 'non2xx') => measures.reduce((sum, measure) => sum + measure[key], 0);
  return { rps: pick('rps'), p50: pick('p50'), p99: pick('p99'), errors: total('errors'), non2xx: total('non2xx'), serverCpuUs: pick('serverCpuUs'), postgresCpuUs: pick('postgresCpuUs') };
}

/** ROUNDS runs of each side, taking turns in ABBA order; medians, with each round's ratio. */
async function compare(runBaseline: () => Promise<Measure>, runProject: () => Promise<Measure>): Promise<{ baseline: Measure; project: Measure }> {
  const baselines: Measure[] = [];
  const projects: Measure[] = [];
  for (let round = 0; round < ROUNDS; round += 1) {
    if (round % 2 === 0) {
      baselines.push(await runBaseline());
      projects.push(await runProject());
    } else {
      projects.push(await runProject());
      baselines.push(await runBaseline());
    }
  }
  const ratios = projects.map((project, index) => project.rps / baselines[index]!.rps);
  return { baseline: medianOf(baselines), project: { ...medianOf(projects), ratios } };
}

async function main() {
  const adminUrl = process.env.DATABASE_URL;
  if (!adminUrl) throw new Error('Set DATABASE_URL (e.g. postgres://postgres@127.0.0.1:5432/postgres)');
  const name = `svc_bench_${Date.now().toString(36)}`;
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${name}`);
  const url = withDatabase(adminUrl, name);
  await runMigrations(url);
  const database = createDatabase(url);
  const org = await createOrganisationsService({ database }).create({ name: 'Bench', credits: 0 });
  const { key } = await createApiKeysService({ database }).create({ orgId: org.id, scopes: ['customers:read', 'customers:write'] });

  // Benchmark what operators run: the compiled build under NODE_ENV=production.
  execFileSync('npm', ['run', '-s', 'build'], { cwd: root, stdio: 'inherit' });
  const projectPort = await freeLoopbackPort();
  const baselinePort = await freeLoopbackPort();
  // BENCH_CPU_PROF=DIR writes a V8 CPU profile of the project's server there (open it in Chrome DevTools).
  const profile = process.env.BENCH_CPU_PROF ? ['--cpu-prof', `--cpu-prof-dir=${process.env.BENCH_CPU_PROF}`] : [];
  const project = await startProcess([...profile, 'bin/svc.js', 'serve'], {
    DATABASE_URL: url,
    PORT: String(projectPort),
    HOST: '127.0.0.1',
    LOG_LEVEL: 'warn',
    WEBHOOK_WORKER: 'off',
    RATE_LIMIT_BURST: '1000000',
    RATE_LIMIT_DAILY: '1000000000',
    NODE_ENV: 'production',
  }, `http://127.0.0.1:${projectPort}/readyz`);
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

    // Upsert by externalId over 1,000 ids with a changing phone (every request is a real write).
    const upsert = (server: ChildProcess, base: string, path: string, headers: Record<string, string>, duration = DURATION) => {
      let counter = 0;
      return load(server, {
        duration,
        url: `${base}${path}`,
        method: 'POST',
        headers,
        requests: [
          {
            method: 'POST',
            setupRequest: (request) => {
              counter += 1;
              const id = counter % 1000;
              return {
                ...request,
                headers: { ...request.headers, ...headers },
                body: JSON.stringify({ externalId: `bench-${id}`, fullName: `Bench Person ${id}`, email: `p${id}@bench.test`, phone: String(counter) }),
              };
            },
          },
        ],
      });
    };
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
    await database.close();
    await new Promise((resolve) => setTimeout(resolve, 1000));
    await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    await admin.end();
  }
}

/** Bulk-seeds customers up to `total` rows with generate_series; 50 of them "recently updated". */
async function seed(database: ReturnType<typeof createDatabase>, orgId: string, total: number) {
  const { rows } = await database.pool.query(`SELECT count(*)::int AS count FROM customers WHERE org_id = $1`, [orgId]);
  const have = rows[0].count as number;
  const client = await database.pool.connect();
  try {
    await client.query('BEGIN');
    await client.query(`SET LOCAL session_replication_role = replica`); // skip per-row triggers while seeding
    await client.query(
      `INSERT INTO customers (org_id, kind, external_id, type, name, email, kyc_status, added_via, created_at, updated_at)
       SELECT $1, 'individual', 'seed-' || g, 'INDIVIDUAL', 'Seeded Person ' || g, 'seed' || g || '@bench.test', 'NOT_REQUIRED', 'BULK_IMPORT',
              now() - interval '30 days' + g * interval '1 millisecond', now() - interval '30 days' + g * interval '1 millisecond'
         FROM generate_series($2::int, $3::int) AS g`,
      [orgId, have + 1, have + Math.max(0, total - have)],
    );
    await client.query(`UPDATE customers SET updated_at = now() WHERE id IN (SELECT id FROM customers WHERE org_id = $1 AND added_via = 'BULK_IMPORT' ORDER BY random() LIMIT 50)`, [orgId]);
    await client.query('COMMIT');
  } finally {
    client.release();
  }
  await database.pool.query('ANALYZE customers');
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
