import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { and, eq } from 'drizzle-orm';
import { createDatabase } from '../../src/db/client.js';
import { auditLog, outboxEvents, webhookDeliveries, webhookEndpoints } from '../../src/db/schema.js';
import { createDeliveryRepository } from '../../src/modules/webhooks/delivery.repository.js';
import { createDeliveryWorker, type DeliveryWorker, type DeliveryWorkerOptions } from '../../src/modules/webhooks/delivery.worker.js';
import { NOT_A_PUBLIC_HOST } from '../../src/modules/webhooks/endpoint-url.js';
import { createOutboxRepository, type EventType } from '../../src/shared/outbox.js';
import { createTestContext, type TestContext, testServices } from '../helpers/harness.js';
import { startReceiver, waitFor, type Receiver } from '../helpers/webhook-receiver.js';

let ctx: TestContext;
let receiver: Receiver;
const workers: DeliveryWorker[] = [];

beforeAll(async () => {
  ctx = await createTestContext();
  receiver = await startReceiver();
});
afterEach(async () => {
  await Promise.all(workers.splice(0).map((worker) => worker.stop()));
  receiver.setReply(() => ({}));
});
afterAll(async () => {
  await receiver?.close();
  await ctx?.close();
});

const service = () => testServices(ctx.database, { config: { webhookAllowPrivateUrls: true } }).webhooks;

let pathCounter = 0;
/** An organisation with one endpoint on its own receiver path. */
async function orgWithEndpoint(options: { events?: EventType[] } = {}) {
  const org = await ctx.createOrg();
  const path = `/hook-${(pathCounter += 1)}`;
  const endpoint = await service().addEndpoint({ orgId: org.id, url: receiver.url(path), events: options.events });
  receiver.trust(path, endpoint.secret);
  return { orgId: org.id, path, endpoint };
}

async function emit(orgId: string, type: EventType = 'customer.updated', customer: unknown = { id: 'c-1', full_name: 'Zoë Ångström' }) {
  return ctx.database.transaction((tx) => createOutboxRepository().record({ orgId, type, customerId: null, customer }, tx));
}

async function startWorker(overrides: Partial<DeliveryWorkerOptions> = {}) {
  const worker = createDeliveryWorker({
    database: ctx.database,
    allowPrivateUrls: true,
    requestTimeoutMs: 2_000,
    retrySchedule: [50, 50, 50, 50],
    jitter: 0,
    pollIntervalMs: 100,
    stopTimeoutMs: 2_000,
    ...overrides,
  });
  workers.push(worker);
  await worker.start();
  return worker;
}

async function deliveryOf(orgId: string, eventId: string) {
  const [delivery] = await service().listDeliveries({ orgId, eventId });
  return delivery!;
}

async function settledDelivery(orgId: string, eventId: string, status: 'succeeded' | 'failed' = 'succeeded') {
  return waitFor(
    async () => {
      const delivery = await deliveryOf(orgId, eventId);
      return delivery.status === status ? delivery : undefined;
    },
    20_000,
    `delivery of ${eventId} to be ${status}`,
  );
}

const receiptsFor = (path: string) => receiver.receipts.filter((receipt) => receipt.path === path);

describe('webhook delivery', () => {
  it('when an event is recorded, the worker posts the stored payload byte for byte with Standard Webhooks headers that verify', async () => {
    const { orgId, path } = await orgWithEndpoint();
    await startWorker();
    const eventId = await emit(orgId);
    const delivery = await settledDelivery(orgId, eventId);

    const [receipt] = receiptsFor(path);
    const [stored] = await ctx.database.db.select().from(outboxEvents).where(eq(outboxEvents.id, eventId));
    expect(receipt!.body).toBe(stored!.payload);
    expect(JSON.parse(receipt!.body)).toEqual({
      id: eventId,
      type: 'customer.updated',
      created: expect.any(String),
      data: { customer: { id: 'c-1', full_name: 'Zoë Ångström' } },
    });
    expect(receipt!.verifyError).toBeNull();
    expect(receipt!.headers['content-type']).toBe('application/json');
    expect(receipt!.headers['svc-event-id']).toBe(eventId);
    expect(receipt!.headers['webhook-id']).toBe(eventId);
    expect(Math.abs(Number(receipt!.headers['webhook-timestamp']) - Date.now() / 1000)).toBeLessThan(10);
    expect(receipt!.headers['webhook-signature']).toMatch(/^v1,[A-Za-z0-9+/]+=*$/);
    expect(delivery.attempts).toEqual([
      expect.objectContaining({ attempt_number: 1, status_code: 200, error: null, latency_ms: expect.any(Number) }),
    ]);
  });

  it('when the receiver answers 500, it retries with the same event id and a freshly signed timestamp', async () => {
    const { orgId, path } = await orgWithEndpoint();
    receiver.setReply((receipt) => ({ status: receiptsFor(receipt.path).length === 1 ? 500 : 200 }));
    // A retry a second later, so the fresh timestamp is visibly a different second.
    await startWorker({ retrySchedule: [1_100] });
    const eventId = await emit(orgId);
    const delivery = await settledDelivery(orgId, eventId);

    const [first, second] = receiptsFor(path);
    expect([first!.webhookId, second!.webhookId]).toEqual([eventId, eventId]);
    expect(second!.headers['svc-event-id']).toBe(eventId);
    expect(second!.body).toBe(first!.body);
    expect(Number(second!.headers['webhook-timestamp'])).toBeGreaterThan(Number(first!.headers['webhook-timestamp']));
    expect(second!.headers['webhook-signature']).not.toBe(first!.headers['webhook-signature']);
    expect([first!.verifyError, second!.verifyError]).toEqual([null, null]);
    expect(delivery.attempts.map((attempt) => attempt.status_code)).toEqual([500, 200]);
    expect(delivery.attempts[0]!.error).toBe('HTTP 500');
    expect(delivery.attempt_count).toBe(2);
  });

  it('when the receiver does not answer within the timeout, the attempt fails and the retry keeps the event id', async () => {
    const { orgId, path } = await orgWithEndpoint();
    receiver.setReply((receipt) => (receiptsFor(receipt.path).length === 1 ? { delayMs: 1_500 } : {}));
    await startWorker({ requestTimeoutMs: 300 });
    const eventId = await emit(orgId);
    const delivery = await settledDelivery(orgId, eventId);

    expect(receiptsFor(path).map((receipt) => receipt.webhookId)).toEqual([eventId, eventId]);
    expect(receiptsFor(path).every((receipt) => receipt.verifyError === null)).toBe(true);
    expect(delivery.attempts[0]).toMatchObject({ status_code: null, error: expect.stringMatching(/timed out after 300 ms/) });
    expect(delivery.attempts[1]).toMatchObject({ status_code: 200, error: null });
  });

  it('when a 2xx starts within the timeout but its body is still arriving at the deadline, the attempt fails and is retried', async () => {
    // Headers at once, the body's end only after the deadline: "2xx within the timeout" means the whole answer.
    let answered = 0;
    const slowBody = createServer((request, response) => {
      request.resume();
      request.on('end', () => {
        answered += 1;
        response.writeHead(200, { 'content-type': 'text/plain' });
        response.write('accepted');
        if (answered === 1) setTimeout(() => response.end(), 1_000);
        else response.end();
      });
    });
    await new Promise<void>((resolve) => slowBody.listen(0, '127.0.0.1', resolve));
    try {
      const org = await ctx.createOrg();
      await service().addEndpoint({ orgId: org.id, url: `http://127.0.0.1:${(slowBody.address() as AddressInfo).port}/slow-body` });
      await startWorker({ requestTimeoutMs: 300 });
      const eventId = await emit(org.id);
      const delivery = await settledDelivery(org.id, eventId);

      expect(delivery.attempts.map((attempt) => [attempt.status_code, attempt.error])).toEqual([
        // The exchange was cut at the deadline: a failed attempt, whose log still shows the status received.
        [200, expect.stringMatching(/^HTTP 200; timed out after 300 ms/)],
        [200, null],
      ]);
    } finally {
      slowBody.closeAllConnections();
      await new Promise((resolve) => slowBody.close(resolve));
    }
  });

  it('when failing deliveries are retried, each delay is jittered around the schedule so they do not retry in lockstep', async () => {
    const { orgId } = await orgWithEndpoint();
    receiver.setReply(() => ({ status: 500 }));
    // The default jitter (the helper turns it off for the other tests).
    await startWorker({ retrySchedule: [600_000], jitter: undefined });
    const eventIds = await Promise.all([1, 2, 3, 4, 5, 6].map(() => emit(orgId)));
    const delays = await waitFor(async () => {
      const deliveries = await Promise.all(eventIds.map((eventId) => deliveryOf(orgId, eventId)));
      if (!deliveries.every((delivery) => delivery.attempts.length === 1 && delivery.status === 'pending')) return undefined;
      return deliveries.map((delivery) => Date.parse(delivery.next_attempt_at!) - Date.parse(delivery.attempts[0]!.started_at));
    });

    // ±20 % of 10 minutes; without jitter they would all sit within a second of 600 s. The delay is counted
    // from the attempt's start, so the upper bound leaves room for the attempt itself on a busy machine.
    for (const delay of delays) {
      expect(delay).toBeGreaterThanOrEqual(480_000);
      expect(delay).toBeLessThanOrEqual(720_000 + 30_000);
    }
    expect(Math.max(...delays) - Math.min(...delays)).toBeGreaterThan(5_000);
  });

  it('when the receiver answers 410, the endpoint is disabled, the delivery fails and later events are not queued for it', async () => {
    const { orgId, path, endpoint } = await orgWithEndpoint();
    receiver.setReply(() => ({ status: 410 }));
    await startWorker();
    const eventId = await emit(orgId);
    const delivery = await settledDelivery(orgId, eventId, 'failed');

    expect(delivery.attempts).toHaveLength(1);
    expect(receiptsFor(path)).toHaveLength(1);
    const [listed] = await service().listEndpoints(orgId);
    expect(listed).toMatchObject({ id: endpoint.id, enabled: false, disabled_reason: expect.stringMatching(/410 Gone/) });
    const audit = await ctx.database.db
      .select()
      .from(auditLog)
      .where(and(eq(auditLog.orgId, orgId), eq(auditLog.subjectId, endpoint.id)));
    expect(audit.map((row) => [row.action, row.actorType])).toEqual([
      ['webhook_endpoint.created', 'system'],
      ['webhook_endpoint.disabled', 'system'],
    ]);
    const later = await emit(orgId);
    expect(await service().listDeliveries({ orgId, eventId: later })).toEqual([]);
  });

  it('when the receiver redirects, the redirect is not followed and the attempt counts as failed', async () => {
    const { orgId, path } = await orgWithEndpoint();
    receiver.trust('/elsewhere', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw');
    receiver.setReply((receipt) => (receipt.path === path ? { status: 302, headers: { location: receiver.url('/elsewhere') } } : {}));
    await startWorker({ retrySchedule: [60_000] });
    const eventId = await emit(orgId);
    const delivery = await waitFor(async () => {
      const current = await deliveryOf(orgId, eventId);
      return current.attempts.length === 1 ? current : undefined;
    });

    expect(delivery.status).toBe('pending');
    expect(delivery.attempts[0]).toMatchObject({ status_code: 302, error: expect.stringMatching(/redirect not followed/) });
    expect(receiptsFor('/elsewhere')).toHaveLength(0);
  });

  it('when the receiver sends Retry-After, the next attempt is scheduled that far out instead of the backoff', async () => {
    const { orgId, path } = await orgWithEndpoint();
    receiver.setReply((receipt) => (receiptsFor(receipt.path).length === 1 ? { status: 503, headers: { 'retry-after': '2' } } : {}));
    await startWorker({ retrySchedule: [10] });
    const eventId = await emit(orgId);
    const afterFirst = await waitFor(async () => {
      const current = await deliveryOf(orgId, eventId);
      return current.attempts.length === 1 && current.status === 'pending' ? current : undefined;
    });
    expect(afterFirst.attempts[0]).toMatchObject({ status_code: 503, error: 'HTTP 503' });
    const waited = Date.parse(afterFirst.next_attempt_at!) - Date.parse(afterFirst.attempts[0]!.started_at);
    expect(waited).toBeGreaterThanOrEqual(1_900);

    const delivered = await settledDelivery(orgId, eventId);
    expect(receiptsFor(path)).toHaveLength(2);
    expect(delivered.attempts.map((attempt) => attempt.status_code)).toEqual([503, 200]);
    // The retry was not sent before it was due (both stamps from this machine's clock).
    expect(Date.parse(delivered.attempts[1]!.started_at)).toBeGreaterThanOrEqual(Date.parse(afterFirst.next_attempt_at!));
  });

  it('when a Retry-After asks for longer than the cap, the next attempt is scheduled at the cap', async () => {
    const { orgId } = await orgWithEndpoint();
    receiver.setReply(() => ({ status: 429, headers: { 'retry-after': '999999999' } }));
    await startWorker({ maxRetryAfterMs: 60_000 });
    const eventId = await emit(orgId);
    const delivery = await waitFor(async () => {
      const current = await deliveryOf(orgId, eventId);
      return current.attempts.length === 1 && current.status === 'pending' ? current : undefined;
    });
    const waited = Date.parse(delivery.next_attempt_at!) - Date.parse(delivery.attempts[0]!.started_at);
    // The cap (60 s), not the header's 999,999,999 s nor the test schedule's 50 ms; counted from the attempt's
    // start, with room for the attempt itself on a busy machine.
    expect(waited).toBeGreaterThan(55_000);
    expect(waited).toBeLessThan(60_000 + 30_000);
  });

  it('when every scheduled attempt fails, the delivery ends failed after the last one', async () => {
    const { orgId, path } = await orgWithEndpoint();
    receiver.setReply(() => ({ status: 500 }));
    await startWorker({ retrySchedule: [20, 20] });
    const eventId = await emit(orgId);
    const delivery = await settledDelivery(orgId, eventId, 'failed');

    expect(delivery.attempts.map((attempt) => attempt.attempt_number)).toEqual([1, 2, 3]);
    expect(delivery.last_error).toMatch(/gave up after 3 attempts/);
    expect(delivery.next_attempt_at).toBeNull();
    expect(receiptsFor(path)).toHaveLength(3);
  });

  it('when an endpoint host resolves to a private address at delivery time, the worker refuses to connect', async () => {
    const org = await ctx.createOrg();
    // Registered while its name pointed at a public address; the DNS answer now says loopback.
    for (const url of [
      `https://localhost:${receiver.port}/rebound`,
      `https://127.0.0.1:${receiver.port}/rebound`,
      `http://example.com/plain`,
    ]) {
      await ctx.database.db.insert(webhookEndpoints).values({ orgId: org.id, url, secret: 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw' });
    }
    // The receiver's port is allowed, so what refuses these is the address rule.
    await startWorker({ allowPrivateUrls: false, allowedPorts: [receiver.port], retrySchedule: [60_000] });
    const eventId = await emit(org.id);
    const deliveries = await waitFor(async () => {
      const current = await service().listDeliveries({ orgId: org.id, eventId });
      return current.every((delivery) => delivery.attempts.length === 1) ? current : undefined;
    });

    const errors = Object.fromEntries(deliveries.map((delivery) => [delivery.endpoint_url, delivery.attempts[0]!.error]));
    // The name's answer is not told (the organisation may point a name of its own at an internal one).
    expect(errors[`https://localhost:${receiver.port}/rebound`]).toBe(NOT_A_PUBLIC_HOST);
    expect(errors[`https://127.0.0.1:${receiver.port}/rebound`]).toMatch(/127\.0\.0\.1 is not a public address/);
    expect(errors['http://example.com/plain']).toMatch(/https only/);
    expect(receiptsFor('/rebound')).toHaveLength(0);
  });

  it('when its process commits an event, the worker is woken after the commit and delivers without waiting for the next poll', async () => {
    const { orgId } = await orgWithEndpoint();
    await startWorker({ pollIntervalMs: 600_000 });
    const eventId = await emit(orgId);
    expect((await settledDelivery(orgId, eventId)).status).toBe('succeeded');
  });
});

describe('webhook delivery isolation and atomicity', () => {
  it('when the transaction that called record() rolls back, nothing is stored or delivered', async () => {
    const { orgId, path } = await orgWithEndpoint();
    await startWorker();
    const outbox = createOutboxRepository();
    let rolledBackId: string | undefined;
    await expect(
      ctx.database.transaction(async (tx) => {
        rolledBackId = await outbox.record({ orgId, type: 'customer.updated', customerId: null, customer: { id: 'gone' } }, tx);
        throw new Error('the state change failed');
      }),
    ).rejects.toThrow('the state change failed');
    // A committed event after it: once that one is delivered, the worker has been through the queue.
    const committed = await emit(orgId);
    await settledDelivery(orgId, committed);

    expect(receiptsFor(path).map((receipt) => receipt.webhookId)).toEqual([committed]);
    expect(await ctx.database.db.select().from(outboxEvents).where(eq(outboxEvents.id, rolledBackId!))).toEqual([]);
    expect(await service().listDeliveries({ orgId })).toHaveLength(1);
  });

  it("when two organisations have endpoints, an organisation's event never reaches the other's endpoint", async () => {
    const a = await orgWithEndpoint();
    const b = await orgWithEndpoint();
    await startWorker();
    const eventA = await emit(a.orgId);
    const eventB = await emit(b.orgId);
    await settledDelivery(a.orgId, eventA);
    await settledDelivery(b.orgId, eventB);

    expect(receiptsFor(a.path).map((receipt) => receipt.webhookId)).toEqual([eventA]);
    expect(receiptsFor(b.path).map((receipt) => receipt.webhookId)).toEqual([eventB]);
    expect(await service().listDeliveries({ orgId: b.orgId, eventId: eventA })).toEqual([]);
  });
});

describe('webhook delivery across worker failures', () => {
  it('when a worker is stopped mid-flight, it releases its claim and another worker delivers the same event after', async () => {
    const { orgId, path } = await orgWithEndpoint();
    receiver.setReply(() => ({ hang: true }));
    const first = await startWorker({ stopTimeoutMs: 200, requestTimeoutMs: 10_000 });
    const eventId = await emit(orgId);
    await waitFor(() => receiptsFor(path).length === 1);
    await first.stop();

    const [row] = await ctx.database.db.select().from(webhookDeliveries).where(eq(webhookDeliveries.eventId, eventId));
    expect(row).toMatchObject({ status: 'pending', lockedBy: null, lockedUntil: null });
    expect(row!.nextAttemptAt.getTime()).toBeLessThanOrEqual(Date.now());

    receiver.setReply(() => ({}));
    const second = await startWorker();
    const delivery = await settledDelivery(orgId, eventId);
    expect(receiptsFor(path).map((receipt) => receipt.webhookId)).toEqual([eventId, eventId]);
    expect(delivery.attempts[0]).toMatchObject({ worker_id: first.id, error: expect.stringMatching(/worker stopped/) });
    expect(delivery.attempts[1]).toMatchObject({ worker_id: second.id, status_code: 200 });
  });

  it('when a worker dies holding a claim, another worker retakes the delivery once the lease expires', async () => {
    const { orgId, path } = await orgWithEndpoint();
    const eventId = await emit(orgId);
    const [claim] = await createDeliveryRepository().claim('crashed-worker', 10, 500, ctx.database.db);
    expect(claim!.eventId).toBe(eventId);

    await startWorker();
    const delivery = await settledDelivery(orgId, eventId);
    expect(receiptsFor(path).map((receipt) => receipt.webhookId)).toEqual([eventId]);
    expect(delivery.attempt_count).toBe(2);
    expect(delivery.attempts).toEqual([expect.objectContaining({ attempt_number: 2, status_code: 200 })]);
  });

  it('when the process crashed right after commit, a fresh worker on a new pool delivers the event', async () => {
    const { orgId, path } = await orgWithEndpoint();
    const eventId = await emit(orgId);

    const freshDatabase = createDatabase(ctx.databaseUrl, { poolSize: 4 });
    try {
      const worker = createDeliveryWorker({ database: freshDatabase, allowPrivateUrls: true, pollIntervalMs: 100 });
      await worker.start();
      await settledDelivery(orgId, eventId);
      await worker.stop();
    } finally {
      await freshDatabase.close();
    }
    expect(receiptsFor(path).map((receipt) => receipt.webhookId)).toEqual([eventId]);
  });
});

describe('webhook claims and leases', () => {
  it('when a lease expired and another worker retook the delivery, the first worker cannot overwrite its outcome', async () => {
    const { orgId } = await orgWithEndpoint();
    const eventId = await emit(orgId);
    const repository = createDeliveryRepository();
    const [late] = await repository.claim('slow-worker', 10, 100, ctx.database.db);
    expect(await repository.claim('other-worker', 10, 60_000, ctx.database.db)).toEqual([]);
    await new Promise((resolve) => setTimeout(resolve, 150));
    const [retaken] = await repository.claim('other-worker', 10, 60_000, ctx.database.db);
    expect(retaken).toMatchObject({ id: late!.id, attempt: 2 });

    const attempt = { statusCode: 200, latencyMs: 5, error: null, startedAt: new Date() };
    expect(await repository.settle(late!, 'slow-worker', { status: 'succeeded', attempt }, ctx.database.db)).toBe(false);
    const [row] = await ctx.database.db.select().from(webhookDeliveries).where(eq(webhookDeliveries.eventId, eventId));
    expect(row).toMatchObject({ status: 'pending', lockedBy: 'other-worker' });
    expect(
      await repository.settle(
        retaken!,
        'other-worker',
        {
          status: 'retry',
          attempt: { ...attempt, statusCode: 500, error: 'HTTP 500' },
          delayMs: 60_000,
        },
        ctx.database.db,
      ),
    ).toBe(true);
    const delivery = await deliveryOf(orgId, eventId);
    expect(delivery).toMatchObject({ status: 'pending', last_status_code: 500 });
    // Both attempts stay in the history, even the one that lost its lease.
    expect(delivery.attempts.map((entry) => [entry.attempt_number, entry.worker_id])).toEqual([
      [1, 'slow-worker'],
      [2, 'other-worker'],
    ]);
  });

  it('when background jobs run with the webhook worker on, events are delivered and stop() ends the worker', async () => {
    const { orgId } = await orgWithEndpoint();
    const pino = (await import('pino')).default;
    const { startBackgroundJobs } = await import('../../src/jobs.js');
    const jobs = await startBackgroundJobs({
      config: { ...ctx.config, webhookAllowPrivateUrls: true },
      database: ctx.database,
      logger: pino({ level: 'silent' }),
      webhookWorker: true,
    });
    try {
      const eventId = await emit(orgId);
      expect((await settledDelivery(orgId, eventId)).status).toBe('succeeded');
    } finally {
      await jobs.stop();
    }
    const afterStop = await emit(orgId);
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect((await deliveryOf(orgId, afterStop)).attempts).toEqual([]);
  });
});

describe('webhook resend', () => {
  it('when a succeeded delivery is resent, a new delivery of the same event goes out with the same id', async () => {
    const { orgId, path } = await orgWithEndpoint();
    await startWorker();
    const eventId = await emit(orgId);
    const original = await settledDelivery(orgId, eventId);

    const resent = await service().resendDelivery(original.id);
    // A running worker may already have delivered it by the time the answer is read.
    expect(resent).toMatchObject({ event_id: eventId, endpoint_id: original.endpoint_id, resent_from: original.id });
    expect(['pending', 'succeeded']).toContain(resent.status);
    expect(resent.id).not.toBe(original.id);
    await waitFor(async () => (await deliveryOf(orgId, eventId)).status === 'succeeded' && receiptsFor(path).length === 2);
    expect(receiptsFor(path).map((receipt) => receipt.webhookId)).toEqual([eventId, eventId]);
    const all = await service().listDeliveries({ orgId, eventId });
    expect(all.map((delivery) => delivery.status)).toEqual(['succeeded', 'succeeded']);
  });

  it('when a pending delivery waiting for its backoff is resent, it becomes due now', async () => {
    const { orgId, path } = await orgWithEndpoint();
    receiver.setReply((receipt) => ({ status: receiptsFor(receipt.path).length === 1 ? 500 : 200 }));
    await startWorker({ retrySchedule: [3_600_000] });
    const eventId = await emit(orgId);
    const waiting = await waitFor(async () => {
      const current = await deliveryOf(orgId, eventId);
      return current.attempts.length === 1 ? current : undefined;
    });
    expect(Date.parse(waiting.next_attempt_at!)).toBeGreaterThan(Date.now() + 3_000_000);

    const resent = await service().resendDelivery(waiting.id, { orgId });
    expect(resent).toMatchObject({ id: waiting.id, resent_from: null });
    await settledDelivery(orgId, eventId);
    expect(receiptsFor(path)).toHaveLength(2);
  });

  it('when a delivery id of another organisation is given with --org, it is not found', async () => {
    const a = await orgWithEndpoint();
    const b = await orgWithEndpoint();
    const eventId = await emit(a.orgId);
    const delivery = await deliveryOf(a.orgId, eventId);
    await expect(service().resendDelivery(delivery.id, { orgId: b.orgId })).rejects.toMatchObject({ code: 'not_found' });
  });
});
