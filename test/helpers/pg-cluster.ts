import { execFile } from 'node:child_process';
import { chownSync, existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

/**
 * Private PostgreSQL clusters for tests that need what the machine's shared server must not be
 * put through: a primary with a streaming standby, a server stopped mid-test, settings of their own.
 * Each runs from the machine's PostgreSQL binaries (PG_BIN, default /usr/lib/postgresql/15/bin) in
 * a temporary directory, on a free loopback port, with trust authentication, and is removed by stop().
 * PostgreSQL refuses to run as root: as root, every binary runs as the `postgres` OS user, which then
 * owns the directories.
 */

const run = promisify(execFile);
const PG_BIN = process.env.PG_BIN ?? '/usr/lib/postgresql/15/bin';

/** Whether this machine has the PostgreSQL server binaries the helpers run (initdb, pg_ctl, pg_basebackup). */
export function clusterBinariesPresent(): boolean {
  return ['initdb', 'pg_ctl', 'pg_basebackup'].every((binary) => existsSync(join(PG_BIN, binary)));
}

export type ClusterSettings = Record<string, string | number | boolean>;

export type PgCluster = {
  port: number;
  dataDir: string;
  /** A connection URL to `database` (default postgres) as the superuser `postgres`. */
  url(database?: string): string;
  start(): Promise<void>;
  /** Stops the server (fast shutdown: sessions are ended); the data directory stays, so start() brings it back. */
  halt(): Promise<void>;
  running(): boolean;
  /** The server's log so far (for a failing test's message). */
  log(): string;
  /** Stops the server, if running, and removes its directory. */
  stop(): Promise<void>;
};

/** Settings that keep a throwaway cluster light on a shared machine (durability is not the point). */
export const LIGHT_SETTINGS: ClusterSettings = {
  fsync: 'off',
  full_page_writes: 'off',
  shared_buffers: '32MB',
  max_connections: 60,
  listen_addresses: '127.0.0.1',
};

function asPostgres(): { uid: number; gid: number } | undefined {
  if (process.getuid?.() !== 0) return undefined;
  const line = readFileSync('/etc/passwd', 'utf8')
    .split('\n')
    .find((entry) => entry.startsWith('postgres:'));
  if (!line) throw new Error('running as root needs a `postgres` OS user to run PostgreSQL as');
  const [, , uid, gid] = line.split(':');
  return { uid: Number(uid), gid: Number(gid) };
}

async function pgBin(binary: string, args: string[]): Promise<string> {
  const path = join(PG_BIN, binary);
  const owner = asPostgres();
  const { stdout } = owner
    ? await run('runuser', ['-u', 'postgres', '--', path, ...args], { timeout: 120_000 })
    : await run(path, args, { timeout: 120_000 });
  return stdout;
}

/** A directory the server's OS user owns. */
function ownedDirectory(prefix: string): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  const owner = asPostgres();
  if (owner) chownSync(dir, owner.uid, owner.gid);
  return dir;
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() => (typeof address === 'object' && address ? resolve(address.port) : reject(new Error('no port'))));
    });
  });
}

function settingArgs(settings: ClusterSettings): string {
  // pg_ctl passes -o to postgres through a shell: values are quoted.
  return Object.entries(settings)
    .map(([name, value]) => `-c ${name}='${String(value).replace(/'/g, '')}'`)
    .join(' ');
}

function clusterAt(root: string, dataDir: string, port: number, settings: ClusterSettings): PgCluster {
  const logFile = join(root, 'server.log');
  let isRunning = false;
  const options = `-p ${port} -c unix_socket_directories='${root}' ${settingArgs(settings)}`;
  const cluster: PgCluster = {
    port,
    dataDir,
    url: (database = 'postgres') => `postgres://postgres@127.0.0.1:${port}/${database}`,
    async start() {
      await pgBin('pg_ctl', ['-D', dataDir, '-l', logFile, '-o', options, '-w', '-t', '60', 'start']);
      isRunning = true;
    },
    async halt() {
      if (!isRunning) return;
      await pgBin('pg_ctl', ['-D', dataDir, '-m', 'fast', '-w', '-t', '60', 'stop']);
      isRunning = false;
    },
    running: () => isRunning,
    log: () => (existsSync(logFile) ? readFileSync(logFile, 'utf8') : ''),
    async stop() {
      if (isRunning) {
        await pgBin('pg_ctl', ['-D', dataDir, '-m', 'immediate', '-w', '-t', '60', 'stop']).catch(() => {});
        isRunning = false;
      }
      rmSync(root, { recursive: true, force: true });
    },
  };
  return cluster;
}

/** initdb a new cluster (trust authentication, UTF-8) and start it with `settings` on a free port. */
export async function startCluster(settings: ClusterSettings = {}): Promise<PgCluster> {
  const root = ownedDirectory('pg-cluster-');
  const dataDir = join(root, 'data');
  try {
    await pgBin('initdb', ['-D', dataDir, '-U', 'postgres', '--auth=trust', '--encoding=UTF8', '--locale=C.UTF-8', '--no-sync']);
    const cluster = clusterAt(root, dataDir, await freePort(), { ...LIGHT_SETTINGS, ...settings });
    await cluster.start();
    return cluster;
  } catch (error) {
    rmSync(root, { recursive: true, force: true });
    throw error;
  }
}

/**
 * A physical streaming standby of `primary`: `pg_basebackup -R` (WAL streamed during the copy,
 * primary_conninfo and standby.signal written), started as a hot standby with `settings` on a port
 * of its own. The primary needs wal_level replica or higher (15's default) and a free WAL sender.
 */
export async function startStandby(primary: PgCluster, settings: ClusterSettings = {}): Promise<PgCluster> {
  const root = ownedDirectory('pg-standby-');
  const dataDir = join(root, 'data');
  try {
    await pgBin('pg_basebackup', [
      '-h',
      '127.0.0.1',
      '-p',
      String(primary.port),
      '-U',
      'postgres',
      '-D',
      dataDir,
      '-R',
      '-X',
      'stream',
      '--no-sync',
      '-c',
      'fast',
    ]);
    const standby = clusterAt(root, dataDir, await freePort(), { ...LIGHT_SETTINGS, hot_standby: 'on', ...settings });
    await standby.start();
    return standby;
  } catch (error) {
    rmSync(root, { recursive: true, force: true });
    throw error;
  }
}
