import { networkInterfaces } from 'node:os';
import { rmSync } from 'node:fs';
import { afterAll, describe, expect, it, vi } from 'vitest';
import { API_KEY_IN_OUTPUT, runSvc, startServe, temporaryDataDir, type ServeProcess } from '../helpers/svc-process.js';

// Each spawned `svc` loads the TypeScript sources (about a second, several on a busy machine).
vi.setConfig({ testTimeout: 120_000 });

// `npm start` as a newcomer runs it: no DATABASE_URL, no HOST. The steps share one DATA_DIR, in order.
const dataDir = temporaryDataDir();
const env = { DATA_DIR: dataDir, DATABASE_URL: undefined, HOST: undefined, WEBHOOK_WORKER: 'off' };
const running: ServeProcess[] = [];

afterAll(async () => {
  await Promise.all(running.map((server) => server.stop('SIGTERM')));
  rmSync(dataDir, { recursive: true, force: true });
});

function serve(): ServeProcess {
  const server = startServe(env);
  running.push(server);
  return server;
}

/** The messages of the service's JSON log lines on stderr, in order. */
function logMessages(stderr: string): string[] {
  return stderr
    .split('\n')
    .filter((line) => line.startsWith('{'))
    .map((line) => (JSON.parse(line) as { msg?: string }).msg ?? '');
}

/** The messages matching `steps`, one after the other, each the first match after the previous one. */
function stepsInOrder(messages: string[], steps: RegExp[]): string[] {
  const found: string[] = [];
  let from = 0;
  for (const step of steps) {
    const index = messages.findIndex((message, at) => at >= from && step.test(message));
    if (index < 0) break;
    found.push(messages[index]!);
    from = index + 1;
  }
  return found;
}

const SECONDS = String.raw`\d+\.\d s`;
const UUID = /[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/;

/** An address of this machine other than loopback, if it has one. */
function externalIPv4(): string | undefined {
  return Object.values(networkInterfaces())
    .flat()
    .find((address) => address?.family === 'IPv4' && !address.internal)?.address;
}

describe('the first start on the embedded database', () => {
  it('when started on an empty DATA_DIR, it reports initialising the database, the migrations and ready, in that order, each with its duration', async () => {
    const server = serve();
    await server.port;
    await vi.waitFor(() => expect(logMessages(server.stderr()).some((message) => message.startsWith('ready on'))).toBe(true), {
      timeout: 10_000,
    });
    const steps = [
      /^initialising the embedded PostgreSQL in .+ \(first start only\)…$/,
      new RegExp(`^initialised the embedded PostgreSQL in ${SECONDS}$`),
      new RegExp(`^embedded PostgreSQL listening on 127\\.0\\.0\\.1:\\d+, started in ${SECONDS}$`),
      new RegExp(`^applied \\d+ migrations in ${SECONDS}$`),
      new RegExp(
        `^ready on http://127\\.0\\.0\\.1:${await server.port} in ${SECONDS}; API reference: http://127\\.0\\.0\\.1:${await server.port}/docs$`,
      ),
    ];
    const messages = logMessages(server.stderr());
    expect(stepsInOrder(messages, steps), messages.join('\n')).toHaveLength(steps.length);
  });

  it('when it created the sandbox, it prints the organisation id with the key and the API reference URL, and org list shows that organisation', async () => {
    const [server] = running;
    const port = await server!.port;
    // The first-start block is written on stdout after the ready line on stderr: wait for all of it.
    await vi.waitFor(() => expect(server!.stdout()).toMatch(/API reference: /), { timeout: 10_000 });
    const stdout = server!.stdout();
    expect(new Set(stdout.match(API_KEY_IN_OUTPUT))).toHaveProperty('size', 1);
    const orgIdLine = stdout.split('\n').find((line) => new RegExp(`^  ${UUID.source}$`).test(line));
    expect(orgIdLine, stdout).toBeDefined();
    const orgId = orgIdLine!.trim();
    expect(stdout).toContain(`API reference: http://localhost:${port}/docs`);

    const listed = await runSvc(['org', 'list'], env);
    expect(listed.code, listed.stderr).toBe(0);
    expect(JSON.parse(listed.stdout)).toEqual([expect.objectContaining({ id: orgId, name: 'Sandbox', is_sandbox: true, credits: 100 })]);

    const keys = await runSvc(['key', 'list', '--org', orgId], env);
    expect(keys.code, keys.stderr).toBe(0);
    expect(JSON.parse(keys.stdout)).toHaveLength(1);
  });

  it("when HOST is unset, it listens on 127.0.0.1 only: not on the machine's other addresses", async () => {
    const [server] = running;
    const port = await server!.port;
    const listening = logMessages(server!.stderr()).filter((message) => message.startsWith('Server listening at'));
    expect(listening).toEqual([`Server listening at http://127.0.0.1:${port}`]);
    expect((await fetch(`http://127.0.0.1:${port}/healthz`)).status).toBe(200);
    const external = externalIPv4();
    if (external !== undefined) {
      await expect(fetch(`http://${external}:${port}/healthz`)).rejects.toMatchObject({ cause: { code: 'ECONNREFUSED' } });
    }
    expect(await server!.stop('SIGTERM')).toEqual({ code: 0, signal: null });
  });

  it('when started again on the same DATA_DIR, it reports the database start, an up-to-date schema and ready, without initialising', async () => {
    const server = serve();
    const port = await server.port;
    await vi.waitFor(() => expect(logMessages(server.stderr()).some((message) => message.startsWith('ready on'))).toBe(true), {
      timeout: 10_000,
    });
    const messages = logMessages(server.stderr());
    expect(messages.filter((message) => message.startsWith('initialis'))).toEqual([]);
    const steps = [
      new RegExp(`^embedded PostgreSQL listening on 127\\.0\\.0\\.1:\\d+, started in ${SECONDS}$`),
      new RegExp(`^database schema up to date \\(checked in ${SECONDS}\\)$`),
      new RegExp(`^ready on http://127\\.0\\.0\\.1:${port} in ${SECONDS}`),
    ];
    expect(stepsInOrder(messages, steps), messages.join('\n')).toHaveLength(steps.length);
    expect(server.stdout()).not.toMatch(API_KEY_IN_OUTPUT);
    expect(await server.stop('SIGTERM')).toEqual({ code: 0, signal: null });
  });
});
