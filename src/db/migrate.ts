import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import { existsSync, readFileSync } from 'node:fs';
import pg from 'pg';
import { drizzle } from 'drizzle-orm/node-postgres';
import { migrate } from 'drizzle-orm/node-postgres/migrator';

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

/** Applies pending migrations under a session advisory lock, so concurrent starts migrate once. */
export async function runMigrations(connectionString: string): Promise<{ applied: number }> {
  const client = new pg.Client({ connectionString });
  await client.connect();
  try {
    await client.query('SELECT pg_advisory_lock($1)', [MIGRATION_LOCK_ID]);
    try {
      const before = await countApplied(client);
      await migrate(drizzle(client), { migrationsFolder: migrationsFolder() });
      const after = await countApplied(client);
      return { applied: after - before };
    } finally {
      await client.query('SELECT pg_advisory_unlock($1)', [MIGRATION_LOCK_ID]);
    }
  } finally {
    await client.end();
  }
}

async function countApplied(client: pg.Client): Promise<number> {
  const exists = await client.query(`SELECT to_regclass('drizzle.__drizzle_migrations') AS table`);
  if (!exists.rows[0]?.table) return 0;
  const result = await client.query('SELECT count(*)::int AS count FROM drizzle.__drizzle_migrations');
  return result.rows[0].count as number;
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
