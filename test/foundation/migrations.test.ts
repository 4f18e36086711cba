import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import pg from 'pg';
import { afterAll, describe, expect, it, vi } from 'vitest';
import { migrationsFolder, runMigrations } from '../../src/db/migrate.js';
import { createEmptyDatabase } from '../helpers/database.js';
import { API_KEY_IN_OUTPUT, startServe, type ServeProcess } from '../helpers/svc-process.js';
import { runSvcInProcess } from '../helpers/cli-in-process.js';

// The svc commands run in this process (runSvcInProcess); `svc serve` is spawned.
vi.setConfig({ testTimeout: 120_000 });

const journal = JSON.parse(readFileSync(join(migrationsFolder(), 'meta', '_journal.json'), 'utf8')) as {
  entries: Array<{ tag: string }>;
};
const EXPECTED_TABLES = ['organisations', 'api_keys', 'audit_log', 'customers', 'idempotency_keys', 'outbox_events'];

const cleanups: Array<() => Promise<void>> = [];
afterAll(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup();
});

async function query<T extends pg.QueryResultRow>(url: string, text: string): Promise<T[]> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return (await client.query<T>(text)).rows;
  } finally {
    await client.end();
  }
}

async function expectMigratedOnce(url: string): Promise<void> {
  const applied = await query<{ hash: string; count: number }>(
    url,
    'SELECT hash, count(*)::int AS count FROM drizzle.__drizzle_migrations GROUP BY hash',
  );
  expect(applied).toHaveLength(journal.entries.length);
  expect(applied.every((row) => row.count === 1)).toBe(true);
  const tables = await query<{ table_name: string }>(url, `SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'`);
  expect(tables.map((row) => row.table_name)).toEqual(expect.arrayContaining(EXPECTED_TABLES));
}

describe('migrations under concurrency', () => {
  it('when a database from before the job queues holds a queued email, migrating installs the queues and gives that email a job', async () => {
    const database = await createEmptyDatabase();
    cleanups.push(database.drop);
    await runMigrations(database.url);
    // As the loops left it: no job schema, an email waiting in its table (and one already sent).
    await query(database.url, 'DROP SCHEMA pgboss CASCADE');
    const [org] = await query<{ id: string }>(database.url, `INSERT INTO organisations (name) VALUES ('Upgraded') RETURNING id`);
    const [queued] = await query<{ id: string }>(
      database.url,
      `INSERT INTO emails (org_id, recipient, subject, body) VALUES ('${org!.id}', 'a@example.test', 'S', 'B') RETURNING id`,
    );
    await query(
      database.url,
      `INSERT INTO emails (org_id, recipient, subject, body, status) VALUES ('${org!.id}', 'b@example.test', 'S', 'B', 'sent')`,
    );

    expect(await runMigrations(database.url)).toEqual({ applied: 0 });

    const jobs = await query<{ data: unknown; group_id: string }>(
      database.url,
      `SELECT data, group_id FROM pgboss.job WHERE name = 'email-send'`,
    );
    expect(jobs).toEqual([{ data: { orgId: org!.id, emailId: queued!.id }, group_id: org!.id }]);
  });

  it('when four migrators run at once on an empty database, all succeed and each migration is applied exactly once', async () => {
    const database = await createEmptyDatabase();
    cleanups.push(database.drop);

    const results = await Promise.all([1, 2, 3, 4].map(() => runMigrations(database.url)));

    expect(results.map((result) => result.applied).sort((a, b) => a - b)).toEqual([0, 0, 0, journal.entries.length]);
    await expectMigratedOnce(database.url);
  });

  it('when the database is already current, running the migrations again applies nothing', async () => {
    const database = await createEmptyDatabase();
    cleanups.push(database.drop);
    await runMigrations(database.url);
    expect(await runMigrations(database.url)).toEqual({ applied: 0 });
    await expectMigratedOnce(database.url);
  });

  it('when svc migrate runs, it prints one JSON document with the number applied, and a second run applies nothing', async () => {
    const database = await createEmptyDatabase();
    cleanups.push(database.drop);
    const first = await runSvcInProcess(['migrate'], { DATABASE_URL: database.url });
    expect(first.code, first.stderr).toBe(0);
    expect(JSON.parse(first.stdout)).toEqual({ applied: journal.entries.length });
    await expectMigratedOnce(database.url);
    const second = await runSvcInProcess(['migrate'], { DATABASE_URL: database.url });
    expect(second.code, second.stderr).toBe(0);
    expect(JSON.parse(second.stdout)).toEqual({ applied: 0 });
    // Migrating is not a first start: no sandbox organisation and no key.
    expect(await query(database.url, 'SELECT id FROM organisations')).toEqual([]);
  });

  it('when svc migrate cannot reach the database, it exits non-zero with a message and prints nothing', async () => {
    const result = await runSvcInProcess(['migrate'], { DATABASE_URL: 'postgres://nobody@127.0.0.1:1/none' });
    expect(result.code).not.toBe(0);
    expect(result.code).not.toBeNull();
    expect(result.stdout).toBe('');
    expect(result.stderr).toMatch(/^error: /m);
  });

  it('when two svc serve processes start at once on one empty DATABASE_URL, both become ready, the schema is migrated once, and no organisation or key is created: each says how to make one with the CLI', async () => {
    const database = await createEmptyDatabase();
    cleanups.push(database.drop);
    const servers: ServeProcess[] = [1, 2].map(() => startServe({ DATABASE_URL: database.url, WEBHOOK_WORKER: 'off' }));
    cleanups.push(async () => void (await Promise.all(servers.map((server) => server.stop('SIGKILL')))));

    for (const server of servers) {
      const response = await fetch(`${await server.baseUrl()}/readyz`);
      expect(response.status).toBe(200);
      expect(await response.json()).toEqual({ status: 'ready', database: 'ok' });
    }
    await expectMigratedOnce(database.url);
    // A key printed here would sit in a deployment's logs: the sandbox belongs to the embedded default only.
    expect(await query(database.url, 'SELECT id FROM organisations')).toEqual([]);
    expect(await query(database.url, 'SELECT id FROM api_keys')).toEqual([]);
    for (const server of servers) {
      expect(server.stdout()).not.toMatch(API_KEY_IN_OUTPUT);
      expect(server.stdout()).toContain('has no organisation yet');
      expect(server.stdout()).toMatch(/node bin\/svc\.js org create --name/);
      expect(server.stdout()).toMatch(/node bin\/svc\.js key create --org <id printed above> --scopes customers:read,/);
    }

    const exits = await Promise.all(servers.map((server) => server.stop('SIGTERM')));
    expect(exits).toEqual([
      { code: 0, signal: null },
      { code: 0, signal: null },
    ]);

    // Once an organisation exists (made with the CLI as printed), a start prints nothing at all on stdout.
    const created = await runSvcInProcess(['org', 'create', '--name', 'First Org'], { DATABASE_URL: database.url });
    expect(created.code, created.stderr).toBe(0);
    const again = startServe({ DATABASE_URL: database.url, WEBHOOK_WORKER: 'off' });
    cleanups.push(async () => void (await again.stop('SIGKILL')));
    expect((await fetch(`${await again.baseUrl()}/readyz`)).status).toBe(200);
    expect(await again.stop('SIGTERM')).toEqual({ code: 0, signal: null });
    expect(again.stdout()).toBe('');
  });
});
