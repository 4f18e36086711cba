import pg from 'pg';
import { afterAll, beforeAll, inject } from 'vitest';
import { createDatabase } from '../../src/db/client.js';
import { createTestDatabase } from '../helpers/database.js';
import { ALL_SCOPES, testServices } from '../helpers/harness.js';
import { startServerProcess, type ServerProcess } from './processes.js';

/**
 * Shared pieces of the database fault tests (`database-faults-*.test.ts`, issue 26 item 8): a scratch
 * database on the run's PostgreSQL, a closed-loop load of GETs, lists and upserts whose every request
 * is timed, and the figures each test prints as one JSON line.
 */

/**
 * Small timeouts, so that "no request waits longer than the configured timeouts" is quick to check.
 * The lock timeout is 2 s (less than half the statement timeout, as the configuration requires): a
 * smaller one would make the connection-fault tests measure slow writers on a loaded machine.
 */
export const FAULT_TIMEOUTS = {
  DATABASE_STATEMENT_TIMEOUT_MS: '5000',
  DATABASE_LOCK_TIMEOUT_MS: '2000',
  DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_MS: '5000',
  DATABASE_QUERY_TIMEOUT_MS: '6000',
  DATABASE_CONNECT_TIMEOUT_MS: '2000',
  DATABASE_POOL_SIZE: '10',
} as const;

/** The longest a request may take under these settings: the largest timeout plus 1 s of slack. */
export function requestBound(env: Record<string, string>): number {
  const timeouts = Object.entries(env)
    .filter(([name]) => /^DATABASE_.*_TIMEOUT_MS$/.test(name) && name !== 'DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_MS')
    .map(([, value]) => Number(value));
  return Math.max(...timeouts) + 1000;
}

/** A client's own guard: a request still open after this is a hang, recorded as status 0. */
const HANG_MS = 20_000;

export type FaultDatabase = { url: string; name: string; key: string; orgId: string; drop(): Promise<void> };

/** A migrated scratch database of the test's own (dropped WITH (FORCE)), with an org and an all-scopes key. */
export async function createFaultDatabase(label: string): Promise<FaultDatabase> {
  const testDatabase = await createTestDatabase();
  const name = decodeURIComponent(new URL(testDatabase.url).pathname.slice(1));
  const database = createDatabase(testDatabase.url);
  try {
    const org = await testServices(database).organisations.create({ name: `Faults ${label}`, credits: 0 });
    const { key } = await testServices(database).apiKeys.create({ orgId: org.id, scopes: ALL_SCOPES });
    return { url: testDatabase.url, name, key, orgId: org.id, drop: testDatabase.drop };
  } finally {
    await database.close();
  }
}

/** A plain pg.Client on the run's server: on its admin database, or on `database` when given. */
export async function connectAdmin(database?: string): Promise<pg.Client> {
  const url = new URL(inject('adminDatabaseUrl'));
  if (database) url.pathname = `/${database}`;
  const client = new pg.Client({ connectionString: url.toString() });
  client.on('error', () => {});
  await client.connect();
  return client;
}

export type RequestSpec = { op: string; method: string; path: string; body?: unknown; target?: string };

export type Outcome = {
  op: string;
  target?: string;
  method: string;
  path: string;
  status: number;
  code?: string;
  retryAfter: string | null;
  ms: number;
  startedAt: number;
  endedAt: number;
  error?: string;
  body?: string;
};

/** One request, timed; a network error or a hang past HANG_MS is status 0 rather than a thrown error. */
export async function timedCall(server: { url: string }, key: string, spec: RequestSpec): Promise<Outcome> {
  const startedAt = Date.now();
  const headers: Record<string, string> = { authorization: `Bearer ${key}` };
  if (spec.body !== undefined) headers['content-type'] = 'application/json';
  const base = { op: spec.op, target: spec.target, method: spec.method, path: spec.path, startedAt };
  try {
    const response = await fetch(`${server.url}${spec.path}`, {
      method: spec.method,
      headers,
      body: spec.body === undefined ? undefined : JSON.stringify(spec.body),
      signal: AbortSignal.timeout(HANG_MS),
    });
    const body = await response.text();
    const endedAt = Date.now();
    let code: string | undefined;
    if (response.status >= 300) {
      try {
        code = JSON.parse(body)?.error?.code;
      } catch {
        code = '(not an error envelope)';
      }
    }
    return {
      ...base,
      status: response.status,
      code,
      retryAfter: response.headers.get('retry-after'),
      ms: endedAt - startedAt,
      endedAt,
      ...(response.status >= 300 ? { body: body.slice(0, 300) } : {}),
    };
  } catch (error) {
    const endedAt = Date.now();
    return { ...base, status: 0, retryAfter: null, ms: endedAt - startedAt, endedAt, error: String((error as Error)?.message ?? error) };
  }
}

export const ok = (outcome: Outcome) => outcome.status >= 200 && outcome.status < 300;

/** Upserts `count` customers with external ids `<prefix>-<i>` and returns their ids (in order). */
export async function seedCustomers(server: { url: string }, key: string, prefix: string, count: number): Promise<string[]> {
  const ids: string[] = [];
  for (let index = 0; index < count; index += 1) {
    const spec = upsertSpec(`${prefix}-${index}`, `Seed${prefix.replace(/[^a-z0-9]/gi, '')} Number${index}`, 0);
    const response = await fetch(`${server.url}${spec.path}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify(spec.body),
    });
    const body = (await response.json()) as { id?: string };
    if (!response.ok || !body.id) throw new Error(`seeding ${prefix}-${index} failed: ${response.status} ${JSON.stringify(body)}`);
    ids.push(body.id);
  }
  return ids;
}

/** An upsert by external id; `version` changes the phone (and the structured name), so each one is a real write. */
export function upsertSpec(externalId: string, fullName: string, version: number, target?: string): RequestSpec {
  const slug = externalId.replace(/[^a-z0-9]/gi, '').toLowerCase();
  return {
    op: 'upsert',
    target,
    method: 'POST',
    path: '/v1/customers',
    body: {
      externalId,
      fullName,
      email: `${slug}@faults.test`,
      phone: `+61 400 ${String(version % 1_000_000).padStart(6, '0')}`,
      firstName: fullName.split(' ')[0],
      lastName: `${fullName.split(' ').slice(1).join(' ') || 'Person'} ${version % 3}`,
    },
  };
}

export const getSpec = (id: string, target?: string): RequestSpec => ({ op: 'get', target, method: 'GET', path: `/v1/customers/${id}` });
export const listSpec = (): RequestSpec => ({ op: 'list', method: 'GET', path: '/v1/customers?limit=20' });

/** The mix of the storms: a GET by id of a seeded record, a list page, an upsert of one of 20 records of the worker's own. */
export function mixedRequest(ids: string[], worker: number, n: number): RequestSpec {
  switch (n % 3) {
    case 0:
      return getSpec(ids[Math.floor(Math.random() * ids.length)]!);
    case 1:
      return listSpec();
    default:
      return upsertSpec(`w${worker}-r${n % 20}`, `Worker${worker} Record${n % 20}`, n);
  }
}

export type Load = {
  outcomes: Outcome[];
  /** Stops issuing requests and waits for those in flight. */
  stop(): Promise<Outcome[]>;
};

/** `workers` clients, each sending its next request as soon as the previous one answered. */
export function startLoad(server: { url: string }, key: string, workers: number, next: (worker: number, n: number) => RequestSpec): Load {
  const outcomes: Outcome[] = [];
  let stopping = false;
  const running = Array.from({ length: workers }, async (_, worker) => {
    for (let n = 0; !stopping; n += 1) outcomes.push(await timedCall(server, key, next(worker, n)));
  });
  return {
    outcomes,
    async stop() {
      stopping = true;
      await Promise.all(running);
      return outcomes;
    },
  };
}

export const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Milliseconds from `since` until /readyz answers 200 and then a GET by id and an upsert succeed, all
 * in one pass (probing every 20 ms); `null` when that did not happen within `withinMs`.
 */
export async function timeToHealthy(
  server: { url: string },
  key: string,
  probe: { getId: string; upsert: RequestSpec },
  since: number,
  withinMs = 15_000,
): Promise<number | null> {
  while (Date.now() - since < withinMs) {
    const ready = await fetch(`${server.url}/readyz`, { signal: AbortSignal.timeout(HANG_MS) }).then(
      (response) => response.status === 200,
      () => false,
    );
    if (ready && ok(await timedCall(server, key, getSpec(probe.getId))) && ok(await timedCall(server, key, probe.upsert))) {
      return Date.now() - since;
    }
    await sleep(20);
  }
  return null;
}

/**
 * The server's backends on `database` that are not idle (running a statement or inside a transaction).
 * With `begunBefore`, only those whose transaction began before it: what a load left behind, not a
 * statement of the server's own background work (its job runner polls) that began after.
 */
export async function busyBackends(admin: pg.Client, database: string, options: { exceptPids?: number[]; begunBefore?: Date } = {}) {
  const { rows } = await admin.query<{ pid: number; state: string; query: string; seconds: number }>(
    `SELECT pid, state, left(query, 120) AS query, extract(epoch FROM now() - state_change)::float AS seconds
       FROM pg_stat_activity
      WHERE datname = $1 AND pid <> pg_backend_pid() AND backend_type = 'client backend'
        AND state IS DISTINCT FROM 'idle' AND NOT (pid = ANY($2::int[]))
        AND ($3::timestamptz IS NULL OR xact_start < $3::timestamptz)`,
    [database, options.exceptPids ?? [], options.begunBefore ?? null],
  );
  return rows;
}

/** How many backends (any state) are connected to `database`. */
export async function backendCount(admin: pg.Client, database: string): Promise<number> {
  const { rows } = await admin.query<{ count: number }>(
    `SELECT count(*)::int AS count FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid() AND backend_type = 'client backend'`,
    [database],
  );
  return rows[0]!.count;
}

/** Failures grouped by status ("503") and by status and code ("503 database_unavailable"). */
export function failureBreakdown(outcomes: Outcome[]) {
  const byStatus: Record<string, number> = {};
  const byCode: Record<string, number> = {};
  for (const outcome of outcomes) {
    if (ok(outcome)) continue;
    byStatus[String(outcome.status)] = (byStatus[String(outcome.status)] ?? 0) + 1;
    const label = `${outcome.status} ${outcome.code ?? outcome.error ?? ''}`.trim();
    byCode[label] = (byCode[label] ?? 0) + 1;
  }
  return { byStatus, byCode };
}

/** Prints the test's figures as one JSON line (copied into the issue's closing note) and returns them. */
export function printFigures(test: string, outcomes: Outcome[], extra: Record<string, unknown>) {
  const { byStatus, byCode } = failureBreakdown(outcomes);
  const longest = outcomes.reduce<Outcome | undefined>((max, outcome) => (!max || outcome.ms > max.ms ? outcome : max), undefined);
  const byOp: Record<string, { requests: number; p50Ms: number; p99Ms: number; maxMs: number }> = {};
  for (const op of [...new Set(outcomes.map((outcome) => `${outcome.target ? `${outcome.target} ` : ''}${outcome.op}`))].sort()) {
    const times = outcomes
      .filter((outcome) => `${outcome.target ? `${outcome.target} ` : ''}${outcome.op}` === op)
      .map((outcome) => outcome.ms)
      .sort((a, b) => a - b);
    const at = (fraction: number) => times[Math.min(times.length - 1, Math.floor(fraction * times.length))]!;
    byOp[op] = { requests: times.length, p50Ms: at(0.5), p99Ms: at(0.99), maxMs: times[times.length - 1]! };
  }
  const figures = {
    test,
    requests: outcomes.length,
    succeeded: outcomes.filter(ok).length,
    failuresByStatus: byStatus,
    failuresByCode: byCode,
    longestRequestMs: longest?.ms ?? 0,
    longestRequest: longest ? `${longest.method} ${longest.path.replace(/[0-9a-f-]{36}/, ':id')} -> ${longest.status}` : null,
    ...extra,
    byOp,
  };
  console.log(JSON.stringify(figures));
  return figures;
}

/** A compact description of outcomes for assertion messages. */
export function describeOutcomes(outcomes: Outcome[], limit = 5): string {
  return JSON.stringify(
    outcomes.slice(0, limit).map((outcome) => ({
      op: outcome.op,
      target: outcome.target,
      status: outcome.status,
      code: outcome.code,
      retryAfter: outcome.retryAfter,
      ms: outcome.ms,
      startedAt: new Date(outcome.startedAt).toISOString(),
      error: outcome.error,
      body: outcome.body,
    })),
  );
}

/** Whether a failure is the one allowed under database faults: 503 database_unavailable in the envelope, with Retry-After. */
export const isDatabaseUnavailable = (outcome: Outcome) =>
  outcome.status === 503 && outcome.code === 'database_unavailable' && outcome.retryAfter !== null;

/**
 * For the test file that calls it: a scratch database and `svc serve` on it with `env`, made before
 * its tests, stopped and dropped after them.
 */
export function servedFaultDatabase(name: string, env: Record<string, string>): { fault: FaultDatabase; server: ServerProcess } {
  const served = {} as { fault: FaultDatabase; server: ServerProcess };
  beforeAll(async () => {
    served.fault = await createFaultDatabase(name);
    served.server = await startServerProcess({ DATABASE_URL: served.fault.url, ...env });
  });
  afterAll(async () => {
    await served.server?.stop();
    await served.fault?.drop();
  });
  return served;
}
