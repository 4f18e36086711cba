import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isDeepStrictEqual } from 'node:util';
import { createDatabase, type Database } from '../../src/db/client.js';
import { createTestDatabase } from '../helpers/database.js';
import { ALL_SCOPES, testServices } from '../helpers/harness.js';
import { call, pool, startServerProcess, type ServerProcess } from './processes.js';

let database: Database;
let drop: () => Promise<void>;
let servers: ServerProcess[] = [];
let orgId: string;
let key: string;

beforeAll(async () => {
  const testDatabase = await createTestDatabase();
  drop = testDatabase.drop;
  database = createDatabase(testDatabase.url);
  // Three instances behind an imaginary load balancer, started at once on one database.
  servers = await Promise.all([0, 1, 2].map(() => startServerProcess({ DATABASE_URL: testDatabase.url })));
  const org = await testServices(database).organisations.create({ name: 'Multi', credits: 0 });
  orgId = org.id;
  key = (await testServices(database).apiKeys.create({ orgId, scopes: ALL_SCOPES })).key;
});

afterAll(async () => {
  await Promise.all(servers.map((server) => server.stop()));
  await database?.close();
  await drop?.();
});

describe('three instances on one database', () => {
  it('when 5,000 concurrent upserts over 500 external ids hit three instances, it leaves exactly 500 records with a consistent audit trail each', async () => {
    const responses = await pool(5000, 60, (index) =>
      call(servers[index % 3]!, 'POST', '/v1/customers', {
        key,
        body: {
          externalId: `multi-${index % 500}`,
          fullName: `Person ${index % 500}`,
          email: `person${index % 500}@multi.test`,
          phone: String(index % 7),
        },
      }),
    );
    const statuses = new Map<number, number>();
    for (const response of responses) statuses.set(response.status, (statuses.get(response.status) ?? 0) + 1);
    const unexpected = responses.filter((response) => response.status !== 200 && response.status !== 201);
    expect(
      unexpected.slice(0, 3).map((response) => `${response.status} ${response.body}`),
      JSON.stringify(Object.fromEntries(statuses)),
    ).toEqual([]);
    expect(statuses.get(201)).toBe(500);

    const { rows: counts } = await database.pool.query(`SELECT count(*)::int AS count FROM customers WHERE org_id = $1`, [orgId]);
    expect(counts[0].count).toBe(500);

    // Every record's audit rows form a chain: a create, then each change starting where the last ended.
    const { rows: audit } = await database.pool.query(
      `SELECT subject_id, action, before, after FROM audit_log WHERE org_id = $1 AND subject_type = 'customer' ORDER BY created_at, id`,
      [orgId],
    );
    const bySubject = new Map<string, Array<{ action: string; before: unknown; after: unknown }>>();
    for (const row of audit) bySubject.set(row.subject_id, [...(bySubject.get(row.subject_id) ?? []), row]);
    expect(bySubject.size).toBe(500);
    for (const trail of bySubject.values()) {
      expect(trail[0]!.action).toBe('customer.created');
      expect(trail[0]!.before).toBeNull();
      for (let i = 1; i < trail.length; i += 1) expect(isDeepStrictEqual(trail[i]!.before, trail[i - 1]!.after)).toBe(true);
    }
    // Each update of an integration record has its customer.updated event, and only those.
    const { rows: events } = await database.pool.query(
      `SELECT count(*)::int AS count FROM outbox_events WHERE org_id = $1 AND type = 'customer.updated'`,
      [orgId],
    );
    expect(events[0].count).toBe(audit.length - 500);
    process.stderr.write(
      `multi-instance: 5000 upserts over 3 instances -> ${JSON.stringify(Object.fromEntries(statuses))} statuses, ${counts[0].count} records, ${audit.length} audit rows, ${events[0].count} customer.updated events\n`,
    );
  });

  it('when one Idempotency-Key reaches all three instances at once, it causes one side effect and one replayed response everywhere', async () => {
    const body = { externalId: 'idem-multi', fullName: 'Idem Person', email: 'idem@multi.test' };
    const responses = await Promise.all(
      Array.from({ length: 15 }, (_, index) =>
        call(servers[index % 3]!, 'POST', '/v1/customers', { key, body, headers: { 'idempotency-key': 'multi-key-1' } }),
      ),
    );
    expect(new Set(responses.map((response) => `${response.status} ${response.body}`)).size).toBe(1);
    expect(responses[0]!.status).toBe(201);
    expect(responses.filter((response) => response.headers.get('idempotent-replayed') === 'true')).toHaveLength(14);
    const { rows } = await database.pool.query(
      `SELECT count(*)::int AS count FROM audit_log WHERE org_id = $1 AND action = 'customer.created' AND after->>'externalId' = 'idem-multi'`,
      [orgId],
    );
    expect(rows[0].count).toBe(1);
  });

  it('when a key is revoked, the very next request on every instance is 401', async () => {
    const revocable = await testServices(database).apiKeys.create({ orgId, scopes: ALL_SCOPES });
    for (const server of servers) expect((await call(server, 'GET', '/v1/customers?limit=1', { key: revocable.key })).status).toBe(200);
    await testServices(database).apiKeys.revoke(revocable.id);
    for (const server of servers) expect((await call(server, 'GET', '/v1/customers?limit=1', { key: revocable.key })).status).toBe(401);
  });

  it('when requests of one key are spread over three instances, the daily limit holds across them', async () => {
    const limited = await testServices(database).apiKeys.create({ orgId, scopes: ALL_SCOPES, dailyLimit: 20 });
    const responses = await Promise.all(
      Array.from({ length: 60 }, (_, index) => call(servers[index % 3]!, 'GET', '/v1/designated-services', { key: limited.key })),
    );
    expect(responses.filter((response) => response.status === 200)).toHaveLength(20);
    const rejected = responses.filter((response) => response.status === 429);
    expect(rejected).toHaveLength(40);
    expect(JSON.parse(rejected[0]!.body).error).toMatchObject({ code: 'rate_limited', details: { limit: 20, window_seconds: 86400 } });
  });
});
