import { execFileSync } from 'node:child_process';
import { chownSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';

/** Where Debian/Ubuntu install the PostgreSQL 15 server binaries. */
export const PG15_BIN = '/usr/lib/postgresql/15/bin';

export type PrivateCluster = {
  port: number;
  /** A connection URL to `database` (default `postgres`) as the superuser `postgres`. */
  url(database?: string): string;
  stop(): Promise<void>;
};

export type PrivateClusterOptions = {
  /** Server settings, as `-c name=value` on the postmaster command line. */
  settings?: Record<string, string | number>;
};

/** A free TCP port on 127.0.0.1, as the kernel hands one out (a tiny race with other binders is accepted). */
async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() => (typeof address === 'object' && address ? resolve(address.port) : reject(new Error('no port'))));
    });
  });
}

/**
 * Runs a PostgreSQL binary as the `postgres` OS user when this process is root (PostgreSQL refuses
 * to run as root), else as ourselves.
 */
function runPg(binary: string, args: string[]): void {
  const path = join(PG15_BIN, binary);
  const asRoot = userInfo().uid === 0;
  execFileSync(asRoot ? 'runuser' : path, asRoot ? ['-u', 'postgres', '--', path, ...args] : args, { stdio: 'pipe' });
}

/**
 * A PostgreSQL 15 cluster of the caller's own: initdb in a temporary directory, started on a free port
 * with the given settings (e.g. shared_preload_libraries, which the machine's shared server cannot
 * take per test). Trust authentication on 127.0.0.1 only. `stop()` shuts it down and removes it.
 */
export async function startPrivateCluster(options: PrivateClusterOptions = {}): Promise<PrivateCluster> {
  const dir = mkdtempSync(join(tmpdir(), 'pg15-private-'));
  if (userInfo().uid === 0) {
    const postgres = Number(execFileSync('id', ['-u', 'postgres']).toString().trim());
    chownSync(dir, postgres, postgres);
  }
  const dataDir = join(dir, 'data');
  const port = await freePort();
  const settings: Record<string, string | number> = {
    listen_addresses: '127.0.0.1',
    port,
    // The socket directory must be writable by the server; the default /var/run/postgresql may be the machine cluster's.
    unix_socket_directories: dir,
    ...options.settings,
  };
  const serverOptions = Object.entries(settings)
    .map(([name, value]) => `-c ${name}=${String(value)}`)
    .join(' ');
  try {
    runPg('initdb', ['-D', dataDir, '-U', 'postgres', '--auth=trust', '--encoding=UTF8', '--locale=C.UTF-8', '--no-sync']);
    runPg('pg_ctl', ['start', '-D', dataDir, '-w', '-t', '60', '-l', join(dir, 'server.log'), '-o', serverOptions]);
  } catch (error) {
    rmSync(dir, { recursive: true, force: true });
    throw error;
  }
  let stopped = false;
  return {
    port,
    url: (database = 'postgres') => `postgres://postgres@127.0.0.1:${port}/${database}`,
    async stop() {
      if (stopped) return;
      stopped = true;
      try {
        runPg('pg_ctl', ['stop', '-D', dataDir, '-m', 'fast', '-w', '-t', '60']);
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
  };
}
