/**
 * What `npm run bench` (run.ts) and `npm run bench:ab` (ab.ts) share: building the project, starting
 * servers as operators run them, driving them with autocannon, measuring CPU per request and RSS from
 * /proc, and seeding customers in bulk.
 *
 * The harness uses the project only from the outside: its build, its CLI (`svc migrate`, `svc org
 * create`, `svc key create`) and its HTTP API. Seeding and EXPLAIN go through a pg pool of its own.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { closeSync, mkdirSync, mkdtempSync, openSync, readFileSync, readSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import autocannon from 'autocannon';
import pg from 'pg';
import ts from 'typescript';
import { imageEnvironment } from './image-environment.js';

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
/** Which scenarios to run: `get`, `upsert`, `diagnostic` (the upsert against the same-write-set server), `poll` (comma-separated; all by default). */
export const SCENARIOS = new Set((process.env.BENCH_SCENARIOS ?? 'get,upsert,diagnostic,poll').split(',').map((name) => name.trim()));

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
export function cpuTicks(pid: number): number {
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

/** Where the servers' log lines go: BENCH_LOG_DIR, or a fresh directory under the system's tmpdir. */
export const LOG_DIR = process.env.BENCH_LOG_DIR ?? mkdtempSync(join(tmpdir(), 'svc-bench-logs-'));
mkdirSync(LOG_DIR, { recursive: true });

/**
 * Starts `node …args` and waits until `readyUrl` answers 2xx. Its stdout and stderr both go to
 * `LOG_DIR/<logName>.log` (a file the kernel writes to directly: no pipe that could fill up and
 * block the server, and no CPU of this process spent draining it).
 */
export async function startProcess(args: string[], env: NodeJS.ProcessEnv, readyUrl: string, logName: string): Promise<ChildProcess> {
  const logFile = join(LOG_DIR, `${logName}.log`);
  const fd = openSync(logFile, 'a');
  const child = spawn(process.execPath, args, { cwd: root, env, stdio: ['ignore', fd, fd] });
  closeSync(fd);
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`${args.join(' ')} exited with ${child.exitCode}; see ${logFile}`);
    const up = await fetch(readyUrl).then(
      (response) => response.ok,
      () => false,
    );
    if (up) return child;
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  child.kill('SIGKILL');
  throw new Error(`timeout waiting for ${args.join(' ')}; see ${logFile}`);
}

/** Lines and bytes a server wrote to its log (a check that the project ran at the level the report says). */
export function logVolume(logName: string): { lines: number; bytes: number; file: string } {
  const file = join(LOG_DIR, `${logName}.log`);
  let fd: number | undefined;
  try {
    fd = openSync(file, 'r');
    const buffer = Buffer.allocUnsafe(1 << 20);
    let lines = 0;
    for (let read = readSync(fd, buffer); read > 0; read = readSync(fd, buffer)) {
      for (let at = buffer.indexOf(10); at !== -1 && at < read; at = buffer.indexOf(10, at + 1)) lines += 1;
    }
    return { lines, bytes: statSync(file).size, file };
  } catch {
    return { lines: 0, bytes: 0, file };
  } finally {
    if (fd !== undefined) closeSync(fd);
  }
}

/** A free TCP port on 127.0.0.1. */
export function freeLoopbackPort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.unref();
    probe.on('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const address = probe.address();
      probe.close(() => (typeof address === 'object' && address ? resolve(address.port) : reject(new Error('no port'))));
    });
  });
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
  return {
    rps: pick('rps'),
    p50: pick('p50'),
    p99: pick('p99'),
    errors: total('errors'),
    non2xx: total('non2xx'),
    serverCpuUs: pick('serverCpuUs'),
    postgresCpuUs: pick('postgresCpuUs'),
  };
}

/** ROUNDS runs of each side, taking turns in ABBA order; medians, with each round's ratio. */
export async function compare(
  runBaseline: () => Promise<Measure>,
  runProject: () => Promise<Measure>,
): Promise<{ baseline: Measure; project: Measure }> {
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
export async function seed(pool: pg.Pool, orgId: string, total: number) {
  const { rows } = await pool.query(`SELECT count(*)::int AS count FROM customers WHERE org_id = $1`, [orgId]);
  const have = rows[0].count as number;
  const client = await pool.connect();
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
    await client.query(
      `UPDATE customers SET updated_at = now() WHERE org_id = $1 AND id IN (SELECT id FROM customers WHERE org_id = $1 AND added_via = 'BULK_IMPORT' ORDER BY random() LIMIT 50)`,
      [orgId],
    );
    await client.query('COMMIT');
  } finally {
    client.release();
  }
  await pool.query('ANALYZE customers');
}

/**
 * Settings of the project (README "Configuration") and of libpq/pg that the environment of whoever
 * runs the bench must not pass on to the project's server: a LOG_LEVEL, a rate limit, a pool size or
 * a PGOPTIONS left in the shell would measure another configuration than the default.
 */
const CONFIG_NAMES = new Set(['PORT', 'HOST', 'DATA_DIR', 'NODE_ENV', 'CI', 'PUBLIC_BASE_URL', 'TRUST_PROXY', 'NODE_OPTIONS']);
const CONFIG_PREFIXES = ['LOG_', 'RATE_LIMIT_', 'DATABASE_', 'WEBHOOK_', 'SMTP_', 'PG', 'AUDIT_'];

/** This process's environment without the project's settings: the servers start from the defaults. */
export function cleanEnv(): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [name, value] of Object.entries(process.env)) {
    if (CONFIG_NAMES.has(name) || CONFIG_PREFIXES.some((prefix) => name.startsWith(prefix))) continue;
    env[name] = value;
  }
  return env;
}

/**
 * A LOG_LEVEL for a diagnostic run only (BENCH_LOG_LEVEL, e.g. `warn`). Unset, the project runs at
 * its default level (info) and the run is the one the headline figures come from.
 */
export const DIAGNOSTIC_LOG_LEVEL = process.env.BENCH_LOG_LEVEL || undefined;

/**
 * The NODE_OPTIONS the image gives every process (the Dockerfile's runtime stage): the project runs
 * with the V8 settings operators run it with (BENCH_IMAGE_NODE_OPTIONS=off: without them, a diagnostic).
 */
export function imageNodeOptions(): string | undefined {
  return process.env.BENCH_IMAGE_NODE_OPTIONS === 'off' ? undefined : imageEnvironment(root).NODE_OPTIONS;
}

/**
 * BENCH_CPU_PROF=DIR (a diagnostic): Node.js arguments that make the project's server write a V8 CPU
 * profile there when it exits (open it in Chrome DevTools). Profiling slows the server, so such a
 * run's figures are not headline ones.
 */
export const CPU_PROFILE_ARGS = process.env.BENCH_CPU_PROF ? ['--cpu-prof', `--cpu-prof-dir=${process.env.BENCH_CPU_PROF}`] : [];

/**
 * The project's server as operators run it (README, docs/operations.md): the compiled build,
 * NODE_ENV=production, on `databaseUrl`, every other setting at its default (LOG_LEVEL info, pool of
 * 10, no rate-limit override), with the image's NODE_OPTIONS. The one setting given is
 * WEBHOOK_WORKER=off, as the documented deployment (docker-compose.yml) runs the API: deliveries
 * belong to a separate `svc worker` process. The bench creates no webhook endpoint, so there would
 * be nothing to deliver anyway.
 */
export function projectServerEnv(databaseUrl: string, port: number): NodeJS.ProcessEnv {
  const nodeOptions = imageNodeOptions();
  return {
    ...cleanEnv(),
    ...(nodeOptions ? { NODE_OPTIONS: nodeOptions } : {}),
    DATABASE_URL: databaseUrl,
    PORT: String(port),
    HOST: '127.0.0.1',
    WEBHOOK_WORKER: 'off',
    NODE_ENV: 'production',
    ...(DIAGNOSTIC_LOG_LEVEL ? { LOG_LEVEL: DIAGNOSTIC_LOG_LEVEL } : {}),
  };
}

/** The bare baseline (baseline-server.ts) on `databaseUrl`, for the organisation `orgId`. */
export function baselineServerEnv(databaseUrl: string, port: number, orgId: string): NodeJS.ProcessEnv {
  return { ...cleanEnv(), DATABASE_URL: databaseUrl, PORT: String(port), BENCH_ORG_ID: orgId, NODE_ENV: 'production' };
}

/** Builds the checkout at `directory` (`npm run build`), as the servers run its compiled code. */
export function build(directory = root): void {
  execFileSync('npm', ['run', '-s', 'build'], { cwd: directory, stdio: 'inherit' });
}

/**
 * The baseline compiled to plain JavaScript (`node_modules/.cache/svc-bench/baseline-server.mjs`,
 * where it still resolves fastify and pg from this checkout), so that it runs as the project does,
 * without tsx's loader in its process (which would add to its RSS and start-up). Returns its path.
 */
export function buildBaseline(): string {
  const source = readFileSync(join(root, 'bench', 'baseline-server.ts'), 'utf8');
  const { outputText } = ts.transpileModule(source, {
    compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 },
    fileName: 'baseline-server.ts',
  });
  const directory = join(root, 'node_modules', '.cache', 'svc-bench');
  mkdirSync(directory, { recursive: true });
  const file = join(directory, 'baseline-server.mjs');
  writeFileSync(file, outputText);
  return file;
}

/** Runs an operator command of the built project (`node bin/svc.js …args`) and parses the JSON it prints; `env` adds settings for that command only. */
export function svc(databaseUrl: string, args: string[], env: NodeJS.ProcessEnv = {}): unknown {
  try {
    const output = execFileSync(process.execPath, ['bin/svc.js', ...args], {
      cwd: root,
      env: { ...cleanEnv(), DATABASE_URL: databaseUrl, NODE_ENV: 'production', ...env },
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    return JSON.parse(output);
  } catch (error) {
    const failed = error as { stderr?: string; message: string };
    throw new Error(`svc ${args.join(' ')} failed: ${failed.stderr || failed.message}`, { cause: error });
  }
}

/**
 * The bench's API key has its own high burst and daily limits (`svc key create --burst-limit
 * --daily-limit`): the rate limit is a product rule, not what the bench measures, and at the default
 * 25 requests per second almost every request would be a 429. The server's own settings stay at
 * their defaults; the access check (key lookup, IP rule, rate windows) runs on every request as usual.
 */
export const BENCH_KEY_LIMITS = { burst: 1_000_000, daily: 1_000_000_000 };

/**
 * A scratch database on DATABASE_URL's server, migrated, with one organisation and a key to read and
 * write customers, all made with the project's own CLI (so call `build()` first). `pool` is the
 * harness's own connection to it, for seeding, ANALYZE and EXPLAIN.
 */
/** An organisation made through the CLI, with a customers key at the bench limits. */
export function createBenchOrganisation(url: string, name: string): { id: string; key: string } {
  const org = svc(url, ['org', 'create', '--name', name]) as { id: string };
  const { key } = svc(url, [
    'key',
    'create',
    '--org',
    org.id,
    '--scopes',
    'customers:read,customers:write',
    '--label',
    'bench',
    '--burst-limit',
    String(BENCH_KEY_LIMITS.burst),
    '--daily-limit',
    String(BENCH_KEY_LIMITS.daily),
  ]) as { key: string };
  return { id: org.id, key };
}

export async function createScratchDatabase(prefix: string) {
  const adminUrl = process.env.DATABASE_URL;
  if (!adminUrl) throw new Error('Set DATABASE_URL (e.g. postgres://postgres@127.0.0.1:5432/postgres)');
  const name = `${prefix}_${Date.now().toString(36)}`;
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${name}`);
  const url = withDatabase(adminUrl, name);
  const pool = new pg.Pool({ connectionString: url, max: 2 });
  const drop = async () => {
    await pool.end().catch(() => {});
    await new Promise((resolve) => setTimeout(resolve, 1000));
    await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    await admin.end();
  };
  try {
    svc(url, ['migrate']);
    const { id, key } = createBenchOrganisation(url, 'Bench');
    return { url, pool, org: { id }, key, drop };
  } catch (error) {
    await drop();
    throw error;
  }
}

/** Phones sent by upsertLoad: one sequence for the whole process, so a later run never repeats an earlier run's value. */
let upsertCounter = 0;

/** How many upserts upsertLoad has sent in this process (a run's count is the difference). */
export function upsertsSent(): number {
  return upsertCounter;
}

/** Upserts by externalId over 1,000 ids with a changing phone (once the records exist, every request is a real update, in every run). */
export function upsertLoad(server: ChildProcess, url: string, headers: Record<string, string>, duration = DURATION): Promise<Measure> {
  return load(server, {
    duration,
    url,
    method: 'POST',
    headers,
    requests: [
      {
        method: 'POST',
        setupRequest: (request) => {
          upsertCounter += 1;
          const id = upsertCounter % 1000;
          return {
            ...request,
            headers: { ...request.headers, ...headers },
            body: JSON.stringify({
              externalId: `bench-${id}`,
              fullName: `Bench Person ${id}`,
              email: `p${id}@bench.test`,
              phone: String(upsertCounter),
            }),
          };
        },
      },
    ],
  });
}
