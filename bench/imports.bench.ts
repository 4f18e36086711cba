/**
 * A customer book imported end to end (issue 46, "Done when"): a CSV of BENCH_IMPORT_ROWS individuals
 * (100,000) uploaded to POST /v1/imports of the production build, applied by the job worker of the
 * same `svc serve` process, while a client reads GET /v1/customers/{id} at a steady pace.
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npm run bench:imports
 *
 * Options (environment): BENCH_IMPORT_ROWS (100000), BENCH_CLIENT_RPS (20: the reading client's
 * requests per second), BENCH_BASELINE_SECONDS (30: how long the client reads without an import,
 * before it and again after it), BENCH_RESULTS (bench/results/imports.md, or imports-worker-process.md), BENCH_CPU_PROF (a directory for a CPU profile of the server: a diagnostic),
 * BENCH_IMPORT_WORKER (`process`: the deployment of docker-compose.yml, where the API runs with
 * IMPORT_WORKER=off and a `svc worker` process works the import, at the lower CPU weight the compose
 * file gives it (as a niceness); unset: the default, one `svc serve`).
 *
 * The file is a realistic mix, from a fixed seed so every run imports the same bytes:
 *  - 10% duplicates of records that exist already (created first through POST /v1/customers, as the
 *    API would have them): half repeat the record exactly (UNCHANGED), half bring a new phone (UPDATED);
 *  - 5% invalid rows (FAILED): a malformed email, a missing name, an unknown service code, a client
 *    date in the future, a pre-commencement field on a new customer, a yes/no answer that is not a boolean;
 *  - the rest new records (CREATED): about 60% existing clients with their pre-commencement fields
 *    (clientSinceDate, preCommencementAssessment.*, some preExistingServices), 40% new customers with
 *    one to three designatedServices and risk answers; 2% of all sole traders with an ABN; names with
 *    commas and quotes, as a spreadsheet exports them.
 *
 * Measured: end-to-end rows/s (from the first byte of the upload to the import seen COMPLETED by a
 * poll every 250 ms), the upload's own time (202 answer) and the worker's (started_at → finished_at);
 * the server process's peak RSS (VmRSS of /proc/<pid>/status every 100 ms); CPU over the import of
 * the server, of its database's PostgreSQL backends and of everything else on the machine (so a run
 * sharing the machine with other work says so); what the audit and feed sealers had yet to seal; and
 * the reading client's p50/p99 during the import against the same client's without it, in the same
 * run (before the upload, and again after the import ended). The file and the counts are checked:
 * the run exits 1 when the counts differ from what the file must give.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { setPriority, tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse as parseCsv } from 'csv-parse/sync';
import { parse as parseYaml } from 'yaml';
import {
  BENCH_KEY_LIMITS,
  build,
  CPU_PROFILE_ARGS,
  cpuTicks,
  createScratchDatabase,
  freeLoopbackPort,
  LOG_DIR,
  projectServerEnv,
  root,
  rssMb,
  startProcess,
  svc,
} from './harness.js';
import type { operations } from '../clients/typescript/schema.js';

const ROWS = Number(process.env.BENCH_IMPORT_ROWS ?? 100_000);
const CLIENT_RPS = Number(process.env.BENCH_CLIENT_RPS ?? 20);
const BASELINE_SECONDS = Number(process.env.BENCH_BASELINE_SECONDS ?? 30);
const TARGET_ROWS_PER_SECOND = 2_000;
const TARGET_RSS_MB = 250;
const TICK_MS = 10; // USER_HZ is 100 on Linux
/** The import worked by a `svc worker` process beside the API (IMPORT_WORKER=off), as docker-compose.yml deploys it. */
const SEPARATE_WORKER = process.env.BENCH_IMPORT_WORKER === 'process';
const RESULTS = process.env.BENCH_RESULTS ?? join(root, 'bench', 'results', SEPARATE_WORKER ? 'imports-worker-process.md' : 'imports.md');
/** docker-compose.yml's CPU weight for the worker (cpu_shares, of the default 1024), as a niceness. */
const WORKER_CPU_SHARES = Number(
  (
    parseYaml(readFileSync(join(root, 'docker-compose.yml'), 'utf8'), { merge: true }) as {
      services: Record<string, { cpu_shares?: number }>;
    }
  ).services.worker?.cpu_shares ?? 1024,
);
const WORKER_NICENESS = Math.round(Math.log(1024 / WORKER_CPU_SHARES) / Math.log(1.25));

/** `svc worker` on `databaseUrl`, once its log says it started (it serves no HTTP to ask). */
async function startWorkerProcess(databaseUrl: string): Promise<ChildProcess> {
  const logFile = join(LOG_DIR, 'imports-worker.log');
  const fd = openSync(logFile, 'a');
  const env = { ...projectServerEnv(databaseUrl, 0) };
  delete env.PORT;
  const child = spawn(process.execPath, ['bin/svc.js', 'worker'], { cwd: root, env, stdio: ['ignore', fd, fd] });
  closeSync(fd);
  // The compose file gives the worker a lower CPU weight than the api; here both are plain processes,
  // so the same weight is given as niceness (each step is a factor of 1.25 in the kernel's weights).
  setPriority(child.pid!, WORKER_NICENESS);
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`svc worker exited with ${child.exitCode}; see ${logFile}`);
    if (readFileSync(logFile, 'utf8').includes('worker started')) return child;
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  child.kill('SIGKILL');
  throw new Error(`timeout waiting for svc worker; see ${logFile}`);
}

/** The server's event-loop delay since the previous scrape and its garbage-collection time so far, from GET /metrics. */
async function scrapeMetrics(base: string): Promise<{ lagP50: number; lagP99: number; lagMax: number; gcSeconds: number }> {
  const text = await fetch(`${base}/metrics`).then((response) => response.text());
  const value = (name: string) => Number(new RegExp(`^${name}(?:\\{[^}]*\\})? ([0-9.e+-]+)$`, 'm').exec(text)?.[1] ?? NaN);
  const gcSeconds = [...text.matchAll(/^nodejs_gc_duration_seconds_sum\{[^}]*\} ([0-9.e+-]+)$/gm)].reduce(
    (sum, match) => sum + Number(match[1]),
    0,
  );
  return {
    lagP50: value('nodejs_eventloop_lag_p50_seconds'),
    lagP99: value('nodejs_eventloop_lag_p99_seconds'),
    lagMax: value('nodejs_eventloop_lag_max_seconds'),
    gcSeconds,
  };
}
const ms = (seconds: number) => (seconds * 1000).toFixed(1);

// --- the file ---------------------------------------------------------------------------------

const COLUMNS = [
  'externalId',
  'type',
  'fullName',
  'email',
  'phone',
  'firstName',
  'lastName',
  'clientSinceDate',
  'preCommencementAssessment.significantChange',
  'preCommencementAssessment.resultingRisk',
  'preCommencementAssessment.assessedAt',
  'preExistingServices',
  'preExistingServiceSince',
  'businessName',
  'abn',
  'risk.isNewCustomer',
  'risk.metFaceToFace',
  'risk.handlesCashOrCrypto',
  'designatedServices',
] as const;
type Cells = Partial<Record<(typeof COLUMNS)[number], string>>;
type Expected = 'CREATED' | 'UPDATED' | 'UNCHANGED' | 'FAILED';

const SERVICES = ['PRO-REAL-ESTATE', 'PRO-CLIENT-MONEY', 'PRO-FORMATION', 'PRO-PURCHASE-SALE', 'FIN-ADVISORY', 'FIN-LOANS', 'RE-BROKER'];
const FIRST = ['Ada', 'Bo', 'Cy', 'Di', 'Ed', 'Flo', 'Gus', 'Hana', 'Ines', 'Jo', 'Kai', 'Lou', 'Mia', 'Ned', 'Oli', 'Pia'];
const LAST = ['Nguyen', 'Smith', "O'Brien", 'Williams', 'Brown', 'Jones', 'Singh', 'Taylor', 'Martin', 'Lee', 'Wilson', 'Chen'];

/** mulberry32: a fixed seed, so every run imports the same file. */
function random(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const draw = random(46);
const pick = <T>(items: readonly T[]) => items[Math.floor(draw() * items.length)]!;
const date = (yearFrom: number, yearTo: number) => {
  const year = yearFrom + Math.floor(draw() * (yearTo - yearFrom + 1));
  return `${year}-${String(1 + Math.floor(draw() * 12)).padStart(2, '0')}-${String(1 + Math.floor(draw() * 28)).padStart(2, '0')}`;
};
const services = () => {
  const chosen = new Set<string>();
  const count = 1 + Math.floor(draw() * 3);
  while (chosen.size < count) chosen.add(pick(SERVICES));
  return [...chosen].join(';');
};

/** A new record's cells: an existing client with its pre-commencement fields, or a new customer with its services. */
function newRecord(index: number): Cells {
  const first = pick(FIRST);
  const last = pick(LAST);
  const comma = draw() < 0.02;
  const cells: Cells = {
    externalId: `crm-${index}`,
    fullName: comma ? `${last}, ${first}` : `${first} ${last}`,
    email: `client${index}@example.com`,
    phone: `04${String(10_000_000 + index).slice(-8)}`,
    firstName: first,
    lastName: last,
  };
  if (draw() < 0.02) {
    Object.assign(cells, { type: 'SOLE_TRADER', businessName: `${last} Trading`, abn: '51824753556' });
  }
  if (draw() < 0.6) {
    Object.assign(cells, {
      'risk.isNewCustomer': 'false',
      clientSinceDate: date(2005, 2023),
    });
    // Services provided before commencement only (history, no designated service now: no assessment),
    // or designated services now with the pre-commencement assessment.
    if (draw() < 0.3) Object.assign(cells, { preExistingServices: services(), preExistingServiceSince: date(2005, 2020) });
    else
      Object.assign(cells, {
        designatedServices: services(),
        'preCommencementAssessment.significantChange': draw() < 0.03 ? 'true' : 'false',
        'preCommencementAssessment.resultingRisk': pick(['LOW', 'LOW', 'LOW', 'MEDIUM', 'HIGH']),
        'preCommencementAssessment.assessedAt': date(2024, 2025),
      });
  } else {
    Object.assign(cells, {
      'risk.isNewCustomer': 'true',
      'risk.metFaceToFace': draw() < 0.7 ? 'true' : 'false',
      'risk.handlesCashOrCrypto': draw() < 0.05 ? 'true' : 'false',
      designatedServices: services(),
    });
  }
  return cells;
}

/** A row its single request would refuse with a 422, in one of six ways (`kind`). */
function invalidRecord(index: number, kind: number): Cells {
  const cells = newRecord(index);
  switch (kind % 6) {
    case 0:
      return { ...cells, email: `client${index}.example.com` };
    case 1:
      return { ...cells, fullName: undefined };
    case 2:
      return { ...cells, designatedServices: 'PRO-REAL-ESTATE;NOT-A-SERVICE' };
    case 3:
      return { ...cells, 'risk.isNewCustomer': 'false', clientSinceDate: '2099-01-01' };
    case 4:
      return { ...cells, 'risk.isNewCustomer': 'true', clientSinceDate: '2015-06-30', preExistingServices: undefined };
    default:
      return { ...cells, 'risk.metFaceToFace': 'yes' };
  }
}

/** The existing record a duplicate row matches: an existing client, as POST /v1/customers received it. */
function duplicateRecord(index: number): Cells {
  return {
    externalId: `crm-existing-${index}`,
    fullName: `${pick(FIRST)} ${pick(LAST)}`,
    email: `existing${index}@example.com`,
    phone: `03${String(90_000_000 + index).slice(-8)}`,
    'risk.isNewCustomer': 'false',
    clientSinceDate: date(2005, 2023),
    'preCommencementAssessment.significantChange': 'false',
    'preCommencementAssessment.resultingRisk': 'LOW',
    designatedServices: services(),
  };
}

/** The request body of a row's cells, as the import reads a CSV row (dotted nesting, `;` lists, booleans). */
function bodyOf(cells: Cells): Record<string, unknown> {
  const body: Record<string, unknown> = {};
  for (const [column, text] of Object.entries(cells)) {
    if (text === undefined || text === '') continue;
    const path = column.split('.');
    let target = body;
    for (const segment of path.slice(0, -1)) target = (target[segment] ??= {}) as Record<string, unknown>;
    target[path.at(-1)!] =
      column === 'designatedServices' || column === 'preExistingServices'
        ? text.split(';')
        : text === 'true' || text === 'false'
          ? text === 'true'
          : text;
  }
  return body;
}

const quote = (text: string) => (/[",\n\r]/.test(text) ? `"${text.replaceAll('"', '""')}"` : text);
const csvLine = (cells: Cells) => COLUMNS.map((column) => quote(cells[column] ?? '')).join(',');

/** The file's rows in order, each with the outcome it must end with, and the records to create first. */
function buildFile(rows: number) {
  const existing: Cells[] = [];
  const lines: string[] = [COLUMNS.join(',')];
  const expected: Record<Expected, number> = { CREATED: 0, UPDATED: 0, UNCHANGED: 0, FAILED: 0 };
  for (let index = 1; index <= rows; index += 1) {
    let cells: Cells;
    let outcome: Expected;
    if (index % 10 === 0) {
      const record = duplicateRecord(existing.length + 1);
      existing.push(record);
      outcome = existing.length % 2 === 0 ? 'UPDATED' : 'UNCHANGED';
      cells = outcome === 'UPDATED' ? { ...record, phone: `02${String(80_000_000 + index).slice(-8)}` } : record;
    } else if (index % 20 === 3) {
      cells = invalidRecord(index, expected.FAILED);
      outcome = 'FAILED';
    } else {
      cells = newRecord(index);
      outcome = 'CREATED';
    }
    expected[outcome] += 1;
    lines.push(csvLine(cells));
  }
  return { text: lines.join('\n') + '\n', existing, expected };
}

// --- measuring --------------------------------------------------------------------------------

type Stat = { requests: number; errors: number; p50: number; p99: number; max: number };
const percentile = (sorted: number[], p: number) =>
  sorted.length === 0 ? 0 : sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!;

function statOf(times: number[], errors: number): Stat {
  const sorted = [...times].sort((a, b) => a - b);
  const round = (value: number) => Math.round(value * 10) / 10;
  return {
    requests: times.length,
    errors,
    p50: round(percentile(sorted, 50)),
    p99: round(percentile(sorted, 99)),
    max: round(sorted.at(-1) ?? 0),
  };
}

/**
 * A client reading GET /v1/customers/{id} at CLIENT_RPS, each request at its slot (a slow answer
 * delays the next, never stacks them), one connection's worth of load; stop() gives its latencies.
 */
function startReader(base: string, key: string, ids: string[]) {
  let running = true;
  const times: number[] = [];
  const startedAt: number[] = [];
  let errors = 0;
  const interval = 1000 / CLIENT_RPS;
  const done = (async () => {
    let next = performance.now();
    let index = 0;
    while (running) {
      const id = ids[(index * 7919) % ids.length]!;
      index += 1;
      const started = performance.now();
      try {
        const response = await fetch(`${base}/v1/customers/${id}`, { headers: { authorization: `Bearer ${key}` } });
        await response.arrayBuffer();
        if (response.ok) {
          times.push(performance.now() - started);
          startedAt.push(started);
        } else errors += 1;
      } catch {
        errors += 1;
      }
      next += interval;
      const wait = next - performance.now();
      if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
      else next = performance.now();
    }
  })();
  return {
    async stop(): Promise<Stat> {
      running = false;
      await done;
      return statOf(times, errors);
    },
    /** The latencies of the requests that started in [from, to) (performance.now()), errors not counted. */
    between(from: number, to: number): Stat {
      return statOf(
        times.filter((_, index) => startedAt[index]! >= from && startedAt[index]! < to),
        0,
      );
    },
  };
}

async function readFor(base: string, key: string, ids: string[], seconds: number): Promise<Stat> {
  const reader = startReader(base, key, ids);
  await new Promise((resolve) => setTimeout(resolve, seconds * 1000));
  return reader.stop();
}

/** The server's VmRSS every 100 ms until stopped: its peak and its first sample. */
function sampleRss(pid: number) {
  let peak = 0;
  const first = rssMb(pid);
  const timer = setInterval(() => {
    try {
      peak = Math.max(peak, rssMb(pid));
    } catch {
      // the process ended
    }
  }, 100);
  return {
    stop() {
      clearInterval(timer);
      return { first, peak: Math.max(peak, first) };
    },
  };
}

/** Busy and total CPU ticks of the whole machine (/proc/stat): busy is all but idle and iowait. */
function machineTicks(): { busy: number; total: number } {
  const fields = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1, 9).map(Number);
  const total = fields.reduce((sum, value) => sum + value, 0);
  return { busy: total - fields[3]! - fields[4]!, total };
}

/**
 * CPU ticks of the PostgreSQL backends serving `database` (their process title names it), sampled
 * every second while it runs, so a backend that starts meanwhile counts from zero; and of the whole
 * machine, so the load of anything else running on it (another checkout's tests) shows in the report.
 */
function sampleCpu(database: string, serverPid: number, workerPid: number | undefined) {
  const backends = new Map<number, { from: number; last: number }>();
  const read = (first: boolean) => {
    for (const entry of readdirSync('/proc')) {
      if (!/^\d+$/.test(entry)) continue;
      try {
        const title = readFileSync(`/proc/${entry}/cmdline`, 'utf8');
        if (!title.startsWith('postgres:') || !title.includes(database)) continue;
        const pid = Number(entry);
        const ticks = cpuTicks(pid);
        const known = backends.get(pid);
        if (known) known.last = ticks;
        else backends.set(pid, { from: first ? ticks : 0, last: ticks });
      } catch {
        // ended meanwhile
      }
    }
  };
  read(true);
  const machine = machineTicks();
  const server = cpuTicks(serverPid);
  const worker = workerPid === undefined ? 0 : cpuTicks(workerPid);
  const bench = cpuTicks(process.pid);
  const started = performance.now();
  const timer = setInterval(() => read(false), 1000);
  return {
    /** Each as a share of one core over the time sampled. */
    stop() {
      clearInterval(timer);
      read(false);
      const elapsedTicks = (performance.now() - started) / TICK_MS;
      const postgres = [...backends.values()].reduce((sum, backend) => sum + backend.last - backend.from, 0);
      const now = machineTicks();
      const cores = (now.total - machine.total) / elapsedTicks;
      const share = (ticks: number) => ticks / elapsedTicks;
      const used = {
        server: share(cpuTicks(serverPid) - server),
        worker: workerPid === undefined ? 0 : share(cpuTicks(workerPid) - worker),
        postgres: share(postgres),
        bench: share(cpuTicks(process.pid) - bench),
      };
      const busy = share(now.busy - machine.busy) / cores;
      return {
        ...used,
        cores: Math.round(cores),
        machine: busy * Math.round(cores),
        others: Math.max(0, busy * Math.round(cores) - used.server - used.worker - used.postgres - used.bench),
      };
    },
  };
}

/** Runs `work` over `items` with `limit` in flight. */
async function inParallel<T>(items: T[], limit: number, work: (item: T, index: number) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: limit }, async () => {
      while (next < items.length) {
        const index = next++;
        await work(items[index]!, index);
      }
    }),
  );
}

/** GET /v1/imports/{id}'s answer, as the committed typed client has it. */
type ImportDto = operations['getImport']['responses'][200]['content']['application/json'];

async function main() {
  const generated = performance.now();
  const file = buildFile(ROWS);
  const folder = mkdtempSync(join(tmpdir(), 'svc-import-bench-'));
  const csvPath = join(folder, 'clients.csv');
  writeFileSync(csvPath, file.text);
  process.stderr.write(
    `file: ${ROWS.toLocaleString('en')} rows, ${(Buffer.byteLength(file.text) / 1048576).toFixed(1)} MiB, ` +
      `expected ${JSON.stringify(file.expected)} (${((performance.now() - generated) / 1000).toFixed(1)} s)\n`,
  );

  build();
  const scratch = await createScratchDatabase('svc_imports');
  const { url, org, key: customersKey, pool } = scratch;
  /** What the sealers (in the server process) have yet to seal: audit rows without a sequence, events without a feed position. */
  const backlog = async () => {
    const { rows } = await pool.query<{ audit: number; events: number }>(
      `SELECT (SELECT count(*)::int FROM audit_log WHERE org_id = $1 AND sequence IS NULL) AS audit,
              (SELECT count(*)::int FROM outbox_events WHERE org_id = $1 AND position IS NULL) AS events`,
      [org.id],
    );
    return rows[0]!;
  };
  const backlogPeak = { audit: 0, events: 0 };
  const { key: importsKey } = svc(url, [
    'key',
    'create',
    '--org',
    org.id,
    '--scopes',
    'imports:read,imports:write',
    '--label',
    'bench-imports',
    '--burst-limit',
    String(BENCH_KEY_LIMITS.burst),
    '--daily-limit',
    String(BENCH_KEY_LIMITS.daily),
  ]) as { key: string };

  const port = await freeLoopbackPort();
  const server = await startProcess(
    [...CPU_PROFILE_ARGS, 'bin/svc.js', 'serve'],
    { ...projectServerEnv(url, port), ...(SEPARATE_WORKER ? { IMPORT_WORKER: 'off' } : {}) },
    `http://127.0.0.1:${port}/readyz`,
    'imports-project',
  );
  const worker = SEPARATE_WORKER ? await startWorkerProcess(url) : undefined;
  const base = `http://127.0.0.1:${port}`;
  try {
    // The records 10% of the rows duplicate, created as the API receives them.
    const seeding = performance.now();
    const ids: string[] = new Array<string>(file.existing.length);
    await inParallel(file.existing, 8, async (cells, index) => {
      const response = await fetch(`${base}/v1/customers`, {
        method: 'POST',
        headers: { authorization: `Bearer ${customersKey}`, 'content-type': 'application/json' },
        body: JSON.stringify(bodyOf(cells)),
      });
      const body = (await response.json()) as { id?: string };
      if (response.status !== 201 || !body.id) throw new Error(`seeding answered ${response.status}: ${JSON.stringify(body)}`);
      ids[index] = body.id;
    });
    process.stderr.write(
      `seeded ${ids.length.toLocaleString('en')} existing records through the API in ${((performance.now() - seeding) / 1000).toFixed(1)} s\n`,
    );

    await readFor(base, customersKey, ids, 3); // warm-up, not counted
    process.stderr.write(`reading without an import for ${BASELINE_SECONDS} s…\n`);
    const before = await readFor(base, customersKey, ids, BASELINE_SECONDS);
    const idleRss = rssMb(server.pid!);
    const workerIdleRss = worker ? rssMb(worker.pid!) : 0;

    process.stderr.write('uploading…\n');
    // The server's own measures (prom-client's defaults): a scrape resets the event-loop delay histogram.
    const metricsBefore = await scrapeMetrics(base);
    const rss = sampleRss(server.pid!);
    const workerRss = worker ? sampleRss(worker.pid!) : undefined;
    const cpuSampler = sampleCpu(new URL(url).pathname.slice(1), server.pid!, worker?.pid);
    const reader = startReader(base, customersKey, ids);
    const started = performance.now();
    const body = readFileSync(csvPath);
    const uploaded = await fetch(`${base}/v1/imports?kind=individuals`, {
      method: 'POST',
      headers: { authorization: `Bearer ${importsKey}`, 'content-type': 'text/csv' },
      body,
    });
    const accepted = performance.now();
    const created = (await uploaded.json()) as ImportDto;
    if (uploaded.status !== 202) throw new Error(`POST /v1/imports answered ${uploaded.status}: ${JSON.stringify(created)}`);
    process.stderr.write(`202 after ${((accepted - started) / 1000).toFixed(1)} s; import ${created.id}\n`);

    let current = created;
    let lastReport = 0;
    const progress: string[] = [];
    while (!['COMPLETED', 'FAILED', 'CANCELLED'].includes(current.status)) {
      await new Promise((resolve) => setTimeout(resolve, 250));
      const response = await fetch(`${base}/v1/imports/${created.id}`, { headers: { authorization: `Bearer ${importsKey}` } });
      current = (await response.json()) as ImportDto;
      if (performance.now() - lastReport > 10_000) {
        lastReport = performance.now();
        const seconds = (lastReport - started) / 1000;
        const unsealed = await backlog();
        backlogPeak.audit = Math.max(backlogPeak.audit, unsealed.audit);
        backlogPeak.events = Math.max(backlogPeak.events, unsealed.events);
        const line = `${seconds.toFixed(0)} s: ${current.rows_done}/${current.rows_total} rows (${Math.round(current.rows_done / seconds)} rows/s so far), RSS ${rssMb(server.pid!)} MB, unsealed: ${unsealed.audit} audit rows, ${unsealed.events} events`;
        progress.push(line);
        process.stderr.write(`  ${current.status} ${line}\n`);
      }
    }
    const ended = performance.now();
    const metricsAfter = await scrapeMetrics(base);
    const during = await reader.stop();
    const duringUpload = reader.between(started, accepted);
    const duringBatches = reader.between(accepted, ended);
    const cpu = cpuSampler.stop();
    const memory = rss.stop();
    const workerMemory = workerRss?.stop();
    const backlogAtEnd = await backlog();
    process.stderr.write(`${current.status} after ${((ended - started) / 1000).toFixed(1)} s; reading without an import again…\n`);
    const after = await readFor(base, customersKey, ids, BASELINE_SECONDS);
    const backlogAfter = await backlog();

    // The failed rows as the user downloads them, to fix and import again.
    const downloading = performance.now();
    const failedCsv = await fetch(`${base}/v1/imports/${created.id}/rows?outcome=FAILED`, {
      headers: { authorization: `Bearer ${importsKey}`, accept: 'text/csv' },
    }).then((response) => response.text());
    const downloadMs = performance.now() - downloading;
    const failedRecords: Array<Record<string, string>> = parseCsv(failedCsv, { columns: true });
    const failedLines = failedRecords.length;
    // Why they failed: the JSON pages carry each row's error details (field → messages).
    const reasons = new Map<string, number>();
    for (let cursor: string | null = ''; cursor !== null;) {
      const page = (await fetch(
        `${base}/v1/imports/${created.id}/rows?outcome=FAILED&limit=100${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`,
        { headers: { authorization: `Bearer ${importsKey}` } },
      ).then((response) => response.json())) as {
        data: Array<{ error: { code: string; message: string; details?: { issues?: Record<string, string[]> } } }>;
        next_cursor: string | null;
      };
      for (const { error } of page.data) {
        const issues = Object.entries(error.details?.issues ?? {}).map(([field, messages]) => `${field}: ${messages.join(' ')}`);
        const reason = `${error.code}: ${issues.length > 0 ? issues.join('; ') : error.message}`;
        reasons.set(reason, (reasons.get(reason) ?? 0) + 1);
      }
      cursor = page.next_cursor;
    }
    const topReasons = [...reasons].sort((a, b) => b[1] - a[1]).slice(0, 10);

    const endToEndSeconds = (ended - started) / 1000;
    const workerSeconds =
      current.started_at && current.finished_at ? (Date.parse(current.finished_at) - Date.parse(current.started_at)) / 1000 : NaN;
    const queuedSeconds = current.started_at ? (Date.parse(current.started_at) - Date.parse(current.created_at)) / 1000 : NaN;
    const rowsPerSecond = Math.round(current.rows_total / endToEndSeconds);
    const workerRowsPerSecond = Math.round(current.rows_total / workerSeconds);
    const expectedCounts = {
      created: file.expected.CREATED,
      updated: file.expected.UPDATED,
      unchanged: file.expected.UNCHANGED,
      failed: file.expected.FAILED,
    };
    const countsMatch = JSON.stringify(current.counts) === JSON.stringify(expectedCounts);
    const p99Ratio = before.p99 > 0 ? Math.round((during.p99 / before.p99) * 100) / 100 : NaN;
    const cores = (share: number) => share.toFixed(2);
    const verdict = (ok: boolean) => (ok ? 'met' : '**not met**');

    const lines = [
      `# Importing ${ROWS.toLocaleString('en')} individuals (issue 46)`,
      '',
      `\`npm run bench:imports\` (BENCH_IMPORT_ROWS=${ROWS}, BENCH_CLIENT_RPS=${CLIENT_RPS}, BENCH_BASELINE_SECONDS=${BASELINE_SECONDS}), ${new Date().toISOString().slice(0, 10)}. ` +
        (SEPARATE_WORKER
          ? `The production build as docker-compose.yml deploys it: \`svc serve\` (NODE_ENV=production, default settings, WEBHOOK_WORKER=off, IMPORT_WORKER=off) and a \`svc worker\` process that works the import at the compose file's CPU weight for it (cpu_shares ${WORKER_CPU_SHARES}, here niceness ${WORKER_NICENESS}), both on this machine, `
          : `The production build (\`svc serve\`, NODE_ENV=production, default settings, WEBHOOK_WORKER=off) with its job worker in the same process, `) +
        `on PostgreSQL at DATABASE_URL, this machine (2 cores). One organisation; ${file.existing.length.toLocaleString('en')} existing records created first through POST /v1/customers.`,
      '',
      `The file: ${current.rows_total.toLocaleString('en')} rows, ${(current.file_bytes / 1048576).toFixed(1)} MiB of CSV (19 columns), uploaded as the raw body (text/csv). ` +
        `Mix: 10% duplicates of existing records (half identical, half with a new phone), 5% invalid rows (six kinds), ` +
        `the rest new records (~60% existing clients with clientSinceDate and preCommencementAssessment, some preExistingServices; ~40% new customers with designatedServices and risk answers; 2% sole traders).`,
      '',
      '| figure | value | target |',
      '|---|---:|---|',
      `| end to end (upload start → COMPLETED seen) | ${endToEndSeconds.toFixed(1)} s: **${rowsPerSecond.toLocaleString('en')} rows/s** | ≥ ${TARGET_ROWS_PER_SECOND.toLocaleString('en')} rows/s: ${verdict(rowsPerSecond >= TARGET_ROWS_PER_SECOND)} |`,
      `| upload (parse, spool, store the rows; 202) | ${((accepted - started) / 1000).toFixed(1)} s | |`,
      `| queued (created_at → started_at) | ${queuedSeconds.toFixed(1)} s | |`,
      `| worker (started_at → finished_at) | ${workerSeconds.toFixed(1)} s: ${workerRowsPerSecond.toLocaleString('en')} rows/s | |`,
      `| server RSS: idle before / peak during | ${idleRss} MB / **${memory.peak} MB** | ≤ ${TARGET_RSS_MB} MB: ${verdict(memory.peak <= TARGET_RSS_MB)} |`,
      ...(workerMemory
        ? [
            `| the \`svc worker\` process: RSS idle before / peak during; CPU over the import, in cores | ${workerIdleRss} MB / ${workerMemory.peak} MB; ${cores(cpu.worker)} | |`,
          ]
        : []),
      `| CPU over the import, in cores: server process / its PostgreSQL backends / the bench process (client, poller) | ${cores(cpu.server)} / ${cores(cpu.postgres)} / ${cores(cpu.bench)} | |`,
      `| CPU of everything else on the machine over the import (PostgreSQL's shared processes such as the WAL writer and checkpointer, other checkouts' tests), in cores of ${cpu.cores} | ${cores(cpu.others)} (machine busy: ${cores(cpu.machine)}) | 0 on a quiet machine |`,
      `| GET /v1/customers/{id} p99: without the import (before) / during | ${before.p99} ms / **${during.p99} ms** (×${p99Ratio}) | ≤ 2×: ${verdict(p99Ratio <= 2)} |`,
      `| the server's event loop over the import (prom-client): delay p50 / p99 / max; time in garbage collection | ${ms(metricsAfter.lagP50)} / ${ms(metricsAfter.lagP99)} / ${ms(metricsAfter.lagMax)} ms; ${(metricsAfter.gcSeconds - metricsBefore.gcSeconds).toFixed(1)} s | |`,
      `| not yet sealed (audit rows without a sequence / events without a feed position): peak sampled / at COMPLETED / ${BASELINE_SECONDS} s later | ${backlogPeak.audit} / ${backlogAtEnd.audit} / ${backlogAfter.audit} audit rows; ${backlogPeak.events} / ${backlogAtEnd.events} / ${backlogAfter.events} events | |`,
      `| status, counts | ${current.status}, ${JSON.stringify(current.counts)} | expected ${JSON.stringify(expectedCounts)}: ${countsMatch ? 'exact' : '**differs**'} |`,
      `| failed rows download (CSV) | ${failedLines.toLocaleString('en')} rows in ${Math.round(downloadMs)} ms | |`,
      '',
      `The reading client: one request at a time, paced at ${CLIENT_RPS} requests/s, GET /v1/customers/{id} over the ${ids.length.toLocaleString('en')} existing records (half of which the import updates).`,
      '',
      '| reading client | requests | errors | p50 ms | p99 ms | max ms |',
      '|---|---:|---:|---:|---:|---:|',
      `| before the import | ${before.requests} | ${before.errors} | ${before.p50} | ${before.p99} | ${before.max} |`,
      `| during the import | ${during.requests} | ${during.errors} | ${during.p50} | ${during.p99} | ${during.max} |`,
      `| … of which during the upload (until the 202) | ${duringUpload.requests} | | ${duringUpload.p50} | ${duringUpload.p99} | ${duringUpload.max} |`,
      `| … of which after the 202 (the batches) | ${duringBatches.requests} | | ${duringBatches.p50} | ${duringBatches.p99} | ${duringBatches.max} |`,
      `| after the import | ${after.requests} | ${after.errors} | ${after.p50} | ${after.p99} | ${after.max} |`,
      '',
      "Why the rows failed (each error's code and field messages, from GET /v1/imports/{id}/rows?outcome=FAILED; the ten most frequent):",
      '',
      '| rows | error |',
      '|---:|---|',
      ...topReasons.map(([reason, rows]) => `| ${rows} | ${reason.replaceAll('|', '\\|')} |`),
      '',
      'Progress as the poller saw it (every 10 s):',
      '',
      '```',
      ...progress,
      '```',
      '',
      `Server log: ${join(LOG_DIR, 'imports-project.log')}.`,
      '',
    ];
    writeFileSync(RESULTS, lines.join('\n'));
    process.stdout.write(lines.join('\n'));
    if (!countsMatch) process.exitCode = 1;
  } finally {
    server.kill('SIGTERM');
    worker?.kill('SIGTERM');
    const exited = (child: ChildProcess) =>
      child.exitCode === null ? new Promise((resolve) => child.once('exit', resolve)) : Promise.resolve();
    await Promise.all([exited(server), ...(worker ? [exited(worker)] : [])]);
    await scratch.drop();
    rmSync(folder, { recursive: true, force: true });
  }
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
