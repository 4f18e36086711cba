/**
 * What `npm run bench` (run.ts) and `npm run bench:ab` (ab.ts) share: starting servers, driving them
 * with autocannon, measuring CPU per request and RSS from /proc, and seeding customers in bulk.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import autocannon from 'autocannon';
import pg from 'pg';
import { createDatabase } from '../src/db/client.js';
import { runMigrations } from '../src/db/migrate.js';
import { createApiKeysService } from '../src/modules/api-keys/api-keys.service.js';
import { createOrganisationsService } from '../src/modules/organisations/organisations.service.js';

export const root = join(dirname(fileURLToPath(import.meta.url)), '..');
export const DURATION = Number(process.env.BENCH_DURATION ?? 10);
export const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 10);
export const LARGE = Number(process.env.BENCH_LARGE_ROWS ?? 1_000_000);
/**
 * Rounds per scenario: the baseline and the project take turns (ABBA order, so a drift of the
 * machine over the scenario weighs on both alike), and the report gives the medians. One run of each,
 * back to back, swung the GET ratio between 0.52 and 0.80 on this VM.
 */
export const ROUNDS = Math.max(1, Number(process.env.BENCH_ROUNDS ?? 3));
/** Which scenarios to run: `get`, `upsert`, `poll` (comma-separated; all by default). */
export const SCENARIOS = new Set((process.env.BENCH_SCENARIOS ?? 'get,upsert,poll').split(',').map((name) => name.trim()));

export type Measure = {
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

export function withDatabase(url: string, database: string): string {
  const parsed = new URL(url);
  parsed.pathname = `/${database}`;
  return parsed.toString();
}

export function rssMb(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? 0);
  return Math.round(kb / 1024);
}

export async function startProcess(args: string[], env: NodeJS.ProcessEnv, readyUrl: string): Promise<ChildProcess> {
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
export async function load(server: ChildProcess, options: autocannon.Options): Promise<Measure> {
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

export const median = (values: number[]) => {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[middle]! : (sorted[middle - 1]! + sorted[middle]!) / 2;
};

/** The median of each figure over the rounds; errors and non-2xx answers of all rounds added up. */
export function medianOf(measures: Measure[]): Measure {
  const pick = (key: keyof Omit<Measure, 'ratios'>) => Math.round(median(measures.map((measure) => measure[key])) * 100) / 100;
  const total = (key: 'errors' | 'non2xx') => measures.reduce((sum, measure) => sum + measure[key], 0);
  return { rps: pick('rps'), p50: pick('p50'), p99: pick('p99'), errors: total('errors'), non2xx: total('non2xx'), serverCpuUs: pick('serverCpuUs'), postgresCpuUs: pick('postgresCpuUs') };
}

/** ROUNDS runs of each side, taking turns in ABBA order; medians, with each round's ratio. */
export async function compare(runBaseline: () => Promise<Measure>, runProject: () => Promise<Measure>): Promise<{ baseline: Measure; project: Measure }> {
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

/** Bulk-seeds customers up to `total` rows with generate_series; 50 of them "recently updated". */
export async function seed(database: ReturnType<typeof createDatabase>, orgId: string, total: number) {
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

/** The project's server as operators run it (the compiled build, NODE_ENV=production), on `databaseUrl`. */
export function projectServerEnv(databaseUrl: string, port: number): NodeJS.ProcessEnv {
  return {
    DATABASE_URL: databaseUrl,
    PORT: String(port),
    HOST: '127.0.0.1',
    LOG_LEVEL: 'warn',
    WEBHOOK_WORKER: 'off',
    RATE_LIMIT_BURST: '1000000',
    RATE_LIMIT_DAILY: '1000000000',
    NODE_ENV: 'production',
  };
}

/** Builds the checkout at `directory` (`npm run build`), as the servers run its compiled code. */
export function build(directory = root): void {
  execFileSync('npm', ['run', '-s', 'build'], { cwd: directory, stdio: 'inherit' });
}

/** A scratch database on DATABASE_URL's server, migrated, with one organisation and a key to read and write customers. */
export async function createScratchDatabase(prefix: string) {
  const adminUrl = process.env.DATABASE_URL;
  if (!adminUrl) throw new Error('Set DATABASE_URL (e.g. postgres://postgres@127.0.0.1:5432/postgres)');
  const name = `${prefix}_${Date.now().toString(36)}`;
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${name}`);
  const url = withDatabase(adminUrl, name);
  await runMigrations(url);
  const database = createDatabase(url);
  const org = await createOrganisationsService({ database }).create({ name: 'Bench', credits: 0 });
  const { key } = await createApiKeysService({ database }).create({ orgId: org.id, scopes: ['customers:read', 'customers:write'] });
  return {
    url,
    database,
    org,
    key,
    async drop() {
      await database.close();
      await new Promise((resolve) => setTimeout(resolve, 1000));
      await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      await admin.end();
    },
  };
}

/** Upserts by externalId over 1,000 ids with a changing phone (once the records exist, every request is a real update). */
export function upsertLoad(server: ChildProcess, url: string, headers: Record<string, string>, duration = DURATION): Promise<Measure> {
  let counter = 0;
  return load(server, {
    duration,
    url,
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
}
