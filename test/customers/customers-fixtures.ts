import type { LightMyRequestResponse } from 'fastify';
import type { TestContext, TestOrg } from '../helpers/harness.js';

let counter = 0;
/** A person nobody else in the file uses: unique full name and email. */
export function person(overrides: Record<string, unknown> = {}): Record<string, unknown> {
  counter += 1;
  const tag = `${Date.now().toString(36)}${counter}`;
  return { fullName: `Person ${tag}`, email: `person-${tag}@example.com`, ...overrides };
}

export function upsert(ctx: TestContext, org: TestOrg, body: unknown): Promise<LightMyRequestResponse> {
  return ctx.request('POST', '/v1/customers', { key: org.key, body });
}

/** Creates a customer and returns its DTO, failing loudly when it was not created. */
export async function createCustomer(ctx: TestContext, org: TestOrg, body: Record<string, unknown> = person()) {
  const response = await upsert(ctx, org, body);
  if (response.statusCode !== 201) throw new Error(`expected 201, got ${response.statusCode}: ${response.body}`);
  return response.json<Record<string, any>>();
}

export async function customerRow(ctx: TestContext, id: string): Promise<Record<string, any>> {
  const { rows } = await ctx.database.pool.query('SELECT * FROM customers WHERE id = $1', [id]);
  return rows[0];
}

export async function countCustomers(ctx: TestContext, orgId: string, where = 'TRUE', params: unknown[] = []): Promise<number> {
  const { rows } = await ctx.database.pool.query(`SELECT count(*)::int AS n FROM customers WHERE org_id = $1 AND ${where}`, [
    orgId,
    ...params,
  ]);
  return rows[0].n;
}

/** An entity row written directly: the entities module is not needed to test that individuals ignore it. */
export async function insertEntity(ctx: TestContext, orgId: string, externalId: string | null = null): Promise<string> {
  const { rows } = await ctx.database.pool.query(
    `INSERT INTO customers (org_id, kind, external_id, type, name, kyc_status, added_via)
     VALUES ($1, 'entity', $2, 'COMPANY', $3, 'NOT_REQUIRED', 'INTEGRATION') RETURNING id`,
    [orgId, externalId, `Entity ${Math.random().toString(36).slice(2)}`],
  );
  return rows[0].id;
}

export function issues(response: LightMyRequestResponse): Record<string, string[]> {
  return response.json<{ error: { details?: { issues?: Record<string, string[]> } } }>().error.details?.issues ?? {};
}
