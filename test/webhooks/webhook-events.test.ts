import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createDeliveryWorker, type DeliveryWorker } from '../../src/modules/webhooks/delivery.worker.js';
import { createTestContext, type TestContext, type TestOrg, testServices } from '../helpers/harness.js';
import { startReceiver, waitFor, type Receiver } from '../helpers/webhook-receiver.js';

/**
 * From a change to the receiver: the change goes through the API or the back office (as the
 * operator CLI drives it), the outbox row commits with it, a worker delivers it, and the signed
 * payload carries what GET shows.
 */
let ctx: TestContext;
let receiver: Receiver;
let worker: DeliveryWorker;
beforeAll(async () => {
  ctx = await createTestContext();
  receiver = await startReceiver();
  worker = createDeliveryWorker({ database: ctx.database, allowPrivateUrls: true, pollIntervalMs: 100, requestTimeoutMs: 5_000 });
  await worker.start();
});
afterAll(async () => {
  await worker?.stop();
  await receiver?.close();
  await ctx?.close();
});

const operator = { type: 'operator' as const, id: 'cli:test' };
type Event = { id: string; type: string; created: string; data: { customer: Record<string, unknown> | null } };

let pathCounter = 0;
async function orgWithEndpoint(): Promise<{ org: TestOrg; path: string }> {
  const org = await ctx.createOrg();
  const path = `/events-${(pathCounter += 1)}`;
  const endpoint = await testServices(ctx.database, { config: { webhookAllowPrivateUrls: true } }).webhooks.addEndpoint({
    orgId: org.id,
    url: receiver.url(path),
  });
  receiver.trust(path, endpoint.secret);
  return { org, path };
}

/** The events received on `path`, each verified with the endpoint's secret. */
function eventsAt(path: string): Event[] {
  return receiver.receipts
    .filter((receipt) => receipt.path === path)
    .map((receipt) => {
      expect(receipt.verifyError).toBeNull();
      expect(receipt.headers['svc-event-id']).toBe(receipt.webhookId);
      const event = JSON.parse(receipt.body) as Event;
      expect(event.id).toBe(receipt.webhookId);
      return event;
    });
}

async function createPerson(org: TestOrg, externalId: string) {
  const response = await ctx.request('POST', '/v1/customers', {
    key: org.key,
    body: { externalId, fullName: 'Noor Haddad', email: `${externalId}@example.com` },
  });
  expect(response.statusCode, response.body).toBe(201);
  return response.json<{ id: string }>();
}

const getCustomer = async (org: TestOrg, id: string) =>
  (await ctx.request('GET', `/v1/customers/${id}`, { key: org.key })).json<Record<string, unknown>>();

describe('events from changes to the receiver', () => {
  it('when the integration changes a customer through the API, the endpoint receives one signed customer.updated whose data.customer equals GET', async () => {
    const { org, path } = await orgWithEndpoint();
    const person = await createPerson(org, 'evt-api');
    const patched = await ctx.request('PATCH', `/v1/customers/${person.id}`, { key: org.key, body: { fullName: 'Noor H. Haddad' } });
    expect(patched.statusCode, patched.body).toBe(200);
    // A repeat of the same values is a no-op: no second event.
    expect(
      (await ctx.request('PATCH', `/v1/customers/${person.id}`, { key: org.key, body: { fullName: 'Noor H. Haddad' } })).statusCode,
    ).toBe(200);

    await waitFor(() => eventsAt(path).length === 1, 20_000, 'the customer.updated delivery');
    await new Promise((resolve) => setTimeout(resolve, 300));
    const events = eventsAt(path);
    expect(events.map((event) => event.type)).toEqual(['customer.updated']);
    expect(events[0]!.created).toMatch(/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$/);
    expect(events[0]!.data.customer).toEqual(await getCustomer(org, person.id));
  });

  it('when the back office screens and resolves an integration record, the endpoint receives customer.updated for each change and aml.review_completed', async () => {
    const { org, path } = await orgWithEndpoint();
    const person = await createPerson(org, 'evt-back-office');
    const backOffice = testServices(ctx.database).backOffice;
    await backOffice.setAml(org.id, person.id, { status: 'NEEDS_REVIEW', pep: true }, operator);
    await backOffice.resolveAml(org.id, person.id, operator);

    await waitFor(() => eventsAt(path).length === 3, 20_000, 'three deliveries');
    const amlStatus = (event: Event) => (event.data.customer!.aml as { status: string }).status;
    const events = eventsAt(path);
    expect(events.map((event) => `${event.type} ${amlStatus(event)}`).sort()).toEqual([
      'aml.review_completed RESOLVED',
      'customer.updated NEEDS_REVIEW',
      'customer.updated RESOLVED',
    ]);
    // Both events of the resolving change carry the record as GET shows it now.
    const current = await getCustomer(org, person.id);
    expect(events.filter((event) => amlStatus(event) === 'RESOLVED').map((event) => event.data.customer)).toEqual([current, current]);
  });

  it('when the back office changes a record the integration did not add, aml.review_completed still fires but customer.updated never does', async () => {
    const { org, path } = await orgWithEndpoint();
    const person = await createPerson(org, 'evt-not-integration');
    await ctx.database.pool.query(`UPDATE customers SET added_via = 'ADMIN_MANUAL' WHERE id = $1`, [person.id]);
    const backOffice = testServices(ctx.database).backOffice;
    await backOffice.setAml(org.id, person.id, { status: 'NEEDS_REVIEW' }, operator);
    await backOffice.resolveAml(org.id, person.id, operator);

    await waitFor(() => eventsAt(path).length === 1, 20_000, 'the aml.review_completed delivery');
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(eventsAt(path).map((event) => event.type)).toEqual(['aml.review_completed']);
  });
});
