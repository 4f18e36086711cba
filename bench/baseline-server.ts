/**
 * The bare baseline: Fastify + pg doing the same SQL as the project's hot paths, with no auth, no
 * validation, no rate limits, no idempotency, no audit and no logging.
 */
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
