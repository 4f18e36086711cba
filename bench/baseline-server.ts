/**
 * The bare baseline: Fastify + pg doing the same SQL as the project's hot paths, with no auth, no
 * validation, no rate limits, no idempotency, no audit and no logging.
 */
import { randomUUID } from 'node:crypto';
import { createRequire } from 'node:module';
import Fastify from 'fastify';
import pg from 'pg';

const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: 10 });
const orgId = process.env.BENCH_ORG_ID!;
const app = Fastify({ logger: false });

app.get('/healthz', async () => ({ status: 'ok' }));

app.get('/customers/:id', async (request, reply) => {
  const { rows } = await pool.query('SELECT * FROM customers WHERE org_id = $1 AND id = $2', [orgId, (request.params as { id: string }).id]);
  if (rows.length === 0) return reply.code(404).send({});
  return rows[0];
});

app.post('/customers', async (request) => {
  const body = request.body as { externalId: string; fullName: string; email: string; phone: string };
  const { rows } = await pool.query(
    `INSERT INTO customers (org_id, kind, external_id, type, name, email, phone, kyc_status, added_via)
     VALUES ($1, 'individual', $2, 'INDIVIDUAL', $3, $4, $5, 'NOT_REQUIRED', 'INTEGRATION')
     ON CONFLICT (org_id, external_id) WHERE external_id IS NOT NULL
     DO UPDATE SET name = EXCLUDED.name, email = EXCLUDED.email, phone = EXCLUDED.phone
     RETURNING *`,
    [orgId, body.externalId, body.fullName, body.email, body.phone],
  );
  return rows[0];
});

/**
 * Not a baseline the targets refer to: a diagnostic that separates the SQL the upsert must run
 * from the server around it. The project's upsert statements for a changed record, bare: one
 * transaction with the locking read, the UPDATE, the audit row and the `customer.updated` event (with
 * its delivery fan-out and NOTIFY), sent as the project sends them on a pipelined connection: BEGIN
 * with the locking read, then the last three and the COMMIT, each group in one write with one Sync.
 * No auth, validation, merge rules, DTOs or logging.
 */
const pipelined = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: 10, pipeline: true });
const ISO = `'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'`;
const EVENT_SQL = `
  WITH event AS (
    INSERT INTO outbox_events (id, org_id, type, customer_id, payload, created_at)
    VALUES ($1, $2, 'customer.updated', $3, replace($4, '"updated_at":"record.updated_at"',
        (SELECT '"updated_at":"' || to_char(updated_at AT TIME ZONE 'UTC', ${ISO}) || '"' FROM customers WHERE id = $3)), $5)
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

type Statement = { name: string; text: string; values: unknown[] };
const Query = createRequire(import.meta.url)('pg/lib/query.js') as new (config: { text: string }) => object;

/**
 * Statements sent with one Sync, as the project sends a transaction's opening and closing statements
 * (src/db/statement-batch.ts): PostgreSQL answers them in one reply. pg collects the results into an
 * array. A pg Query, because pg takes no other submittable on a pipelined client.
 */
class Batch extends Query {
  constructor(private readonly statements: Statement[], readonly callback: (error: Error | undefined, results: pg.QueryResult[]) => void) {
    super({ text: '' });
  }

  requiresPreparation() {
    return true;
  }

  prepare(connection: {
    parsedStatements: Record<string, string>;
    parse(message: object): void;
    bind(message: object): void;
    describe(message: object): void;
    execute(message: object): void;
    sync(): void;
  }) {
    for (const { name, text, values } of this.statements) {
      if (!name || connection.parsedStatements[name] === undefined) {
        connection.parse({ text, name });
        if (name) connection.parsedStatements[name] = text;
      }
      connection.bind({ statement: name, values });
      connection.describe({ type: 'P', name: '' });
      connection.execute({ portal: '' });
    }
    connection.sync();
  }
}

const batch = (client: pg.PoolClient, statements: Statement[]) =>
  new Promise<pg.QueryResult[]>((resolve, reject) =>
    (client.query as unknown as (query: Batch) => void).call(client, new Batch(statements, (error, results) => (error ? reject(error) : resolve(results)))),
  );

app.post('/customers/same-statements', async (request, reply) => {
  const body = request.body as { externalId: string; fullName: string; email: string; phone: string };
  const client = await pipelined.connect();
  try {
    const [, locked] = await batch(client, [
      { name: '', text: 'BEGIN', values: [] },
      { name: 'lock', text: 'SELECT * FROM customers WHERE org_id = $1 AND external_id = $2 FOR UPDATE', values: [orgId, body.externalId] },
    ]);
    const before = locked!.rows[0];
    if (!before) {
      await client.query('ROLLBACK');
      return reply.code(404).send({});
    }
    const { created_at: _created, updated_at: _updated, org_id: _org, ...snapshot } = before;
    const after = { ...snapshot, name: body.fullName, email: body.email, phone: body.phone };
    const id = randomUUID();
    const created = new Date().toISOString();
    const [updated] = await batch(client, [
      {
        name: 'update',
        text: 'UPDATE customers SET name = $3, email = $4, phone = $5 WHERE org_id = $1 AND id = $2 RETURNING updated_at',
        values: [orgId, before.id, body.fullName, body.email, body.phone],
      },
      {
        name: 'audit',
        text: `INSERT INTO audit_log (org_id, actor_type, actor_id, action, subject_type, subject_id, before, after)
               VALUES ($1, 'api_key', NULL, 'customer.upserted', 'customer', $2, $3, $4)`,
        values: [orgId, before.id, JSON.stringify(snapshot), JSON.stringify(after)],
      },
      {
        name: 'event',
        text: EVENT_SQL,
        values: [id, orgId, before.id, JSON.stringify({ id, type: 'customer.updated', created, data: { customer: { ...after, updated_at: 'record.updated_at' } } }), created],
      },
      { name: '', text: 'COMMIT', values: [] },
    ]);
    return { ...after, updated_at: updated!.rows[0].updated_at };
  } finally {
    client.release();
  }
});

app.get('/customers', async (request) => {
  const query = request.query as { updated_since: string; limit?: string };
  const limit = Number(query.limit ?? 50);
  const { rows } = await pool.query(
    `SELECT * FROM customers WHERE org_id = $1 AND kind = 'individual' AND updated_at > $2
     ORDER BY created_at, id LIMIT $3`,
    [orgId, query.updated_since, limit + 1],
  );
  return { object: 'list', data: rows.slice(0, limit), has_more: rows.length > limit };
});

await app.listen({ port: Number(process.env.PORT), host: '127.0.0.1' });
