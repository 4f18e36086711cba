import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { chmodSync, chownSync, existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';

/**
 * A PgBouncer (Debian package `pgbouncer`; .ci/run installs it) of a test's own, on a free loopback
 * port, in transaction pooling mode in front of the run's PostgreSQL.
 */
export type PgBouncer = {
  port: number;
  /** `url` (user, password, database) with PgBouncer's host and port. */
  via(url: string): string;
  output(): string;
  stop(): Promise<void>;
};

/** The pgbouncer executable, or undefined when it is not installed. */
export function findPgBouncer(): string | undefined {
  for (const candidate of ['/usr/sbin/pgbouncer', '/usr/bin/pgbouncer', '/usr/local/bin/pgbouncer', '/usr/local/sbin/pgbouncer']) {
    if (existsSync(candidate)) return candidate;
  }
  const which = spawnSync('sh', ['-c', 'command -v pgbouncer'], { encoding: 'utf8' });
  const found = which.status === 0 ? which.stdout.trim() : '';
  return found || undefined;
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.on('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address() as AddressInfo;
      probe.close(() => resolve(port));
    });
  });
}

/** uid and gid of an OS user, from `id`. */
function osUser(name: string): { uid: number; gid: number } | undefined {
  const uid = spawnSync('id', ['-u', name], { encoding: 'utf8' });
  const gid = spawnSync('id', ['-g', name], { encoding: 'utf8' });
  if (uid.status !== 0 || gid.status !== 0) return undefined;
  return { uid: Number(uid.stdout.trim()), gid: Number(gid.stdout.trim()) };
}

/** The startup parameters PgBouncer is told to ignore by default (see the comment in the ini below). */
const IGNORED_STARTUP_PARAMETERS = [
  'extra_float_digits',
  'statement_timeout',
  'lock_timeout',
  'idle_in_transaction_session_timeout',
  'options',
];

export async function startPgBouncer(
  executable: string,
  serverUrl: string,
  options: { poolSize?: number; ignoreStartupParameters?: readonly string[] } = {},
): Promise<PgBouncer> {
  const server = new URL(serverUrl);
  const user = decodeURIComponent(server.username || 'postgres');
  const password = decodeURIComponent(server.password);
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'svc-pgbouncer-'));
  const ini = join(dir, 'pgbouncer.ini');
  const authFile = join(dir, 'userlist.txt');
  const quote = (value: string) => value.replace(/"/g, '""');
  // trust: clients are not asked for a password; the user must still be listed in auth_file.
  writeFileSync(authFile, `"${quote(user)}" "${quote(password)}"\n`);
  const serverAuth = `user=${user}${password ? ` password=${password}` : ''}`;
  writeFileSync(
    ini,
    [
      '[databases]',
      // Any database name is passed through to the same server.
      `* = host=${server.hostname} port=${server.port || 5432} ${serverAuth}`,
      '',
      '[pgbouncer]',
      'listen_addr = 127.0.0.1',
      `listen_port = ${port}`,
      'unix_socket_dir =',
      'auth_type = trust',
      `auth_file = ${authFile}`,
      'pool_mode = transaction',
      `default_pool_size = ${options.poolSize ?? 20}`,
      'max_client_conn = 500',
      // pg sends statement_timeout, lock_timeout and idle_in_transaction_session_timeout (and
      // `options`) as startup parameters, which PgBouncer refuses unless told to ignore them. Ignored,
      // they do not reach the server: behind a transaction-mode pooler, set the timeouts on the role
      // or the database instead (ALTER ROLE … SET statement_timeout = …).
      `ignore_startup_parameters = ${(options.ignoreStartupParameters ?? IGNORED_STARTUP_PARAMETERS).join(',')}`,
      `pidfile = ${join(dir, 'pgbouncer.pid')}`,
      '',
    ].join('\n'),
  );

  // PgBouncer refuses to run as root: as root, it switches to the postgres OS user (-u), which must read the files.
  const args: string[] = [];
  if (process.getuid?.() === 0) {
    const postgres = osUser('postgres');
    if (!postgres) throw new Error('pgbouncer cannot run as root and there is no postgres OS user to run it as');
    for (const path of [dir, ini, authFile]) chownSync(path, postgres.uid, postgres.gid);
    chmodSync(dir, 0o700);
    args.push('-u', 'postgres');
  }
  args.push(ini);

  let output = '';
  const child: ChildProcess = spawn(executable, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  child.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const reap = () => child.kill('SIGKILL');
  process.once('exit', reap);
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  child.once('exit', () => process.removeListener('exit', reap));

  const via = (url: string) => {
    const parsed = new URL(url);
    parsed.hostname = '127.0.0.1';
    parsed.port = String(port);
    return parsed.toString();
  };
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM'); // immediate shutdown
      await Promise.race([exited, new Promise((resolve) => setTimeout(resolve, 5000))]);
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    }
    rmSync(dir, { recursive: true, force: true });
  };

  // Ready once a query goes through it.
  const deadline = Date.now() + 15_000;
  for (;;) {
    if (child.exitCode !== null) {
      await stop();
      throw new Error(`pgbouncer exited early (${child.exitCode}):\n${output}`);
    }
    const probe = new pg.Client({ connectionString: via(serverUrl), connectionTimeoutMillis: 1000 });
    probe.on('error', () => {});
    const answered = await probe
      .connect()
      .then(() => probe.query('SELECT 1'))
      .then(
        () => true,
        () => false,
      );
    await probe.end().catch(() => {});
    if (answered) break;
    if (Date.now() > deadline) {
      await stop();
      throw new Error(`pgbouncer did not answer within 15 s:\n${output}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  return { port, via, output: () => output, stop };
}
