import { readdirSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { FastifyInstance } from 'fastify';
import pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { buildApp } from '../../src/app.js';
import { createDatabase, type Database, type Tx } from '../../src/db/client.js';
import {
  createDeliveryWorker,
  DELIVERY_CHANNEL,
  type DeliveryWorker,
  type DeliveryWorkerOptions,
} from '../../src/modules/webhooks/delivery.worker.js';
import { createOutboxRepository } from '../../src/shared/outbox.js';
import { createTestContext, type TestContext, testServices } from '../helpers/harness.js';
import { collectingLoggerOptions } from '../helpers/log-collector.js';
import { startReceiver, waitFor, type Receiver } from '../helpers/webhook-receiver.js';

// No NOTIFY in the commit path of API writes, and none anywhere else: a process's workers are woken
// in-process after its commits, and every worker's poll alone guarantees delivery (what another
// process committed is found by the poll).

const SOURCE_ROOT = join(fileURLToPath(new URL('.', import.meta.url)), '..', '..', 'src');

let ctx: TestContext;
let receiver: Receiver;
const workers: DeliveryWorker[] = [];
const closers: Array<() => Promise<void>> = [];

beforeAll(async () => {
  ctx = await createTestContext();
  receiver = await startReceiver();
});
afterEach(async () => {
  await Promise.all(workers.splice(0).map((worker) => worker.stop()));
  for (const close of closers.splice(0).reverse()) await close();
});
afterAll(async () => {
  await receiver?.close();
  await ctx?.close();
});

let pathCounter = 0;
async function orgWithEndpoint() {
  const org = await ctx.createOrg();
  const path = `/wake-${(pathCounter += 1)}`;
  const endpoint = await testServices(ctx.database, { config: { webhookAllowPrivateUrls: true } }).webhooks.addEndpoint({
    orgId: org.id,
    url: receiver.url(path),
  });
  receiver.trust(path, endpoint.secret);
  return { org, path };
}

/** A Database of its own, as another process would have (closed after the test). */
function ownDatabase(options: Parameters<typeof createDatabase>[1] = {}): Database {
  const database = createDatabase(ctx.databaseUrl, { poolSize: 4, ...options });
  closers.push(() => database.close());
  return database;
}

async function ownApp(database: Database): Promise<FastifyInstance> {
  const app = await buildApp({ config: ctx.config, database, logger: collectingLoggerOptions(), validateResponses: true });
  await app.ready();
  closers.push(() => app.close());
  return app;
}

type Heard = { at: number; payload: string | undefined; deliveriesVisible: number };

/** A LISTEN of the test's own on the delivery channel; on each notification it counts the deliveries another connection can see. */
async function listenForWakes(orgId: string): Promise<Heard[]> {
  const heard: Heard[] = [];
  const listener = new pg.Client({ connectionString: ctx.databaseUrl });
  const reader = new pg.Client({ connectionString: ctx.databaseUrl });
  await Promise.all([listener.connect(), reader.connect()]);
  listener.on('notification', (message) => {
    const at = Date.now();
    const entry: Heard = { at, payload: message.payload, deliveriesVisible: -1 };
    heard.push(entry);
    void reader
      .query<{ count: number }>('SELECT count(*)::int AS count FROM webhook_deliveries WHERE org_id = $1', [orgId])
      .then((result) => (entry.deliveriesVisible = result.rows[0]!.count))
      .catch(() => {}); // the test may have ended and closed the reader
  });
  await listener.query(`LISTEN ${DELIVERY_CHANNEL}`);
  closers.push(async () => {
    await listener.end();
    await reader.end();
  });
  return heard;
}

async function startWorker(database: Database, overrides: Partial<DeliveryWorkerOptions>) {
  const worker = createDeliveryWorker({ database, allowPrivateUrls: true, requestTimeoutMs: 2_000, stopTimeoutMs: 2_000, ...overrides });
  workers.push(worker);
  await worker.start();
  return worker;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Source text without comments, so that prose about NOTIFY is not taken for SQL. */
function codeOf(file: string): string {
  return readFileSync(file, 'utf8')
    .replace(/\/\*[\s\S]*?\*\//g, '')
    .replace(/^\s*\/\/.*$/gm, '');
}

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return sourceFiles(path);
    return entry.name.endsWith('.ts') && !entry.name.endsWith('.test.ts') ? [path] : [];
  });
}

describe('workers woken after commit', () => {
  it('when any module runs SQL, none sends a NOTIFY or LISTENs', () => {
    const notifying = sourceFiles(SOURCE_ROOT)
      .filter((file) => /pg_notify|(?<![.\w])(notify|listen)\s+["\w$]/i.test(codeOf(file)))
      .map((file) => relative(SOURCE_ROOT, file));
    expect(notifying).toEqual([]);
  });

  it('when twenty upserts that queue deliveries commit, this process is woken after each commit and PostgreSQL hears no NOTIFY', async () => {
    const { org } = await orgWithEndpoint();
    const heard = await listenForWakes(org.id);
    const database = ownDatabase();
    let wokenHere = 0;
    const unsubscribe = database.onWake(DELIVERY_CHANNEL, () => (wokenHere += 1));
    closers.push(async () => unsubscribe());
    const app = await ownApp(database);
    const upsert = (phone: string) =>
      app.inject({
        method: 'POST',
        url: '/v1/customers',
        headers: { authorization: `Bearer ${org.key}` },
        payload: { externalId: 'wake-1', fullName: 'Wake Person', email: 'wake@example.test', phone },
      });
    expect((await upsert('+441000000000')).statusCode).toBe(201); // a creation fires no customer.updated
    for (let n = 1; n <= 20; n += 1) expect((await upsert(`+44100000${String(n).padStart(4, '0')}`)).statusCode).toBe(200);
    await sleep(300);

    const { rows } = await ctx.database.pool.query<{ count: number }>(
      'SELECT count(*)::int AS count FROM webhook_deliveries WHERE org_id = $1',
      [org.id],
    );
    expect(rows[0]!.count).toBe(20);
    expect({ wokenHere, heard: heard.length }).toEqual({ wokenHere: 20, heard: 0 });
  });

  it('when a write that queued a delivery rolls back, nobody is woken; when the same write commits, this process is woken once', async () => {
    const { org } = await orgWithEndpoint();
    const heard = await listenForWakes(org.id);
    const database = ownDatabase();
    let wokenHere = 0;
    const unsubscribe = database.onWake(DELIVERY_CHANNEL, () => (wokenHere += 1));
    closers.push(async () => unsubscribe());
    const outbox = createOutboxRepository();
    const record = (tx: Tx) => outbox.record({ orgId: org.id, type: 'customer.updated', customerId: null, customer: { n: 1 } }, tx);
    const write = () => database.transaction(record);

    await expect(
      database.transaction(async (tx) => {
        await record(tx);
        expect(wokenHere).toBe(0); // not before the commit either
        throw new Error('the change failed');
      }),
    ).rejects.toThrow('the change failed');
    await sleep(300);
    expect({ wokenHere, heard: heard.length }).toEqual({ wokenHere: 0, heard: 0 });

    await write();
    expect(wokenHere).toBe(1);
    await sleep(300);
    expect(heard).toHaveLength(0);
  });

  it("when work is committed with no wake at all, the worker's poll still delivers it", async () => {
    const { org, path } = await orgWithEndpoint();
    const database = ownDatabase();
    await startWorker(database, { pollIntervalMs: 200 });
    // Written by hand, as by a process that died between its commit and its wake.
    const writer = new pg.Client({ connectionString: ctx.databaseUrl });
    await writer.connect();
    closers.push(() => writer.end());
    const eventId = crypto.randomUUID();
    await writer.query('BEGIN');
    await writer.query(
      `INSERT INTO outbox_events (id, org_id, type, customer_id, payload, created_at) VALUES ($1, $2, 'customer.updated', NULL, $3, now())`,
      [
        eventId,
        org.id,
        JSON.stringify({ id: eventId, type: 'customer.updated', created: new Date().toISOString(), data: { customer: null } }),
      ],
    );
    await writer.query(
      `INSERT INTO webhook_deliveries (org_id, event_id, endpoint_id) SELECT $1, $2, id FROM webhook_endpoints WHERE org_id = $1`,
      [org.id, eventId],
    );
    await writer.query('COMMIT');

    await waitFor(
      () => receiver.receipts.some((receipt) => receipt.path === path && receipt.webhookId === eventId),
      10_000,
      'the polled delivery',
    );
  });

  it('when this process commits a delivery, its own worker is woken in-process at once, with a poll every ten minutes', async () => {
    const { org, path } = await orgWithEndpoint();
    const database = ownDatabase();
    await startWorker(database, { pollIntervalMs: 600_000 });
    await sleep(200); // past the worker's first (empty) claim
    const eventId = await database.transaction((tx) =>
      createOutboxRepository().record({ orgId: org.id, type: 'customer.updated', customerId: null, customer: { n: 2 } }, tx),
    );
    await waitFor(
      () => receiver.receipts.some((receipt) => receipt.path === path && receipt.webhookId === eventId),
      5_000,
      'the in-process wake',
    );
  });

  it("when another process commits a delivery, the worker's poll finds it, and a worker that never polls again does not", async () => {
    const { org, path } = await orgWithEndpoint();
    const polling = ownDatabase();
    const idle = ownDatabase();
    await startWorker(polling, { pollIntervalMs: 300 });
    await startWorker(idle, { pollIntervalMs: 600_000 });
    await sleep(300); // past both workers' first claims
    await workers.shift()!.stop(); // the polling one: the event below is left to the idle one
    const writer = ownDatabase();
    const record = (n: number) =>
      writer.transaction((tx) =>
        createOutboxRepository().record({ orgId: org.id, type: 'customer.updated', customerId: null, customer: { n } }, tx),
      );
    const unseen = await record(3);
    await sleep(1_000);
    expect(receiver.receipts.some((receipt) => receipt.webhookId === unseen)).toBe(false);

    await startWorker(ownDatabase(), { pollIntervalMs: 300 });
    const seen = await record(4);
    await waitFor(
      () => [unseen, seen].every((id) => receiver.receipts.some((receipt) => receipt.path === path && receipt.webhookId === id)),
      5_000,
      'the polled deliveries',
    );
  });
});
