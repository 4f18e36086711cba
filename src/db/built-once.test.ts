import { and, DrizzleQueryError, eq, sql } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext, type TestOrg } from '../../test/helpers/harness.js';
import { createCustomersRepository } from '../modules/customers/customers.repository.js';
import { builtOnce, rowMapper } from './built-once.js';
import { customers } from './schema.js';

let ctx: TestContext;
let org: TestOrg;
beforeAll(async () => {
  ctx = await createTestContext();
  org = await ctx.createOrg();
});
afterAll(async () => ctx?.close());

async function insertCustomer(externalId: string): Promise<string> {
  const { rows } = await ctx.database.pool.query(
    `INSERT INTO customers (org_id, kind, external_id, type, name, email, kyc_status, added_via, risk_answers, designated_services, client_since_date, kyc_started_at, pre_commencement_assessment)
     VALUES ($1, 'individual', $2, 'INDIVIDUAL', 'Built Once', $2 || '@example.com', 'NOT_STARTED', 'INTEGRATION', '{"isNewCustomer": false}', '{FIN-FX,RE-BROKER}', '2020-02-29', now(), '{"assessedAt": "2024-01-01"}')
     RETURNING id`,
    [org.id, externalId],
  );
  return rows[0].id;
}

describe('statements built once', () => {
  const byExternalId = builtOnce('test_customers_by_external_id', () =>
    ctx.database.db
      .select()
      .from(customers)
      .where(and(eq(customers.orgId, sql.placeholder('orgId')), eq(customers.externalId, sql.placeholder('externalId')))),
  );
  const toRow = rowMapper(customers);

  it('when a row is read through a built-once statement, it maps to exactly what a Drizzle select returns (dates, arrays, jsonb, timestamps)', async () => {
    const id = await insertCustomer('bo-map');
    const [viaDrizzle] = await ctx.database.db.select().from(customers).where(eq(customers.id, id));
    const { rows } = await byExternalId.run(ctx.database.db, { orgId: org.id, externalId: 'bo-map' });
    expect(rows).toHaveLength(1);
    const mapped = toRow(rows[0]!);
    expect(mapped).toEqual(viaDrizzle);
    expect(mapped.kycStartedAt).toBeInstanceOf(Date);
  });

  it("when it runs on a transaction, it runs on that transaction's connection: it sees the transaction's uncommitted write and is rolled back with it", async () => {
    const id = await insertCustomer('bo-tx');
    const outcome = ctx.database.transaction(async (tx) => {
      await tx.update(customers).set({ phone: 'uncommitted' }).where(eq(customers.id, id));
      const { rows } = await byExternalId.run(tx, { orgId: org.id, externalId: 'bo-tx' });
      expect(toRow(rows[0]!).phone).toBe('uncommitted');
      throw new Error('roll back');
    });
    await expect(outcome).rejects.toThrow('roll back');
    const { rows } = await byExternalId.run(ctx.database.db, { orgId: org.id, externalId: 'bo-tx' });
    expect(toRow(rows[0]!).phone).toBeNull();
  });

  it('when two built-once statements share a name prefix but not their text, each gets its own prepared statement name', async () => {
    const one = builtOnce('test_same_prefix', () => sql`SELECT ${sql.placeholder('n')}::int AS n`);
    const two = builtOnce('test_same_prefix', () => sql`SELECT ${sql.placeholder('n')}::int + 1 AS n`);
    const first = await one.run(ctx.database.db, { n: 1 });
    const second = await two.run(ctx.database.db, { n: 1 });
    expect([first.rows[0]![0], second.rows[0]![0]]).toEqual([1, 2]);
  });

  it("when it fails, its error is what a Drizzle query throws: a DrizzleQueryError with the statement, and PostgreSQL's error as its cause", async () => {
    const dividing = builtOnce('test_failing', () => sql`SELECT 1 / ${sql.placeholder('n')}::int AS quotient`);
    const viaDrizzle = await ctx.database.db.execute(sql`SELECT 1 / ${0}::int AS quotient`).catch((error: unknown) => error);
    const error = await dividing.run(ctx.database.db, { n: 0 }).catch((failure: unknown) => failure);
    expect(viaDrizzle).toBeInstanceOf(DrizzleQueryError);
    expect(error).toBeInstanceOf(DrizzleQueryError);
    expect((error as DrizzleQueryError).query).toMatch(/^select 1 \/ \$1::int as quotient$/i);
    expect((error as DrizzleQueryError).params).toEqual([0]);
    expect(((error as DrizzleQueryError).cause as { code?: string }).code).toBe(
      ((viaDrizzle as DrizzleQueryError).cause as { code?: string }).code,
    );
    expect(((error as DrizzleQueryError).cause as { code?: string }).code).toBe('22012');
  });
});

describe('the customers UPDATE built once per column set', () => {
  it('when an update clears jsonb, array, date and timestamp columns, they become SQL NULL or empty as sent, not the JSON text "null"', async () => {
    const id = await insertCustomer('bo-null');
    const repository = createCustomersRepository(ctx.database.db);
    const updated = await repository.update(
      org.id,
      id,
      {
        preCommencementAssessment: null,
        clientSinceDate: null,
        kycStartedAt: null,
        designatedServices: [],
      },
      ctx.database.db,
    );
    expect(updated).toMatchObject({ preCommencementAssessment: null, clientSinceDate: null, kycStartedAt: null, designatedServices: [] });
    const { rows } = await ctx.database.pool.query(
      `SELECT pre_commencement_assessment IS NULL AS assessment_null, client_since_date IS NULL AS date_null, kyc_started_at IS NULL AS started_null, designated_services FROM customers WHERE id = $1`,
      [id],
    );
    expect(rows[0]).toEqual({ assessment_null: true, date_null: true, started_null: true, designated_services: [] });
  });

  it('when an update sets jsonb, array, date and timestamp values, they are stored as a Drizzle update would store them', async () => {
    const id = await insertCustomer('bo-set');
    const repository = createCustomersRepository(ctx.database.db);
    const startedAt = new Date('2025-06-01T10:11:12.345Z');
    const values = {
      riskAnswers: { isNewCustomer: false, complexStructure: true },
      designatedServices: ['PRO-FORMATION'],
      clientSinceDate: '2019-12-31',
      kycStartedAt: startedAt,
    };
    const updated = await repository.update(org.id, id, values, ctx.database.db);
    const [stored] = await ctx.database.db.select().from(customers).where(eq(customers.id, id));
    expect(updated).toEqual(stored);
    expect(stored).toMatchObject(values);
  });
});
