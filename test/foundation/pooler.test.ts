import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { drizzle } from 'drizzle-orm/node-postgres';
import { migrate } from 'drizzle-orm/node-postgres/migrator';
import { afterAll, describe, expect, it } from 'vitest';
import { inject } from 'vitest';
import { type ConfigError, loadConfig } from '../../src/config/config.js';
import { buildApp } from '../../src/app.js';
import { createDatabase } from '../../src/db/client.js';
import { connect } from '../../src/db/connect.js';
import { migrationsFolder, runMigrations } from '../../src/db/migrate.js';
import { createEmptyDatabase } from '../helpers/database.js';
import { testConfig } from '../helpers/harness.js';
import { findPgBouncer, startPgBouncer, type PgBouncer } from '../reliability/pgbouncer.js';

// Issue 34, item 7: migrations under a transaction-scoped advisory lock, and DATABASE_DIRECT_URL for
// what a transaction-mode pooler at DATABASE_URL cannot carry (migrations).

const journal = JSON.parse(readFileSync(join(migrationsFolder(), 'meta', '_journal.json'), 'utf8')) as { entries: Array<{ tag: string }> };
const cleanups: Array<() => Promise<void> | void> = [];
afterAll(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup();
});

async function query<T extends pg.QueryResultRow>(url: string, text: string, values: unknown[] = []): Promise<T[]> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return (await client.query<T>(text, values)).rows;
  } finally {
    await client.end();
  }
}

/** Advisory locks held in the database the query runs in (pg_locks spans the whole server). */
const ADVISORY_LOCKS_HERE = `SELECT count(*)::int AS count FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`;

/** Each shipped migration recorded exactly once, in journal order, and the schema there. */
async function expectMigratedOnce(url: string): Promise<void> {
  const rows = await query<{ hash: string; created_at: number }>(
    url,
    'SELECT hash, created_at::float8 AS created_at FROM drizzle.__drizzle_migrations ORDER BY id',
  );
  expect(rows).toHaveLength(journal.entries.length);
  expect(new Set(rows.map((row) => row.hash)).size).toBe(journal.entries.length);
  const tables = await query<{ count: number }>(
    url,
    `SELECT count(*)::int AS count FROM information_schema.tables WHERE table_schema = 'public' AND table_name IN ('customers', 'outbox_events', 'webhook_deliveries')`,
  );
  expect(tables[0]!.count).toBe(3);
}

/** The migrations folder cut after its first `count` entries, as an older build shipped it. */
function olderMigrationsFolder(count: number): string {
  const dir = mkdtempSync(join(tmpdir(), 'svc-older-migrations-'));
  cpSync(migrationsFolder(), dir, { recursive: true });
  const full = JSON.parse(readFileSync(join(dir, 'meta', '_journal.json'), 'utf8')) as { entries: unknown[] };
  writeFileSync(join(dir, 'meta', '_journal.json'), JSON.stringify({ ...full, entries: full.entries.slice(0, count) }));
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** What the previous runner did: drizzle's own migrate() on one connection. */
async function migrateWithDrizzle(url: string, folder: string): Promise<void> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    await migrate(drizzle({ client }), { migrationsFolder: folder });
  } finally {
    await client.end();
  }
}

describe('migrations under a transaction-scoped lock', () => {
  it("when a database was migrated by drizzle's own migrate() (the previous runner), the new runner applies nothing and records nothing twice", async () => {
    const database = await createEmptyDatabase();
    cleanups.push(database.drop);
    await migrateWithDrizzle(database.url, migrationsFolder());

    expect(await runMigrations(database.url)).toEqual({ applied: 0 });
    await expectMigratedOnce(database.url);
  });

  it('when a database was migrated by the previous runner with an older build, the new runner applies exactly the migrations added since, once each', async () => {
    const database = await createEmptyDatabase();
    cleanups.push(database.drop);
    const older = journal.entries.length - 3;
    await migrateWithDrizzle(database.url, olderMigrationsFolder(older));

    expect(await runMigrations(database.url)).toEqual({ applied: 3 });
    await expectMigratedOnce(database.url);
    // And drizzle's own runner, given the whole folder, finds nothing left to do either.
    await migrateWithDrizzle(database.url, migrationsFolder());
    await expectMigratedOnce(database.url);
  });

  it('when a migration fails, nothing of the run is kept: no schema change, no row, and the lock is gone with the transaction', async () => {
    const database = await createEmptyDatabase();
    cleanups.push(database.drop);
    // A table the first migration creates, made beforehand: its CREATE TABLE fails.
    await query(database.url, 'CREATE TABLE organisations (id int)');
    await expect(runMigrations(database.url)).rejects.toThrow(/already exists/);
    const migrated = await query<{ table: string | null }>(
      database.url,
      `SELECT to_regclass('drizzle.__drizzle_migrations')::text AS table`,
    );
    expect(migrated[0]!.table).toBeNull();
    const locks = await query<{ count: number }>(database.url, ADVISORY_LOCKS_HERE);
    expect(locks[0]!.count).toBe(0);
  });
});

describe('DATABASE_DIRECT_URL', () => {
  it('when DATABASE_DIRECT_URL is set, it is parsed; without DATABASE_URL or as another scheme, it is refused by name', () => {
    expect(
      loadConfig({ DATABASE_URL: 'postgres://app@pooler:6432/svc', DATABASE_DIRECT_URL: 'postgres://app@db:5432/svc' }).databaseDirectUrl,
    ).toBe('postgres://app@db:5432/svc');
    expect(loadConfig({ DATABASE_URL: 'postgres://app@db:5432/svc' }).databaseDirectUrl).toBeUndefined();
    const problems = (environment: NodeJS.ProcessEnv) => {
      try {
        loadConfig(environment);
      } catch (error) {
        return (error as ConfigError).problems;
      }
      return [];
    };
    expect(problems({ DATABASE_DIRECT_URL: 'postgres://app@db:5432/svc' })[0]).toMatch(
      /^DATABASE_DIRECT_URL: set only together with DATABASE_URL/,
    );
    expect(problems({ DATABASE_URL: 'postgres://app@db/svc', DATABASE_DIRECT_URL: 'mysql://db/svc' })[0]).toMatch(
      /^DATABASE_DIRECT_URL: must be a postgres/,
    );
  });
});

const pgbouncer = findPgBouncer();
if (!pgbouncer)
  console.warn('pooler tests skipped: pgbouncer is not installed (Debian package "pgbouncer"; .ci/run installs it when apt-get can)');

describe.skipIf(!pgbouncer)('behind pgbouncer in transaction mode', () => {
  async function bouncer(): Promise<PgBouncer> {
    const started = await startPgBouncer(pgbouncer!, inject('adminDatabaseUrl'), { poolSize: 4 });
    cleanups.push(() => started.stop());
    return started;
  }

  it('when the pooler refuses the statement_timeout startup parameter, GET /readyz answers 503 naming the pooler message', async () => {
    const strict = await startPgBouncer(pgbouncer!, inject('adminDatabaseUrl'), {
      poolSize: 2,
      ignoreStartupParameters: ['extra_float_digits'],
    });
    cleanups.push(() => strict.stop());
    const database = await createEmptyDatabase();
    cleanups.push(database.drop);
    // The service's own client sends statement_timeout (and lock_timeout) as startup parameters.
    const viaPooler = createDatabase(strict.via(database.url), { poolSize: 1 });
    const app = await buildApp({ config: testConfig({ databaseUrl: database.url }), database: viaPooler, logger: false });
    try {
      const ready = await app.inject({ method: 'GET', url: '/readyz' });
      expect(ready.statusCode).toBe(503);
      expect(ready.json()).toEqual({
        error: {
          code: 'database_unavailable',
          message: expect.stringMatching(
            /^The database refused the connection \(08P01\): unsupported startup parameter: (statement|lock)_timeout$/,
          ),
        },
      });
    } finally {
      await app.close();
      await viaPooler.close();
    }
  });

  it('when four runners start at once on an empty database through the pooler, all succeed and each migration is applied exactly once', async () => {
    const database = await createEmptyDatabase();
    cleanups.push(database.drop);
    const viaPooler = (await bouncer()).via(database.url);

    const results = await Promise.all([1, 2, 3, 4].map(() => runMigrations(viaPooler)));

    expect(results.map((result) => result.applied).sort((a, b) => a - b)).toEqual([0, 0, 0, journal.entries.length]);
    await expectMigratedOnce(database.url);
    const locks = await query<{ count: number }>(database.url, ADVISORY_LOCKS_HERE);
    expect(locks[0]!.count).toBe(0); // a session lock taken through the pooler would be left on a server connection
  });

  it('when DATABASE_URL is the pooler and DATABASE_DIRECT_URL is set, migrations go direct: they work with the pooler gone', async () => {
    const database = await createEmptyDatabase();
    cleanups.push(database.drop);
    const pooler = await bouncer();
    const config = loadConfig({
      DATABASE_URL: pooler.via(database.url),
      DATABASE_DIRECT_URL: database.url,
      DATABASE_PREPARED_STATEMENTS: 'false',
      LOG_LEVEL: 'silent',
    });

    // The pooler stops first: whatever still works went direct.
    await pooler.stop();
    const connection = await connect(config, { info: () => {} });
    cleanups.push(() => connection.close());
    await expectMigratedOnce(database.url);
  });

  it('when DATABASE_DIRECT_URL is not set, the same start goes through the pooler and fails without it (the negative control)', async () => {
    const database = await createEmptyDatabase();
    cleanups.push(database.drop);
    const pooler = await bouncer();
    const config = loadConfig({ DATABASE_URL: pooler.via(database.url), DATABASE_PREPARED_STATEMENTS: 'false', LOG_LEVEL: 'silent' });
    await pooler.stop();
    await expect(connect(config, { info: () => {} })).rejects.toThrow();
  });
});
