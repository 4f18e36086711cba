import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sql } from 'drizzle-orm';
import { createDatabase, type Database } from '../../src/db/client.js';
import { createDeliveryWorker } from '../../src/modules/webhooks/delivery.worker.js';
import { createOutboxRepository } from '../../src/shared/outbox.js';
import { createTestContext, type TestContext, testServices } from '../helpers/harness.js';
import { startReceiver, waitFor, type Receiver } from '../helpers/webhook-receiver.js';

const EVENTS = 500;

let ctx: TestContext;
let receiver: Receiver;
const pools: Database[] = [];
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => {
  await receiver?.close();
  for (const pool of pools) await pool.close();
  await ctx?.close();
});

describe('webhook delivery with several workers', () => {
  it('when two workers share one database, 500 events are each delivered exactly once and never twice at the same time', async () => {
    const inFlight = new Set<string>();
    const overlapping: string[] = [];
    receiver = await startReceiver(async (receipt) => {
      if (inFlight.has(receipt.webhookId)) overlapping.push(receipt.webhookId);
      inFlight.add(receipt.webhookId);
      await new Promise((resolve) => setTimeout(resolve, 1 + Math.random() * 4));
      inFlight.delete(receipt.webhookId);
      return {};
    });
    const org = await ctx.createOrg();
    const endpoint = await testServices(ctx.database, { config: { webhookAllowPrivateUrls: true } }).webhooks.addEndpoint({
      orgId: org.id,
      url: receiver.url('/hook'),
    });
    receiver.trust('/hook', endpoint.secret);

    // Two instances: each its own pool and its own LISTEN connection, as two processes would have.
    const workers = Array.from({ length: 2 }, (_, index) => {
      const database = createDatabase(ctx.databaseUrl, { poolSize: 6 });
      pools.push(database);
      return createDeliveryWorker({ database, allowPrivateUrls: true, concurrency: 16, pollIntervalMs: 200, workerId: `worker-${index}` });
    });
    await Promise.all(workers.map((worker) => worker.start()));

    const outbox = createOutboxRepository();
    const emitted = new Set<string>();
    for (let batch = 0; batch < EVENTS / 50; batch += 1) {
      await ctx.database.transaction(async (tx) => {
        for (let index = 0; index < 50; index += 1) {
          emitted.add(
            await outbox.record({ orgId: org.id, type: 'customer.updated', customerId: null, customer: { n: batch * 50 + index } }, tx),
          );
        }
      });
    }

    await waitFor(() => receiver.receipts.length >= EVENTS, 150_000, `${EVENTS} receipts`);
    await Promise.all(workers.map((worker) => worker.stop()));

    const perId = new Map<string, number>();
    for (const receipt of receiver.receipts) perId.set(receipt.webhookId, (perId.get(receipt.webhookId) ?? 0) + 1);
    expect(receiver.receipts).toHaveLength(EVENTS);
    expect(new Set(perId.keys())).toEqual(emitted);
    expect([...perId.values()].every((count) => count === 1)).toBe(true);
    expect(overlapping).toEqual([]);
    expect(receiver.receipts.filter((receipt) => receipt.verifyError !== null)).toEqual([]);

    const [counts] = (
      await ctx.database.db.execute<{ succeeded: number; attempts: number; total_attempts: number }>(sql`
        SELECT count(*) FILTER (WHERE status = 'succeeded')::int AS succeeded,
               sum(attempts)::int AS attempts,
               (SELECT count(*)::int FROM webhook_attempts WHERE org_id = ${org.id}) AS total_attempts
          FROM webhook_deliveries WHERE org_id = ${org.id}
      `)
    ).rows;
    expect(counts).toEqual({ succeeded: EVENTS, attempts: EVENTS, total_attempts: EVENTS });
    const shares = workers.map((worker) => worker.stats().succeeded);
    expect(shares.reduce((sum, share) => sum + share, 0)).toBe(EVENTS);
    expect(shares.every((share) => share > 0)).toBe(true);
  }, 180_000);
});
