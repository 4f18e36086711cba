import { afterAll, beforeAll, expect, it } from 'vitest';
import { createDatabase, type Database } from '../../src/db/client.js';
import { createServer, type Server } from 'node:http';
import { createTestDatabase } from '../helpers/database.js';
import { ALL_SCOPES, testServices } from '../helpers/harness.js';
import { call, startServerProcess } from './processes.js';

let database: Database;
let drop: () => Promise<void>;
let url: string;

beforeAll(async () => {
  const testDatabase = await createTestDatabase();
  drop = testDatabase.drop;
  url = testDatabase.url;
  database = createDatabase(url);
});

afterAll(async () => {
  await database?.close();
  await drop?.();
});

it('when an instance is killed with SIGKILL during a write load, every committed record has its audit and outbox rows and nothing is half-written', async () => {
  const org = await testServices(database).organisations.create({ name: 'Crash', credits: 0 });
  const { key } = await testServices(database).apiKeys.create({ orgId: org.id, scopes: ALL_SCOPES });
  // A receiver that only counts distinct event ids; no worker runs before the crash.
  const received = new Set<string>();
  const receiver: Server = createServer((request, response) => {
    received.add(String(request.headers['webhook-id']));
    request.resume();
    request.on('end', () => response.writeHead(204).end());
  });
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  const receiverPort = (receiver.address() as { port: number }).port;
  await testServices(database, { config: { webhookAllowPrivateUrls: true } }).webhooks.addEndpoint({
    orgId: org.id,
    url: `http://127.0.0.1:${receiverPort}/hooks`,
  });
  const server = await startServerProcess({ DATABASE_URL: url, WEBHOOK_WORKER: 'off' });

  // Every record exists before the load, so each write during it is an update that emits an event.
  for (let index = 0; index < 50; index += 1) {
    await call(server, 'POST', '/v1/customers', {
      key,
      body: { externalId: `crash-${index}`, fullName: `Crash ${index}`, email: `crash${index}@test.dev` },
    });
  }
  let sent = 0;
  let stop = false;
  const acknowledged = new Set<string>();
  const writers = Array.from({ length: 20 }, async (_, worker) => {
    while (!stop) {
      const index = sent++;
      const externalId = `crash-${index % 50}`;
      try {
        const response = await call(server, 'POST', '/v1/customers', {
          key,
          body: { externalId, fullName: `Crash ${index % 50}`, email: `crash${index % 50}@test.dev`, phone: `${worker}-${index}` },
        });
        if (response.status === 200 || response.status === 201) acknowledged.add(externalId);
      } catch {
        // the connection died with the process
      }
    }
  });
  await new Promise((resolve) => setTimeout(resolve, 1500));
  await server.crash();
  stop = true;
  await Promise.all(writers);
  expect(sent).toBeGreaterThan(20);

  // Everything the server acknowledged is there.
  const { rows: stored } = await database.pool.query(`SELECT id, external_id, added_via FROM customers WHERE org_id = $1`, [org.id]);
  const storedIds = new Set(stored.map((row) => row.external_id));
  for (const externalId of acknowledged) expect(storedIds.has(externalId)).toBe(true);

  // Every record has its create audit row, and every later change its audit row and event.
  const { rows: creates } = await database.pool.query(
    `SELECT count(DISTINCT subject_id)::int AS count FROM audit_log WHERE org_id = $1 AND action = 'customer.created'`,
    [org.id],
  );
  expect(creates[0].count).toBe(stored.length);
  const { rows: updates } = await database.pool.query(
    `SELECT (SELECT count(*)::int FROM audit_log WHERE org_id = $1 AND action = 'customer.upserted') AS audits,
            (SELECT count(*)::int FROM outbox_events WHERE org_id = $1 AND type = 'customer.updated') AS events`,
    [org.id],
  );
  expect(updates[0].events).toBe(updates[0].audits);
  // No record whose last audit image disagrees with the row itself.
  const { rows: drift } = await database.pool.query(
    `SELECT c.id FROM customers c
      JOIN LATERAL (SELECT after FROM audit_log a WHERE a.org_id = c.org_id AND a.subject_id = c.id ORDER BY a.created_at DESC, a.id DESC LIMIT 1) last ON true
     WHERE c.org_id = $1 AND (last.after->>'phone' IS DISTINCT FROM c.phone OR last.after->>'name' IS DISTINCT FROM c.name)`,
    [org.id],
  );
  expect(drift).toEqual([]);

  // A restarted instance (with its delivery worker) serves the same data and delivers every event
  // that was committed before the crash.
  const restarted = await startServerProcess({ DATABASE_URL: url, WEBHOOK_WORKER: 'on', WEBHOOK_ALLOW_PRIVATE_URLS: 'true' });
  try {
    const list = await call(restarted, 'GET', '/v1/customers?include=total_count&limit=1', { key });
    expect(JSON.parse(list.body).total_count).toBe(stored.length);
    const { rows: committedEvents } = await database.pool.query(`SELECT id FROM outbox_events WHERE org_id = $1`, [org.id]);
    expect(committedEvents.length).toBeGreaterThan(0);
    const deadline = Date.now() + 60_000;
    while (received.size < committedEvents.length && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 200));
    expect([...received].sort()).toEqual(committedEvents.map((row) => row.id).sort());
    process.stderr.write(
      `crash: ${sent} writes sent, ${acknowledged.size} external ids acknowledged before SIGKILL, ${stored.length} records stored, ` +
        `${committedEvents.length} committed events, ${received.size} delivered after restart\n`,
    );
  } finally {
    await restarted.stop();
    await new Promise<void>((resolve) => receiver.close(() => resolve()));
  }
});
