import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import { existsSync, readFileSync } from 'node:fs';
import pg from 'pg';
import { readMigrationFiles } from 'drizzle-orm/migrator';
import { unsentEmailJobs } from '../modules/emails/emails.repository.js';
import { installJobQueues } from '../shared/job-runner.js';

// Any fixed number works; it only has to be the same for every instance of this service.
const MIGRATION_LOCK_ID = 7_264_119_001;

export function migrationsFolder(): string {
  // src/db or dist/db → project root / migrations
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 4; i += 1) {
    const candidate = join(dir, 'migrations');
    if (existsSync(join(candidate, 'meta', '_journal.json'))) return candidate;
    dir = dirname(dir);
  }
  throw new Error('migrations folder not found');
}

/**
 * Applies pending migrations in one transaction that first takes a transaction-scoped advisory lock,
 * so concurrent starts migrate once, also through a transaction-mode pooler (where a session lock
 * and its unlock may land on different server connections). Drizzle's own migrate() reads the last
 * applied migration before it opens its transaction, so it cannot run under such a lock; this is its
 * loop on its documented readMigrationFiles, with the same bookkeeping: the table
 * drizzle.__drizzle_migrations (id serial, hash text, created_at bigint), a migration counting as
 * applied when its journal `when` is not after the newest created_at, one row per migration applied.
 * A database migrated by drizzle's migrate() is therefore current for this one, and the other way round.
 * Then the job queue's schema and queues (job-runner.ts), which pg-boss installs under a lock of its own.
 */
export async function runMigrations(connectionString: string): Promise<{ applied: number }> {
  const result = await runSchemaMigrations(connectionString);
  await installJobQueues(connectionString, unsentEmailJobs);
  return result;
}

async function runSchemaMigrations(connectionString: string): Promise<{ applied: number }> {
  const migrations = readMigrationFiles({ migrationsFolder: migrationsFolder() });
  const client = new pg.Client({ connectionString });
  await client.connect();
  try {
    await client.query('BEGIN');
    try {
      await client.query('SELECT pg_advisory_xact_lock($1)', [MIGRATION_LOCK_ID]);
      await client.query('CREATE SCHEMA IF NOT EXISTS drizzle');
      await client.query(
        'CREATE TABLE IF NOT EXISTS drizzle.__drizzle_migrations (id SERIAL PRIMARY KEY, hash text NOT NULL, created_at bigint)',
      );
      const newest = await client.query<{ created_at: string | number | null }>(
        'SELECT created_at FROM drizzle.__drizzle_migrations ORDER BY created_at DESC LIMIT 1',
      );
      const appliedUpTo = newest.rows[0] ? Number(newest.rows[0].created_at) : undefined;
      let applied = 0;
      for (const migration of migrations) {
        if (appliedUpTo !== undefined && appliedUpTo >= migration.folderMillis) continue;
        for (const statement of migration.sql) {
          // Breakpoint chunks can be blank (a trailing `--> statement-breakpoint`).
          if (statement.trim() !== '') await client.query(statement);
        }
        await client.query('INSERT INTO drizzle.__drizzle_migrations (hash, created_at) VALUES ($1, $2)', [
          migration.hash,
          migration.folderMillis,
        ]);
        applied += 1;
      }
      await client.query('COMMIT');
      return { applied };
    } catch (error) {
      await client.query('ROLLBACK').catch(() => {});
      throw error;
    }
  } finally {
    await client.end();
  }
}

/** True when every migration shipped with this build has been applied. */
export async function migrationsAreCurrent(pool: pg.Pool): Promise<boolean> {
  const journal = JSON.parse(readFileSync(join(migrationsFolder(), 'meta', '_journal.json'), 'utf8')) as {
    entries: unknown[];
  };
  const exists = await pool.query(`SELECT to_regclass('drizzle.__drizzle_migrations') AS table`);
  if (!exists.rows[0]?.table) return false;
  const result = await pool.query('SELECT count(*)::int AS count FROM drizzle.__drizzle_migrations');
  return (result.rows[0].count as number) >= journal.entries.length;
}
