import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync, rmSync } from 'node:fs';
import { get as httpGet } from 'node:http';
import { createServer, type Server } from 'node:net';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { apiModules } from '../../src/modules/index.js';
import { ROUTE_SCOPES } from '../../src/plugins/route-scopes.js';
import { type Scope } from '../../src/shared/scopes.js';
import { startServer } from '../../src/server.js';
import { createDatabase } from '../../src/db/client.js';
import { createOutboxRepository } from '../../src/shared/outbox.js';
import { createTestContext, testConfig, type TestContext, type TestOrg, testServices } from '../helpers/harness.js';
import { startReceiver } from '../helpers/webhook-receiver.js';
import { collectProcessOutput } from '../helpers/log-collector.js';
import { API_KEY_IN_OUTPUT, PROJECT_ROOT, startServe, temporaryDataDir } from '../helpers/svc-process.js';

/** A slow v1 route of this test only, to have a request in flight while the server closes. */
let markArrived: () => void = () => {};
/** What the abandoned probe's late database query ended with. */
let lateQuery: Promise<string> = Promise.resolve('not run');
const slowRoutes = async (app: FastifyInstance) => {
  app.get('/abandoned-probe', async () => {
    markArrived();
    await new Promise((resolve) => setTimeout(resolve, 400));
    lateQuery = app.deps.database.pool.query('SELECT 1').then(
      () => 'ok',
      (error: Error) => error.message,
    );
    return { done: await lateQuery };
  });
  app.get('/slow-probe', async () => {
    markArrived();
    await new Promise((resolve) => setTimeout(resolve, 400));
    return { done: true };
  });
};
const scopes = ROUTE_SCOPES as Record<string, Scope | null>;

let ctx: TestContext;
let org: TestOrg;
beforeAll(async () => {
  scopes['GET /v1/slow-probe'] = null;
  scopes['GET /v1/abandoned-probe'] = null;
  apiModules.push(slowRoutes);
  ctx = await createTestContext();
  org = await ctx.createOrg();
});
afterAll(async () => {
  apiModules.splice(apiModules.indexOf(slowRoutes), 1);
  delete scopes['GET /v1/slow-probe'];
  delete scopes['GET /v1/abandoned-probe'];
  await ctx?.close();
});

/** Server-side connections to this test's database other than the querying one. */
async function connectionsToDatabase(): Promise<number> {
  const client = new pg.Client({ connectionString: ctx.databaseUrl });
  await client.connect();
  try {
    const result = await client.query<{ count: number }>(
      'SELECT count(*)::int AS count FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()',
    );
    return result.rows[0]!.count;
  } finally {
    await client.end();
  }
}

/** Backends leave pg_stat_activity shortly after their client disconnects. */
async function settledConnections(atMost: number): Promise<number> {
  let count = await connectionsToDatabase();
  for (let attempt = 0; attempt < 50 && count > atMost; attempt += 1) {
    await new Promise((resolve) => setTimeout(resolve, 100));
    count = await connectionsToDatabase();
  }
  return count;
}

const config = (overrides: Partial<ReturnType<typeof testConfig>> = {}) =>
  testConfig({ databaseUrl: ctx.databaseUrl, host: '127.0.0.1', port: 0, webhookWorker: false, ...overrides });

describe('graceful shutdown of svc serve', () => {
  it('when closed with a request in flight, the request completes, new connections are refused and the pool is closed', async () => {
    const baseline = await connectionsToDatabase();
    const server = await startServer(config());
    const { port } = server.app.server.address() as { port: number };
    const arrived = new Promise<void>((resolve) => (markArrived = resolve));
    const inFlight = fetch(`http://127.0.0.1:${port}/v1/slow-probe`, { headers: { authorization: `Bearer ${org.key}` } });
    // Close only once the handler runs: a request still on its way (a busy machine) would get 503.
    await arrived;

    const closed = server.close();
    const response = await inFlight;
    // Keep-alive: without `Connection: close` on this last response the socket would stay open
    // and hold the shutdown until the keep-alive timeout.
    expect(response.headers.get('connection')).toBe('close');
    expect(response.status).toBe(200);
    expect(await response.json()).toEqual({ done: true });
    await closed;

    await expect(fetch(`http://127.0.0.1:${port}/healthz`)).rejects.toThrow();
    expect(server.connection.database.pool.ending).toBe(true);
    expect(await settledConnections(baseline)).toBeLessThanOrEqual(baseline);
  });

  it('when the client of an in-flight request has gone away, closing still lets its handler use the database before the pool closes', async () => {
    const server = await startServer(config());
    const { port } = server.app.server.address() as { port: number };
    const arrived = new Promise<void>((resolve) => (markArrived = resolve));
    // node:http rather than fetch: destroying the request closes the socket at once (fetch keeps it).
    const request = httpGet(`http://127.0.0.1:${port}/v1/abandoned-probe`, { headers: { authorization: `Bearer ${org.key}` } });
    const abandoned = new Promise<string>((resolve) =>
      request.on('error', () => resolve('aborted')).on('response', () => resolve('answered')),
    );
    await arrived;
    request.destroy();
    expect(await abandoned).toBe('aborted');
    await new Promise((resolve) => setTimeout(resolve, 50)); // the server sees the socket close

    await server.close();
    expect(await lateQuery).toBe('ok');
    expect(server.connection.database.pool.ending).toBe(true);
  });

  it('when the port is taken, the failed start closes its database pool instead of leaking it', async () => {
    const blocker: Server = createServer();
    await new Promise<void>((resolve) => blocker.listen(0, '127.0.0.1', resolve));
    const { port } = blocker.address() as { port: number };
    const baseline = await connectionsToDatabase();
    try {
      await expect(startServer(config({ port }))).rejects.toThrow(/EADDRINUSE|address already in use/i);
    } finally {
      await new Promise((resolve) => blocker.close(resolve));
    }
    expect(await settledConnections(baseline)).toBeLessThanOrEqual(baseline);
  });
  it('when closed with the in-process webhook worker posting, the post finishes and is recorded, and no connection is left', async () => {
    const receiver = await startReceiver(() => ({ delayMs: 600 }));
    try {
      const webhooks = testServices(ctx.database, { config: { webhookAllowPrivateUrls: true } }).webhooks;
      const endpoint = await webhooks.addEndpoint({ orgId: org.id, url: receiver.url('/shutdown') });
      receiver.trust('/shutdown', endpoint.secret);
      const baseline = await connectionsToDatabase();
      const server = await startServer(config({ webhookWorker: true, webhookAllowPrivateUrls: true }));
      // Written on a Database of its own, closed at once, as by another process: the worker's poll finds it.
      const writer = createDatabase(ctx.databaseUrl, { poolSize: 2 });
      const eventId = await writer
        .transaction((tx) =>
          createOutboxRepository().record({ orgId: org.id, type: 'customer.updated', customerId: null, customer: { id: 'c-1' } }, tx),
        )
        .finally(() => writer.close());
      for (let waited = 0; receiver.receipts.length === 0 && waited < 10_000; waited += 25) {
        await new Promise((resolve) => setTimeout(resolve, 25));
      }
      expect(receiver.receipts.map((receipt) => receipt.webhookId)).toEqual([eventId]);

      await server.close();
      const [delivery] = await webhooks.listDeliveries({ orgId: org.id, eventId });
      expect(delivery).toMatchObject({ status: 'succeeded', attempt_count: 1 });
      expect(delivery!.attempts).toEqual([expect.objectContaining({ status_code: 200, error: null })]);
      expect(receiver.receipts[0]!.verifyError).toBeNull();
      expect(await settledConnections(baseline)).toBeLessThanOrEqual(baseline);
    } finally {
      await receiver.close();
    }
  });
});

/*
 * The embedded database under load, as a terminal stops it. Ctrl-C signals the terminal's whole
 * foreground process group: `npm start`, the server, and (were it in that group) the embedded
 * PostgreSQL. Each run is a process group of its own (detached), so a signal to -pid is exactly that.
 */
describe('svc serve on the embedded database, stopped by a signal under load', () => {
  const dataDir = temporaryDataDir();
  const postgresDir = join(dataDir, 'postgres');
  // Room for the held requests in the pool, and a lock wait well past the test's hold.
  const env = {
    DATA_DIR: dataDir,
    PORT: '0',
    HOST: '127.0.0.1',
    WEBHOOK_WORKER: 'off',
    LOG_LEVEL: 'info',
    DATABASE_POOL_SIZE: '20',
    DATABASE_LOCK_TIMEOUT_MS: '8000',
    DATABASE_STATEMENT_TIMEOUT_MS: '20000',
  };
  const STREAMS = 8;
  let key = '';
  let customerId = '';
  const launched: ChildProcess[] = [];

  beforeAll(async () => {
    // The first start: the sandbox key the load uses, and a customer of its organisation.
    const first = startServe({ ...env, DATABASE_URL: undefined });
    const baseUrl = await first.baseUrl();
    for (let waited = 0; !API_KEY_IN_OUTPUT.test(first.stdout()) && waited < 10_000; waited += 25) {
      await new Promise((resolve) => setTimeout(resolve, 25));
    }
    key = first.stdout().match(API_KEY_IN_OUTPUT)![0]!;
    const created = await fetch(`${baseUrl}/v1/customers`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ externalId: 'shutdown-1', fullName: 'Shutdown Probe', email: 'shutdown-probe@example.com' }),
    });
    const body = (await created.json()) as { id: string };
    expect(created.status, JSON.stringify(body)).toBe(201);
    customerId = body.id;
    expect(await first.stop('SIGTERM')).toEqual({ code: 0, signal: null });
  }, 120_000);

  afterAll(() => {
    for (const child of launched) {
      if (child.exitCode === null && child.signalCode === null) process.kill(-child.pid!, 'SIGKILL');
    }
    const running = postmasterPid();
    if (running !== undefined) process.kill(running, 'SIGQUIT');
    rmSync(dataDir, { recursive: true, force: true });
  });

  function postmasterPid(): number | undefined {
    const pidFile = join(postgresDir, 'postmaster.pid');
    return existsSync(pidFile) ? Number(readFileSync(pidFile, 'utf8').split('\n')[0]) : undefined;
  }

  function postgresProcesses(): string[] {
    try {
      return execFileSync('pgrep', ['-af', postgresDir], { encoding: 'utf8' })
        .split('\n')
        .filter((line) => line.includes('postgres') && !line.includes('pgrep'));
    } catch {
      return []; // pgrep exits 1 when nothing matches
    }
  }

  /** `npm start`, or `svc serve` itself, as the leader of a new process group. */
  function launch(how: 'npm start' | 'svc serve') {
    const [file, args] = how === 'npm start' ? ['npm', ['start']] : [process.execPath, [join(PROJECT_ROOT, 'bin', 'svc.js'), 'serve']];
    const child = spawn(file, args, {
      cwd: PROJECT_ROOT,
      env: { PATH: process.env.PATH, HOME: process.env.HOME, ...env },
      detached: true,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    launched.push(child);
    let stderr = '';
    child.stdout.resume();
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
      child.on('exit', (code, signal) => {
        collectProcessOutput(stderr);
        resolve({ code, signal });
      }),
    );
    const port = new Promise<number>((resolve, reject) => {
      child.stderr.on('data', (chunk: Buffer) => {
        stderr += chunk.toString();
        const match = /Server listening at http:\/\/127\.0\.0\.1:(\d+)/.exec(stderr);
        if (match) resolve(Number(match[1]));
      });
      void exited.then(() => reject(new Error(`${how} exited before listening\n${stderr}`)));
    });
    return { child, port, exited, stderr: () => stderr };
  }

  type Outcome = { sentAt: number; status?: number; body?: unknown; error?: string };

  /** Lists customers back to back until the server stops answering (a refused connection or its closing 503). */
  async function stream(baseUrl: string, outcomes: Outcome[]): Promise<void> {
    for (;;) {
      const outcome: Outcome = { sentAt: performance.now() };
      outcomes.push(outcome);
      try {
        const response = await fetch(`${baseUrl}/v1/customers`, { headers: { authorization: `Bearer ${key}` } });
        outcome.status = response.status;
        outcome.body = await response.json();
        if (response.status >= 300) return;
      } catch (error) {
        outcome.error = String((error as { cause?: { code?: string } }).cause?.code ?? error);
        return;
      }
    }
  }

  /** Sessions waiting for the blocker's change to commit: a list's first page waits so (migration 0009). */
  async function waitingForBlocker(client: pg.Client): Promise<number> {
    const result = await client.query(`SELECT count(*)::int AS count FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`);
    return result.rows[0].count as number;
  }

  /** The answer to a request that arrives once closing has begun (graceful-close.plugin.ts): the server is going, not failing. */
  const closingResponse = { error: { code: 'service_unavailable' } };

  it.each([
    ['SIGINT', 'its whole process group (Ctrl-C under npm start)', 'npm start', 'group'],
    ['SIGTERM', 'its whole process group (npm start)', 'npm start', 'group'],
    ['SIGTERM', 'the server process alone', 'svc serve', 'process'],
    ['SIGINT', 'the server process alone', 'svc serve', 'process'],
  ] as const)(
    'when %s reaches %s with requests in flight, every one completes with a 2xx, then PostgreSQL stops and the process exits 0 once drained',
    async (signal, _target, how, scope) => {
      const server = launch(how);
      const baseUrl = `http://127.0.0.1:${await server.port}`;
      const port = Number(readFileSync(join(postgresDir, 'postmaster.pid'), 'utf8').split('\n')[3]);
      const password = readFileSync(join(dataDir, 'postgres-password'), 'utf8').trim();

      // Requests provably in flight when the signal arrives: a list's first page waits for every
      // change of the organisation already stamped to commit, and this client holds one open.
      const blocker = new pg.Client({ host: '127.0.0.1', port, user: 'postgres', password, database: 'verification' });
      blocker.on('error', () => {});
      await blocker.connect();
      await blocker.query('BEGIN');
      await blocker.query(`UPDATE customers SET name = name || '.' WHERE id = $1`, [customerId]);
      const outcomes: Outcome[] = [];
      const streams = Array.from({ length: STREAMS }, () => stream(baseUrl, outcomes));
      for (let waited = 0; (await waitingForBlocker(blocker)) === 0; waited += 25) {
        if (waited > 20_000) throw new Error(`the list requests never waited in the database\n${server.stderr()}`);
        await new Promise((resolve) => setTimeout(resolve, 25));
      }
      // The pool pipelines statements, so the others may queue behind that one in the server: on
      // loopback, half a second more lets every request sent reach it.
      await new Promise((resolve) => setTimeout(resolve, 500));
      expect(outcomes.filter((outcome) => outcome.status !== undefined || outcome.error !== undefined)).toEqual([]);

      const signalledAt = performance.now();
      process.kill(scope === 'group' ? -server.child.pid! : server.child.pid!, signal);
      for (let waited = 0; !server.stderr().includes(`shutting down on ${signal}`); waited += 25) {
        if (waited > 10_000) throw new Error(`no shutdown on ${signal}\n${server.stderr()}`);
        await new Promise((resolve) => setTimeout(resolve, 25));
      }
      await new Promise((resolve) => setTimeout(resolve, 500));
      // PostgreSQL still serves (this session too), and the server still waits for its requests.
      await expect(blocker.query('SELECT 1 AS up')).resolves.toMatchObject({ rows: [{ up: 1 }] });
      expect(await waitingForBlocker(blocker)).toBeGreaterThan(0);
      expect(server.child.exitCode).toBeNull();
      await blocker.query('COMMIT');
      await blocker.end();

      await Promise.all(streams);
      const exit = await server.exited;
      // Exit code 0 is the drain's end: close-with-grace's 25 s timeout would exit 1.
      expect(exit, server.stderr()).toMatchObject({ code: 0, signal: null });
      expect(existsSync(join(postgresDir, 'postmaster.pid'))).toBe(false);
      expect(postgresProcesses()).toEqual([]);

      // Every request sent before the signal was in flight (waiting in the database) and completed.
      const before = outcomes.filter((outcome) => outcome.sentAt < signalledAt);
      expect(before).toHaveLength(STREAMS);
      for (const outcome of before)
        expect(outcome).toMatchObject({ status: 200, body: { data: [expect.objectContaining({ id: customerId })] } });
      // One sent after it is answered too, or meets the server closing: the closing 503 on a
      // kept-alive connection, or a connection no longer accepted. Never a failure of the server or its database.
      for (const outcome of outcomes.filter((candidate) => candidate.sentAt >= signalledAt)) {
        if (outcome.status !== undefined && outcome.status < 300) continue;
        if (outcome.status !== undefined) expect(outcome).toMatchObject({ status: 503, body: closingResponse });
        else expect(outcome.error).toMatch(/ECONNREFUSED|ECONNRESET|UND_ERR_SOCKET/);
      }
    },
    120_000,
  );
});
