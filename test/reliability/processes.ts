import { spawn, type ChildProcess } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { imageEnvironment } from '../../bench/image-environment.js';
import { freeLoopbackPort } from '../../src/embedded/embedded-postgres.js';
import { collectProcessOutput, recordSent } from '../helpers/log-collector.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');

export type ServerProcess = {
  url: string;
  port: number;
  child: ChildProcess;
  output(): string;
  /** SIGTERM and wait for the exit. */
  stop(): Promise<number | null>;
  /** SIGKILL, no cleanup: a crash. */
  crash(): Promise<void>;
};

/**
 * Starts `svc serve` as its own process on the given database and waits until /readyz answers. It runs
 * with the V8 settings of the image (the Dockerfile's NODE_OPTIONS), as the container does.
 */
export async function startServerProcess(env: Record<string, string>): Promise<ServerProcess> {
  const port = await freeLoopbackPort();
  let output = '';
  const child = spawn(process.execPath, [join(root, 'bin', 'svc.js'), 'serve'], {
    cwd: root,
    env: {
      ...process.env,
      NODE_OPTIONS: imageEnvironment(root).NODE_OPTIONS ?? '',
      PORT: String(port),
      HOST: '127.0.0.1',
      LOG_LEVEL: 'warn',
      RATE_LIMIT_BURST: '100000',
      RATE_LIMIT_DAILY: '100000000',
      WEBHOOK_WORKER: 'off',
      ...env,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  // Never outlive the test process, even when a test fails before stopping its server.
  const reap = () => child.kill('SIGKILL');
  process.once('exit', reap);
  child.once('exit', () => {
    process.removeListener('exit', reap);
    collectProcessOutput(output); // its log lines join the run's log scan (helpers/log-scan.ts)
  });
  child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const url = `http://127.0.0.1:${port}`;
  const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
  const deadline = Date.now() + 60_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`svc serve exited early (${child.exitCode}):\n${output}`);
    const ready = await fetch(`${url}/readyz`).then(
      (response) => response.ok,
      () => false,
    );
    if (ready) break;
    if (Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(`svc serve did not become ready:\n${output}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 150));
  }
  return {
    url,
    port,
    child,
    output: () => output,
    async stop() {
      if (child.exitCode !== null) return child.exitCode;
      child.kill('SIGTERM');
      return exited;
    },
    async crash() {
      if (child.exitCode !== null) return;
      child.kill('SIGKILL');
      await exited;
    },
  };
}

export async function call(
  server: { url: string },
  method: string,
  path: string,
  options: { key?: string; body?: unknown; headers?: Record<string, string> } = {},
): Promise<{ status: number; body: string; headers: Headers }> {
  const headers: Record<string, string> = { ...(options.headers ?? {}) };
  if (options.key) headers.authorization = `Bearer ${options.key}`;
  if (options.body !== undefined) headers['content-type'] = 'application/json';
  recordSent(options.body);
  const response = await fetch(`${server.url}${path}`, {
    method,
    headers,
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
  });
  return { status: response.status, body: await response.text(), headers: response.headers };
}

/** Runs `tasks` with at most `concurrency` in flight. */
export async function pool<T>(count: number, concurrency: number, task: (index: number) => Promise<T>): Promise<T[]> {
  const results: T[] = new Array(count);
  let next = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < count) {
        const index = next++;
        results[index] = await task(index);
      }
    }),
  );
  return results;
}
