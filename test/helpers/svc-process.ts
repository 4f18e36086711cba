import { spawn, type ChildProcess } from 'node:child_process';
import { chmodSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { collectProcessOutput } from './log-collector.js';

export const PROJECT_ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const SVC = join(PROJECT_ROOT, 'bin', 'svc.js');

/** The variables a test may set for a spawned `svc`; everything else of this process is dropped. */
export type SvcEnv = Record<string, string | undefined>;

/**
 * The spawned process's environment: PATH and HOME from this one, never its DATABASE_URL (a test
 * that wants one passes it), plus `env`. It logs at debug level unless the test says otherwise: its
 * JSON lines on stderr join the run's log scan (helpers/log-scan.ts). It runs the build the global
 * setup compiled (SVC_BUILD_DIR, helpers/svc-build.ts); `SVC_BUILD_DIR: undefined` runs the sources
 * through tsx, as `npm start` does.
 */
function childEnv(env: SvcEnv): NodeJS.ProcessEnv {
  const base: NodeJS.ProcessEnv = {
    PATH: process.env.PATH,
    HOME: process.env.HOME,
    LOG_LEVEL: 'debug',
    HOST: '127.0.0.1',
    SVC_BUILD_DIR: process.env.SVC_BUILD_DIR,
  };
  for (const [name, value] of Object.entries(env)) {
    if (value === undefined) delete base[name];
    else base[name] = value;
  }
  if (base.SVC_BUILD_DIR === undefined) delete base.SVC_BUILD_DIR;
  return base;
}

export type SvcResult = { code: number | null; stdout: string; stderr: string };

/** Runs one `svc` command to completion. */
export function runSvc(args: string[], env: SvcEnv = {}, timeoutMs = 60_000): Promise<SvcResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [SVC, ...args], { cwd: PROJECT_ROOT, env: childEnv(env), stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`svc ${args.join(' ')} timed out\n${stderr}`));
    }, timeoutMs);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      collectProcessOutput(stderr);
      resolve({ code, stdout, stderr });
    });
  });
}

export type ServeProcess = {
  child: ChildProcess;
  stdout(): string;
  stderr(): string;
  /** The port from the "Server listening" log line (start with PORT=0 and HOST=127.0.0.1). */
  port: Promise<number>;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  baseUrl(): Promise<string>;
  /** Sends `signal` and waits for the exit; SIGKILLs after `timeoutMs` so a failing test leaves nothing behind. */
  stop(signal?: NodeJS.Signals, timeoutMs?: number): Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
};

/** Starts `svc serve` (PORT=0 unless given) and resolves its port once it listens. */
export function startServe(env: SvcEnv = {}): ServeProcess {
  const child = spawn(process.execPath, [SVC, 'serve'], {
    cwd: PROJECT_ROOT,
    env: childEnv({ PORT: '0', ...env }),
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    // 'exit', not 'close': an embedded PostgreSQL left running holds the pipes open. A line still in
    // the pipe at the exit is left out of the scan.
    child.on('exit', (code, signal) => {
      collectProcessOutput(stderr);
      resolve({ code, signal });
    }),
  );
  const port = new Promise<number>((resolve, reject) => {
    const look = () => {
      const match = /Server listening at http:\/\/127\.0\.0\.1:(\d+)/.exec(stderr);
      if (match) resolve(Number(match[1]));
    };
    child.stderr.on('data', (chunk: Buffer) => {
      stderr += chunk.toString();
      look();
    });
    child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
    void exited.then(({ code, signal }) => reject(new Error(`svc serve exited (${code ?? signal}) before listening\n${stderr}`)));
  });
  port.catch(() => {});
  return {
    child,
    stdout: () => stdout,
    stderr: () => stderr,
    port,
    exited,
    baseUrl: async () => `http://127.0.0.1:${await port}`,
    async stop(signal = 'SIGTERM', timeoutMs = 30_000) {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
      const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
      const result = await exited;
      clearTimeout(timer);
      return result;
    },
  };
}

/** A temporary DATA_DIR the embedded PostgreSQL (run as the postgres user when we are root) can reach. */
export function temporaryDataDir(): string {
  const dir = mkdtempSync(join(tmpdir(), 'svc-data-'));
  chmodSync(dir, 0o755);
  return dir;
}

export const API_KEY_IN_OUTPUT = /svc_live_[0-9A-Za-z]+/g;
