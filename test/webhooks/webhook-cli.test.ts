import { spawn } from 'node:child_process';
import pg from 'pg';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createDeliveryWorker } from '../../src/modules/webhooks/delivery.worker.js';
import { createOutboxRepository } from '../../src/shared/outbox.js';
import { createTestContext, type TestContext, testServices } from '../helpers/harness.js';
import { startReceiver, waitFor, type Receiver } from '../helpers/webhook-receiver.js';
import { runSvcInProcess } from '../helpers/cli-in-process.js';

const SVC = fileURLToPath(new URL('../../bin/svc.js', import.meta.url));

let ctx: TestContext;
let receiver: Receiver;
beforeAll(async () => {
  ctx = await createTestContext();
  receiver = await startReceiver();
});
afterAll(async () => {
  await receiver?.close();
  await ctx?.close();
});

type Run = { code: number; stdout: string; stderr: string };
function svc(args: string[], env: Record<string, string> = {}): Promise<Run> {
  return runSvcInProcess(args, { DATABASE_URL: ctx.databaseUrl, LOG_LEVEL: 'warn', ...env }).then(({ code, stdout, stderr }) => ({
    code: code ?? 1,
    stdout,
    stderr,
  }));
}
async function svcJson<T = Record<string, unknown>>(args: string[], env: Record<string, string> = {}): Promise<T> {
  const run = await svc(args, env);
  expect(run.stderr).toBe('');
  expect(run.code).toBe(0);
  return JSON.parse(run.stdout) as T;
}

describe('svc webhook commands', () => {
  it('when an operator adds, lists, tests, inspects, resends and disables, each command prints exactly one JSON document', async () => {
    const org = await ctx.createOrg();
    const privateOk = { WEBHOOK_ALLOW_PRIVATE_URLS: 'true' };

    const added = await svcJson<{ id: string; url: string; secret: string; events: string[]; enabled: boolean }>(
      ['webhook', 'add', '--org', org.id, '--url', receiver.url('/cli'), '--events', 'customer.updated,customer.kyc_completed'],
      privateOk,
    );
    expect(added).toMatchObject({ url: receiver.url('/cli'), events: ['customer.updated', 'customer.kyc_completed'], enabled: true });
    expect(added.secret).toMatch(/^whsec_/);
    receiver.trust('/cli', added.secret);

    const listed = await svcJson<Array<Record<string, unknown>>>(['webhook', 'list', '--org', org.id]);
    expect(listed).toEqual([expect.objectContaining({ id: added.id })]);
    expect(listed[0]).not.toHaveProperty('secret');

    const test = await svcJson<{ event: { id: string; type: string }; deliveries: Array<{ id: string }> }>([
      'webhook',
      'test',
      '--org',
      org.id,
    ]);
    expect(test.event.type).toBe('webhook.test');
    expect(test.deliveries).toHaveLength(1);

    const worker = createDeliveryWorker({ database: ctx.database, allowPrivateUrls: true, pollIntervalMs: 100 });
    await worker.start();
    try {
      await waitFor(() => receiver.receipts.length === 1);
      const deliveries = await waitFor(async () => {
        const current = await svcJson<Array<{ status: string; attempts: unknown[] }>>([
          'webhook',
          'deliveries',
          '--org',
          org.id,
          '--event',
          test.event.id,
        ]);
        return current[0]?.status === 'succeeded' ? current : undefined;
      });
      expect(deliveries[0]!.attempts).toEqual([expect.objectContaining({ attempt_number: 1, status_code: 200 })]);
      expect(await svcJson(['webhook', 'deliveries', '--org', org.id, '--status', 'failed'])).toEqual([]);

      const resent = await svcJson<{ id: string; resent_from: string; status: string }>(['webhook', 'resend', test.deliveries[0]!.id]);
      expect(resent).toMatchObject({ resent_from: test.deliveries[0]!.id, status: expect.stringMatching(/^(pending|succeeded)$/) });
      await waitFor(() => receiver.receipts.length === 2);
      expect(receiver.receipts.map((receipt) => receipt.webhookId)).toEqual([test.event.id, test.event.id]);
      expect(receiver.receipts.every((receipt) => receipt.verifyError === null)).toBe(true);
    } finally {
      await worker.stop();
    }

    const disabled = await svcJson(['webhook', 'disable', added.id]);
    expect(disabled).toMatchObject({ id: added.id, enabled: false });
  }, 120_000);

  it('when the URL is refused, the command exits non-zero with the reason on stderr and nothing on stdout', async () => {
    const org = await ctx.createOrg();
    const run = await svc(['webhook', 'add', '--org', org.id, '--url', 'https://169.254.169.254/latest'], {
      WEBHOOK_ALLOW_PRIVATE_URLS: 'false',
    });
    expect(run.code).not.toBe(0);
    expect(run.stdout).toBe('');
    expect(run.stderr).toMatch(/url: .*169\.254\.169\.254 is not a public address/);
  }, 60_000);

  it('when the operator adds a name that resolves to a private address or not at all, stderr says which (the API does not)', async () => {
    const org = await ctx.createOrg();
    const strictEnv = { WEBHOOK_ALLOW_PRIVATE_URLS: 'false' };
    const loopback = await svc(['webhook', 'add', '--org', org.id, '--url', 'https://localhost/hooks'], strictEnv);
    expect(loopback.code).not.toBe(0);
    expect(loopback.stdout).toBe('');
    expect(loopback.stderr).toMatch(/url: Host "localhost" resolves to (127\.0\.0\.1|::1), which is not a public address/);
    const unknown = await svc(['webhook', 'add', '--org', org.id, '--url', 'https://no-such-host.invalid/hooks'], strictEnv);
    expect(unknown.code).not.toBe(0);
    expect(unknown.stderr).toMatch(/url: Host "no-such-host\.invalid" could not be resolved \(ENOTFOUND\)/);
  }, 60_000);
  it('when `svc worker` runs alone, it delivers queued events and on SIGTERM exits 0 leaving no database connection', async () => {
    const org = await ctx.createOrg();
    const endpoint = await testServices(ctx.database, { config: { webhookAllowPrivateUrls: true } }).webhooks.addEndpoint({
      orgId: org.id,
      url: receiver.url('/worker-process'),
    });
    receiver.trust('/worker-process', endpoint.secret);
    // Queued before the worker starts: it must pick up what is already waiting, not only new NOTIFYs.
    const record = () =>
      ctx.database.transaction((tx) =>
        createOutboxRepository().record({ orgId: org.id, type: 'customer.updated', customerId: null, customer: { id: 'c-1' } }, tx),
      );
    const before = await record();
    const backends = async () => {
      const client = new pg.Client({ connectionString: ctx.databaseUrl });
      await client.connect();
      try {
        const result = await client.query<{ count: number }>(
          "SELECT count(*)::int AS count FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'svc-worker-test'",
        );
        return result.rows[0]!.count;
      } finally {
        await client.end();
      }
    };

    const child = spawn(process.execPath, [SVC, 'worker'], {
      env: {
        PATH: process.env.PATH,
        HOME: process.env.HOME,
        DATABASE_URL: `${ctx.databaseUrl}${ctx.databaseUrl.includes('?') ? '&' : '?'}application_name=svc-worker-test`,
        WEBHOOK_ALLOW_PRIVATE_URLS: 'true',
        LOG_LEVEL: 'info',
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
    try {
      await waitFor(() => /worker started/.test(stderr), 30_000, 'svc worker to start');
      const after = await record();
      await waitFor(() => receiver.receipts.filter((receipt) => receipt.path === '/worker-process').length === 2, 20_000, 'both events');
      const receipts = receiver.receipts.filter((receipt) => receipt.path === '/worker-process');
      expect(receipts.map((receipt) => receipt.webhookId).sort()).toEqual([before, after].sort());
      expect(receipts.every((receipt) => receipt.verifyError === null)).toBe(true);
      expect(await backends()).toBeGreaterThan(0);

      child.kill('SIGTERM');
      expect(await exited).toBe(0);
      expect(stdout).toBe('');
      expect(await waitFor(async () => (await backends()) === 0 || undefined, 5_000, 'the worker connections to close')).toBe(true);
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    }
  }, 90_000);
});
