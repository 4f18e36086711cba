import { and, eq } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { auditLog, webhookDeliveries, webhookEndpoints } from '../../src/db/schema.js';
import { createTestContext, type TestContext, testServices } from '../helpers/harness.js';
import { runSvcInProcess } from '../helpers/cli-in-process.js';

let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext({ webhookAllowPrivateUrls: true });
});
afterAll(async () => {
  await ctx?.close();
});

type Run = { code: number; stdout: string; stderr: string };
function svc(args: string[]): Promise<Run> {
  return runSvcInProcess(args, { DATABASE_URL: ctx.databaseUrl, LOG_LEVEL: 'warn', WEBHOOK_ALLOW_PRIVATE_URLS: 'true' }).then(
    ({ code, stdout, stderr }) => ({ code: code ?? 1, stdout, stderr }),
  );
}
async function svcJson<T = Record<string, unknown>>(args: string[]): Promise<T> {
  const run = await svc(args);
  expect(run.stderr).toBe('');
  expect(run.code).toBe(0);
  return JSON.parse(run.stdout) as T;
}

const service = () => testServices(ctx.database, { config: { webhookAllowPrivateUrls: true } }).webhooks;

describe('svc webhook update, rotate-secret, test --endpoint, delete', () => {
  it('when an operator updates, rotates, tests one endpoint and deletes, each prints one JSON document from the same service as the API', async () => {
    const org = await ctx.createOrg();
    const target = await service().addEndpoint({ orgId: org.id, url: 'http://127.0.0.1:9/target', events: ['customer.updated'] });
    const other = await service().addEndpoint({ orgId: org.id, url: 'http://127.0.0.1:9/other' });

    const updated = await svcJson([
      'webhook',
      'update',
      target.id,
      '--org',
      org.id,
      '--description',
      'CRM',
      '--events',
      'customer.kyc_completed',
    ]);
    expect(updated).toMatchObject({ id: target.id, description: 'CRM', events: ['customer.kyc_completed'], enabled: true });
    expect(updated).not.toHaveProperty('secret');

    const rotated = await svcJson<{ secret: string; previous_secret_expires_at: string }>([
      'webhook',
      'rotate-secret',
      target.id,
      '--grace-period-seconds',
      '120',
    ]);
    expect(rotated.secret).toMatch(/^whsec_/);
    expect(rotated.secret).not.toBe(target.secret);
    expect(Math.abs(Date.parse(rotated.previous_secret_expires_at) - (Date.now() + 120_000))).toBeLessThan(60_000);
    const [stored] = await ctx.database.db.select().from(webhookEndpoints).where(eq(webhookEndpoints.id, target.id));
    expect(stored).toMatchObject({ secret: rotated.secret, previousSecret: target.secret });

    const tested = await svcJson<{ event: { id: string; type: string }; delivery: { endpoint_id: string } }>([
      'webhook',
      'test',
      '--org',
      org.id,
      '--endpoint',
      target.id,
    ]);
    expect(tested.event.type).toBe('webhook.test');
    expect(tested.delivery.endpoint_id).toBe(target.id);
    const queued = await ctx.database.db.select().from(webhookDeliveries).where(eq(webhookDeliveries.eventId, tested.event.id));
    expect(queued.map((row) => row.endpointId)).toEqual([target.id]);

    const disabled = await svcJson(['webhook', 'update', target.id, '--disable']);
    expect(disabled).toMatchObject({ enabled: false, disabled_reason: 'disabled through the API' });
    const enabled = await svcJson(['webhook', 'update', target.id, '--enable', '--description', '']);
    expect(enabled).toMatchObject({ enabled: true, disabled_reason: null, description: null });

    expect(await svcJson(['webhook', 'delete', other.id, '--org', org.id])).toEqual({
      id: other.id,
      object: 'webhook_endpoint',
      deleted: true,
    });
    expect((await service().listEndpoints(org.id)).map((endpoint) => endpoint.id)).toEqual([target.id]);

    const actions = await ctx.database.db
      .select({ action: auditLog.action, actorType: auditLog.actorType })
      .from(auditLog)
      .where(and(eq(auditLog.orgId, org.id)));
    expect(actions).toEqual(
      expect.arrayContaining([
        { action: 'webhook_endpoint.updated', actorType: 'operator' },
        { action: 'webhook_endpoint.secret_rotated', actorType: 'operator' },
        { action: 'webhook_endpoint.test_sent', actorType: 'operator' },
        { action: 'webhook_endpoint.deleted', actorType: 'operator' },
      ]),
    );
  }, 120_000);

  it('when --org names another organisation, or the grace is out of range, the command exits non-zero with the reason on stderr', async () => {
    const org = await ctx.createOrg();
    const stranger = await ctx.createOrg();
    const endpoint = await service().addEndpoint({ orgId: org.id, url: 'http://127.0.0.1:9/mine' });
    for (const args of [
      ['webhook', 'delete', endpoint.id, '--org', stranger.id],
      ['webhook', 'update', endpoint.id, '--org', stranger.id, '--description', 'x'],
      ['webhook', 'test', '--org', stranger.id, '--endpoint', endpoint.id],
    ]) {
      const run = await svc(args);
      expect(run.code, args.join(' ')).not.toBe(0);
      expect(run.stdout).toBe('');
      expect(run.stderr).toMatch(/not found/i);
    }
    const grace = await svc(['webhook', 'rotate-secret', endpoint.id, '--grace-period-seconds', '604801']);
    expect(grace.code).not.toBe(0);
    expect(grace.stderr).toMatch(/grace_period_seconds/);
    const both = await svc(['webhook', 'update', endpoint.id, '--enable', '--disable']);
    expect(both.code).not.toBe(0);
    expect(both.stderr).toMatch(/exclude each other/);
    expect(await service().listEndpoints(org.id)).toEqual([expect.objectContaining({ id: endpoint.id, description: null, enabled: true })]);
  }, 120_000);
});
