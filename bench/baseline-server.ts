/**
 * The bare baseline: Fastify + pg doing the same SQL as the project's hot paths, written as a careful
 * engineer would write a minimal server: every statement a named prepared statement (pg's documented
 * query config `{ name, text, values }`, parsed and planned once per connection), a pool of 10 (the
 * project's default DATABASE_POOL_SIZE). No auth, validation, rate limits, idempotency, audit or
 * logging.
 *
 * The harness compiles this file to plain JavaScript and runs it with `node` (harness.ts,
 * `buildBaseline`); `node --import tsx bench/baseline-server.ts` runs it too.
 */
import { randomUUID } from 'node:crypto';
import Fastify from 'fastify';
import pg from 'pg';

const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: 10 });
const orgId = process.env.BENCH_ORG_ID!;
const app = Fastify({ logger: false });

type Body = { externalId: string; fullName: string; email: string; phone: string };

app.get('/healthz', async () => ({ status: 'ok' }));

const CUSTOMER_BY_ID = 'SELECT * FROM customers WHERE org_id = $1 AND id = $2';

app.get('/customers/:id', async (request, reply) => {
  const { id } = request.params as { id: string };
  const { rows } = await pool.query({ name: 'customer_by_id', text: CUSTOMER_BY_ID, values: [orgId, id] });
  if (rows.length === 0) return reply.code(404).send({});
  return rows[0];
});

const UPSERT = `
  INSERT INTO customers (org_id, kind, external_id, type, name, email, phone, kyc_status, added_via)
  VALUES ($1, 'individual', $2, 'INDIVIDUAL', $3, $4, $5, 'NOT_REQUIRED', 'INTEGRATION')
  ON CONFLICT (org_id, external_id) WHERE external_id IS NOT NULL
  DO UPDATE SET name = EXCLUDED.name, email = EXCLUDED.email, phone = EXCLUDED.phone
  RETURNING *`;

app.post('/customers', async (request) => {
  const body = request.body as Body;
  const { rows } = await pool.query({
    name: 'customer_upsert',
    text: UPSERT,
    values: [orgId, body.externalId, body.fullName, body.email, body.phone],
  });
  return rows[0];
});

/*
 * Not a baseline the targets refer to: a diagnostic that separates the SQL an audited,
 * evented upsert must run from the server around it. The write set the spec requires of a change,
 * bare, written the plain way: one transaction, one named prepared statement per round trip —
 * BEGIN, the locking read, the UPDATE, the audit row, the `customer.updated` event (with its
 * delivery fan-out and NOTIFY), COMMIT. No auth, validation, merge rules, DTOs or logging. It is not
 * the project's own statement text (that belongs to src/ and changes with it): it is the same work.
 */
const LOCK = 'SELECT * FROM customers WHERE org_id = $1 AND external_id = $2 FOR UPDATE';
const UPDATE = 'UPDATE customers SET name = $3, email = $4, phone = $5 WHERE org_id = $1 AND id = $2 RETURNING updated_at';
const AUDIT = `
  INSERT INTO audit_log (org_id, actor_type, actor_id, action, subject_type, subject_id, before, after)
  VALUES ($1, 'api_key', NULL, 'customer.upserted', 'customer', $2, $3, $4)`;
const EVENT = `
  WITH event AS (
    INSERT INTO outbox_events (id, org_id, type, customer_id, payload, created_at)
    VALUES ($1, $2, 'customer.updated', $3, $4, $5)
    RETURNING id, org_id, type
  ),
  queued AS (
    INSERT INTO webhook_deliveries (org_id, event_id, endpoint_id)
    SELECT event.org_id, event.id, endpoint.id
      FROM event JOIN webhook_endpoints endpoint
        ON endpoint.org_id = event.org_id AND endpoint.enabled
       AND (cardinality(endpoint.event_types) = 0 OR event.type = ANY (endpoint.event_types))
    RETURNING 1
  )
  SELECT pg_notify('webhook_deliveries', $2::text) FROM (SELECT 1 FROM queued LIMIT 1) AS anything_queued`;

app.post('/customers/same-statements', async (request, reply) => {
  const body = request.body as Body;
  const client = await pool.connect();
  let failure: Error | undefined;
  try {
    await client.query('BEGIN');
    const locked = await client.query({ name: 'lock', text: LOCK, values: [orgId, body.externalId] });
    const before = locked.rows[0];
    if (!before) {
      await client.query('ROLLBACK');
      return reply.code(404).send({});
    }
    const { created_at: _created, updated_at: _updated, org_id: _org, ...snapshot } = before;
    const after = { ...snapshot, name: body.fullName, email: body.email, phone: body.phone };
    const updated = await client.query({ name: 'update', text: UPDATE, values: [orgId, before.id, body.fullName, body.email, body.phone] });
    const updatedAt = updated.rows[0].updated_at as Date;
    await client.query({ name: 'audit', text: AUDIT, values: [orgId, before.id, JSON.stringify(snapshot), JSON.stringify(after)] });
    const id = randomUUID();
    const created = new Date().toISOString();
    const payload = JSON.stringify({
      id,
      type: 'customer.updated',
      created,
      data: { customer: { ...after, updated_at: updatedAt.toISOString() } },
    });
    await client.query({ name: 'event', text: EVENT, values: [id, orgId, before.id, payload, created] });
    await client.query('COMMIT');
    return { ...after, updated_at: updatedAt };
  } catch (error) {
    failure = error as Error;
    await client.query('ROLLBACK').catch(() => {});
    throw error;
  } finally {
    // A connection that failed mid-transaction is discarded rather than reused.
    client.release(failure);
  }
});

const UPDATED_SINCE = `
  SELECT * FROM customers WHERE org_id = $1 AND kind = 'individual' AND updated_at > $2
  ORDER BY created_at, id LIMIT $3`;

app.get('/customers', async (request) => {
  const query = request.query as { updated_since: string; limit?: string };
  const limit = Number(query.limit ?? 50);
  const { rows } = await pool.query({
    name: 'customers_updated_since',
    text: UPDATED_SINCE,
    values: [orgId, query.updated_since, limit + 1],
  });
  return { object: 'list', data: rows.slice(0, limit), has_more: rows.length > limit };
});

await app.listen({ port: Number(process.env.PORT), host: '127.0.0.1' });
