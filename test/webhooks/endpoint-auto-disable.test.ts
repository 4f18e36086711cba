import pino from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { and, eq, sql } from 'drizzle-orm';
import { loadConfig } from '../../src/config/config.js';
import { auditLog, outboxEvents, webhookDeliveries, webhookEndpoints } from '../../src/db/schema.js';
import { startBackgroundJobs } from '../../src/jobs.js';
import { createDeliveryRepository, type AttemptRecord, type ClaimedDelivery } from '../../src/modules/webhooks/delivery.repository.js';
import { createDeliveryWorker, type DeliveryWorker, type DeliveryWorkerOptions } from '../../src/modules/webhooks/delivery.worker.js';
import { createOutboxRepository, type EventType } from '../../src/shared/outbox.js';
import { createEndpointDisabler } from '../../src/modules/webhooks/webhooks.service.js';
import { createTestContext, type TestContext, testServices } from '../helpers/harness.js';
import { startReceiver, waitFor, type Receiver } from '../helpers/webhook-receiver.js';

let ctx: TestContext;
let receiver: Receiver;
const workers: DeliveryWorker[] = [];

beforeAll(async () => {
  ctx = await createTestContext();
  // Paths starting /down answer 500, /gone 410; everything else 200.
  receiver = await startReceiver((receipt) => ({
    status: receipt.path.startsWith('/down') ? 500 : receipt.path.startsWith('/gone') ? 410 : 200,
  }));
});
afterEach(async () => {
  await Promise.all(workers.splice(0).map((worker) => worker.stop()));
});
afterAll(async () => {
  await receiver?.close();
  await ctx?.close();
});

const MINUTE = 60_000;
const HOUR = 60 * MINUTE;
const DAY = 24 * HOUR;

const service = () => testServices(ctx.database, { config: { webhookAllowPrivateUrls: true } }).webhooks;

let pathCounter = 0;
async function addEndpoint(orgId: string, prefix: 'down' | 'gone' | 'up', events?: EventType[]) {
  const path = `/${prefix}-${(pathCounter += 1)}`;
  const endpoint = await service().addEndpoint({ orgId, url: receiver.url(path), events });
  receiver.trust(path, endpoint.secret);
  return { ...endpoint, path };
}

async function emit(orgId: string, type: EventType = 'customer.updated') {
  return ctx.database.transaction((tx) => createOutboxRepository().record({ orgId, type, customerId: null, customer: { id: 'c-1' } }, tx));
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

async function setFailingSince(orgId: string, endpointId: string, agoMs: number) {
  await ctx.database.db.execute(sql`
    UPDATE webhook_endpoints SET failing_since = clock_timestamp() - ${agoMs} * interval '1 millisecond'
     WHERE org_id = ${orgId} AND id = ${endpointId}`);
}

async function endpointRow(orgId: string, id: string) {
  const [row] = await ctx.database.db
    .select()
    .from(webhookEndpoints)
    .where(and(eq(webhookEndpoints.orgId, orgId), eq(webhookEndpoints.id, id)));
  return row!;
}

async function disabledEvents(orgId: string) {
  return ctx.database.db
    .select()
    .from(outboxEvents)
    .where(and(eq(outboxEvents.orgId, orgId), eq(outboxEvents.type, 'endpoint.disabled')));
}

async function disableAudits(orgId: string, endpointId: string) {
  return ctx.database.db
    .select()
    .from(auditLog)
    .where(and(eq(auditLog.orgId, orgId), eq(auditLog.subjectId, endpointId), eq(auditLog.action, 'webhook_endpoint.disabled')));
}

async function deliveriesOf(orgId: string, eventId: string) {
  return ctx.database.db
    .select()
    .from(webhookDeliveries)
    .where(and(eq(webhookDeliveries.orgId, orgId), eq(webhookDeliveries.eventId, eventId)));
}

const untilDisabled = (orgId: string, id: string) =>
  waitFor(
    async () => {
      const row = await endpointRow(orgId, id);
      return row.enabled ? undefined : row;
    },
    20_000,
    `endpoint ${id} to be disabled`,
  );

const ISO = /\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z/;

describe('endpoint auto-disable', () => {
  it('when an endpoint has failed for more than 3 days and another attempt fails, it is disabled with its queued deliveries, one audit row and one endpoint.disabled event without the secret', async () => {
    const org = await ctx.createOrg();
    const endpoint = await addEndpoint(org.id, 'down');
    // Queued but not due: failed by the disable rather than attempted.
    const queued = await emit(org.id);
    await ctx.database.db.execute(
      sql`UPDATE webhook_deliveries SET next_attempt_at = clock_timestamp() + interval '1 hour' WHERE org_id = ${org.id} AND event_id = ${queued}`,
    );
    await setFailingSince(org.id, endpoint.id, 3 * DAY + MINUTE);
    const failingSince = (await endpointRow(org.id, endpoint.id)).failingSince!;
    // Several due at once: each failed attempt asks for the disable, and one is recorded.
    const due = [await emit(org.id), await emit(org.id), await emit(org.id)];

    await startWorker();
    const disabled = await untilDisabled(org.id, endpoint.id);

    expect(disabled.disabledReason).toBe(
      `every attempt has failed since ${failingSince.toISOString()} (more than 72 hours); the last: HTTP 500`,
    );
    const [queuedDelivery] = await deliveriesOf(org.id, queued);
    expect(queuedDelivery).toMatchObject({ status: 'failed', attempts: 0, lastError: `endpoint disabled: ${disabled.disabledReason}` });
    for (const eventId of due) {
      const settled = await waitFor(async () => {
        const [delivery] = await deliveriesOf(org.id, eventId);
        return delivery!.status === 'failed' ? delivery : undefined;
      });
      expect(settled.lastError).toMatch(/endpoint disabled/);
    }
    // Cleared by the disable and not set again by the attempts in flight, so an endpoint enabled again starts afresh.
    expect((await endpointRow(org.id, endpoint.id)).failingSince).toBeNull();

    const audits = await disableAudits(org.id, endpoint.id);
    expect(audits).toHaveLength(1);
    expect(audits[0]).toMatchObject({
      actorType: 'system',
      actorId: workers[0]!.id,
      before: expect.objectContaining({ enabled: true, disabled_reason: null }),
      after: expect.objectContaining({
        enabled: false,
        disabled_reason: disabled.disabledReason,
        cause: { delivery_id: expect.any(String), event_id: expect.any(String) },
      }),
    });
    const events = await disabledEvents(org.id);
    expect(events).toHaveLength(1);
    expect(events[0]!.customerId).toBeNull();
    expect(events[0]!.payload).not.toContain(endpoint.secret);
    const payload = JSON.parse(events[0]!.payload) as {
      id: string;
      type: string;
      data: { endpoint: Record<string, unknown>; reason: string };
    };
    expect(payload).toMatchObject({ id: events[0]!.id, type: 'endpoint.disabled', data: { reason: disabled.disabledReason } });
    const [listed] = await service().listEndpoints(org.id);
    expect(payload.data.endpoint).toEqual(listed);
    expect(payload.data.endpoint).not.toHaveProperty('secret');
  });

  it('when an endpoint has failed for less than 3 days and another attempt fails, it stays enabled, failing_since does not move and the settlement stays batched', async () => {
    const org = await ctx.createOrg();
    const endpoint = await addEndpoint(org.id, 'down');
    await setFailingSince(org.id, endpoint.id, 3 * DAY - MINUTE);
    const failingSince = (await endpointRow(org.id, endpoint.id)).failingSince!;
    const worker = await startWorker({ retrySchedule: [60_000] });
    const eventId = await emit(org.id);

    await waitFor(async () => (await service().listDeliveries({ orgId: org.id, eventId }))[0]!.attempts.length === 1);
    // Not asked to disable, so not a transaction of its own: failures of a struggling endpoint cost no more than others.
    expect(worker.stats()).toMatchObject({ retried: 1, settleBatches: 1 });
    const row = await endpointRow(org.id, endpoint.id);
    expect(row).toMatchObject({ enabled: true, disabledReason: null });
    expect(row.failingSince).toEqual(failingSince);
    expect(await disabledEvents(org.id)).toEqual([]);
    expect(await disableAudits(org.id, endpoint.id)).toEqual([]);
  });

  it("when attempts fail, failing_since is the first failure's start and later failures keep it; a success clears it", async () => {
    const org = await ctx.createOrg();
    const endpoint = await addEndpoint(org.id, 'up');
    expect((await endpointRow(org.id, endpoint.id)).failingSince).toBeNull();
    let answered = 0;
    receiver.setReply((receipt) => {
      if (receipt.path !== endpoint.path) return { status: 200 };
      answered += 1;
      return { status: answered <= 2 ? 500 : 200 };
    });
    try {
      await startWorker({ retrySchedule: [1_000, 1_000] });
      const eventId = await emit(org.id);
      const attemptsOf = async (count: number) =>
        waitFor(async () => {
          const [delivery] = await service().listDeliveries({ orgId: org.id, eventId });
          return delivery!.attempts.length === count ? delivery!.attempts : undefined;
        });

      const [first] = await attemptsOf(1);
      expect((await endpointRow(org.id, endpoint.id)).failingSince!.toISOString()).toBe(first!.started_at);
      const [, second] = await attemptsOf(2);
      expect(second!.status_code).toBe(500);
      expect((await endpointRow(org.id, endpoint.id)).failingSince!.toISOString()).toBe(first!.started_at);
      const [, , third] = await attemptsOf(3);
      expect(third!.status_code).toBe(200);
      expect(await endpointRow(org.id, endpoint.id)).toMatchObject({ failingSince: null, enabled: true });
    } finally {
      receiver.setReply((receipt) => ({ status: receipt.path.startsWith('/down') ? 500 : receipt.path.startsWith('/gone') ? 410 : 200 }));
    }
  });

  it("when an endpoint is disabled, the endpoint.disabled event is delivered to the organisation's other subscribed enabled endpoints only", async () => {
    const org = await ctx.createOrg();
    // Only the failing endpoint and the one taking everything get the customer.kyc_completed that fails it.
    const failing = await addEndpoint(org.id, 'down', ['customer.kyc_completed']);
    const watcher = await addEndpoint(org.id, 'up', ['endpoint.disabled']);
    const everything = await addEndpoint(org.id, 'up');
    const customersOnly = await addEndpoint(org.id, 'up', ['customer.updated']);
    const other = await ctx.createOrg();
    const otherEndpoint = await addEndpoint(other.id, 'up');
    await setFailingSince(org.id, failing.id, 3 * DAY + MINUTE);

    await startWorker();
    await emit(org.id, 'customer.kyc_completed');
    await untilDisabled(org.id, failing.id);
    const [event] = await disabledEvents(org.id);
    const receivedBy = async (path: string) =>
      waitFor(
        () => receiver.receipts.find((receipt) => receipt.path === path && receipt.webhookId === event!.id),
        20_000,
        `${path} to receive the event`,
      );

    for (const target of [watcher, everything]) {
      const receipt = await receivedBy(target.path);
      expect(receipt.verifyError).toBeNull();
      expect(JSON.parse(receipt.body)).toMatchObject({ type: 'endpoint.disabled', data: { endpoint: { id: failing.id, enabled: false } } });
    }
    const deliveries = await deliveriesOf(org.id, event!.id);
    expect(deliveries.map((delivery) => delivery.endpointId).sort()).toEqual([watcher.id, everything.id].sort());
    expect(deliveries.map((delivery) => delivery.endpointId)).not.toContain(customersOnly.id);
    expect(receiver.receipts.filter((receipt) => receipt.path === failing.path && receipt.webhookId === event!.id)).toEqual([]);
    expect(receiver.receipts.filter((receipt) => receipt.path === otherEndpoint.path)).toEqual([]);
    expect(await disabledEvents(other.id)).toEqual([]);
  });

  it('when the receiver answers 410, the disable records an endpoint.disabled event and its audit row', async () => {
    const org = await ctx.createOrg();
    const endpoint = await addEndpoint(org.id, 'gone');
    await startWorker();
    await emit(org.id);
    const disabled = await untilDisabled(org.id, endpoint.id);

    expect(disabled.disabledReason).toMatch(new RegExp(`^the endpoint answered 410 Gone on ${ISO.source}$`));
    const events = await disabledEvents(org.id);
    expect(events).toHaveLength(1);
    expect(JSON.parse(events[0]!.payload)).toMatchObject({
      type: 'endpoint.disabled',
      data: { endpoint: { id: endpoint.id, enabled: false, disabled_reason: disabled.disabledReason }, reason: disabled.disabledReason },
    });
    expect(await disableAudits(org.id, endpoint.id)).toHaveLength(1);
  });

  it('when an operator disables an endpoint, an endpoint.disabled event is recorded; disabling it again records nothing new', async () => {
    const org = await ctx.createOrg();
    const endpoint = await addEndpoint(org.id, 'up');
    const first = await service().disableEndpoint(endpoint.id, {
      reason: 'receiver retired',
      actor: { type: 'operator', id: 'ops@example.test' },
    });
    expect(first).toMatchObject({ enabled: false, disabled_reason: 'receiver retired' });

    const again = await service().disableEndpoint(endpoint.id, { reason: 'another reason' });
    expect(again).toEqual(first);
    const events = await disabledEvents(org.id);
    expect(events).toHaveLength(1);
    expect(JSON.parse(events[0]!.payload)).toMatchObject({ data: { endpoint: first, reason: 'receiver retired' } });
    const audits = await disableAudits(org.id, endpoint.id);
    expect(audits.map((row) => [row.actorType, row.actorId])).toEqual([['operator', 'ops@example.test']]);
  });

  it('when failing_since was cleared after the worker saw it, the disable asked for does nothing', async () => {
    // A success settled by another worker between this worker's claim and its failed attempt.
    const org = await ctx.createOrg();
    const endpoint = await addEndpoint(org.id, 'down');
    const disabler = createEndpointDisabler();
    const request = {
      orgId: org.id,
      endpointId: endpoint.id,
      reason: 'failing too long',
      failingForMs: 3 * DAY,
      actor: { type: 'system' as const, id: 'w' },
    };

    const cleared = await ctx.database.transaction((tx) => disabler.disable(request, tx));
    expect(cleared).toMatchObject({ disabled: false, endpoint: { enabled: true } });
    await setFailingSince(org.id, endpoint.id, 3 * DAY - MINUTE);
    expect(await ctx.database.transaction((tx) => disabler.disable(request, tx))).toMatchObject({ disabled: false });
    await setFailingSince(org.id, endpoint.id, 3 * DAY + MINUTE);
    expect(await ctx.database.transaction((tx) => disabler.disable(request, tx))).toMatchObject({
      disabled: true,
      endpoint: { enabled: false },
    });
    expect(await disabledEvents(org.id)).toHaveLength(1);
  });

  it('when WEBHOOK_DISABLE_AFTER_HOURS is 1, the background worker disables an endpoint failing for just over an hour', async () => {
    const org = await ctx.createOrg();
    const endpoint = await addEndpoint(org.id, 'down');
    await setFailingSince(org.id, endpoint.id, HOUR + MINUTE);
    const { webhookDisableAfterHours } = loadConfig({ WEBHOOK_DISABLE_AFTER_HOURS: '1' });
    const jobs = await startBackgroundJobs({
      config: { ...ctx.config, webhookAllowPrivateUrls: true, webhookDisableAfterHours },
      database: ctx.database,
      logger: pino({ level: 'silent' }),
      webhookWorker: true,
    });
    try {
      await emit(org.id);
      const disabled = await untilDisabled(org.id, endpoint.id);
      expect(disabled.disabledReason).toMatch(/\(more than 1 hour\); the last: HTTP 500$/);
    } finally {
      await jobs.stop();
    }
  });
});

describe('failing_since bookkeeping in the batched settlement', () => {
  const deliveries = () => createDeliveryRepository();
  const WORKER = 'bookkeeping-worker';

  /** Claims this organisation's due deliveries by hand; anything else claimed is handed back untouched. */
  async function claimOwn(orgId: string, count: number): Promise<ClaimedDelivery[]> {
    const claimed = await deliveries().claim(WORKER, 1000, 60_000, ctx.database.db);
    const others = claimed.filter((claim) => claim.orgId !== orgId);
    await deliveries().settleMany(
      others.map((claim) => ({ claim, settlement: { status: 'released' as const, attempt: null } })),
      WORKER,
      ctx.database.db,
    );
    const own = claimed.filter((claim) => claim.orgId === orgId);
    expect(own).toHaveLength(count);
    return own;
  }

  const at = (startedAt: Date, statusCode: number | null): AttemptRecord => ({
    statusCode,
    latencyMs: 5,
    error: statusCode !== null && statusCode < 300 ? null : `HTTP ${statusCode}`,
    startedAt,
  });

  it('when one batch holds a failure and then a success of one endpoint, failing_since is cleared; a success and then a failure start it at the failure', async () => {
    const org = await ctx.createOrg();
    const endpoint = await addEndpoint(org.id, 'up');
    await emit(org.id);
    await emit(org.id);
    const t0 = new Date(Date.now() - 2_000);
    const t1 = new Date(t0.getTime() + 1_000);

    const [a, b] = await claimOwn(org.id, 2);
    await deliveries().settleMany(
      [
        { claim: a!, settlement: { status: 'retry', attempt: at(t0, 500), delayMs: 0 } },
        { claim: b!, settlement: { status: 'succeeded', attempt: at(t1, 200) } },
      ],
      WORKER,
      ctx.database.db,
    );
    expect((await endpointRow(org.id, endpoint.id)).failingSince).toBeNull();

    const [c] = await claimOwn(org.id, 1);
    await emit(org.id);
    const [d] = await claimOwn(org.id, 1);
    await deliveries().settleMany(
      [
        { claim: c!, settlement: { status: 'retry', attempt: at(t1, 503), delayMs: 0 } },
        { claim: d!, settlement: { status: 'succeeded', attempt: at(t0, 200) } },
      ],
      WORKER,
      ctx.database.db,
    );
    expect((await endpointRow(org.id, endpoint.id)).failingSince).toEqual(t1);
  });

  it('when an interrupted attempt is handed back, failing_since is not set', async () => {
    const org = await ctx.createOrg();
    const endpoint = await addEndpoint(org.id, 'up');
    await emit(org.id);
    const [claim] = await claimOwn(org.id, 1);
    await deliveries().settle(
      claim!,
      WORKER,
      {
        status: 'released',
        attempt: { ...at(new Date(), null), error: 'interrupted: the worker is stopping' },
      },
      ctx.database.db,
    );
    expect((await endpointRow(org.id, endpoint.id)).failingSince).toBeNull();
  });

  it('when an attempt fails after its endpoint was disabled, failing_since stays clear', async () => {
    const org = await ctx.createOrg();
    const endpoint = await addEndpoint(org.id, 'up');
    await emit(org.id);
    const [claim] = await claimOwn(org.id, 1);
    await service().disableEndpoint(endpoint.id, { reason: 'receiver retired' });
    expect(await deliveries().settle(claim!, WORKER, { status: 'retry', attempt: at(new Date(), 500), delayMs: 0 }, ctx.database.db)).toBe(
      true,
    );
    expect(await endpointRow(org.id, endpoint.id)).toMatchObject({ enabled: false, failingSince: null });
  });
});
