import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { and, eq } from 'drizzle-orm';
import { auditLog, webhookEndpoints } from '../../src/db/schema.js';
import { DEFAULT_RETRY_SCHEDULE_MS } from '../../src/modules/webhooks/delivery.worker.js';
import { nonPublicRange, NOT_A_PUBLIC_HOST } from '../../src/modules/webhooks/endpoint-url.js';
import { createOutboxRepository } from '../../src/shared/outbox.js';
import { DEFAULT_REQUEST_TIMEOUT_MS, parseRetryAfter } from '../../src/modules/webhooks/webhook-sender.js';
import { createTestContext, type TestContext, testServices } from '../helpers/harness.js';

let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => {
  await ctx?.close();
});

const strict = () => testServices(ctx.database, { config: { webhookAllowPrivateUrls: false } }).webhooks;
const permissive = () => testServices(ctx.database, { config: { webhookAllowPrivateUrls: true } }).webhooks;
// A public address literal: accepted without any DNS lookup (the test machine has no internet).
const PUBLIC_URL = 'https://93.184.215.14/hooks/svc';

async function emit(orgId: string, type: 'customer.updated' | 'customer.kyc_completed' | 'webhook.test' = 'customer.updated') {
  return ctx.database.transaction((tx) => createOutboxRepository().record({ orgId, type, customerId: null, customer: null }, tx));
}

describe('webhook endpoints', () => {
  it('when an endpoint is added, it returns a Standard Webhooks secret once and stores it; listing never shows it', async () => {
    const org = await ctx.createOrg();
    const added = await strict().addEndpoint({ orgId: org.id, url: PUBLIC_URL, events: ['customer.updated'] });

    expect(added).toMatchObject({ org_id: org.id, url: PUBLIC_URL, events: ['customer.updated'], enabled: true, disabled_reason: null });
    expect(added.secret).toMatch(/^whsec_[A-Za-z0-9+/]+=*$/);
    expect(Buffer.from(added.secret.slice('whsec_'.length), 'base64').length).toBeGreaterThanOrEqual(24);
    const [stored] = await ctx.database.db.select().from(webhookEndpoints).where(eq(webhookEndpoints.id, added.id));
    expect(stored!.secret).toBe(added.secret);

    const listed = await strict().listEndpoints(org.id);
    expect(listed).toHaveLength(1);
    expect(listed[0]).not.toHaveProperty('secret');
    expect(JSON.stringify(listed)).not.toContain(added.secret);

    const [audit] = await ctx.database.db
      .select()
      .from(auditLog)
      .where(and(eq(auditLog.orgId, org.id), eq(auditLog.subjectId, added.id)));
    expect(audit!.action).toBe('webhook_endpoint.created');
    expect(JSON.stringify(audit!.after)).not.toContain(added.secret);
  });

  it('when two endpoints are added, each gets its own secret', async () => {
    const org = await ctx.createOrg();
    const one = await strict().addEndpoint({ orgId: org.id, url: PUBLIC_URL });
    const two = await strict().addEndpoint({ orgId: org.id, url: PUBLIC_URL });
    expect(one.secret).not.toBe(two.secret);
  });

  it('when the event filter names an unknown type, the endpoint is refused naming the field', async () => {
    const org = await ctx.createOrg();
    await expect(
      strict().addEndpoint({ orgId: org.id, url: PUBLIC_URL, events: ['customer.deleted' as 'customer.updated'] }),
    ).rejects.toMatchObject({ code: 'validation_failed', details: { issues: { events: [expect.stringMatching(/Unknown event type/)] } } });
    expect(await strict().listEndpoints(org.id)).toEqual([]);
  });

  it('when the organisation does not exist, adding and listing are not found', async () => {
    const missing = '00000000-0000-4000-8000-000000000000';
    await expect(strict().addEndpoint({ orgId: missing, url: PUBLIC_URL })).rejects.toMatchObject({ code: 'not_found' });
    await expect(strict().listEndpoints('not-a-uuid')).rejects.toMatchObject({ code: 'not_found' });
  });

  it.each([
    ['http://example.com/hook', /https URL/],
    ['ftp://example.com/hook', /https URL/],
    ['not a url', /absolute URL/],
    ['https://user:pass@93.184.215.14/hook', /credentials/],
    ['https://127.0.0.1/hook', /^127\.0\.0\.1 is not a public address \(loopback/],
    ['https://localhost/hook', NOT_A_PUBLIC_HOST],
    ['https://10.1.2.3/hook', /not a public address/],
    ['https://172.16.0.9/hook', /not a public address/],
    ['https://192.168.1.1/hook', /not a public address/],
    ['https://169.254.169.254/latest/meta-data', /not a public address/],
    ['https://100.64.0.1/hook', /not a public address/],
    ['https://0.0.0.0/hook', /not a public address/],
    ['https://[::1]/hook', /not a public address/],
    ['https://[fd00:ec2::254]/hook', /not a public address/],
    ['https://[fe80::1]/hook', /not a public address/],
    ['https://[::ffff:127.0.0.1]/hook', /not a public address/],
    ['https://2130706433/hook', /not a public address/],
    ['https://0x7f.1/hook', /^127\.0\.0\.1 is not a public address/],
    ['https://[::127.0.0.1]/hook', /^::7f00:1 is not a public address \(deprecated IPv4-compatible/],
    ['https://[::8.8.8.8]/hook', /^::808:808 is not a public address/],
    ['https://[::ffff:a9fe:a9fe]/latest', /not a public address \(link-local/],
    ['https://[64:ff9b::a00:1]/hook', /not a public address \(IPv4\/IPv6 translation/],
    ['https://192.0.0.8/hook', /not a public address \(IETF protocol assignments/],
    ['https://198.18.0.1/hook', /not a public address \(benchmarking/],
    ['https://[2001:db8::1]/hook', /not a public address \(documentation/],
    ['https://93.184.215.14:8443/hook', /Port 8443 is not allowed/],
    ['https://93.184.215.14:80/hook', /Port 80 is not allowed/],
    ['https://no-such-host.invalid/hook', NOT_A_PUBLIC_HOST],
  ])('when private URLs are not allowed, %s is refused (SSRF)', async (url, message: RegExp | string) => {
    const org = await ctx.createOrg();
    await expect(strict().addEndpoint({ orgId: org.id, url })).rejects.toMatchObject({
      code: 'validation_failed',
      details: { issues: { url: [typeof message === 'string' ? message : expect.stringMatching(message)] } },
    });
    expect(await strict().listEndpoints(org.id)).toEqual([]);
  });

  it('when WEBHOOK_ALLOWED_PORTS lists a port, an endpoint on it is accepted and one on another port is still refused', async () => {
    const org = await ctx.createOrg();
    const withPorts = testServices(ctx.database, { config: { webhookAllowPrivateUrls: false, webhookAllowedPorts: [8443] } }).webhooks;
    expect(await withPorts.addEndpoint({ orgId: org.id, url: 'https://93.184.215.14:8443/hooks' })).toMatchObject({
      url: 'https://93.184.215.14:8443/hooks',
    });
    await expect(withPorts.addEndpoint({ orgId: org.id, url: 'https://93.184.215.14:9443/hooks' })).rejects.toMatchObject({
      details: { issues: { url: [expect.stringMatching(/Port 9443 is not allowed/)] } },
    });
  });

  it('when a host name resolves to a private address, registration is refused: an API key is told only that it cannot be used, the operator what it resolves to', async () => {
    const org = await ctx.createOrg();
    const service = testServices(ctx.database, {
      config: { webhookAllowPrivateUrls: false },
      resolveHost: async () => [
        { address: '2606:4700:4700::1111', family: 6 },
        { address: '::ffff:192.168.0.10', family: 6 },
      ],
    }).webhooks;
    const input = { orgId: org.id, url: 'https://crm.example.test/hooks' };
    await expect(service.addEndpoint(input, { type: 'api_key', id: org.keyId })).rejects.toMatchObject({
      details: { issues: { url: [NOT_A_PUBLIC_HOST] } },
    });
    await expect(service.addEndpoint(input, { type: 'operator', id: 'cli:test' })).rejects.toMatchObject({
      details: {
        issues: { url: [expect.stringMatching(/"crm\.example\.test" resolves to ::ffff:192\.168\.0\.10, which is not a public address/)] },
      },
    });
    expect(await service.listEndpoints(org.id)).toEqual([]);
  });

  it('when private URLs are allowed (local development), http and loopback endpoints are accepted', async () => {
    const org = await ctx.createOrg();
    const added = await permissive().addEndpoint({ orgId: org.id, url: 'http://127.0.0.1:9999/hook' });
    expect(added).toMatchObject({ url: 'http://127.0.0.1:9999/hook', enabled: true });
  });

  it('when an endpoint is disabled, its queued deliveries fail and later events are not queued for it', async () => {
    const org = await ctx.createOrg();
    const endpoint = await strict().addEndpoint({ orgId: org.id, url: PUBLIC_URL });
    const queued = await emit(org.id);

    const disabled = await strict().disableEndpoint(endpoint.id, { reason: 'receiver retired' });
    expect(disabled).toMatchObject({ id: endpoint.id, enabled: false, disabled_reason: 'receiver retired' });
    const [delivery] = await strict().listDeliveries({ orgId: org.id, eventId: queued });
    expect(delivery).toMatchObject({ status: 'failed', last_error: 'endpoint disabled: receiver retired' });
    const later = await emit(org.id);
    expect(await strict().listDeliveries({ orgId: org.id, eventId: later })).toEqual([]);
    await expect(strict().resendDelivery(delivery!.id)).rejects.toMatchObject({ code: 'conflict' });
  });

  it('when disabling names another organisation, the endpoint is not found and stays enabled', async () => {
    const a = await ctx.createOrg();
    const b = await ctx.createOrg();
    const endpoint = await strict().addEndpoint({ orgId: a.id, url: PUBLIC_URL });
    await expect(strict().disableEndpoint(endpoint.id, { orgId: b.id })).rejects.toMatchObject({ code: 'not_found' });
    expect((await strict().listEndpoints(a.id))[0]!.enabled).toBe(true);
  });

  it('when an endpoint subscribes to some event types, only those are queued for it; webhook.test reaches every endpoint', async () => {
    const org = await ctx.createOrg();
    const kycOnly = await strict().addEndpoint({ orgId: org.id, url: PUBLIC_URL, events: ['customer.kyc_completed'] });
    const everything = await strict().addEndpoint({ orgId: org.id, url: PUBLIC_URL });

    const updated = await emit(org.id, 'customer.updated');
    const completed = await emit(org.id, 'customer.kyc_completed');
    const endpointsOf = async (eventId: string) =>
      (await strict().listDeliveries({ orgId: org.id, eventId })).map((delivery) => delivery.endpoint_id).sort();
    expect(await endpointsOf(updated)).toEqual([everything.id]);
    expect(await endpointsOf(completed)).toEqual([kycOnly.id, everything.id].sort());

    const test = await strict().sendTestEvent(org.id);
    expect(test.event).toMatchObject({ type: 'webhook.test', data: { customer: null } });
    expect(test.deliveries.map((delivery) => delivery.endpoint_id).sort()).toEqual([kycOnly.id, everything.id].sort());
  });

  it("when an event is recorded, deliveries are queued only for the recording organisation's endpoints", async () => {
    const a = await ctx.createOrg();
    const b = await ctx.createOrg();
    await strict().addEndpoint({ orgId: a.id, url: PUBLIC_URL });
    await strict().addEndpoint({ orgId: b.id, url: PUBLIC_URL });
    const eventId = await emit(a.id);
    expect(await strict().listDeliveries({ orgId: a.id, eventId })).toHaveLength(1);
    expect(await strict().listDeliveries({ orgId: b.id, eventId })).toEqual([]);
  });

  it('when deliveries are filtered by an invalid status, the filter is refused naming the field', async () => {
    const org = await ctx.createOrg();
    await expect(strict().listDeliveries({ orgId: org.id, status: 'sent' as 'pending' })).rejects.toMatchObject({
      code: 'validation_failed',
      details: { issues: { status: expect.any(Array) } },
    });
  });
});

describe('webhook address and header rules', () => {
  it.each([
    ['8.8.8.8', true],
    ['2606:4700:4700::1111', true],
    ['127.0.0.1', false],
    ['10.0.0.1', false],
    ['100.64.0.1', false],
    ['169.254.169.254', false],
    ['fd00:ec2::254', false],
    ['::ffff:10.0.0.1', false],
    ['::127.0.0.1', false],
    ['::7f00:1', false],
    ['2002:0a00:0001::1', false],
    ['64:ff9b::a00:1', false],
    ['224.0.0.1', false],
    ['255.255.255.255', false],
  ])('when the address is %s, it is public: %s', (address, expected) => {
    expect(nonPublicRange(address) === undefined).toBe(expected);
  });

  it('when no Retry-After is given, retries follow a growing schedule of 15 attempts over about three days', () => {
    expect(DEFAULT_RETRY_SCHEDULE_MS).toHaveLength(14);
    expect([...DEFAULT_RETRY_SCHEDULE_MS].sort((a, b) => a - b)).toEqual(DEFAULT_RETRY_SCHEDULE_MS);
    const totalHours = DEFAULT_RETRY_SCHEDULE_MS.reduce((sum, delay) => sum + delay, 0) / 3_600_000;
    expect(totalHours).toBeGreaterThan(66);
    expect(totalHours).toBeLessThan(78);
  });

  it('when no timeout is configured, an answer counts only if it completes within 15 seconds', () => {
    expect(DEFAULT_REQUEST_TIMEOUT_MS).toBe(15_000);
  });

  it('when Retry-After is delay-seconds or an HTTP date, it is read as a delay; anything else is ignored', () => {
    const now = Date.parse('2026-01-01T00:00:00Z');
    expect(parseRetryAfter('120', now)).toBe(120_000);
    expect(parseRetryAfter('Thu, 01 Jan 2026 00:00:30 GMT', now)).toBe(30_000);
    expect(parseRetryAfter('Wed, 31 Dec 2025 23:00:00 GMT', now)).toBe(0);
    expect(parseRetryAfter('soon', now)).toBeNull();
    expect(parseRetryAfter(undefined, now)).toBeNull();
  });
});
