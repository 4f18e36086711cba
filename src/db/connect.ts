import { performance } from 'node:perf_hooks';
import type { Config } from '../config/config.js';
import { createDatabase, type Database, type DatabaseOptions } from './client.js';
import { resolveEmbeddedDatabase } from '../embedded/embedded-postgres.js';
import { secondsSince } from '../shared/clock.js';
import { runMigrations } from './migrate.js';

export type Connection = {
  database: Database;
  /** DATABASE_REPLICA_URL's pool, when set: list pages read there once it has replayed far enough (page-reads.ts). */
  replica: Database | undefined;
  url: string;
  /** Where migrations go: DATABASE_DIRECT_URL when set (DATABASE_URL may be a transaction-mode pooler), else `url`. */
  directUrl: string;
  /** The embedded default (DATABASE_URL unset), whichever process started it; false for DATABASE_URL. */
  embedded: boolean;
  /** Closes the pool and stops the embedded server when this process started it. */
  close(): Promise<void>;
};

type Logger = { info(message: string): void };

/** A replica that cannot be reached only sends its pages to the primary, so it is given up on quickly. */
const REPLICA_CONNECT_TIMEOUT_MS = 1_000;

function replicaOptions(config: Config): DatabaseOptions {
  return {
    ...config.database,
    connectTimeoutMs: Math.min(config.database.connectTimeoutMs, REPLICA_CONNECT_TIMEOUT_MS),
    applicationName: 'verification-api-replica-reads',
  };
}

/** DATABASE_URL when set, else the embedded default; migrations applied under a lock, on DATABASE_DIRECT_URL when set. */
export async function connect(config: Config, logger: Logger, options: { migrate?: boolean; replica?: boolean } = {}): Promise<Connection> {
  const resolved = config.databaseUrl
    ? { url: config.databaseUrl, owned: false, stop: async () => {} }
    : await resolveEmbeddedDatabase(config.dataDir, logger);
  const directUrl = config.databaseDirectUrl ?? resolved.url;
  try {
    if (options.migrate !== false) {
      const migrating = performance.now();
      const { applied } = await runMigrations(directUrl);
      logger.info(
        applied > 0
          ? `applied ${applied} migration${applied === 1 ? '' : 's'} in ${secondsSince(migrating)}`
          : `database schema up to date (checked in ${secondsSince(migrating)})`,
      );
    }
  } catch (error) {
    await resolved.stop();
    throw error;
  }
  const database = createDatabase(resolved.url, config.database);
  // Only the HTTP server reads lists; the CLI and the worker never open it.
  const replica =
    options.replica && config.databaseReplicaUrl ? createDatabase(config.databaseReplicaUrl, replicaOptions(config)) : undefined;
  let closed = false;
  return {
    database,
    replica,
    url: resolved.url,
    directUrl,
    embedded: config.databaseUrl === undefined,
    async close() {
      if (closed) return;
      closed = true;
      await Promise.all([database.close(), replica?.close()]);
      await resolved.stop();
    },
  };
}
