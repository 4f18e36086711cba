import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { inject } from 'vitest';

export type TestDatabase = { url: string; drop(): Promise<void> };

export function withDatabase(url: string, database: string): string {
  const parsed = new URL(url);
  parsed.pathname = `/${database}`;
  return parsed.toString();
}

async function onAdmin<T>(work: (admin: pg.Client) => Promise<T>): Promise<T> {
  const admin = new pg.Client({ connectionString: inject('adminDatabaseUrl') });
  await admin.connect();
  try {
    return await work(admin);
  } finally {
    await admin.end();
  }
}

/** Creates a database named after the run's template (so the run's teardown finds leftovers). */
async function createDatabase(kind: 'f' | 'e', create: (admin: pg.Client, name: string) => Promise<void>): Promise<TestDatabase> {
  const name = `${inject('templateDatabase')}_${kind}_${randomBytes(5).toString('hex')}`;
  await onAdmin((admin) => create(admin, name));
  return {
    url: withDatabase(inject('adminDatabaseUrl'), name),
    drop: () => onAdmin(async (admin) => void (await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`))),
  };
}

/** A fresh, migrated database of this test file's own (cloned from the run's template). */
export function createTestDatabase(): Promise<TestDatabase> {
  const template = inject('templateDatabase');
  return createDatabase('f', async (admin, name) => {
    for (let attempt = 0; ; attempt += 1) {
      try {
        await admin.query(`CREATE DATABASE ${name} TEMPLATE ${template}`);
        return;
      } catch (error) {
        // Cloning fails while another session is connected to the template; retry briefly.
        if (attempt >= 20 || (error as { code?: string }).code !== '55006') throw error;
        await new Promise((resolve) => setTimeout(resolve, 100 + Math.random() * 200));
      }
    }
  });
}

/** A fresh database with no schema at all, as a first start against a new server would see. */
export function createEmptyDatabase(): Promise<TestDatabase> {
  return createDatabase('e', async (admin, name) => void (await admin.query(`CREATE DATABASE ${name}`)));
}
