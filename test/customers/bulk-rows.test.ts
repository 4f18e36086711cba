import { randomUUID } from 'node:crypto';
import { eq } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { customers, type CustomerRow, type NewCustomerRow } from '../../src/db/schema.js';
import { createCustomersRepository } from '../../src/modules/customers/customers.repository.js';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';

let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

const byId = (a: CustomerRow, b: CustomerRow) => a.id.localeCompare(b.id);
const builderRows = async (org: TestOrg) => (await ctx.database.db.select().from(customers).where(eq(customers.orgId, org.id))).sort(byId);

describe('the bulk statements of a bulk import read and write records as the query builder does', () => {
  it('when candidates are locked by externalId and by name and email, each row equals the query builder’s row', async () => {
    const org = await ctx.createOrg();
    for (const body of [
      {
        externalId: 'b-1',
        fullName: 'Ada Lovelace',
        email: 'Ada@Example.com',
        firstName: 'Ada',
        lastName: 'Lovelace',
        phone: '0400 000 001',
      },
      {
        externalId: 'b-2',
        type: 'SOLE_TRADER',
        fullName: 'Bo Trader',
        email: 'bo@example.com',
        businessName: 'Bo Trading',
        abn: '51824753556',
        risk: { isNewCustomer: false },
        clientSinceDate: '2015-03-04',
        designatedServices: ['PRO-REAL-ESTATE'],
        preCommencementAssessment: { significantChange: false, resultingRisk: 'LOW', assessedAt: '2025-01-02' },
      },
      { fullName: 'Cy Nobody', email: 'cy@example.com' },
    ]) {
      const response = await ctx.request('POST', '/v1/customers', { key: org.key, body });
      expect(response.statusCode, response.body).toBe(201);
    }
    const repository = createCustomersRepository(ctx.database.db);
    const locked = await ctx.database.transaction((tx) =>
      repository.lockUpsertCandidates(org.id, ['b-1', 'b-2', 'missing'], [{ name: 'cy nobody', email: 'CY@example.com' }], tx),
    );
    expect(locked.sort(byId)).toEqual(await builderRows(org));
  });

  it('when records are inserted in bulk, the rows returned equal the query builder’s rows and a taken key is skipped', async () => {
    const org = await ctx.createOrg();
    const repository = createCustomersRepository(ctx.database.db);
    const base = { orgId: org.id, kind: 'individual' as const, type: 'INDIVIDUAL', kycStatus: 'NOT_REQUIRED', addedVia: 'BULK_IMPORT' };
    const values: NewCustomerRow[] = [
      { ...base, id: randomUUID(), externalId: 'i-1', name: 'Di One', email: 'di@example.com', riskAnswers: { isNewCustomer: true } },
      {
        ...base,
        id: randomUUID(),
        externalId: 'i-2',
        name: 'Ed Two',
        email: 'ed@example.com',
        designatedServices: ['FIN-LOANS', 'RE-BROKER'],
        clientSinceDate: '2010-01-31',
        nextReviewAt: new Date('2027-03-04T05:06:07.089Z'),
        eddRequired: true,
        eddReasons: ['HIGH_RISK'],
      },
      // The same externalId as the first: skipped, not an error.
      { ...base, id: randomUUID(), externalId: 'i-1', name: 'Fay Three', email: 'fay@example.com' },
    ];
    const inserted = await ctx.database.transaction((tx) => repository.insertManyIfAbsent(org.id, values, tx));
    expect(inserted.map((row) => row.externalId).sort()).toEqual(['i-1', 'i-2']);
    expect(inserted.sort(byId)).toEqual(await builderRows(org));
    const second = inserted.find((row) => row.externalId === 'i-2')!;
    expect(second).toMatchObject({ designatedServices: ['FIN-LOANS', 'RE-BROKER'], clientSinceDate: '2010-01-31', eddRequired: true });
    expect(second.nextReviewAt).toEqual(new Date('2027-03-04T05:06:07.089Z'));
    // Left out, so the column defaults apply as in a single insert.
    expect(inserted.find((row) => row.externalId === 'i-1')).toMatchObject({
      amlStatus: 'NOT_SCREENED',
      reviewStatus: 'NOT_SCHEDULED',
      designatedServices: [],
    });
  });

  it('when records are updated in bulk, each ends as updateLocked leaves its twin and the updated_at stamped on it is returned', async () => {
    const org = await ctx.createOrg();
    const repository = createCustomersRepository(ctx.database.db);
    const base = { orgId: org.id, kind: 'individual' as const, type: 'SOLE_TRADER', kycStatus: 'NOT_REQUIRED', addedVia: 'BULK_IMPORT' };
    const twins = (name: string) =>
      (['bulk', 'single'] as const).map((way) => ({
        ...base,
        id: randomUUID(),
        externalId: `${name}-${way}`,
        name,
        email: `${name}.${way}@example.com`,
        businessName: 'Old Trading',
        riskAnswers: { isNewCustomer: true },
      }));
    const [first, second] = [twins('gil'), twins('hal')];
    await ctx.database.transaction((tx) => repository.insertManyIfAbsent(org.id, [...first, ...second], tx));
    // Two sets of columns: one statement each.
    const changes: Array<[string, Partial<NewCustomerRow>]> = [
      [
        'gil',
        {
          phone: '0400 999 000',
          riskAnswers: { isNewCustomer: false, metFaceToFace: true },
          designatedServices: ['FIN-LOANS'],
          clientSinceDate: '2011-02-03',
          nextReviewAt: new Date('2028-01-02T03:04:05.678Z'),
          eddReasons: ['HIGH_RISK'],
          businessName: null,
        },
      ],
      ['hal', { name: 'Hal Renamed', phone: '0400 999 001' }],
    ];
    const idOf = (externalId: string) => [...first, ...second].find((row) => row.externalId === externalId)!.id;
    const stamped = await ctx.database.transaction((tx) =>
      repository.updateManyLocked(
        org.id,
        changes.map(([name, values]) => ({ id: idOf(`${name}-bulk`), values })),
        tx,
      ),
    );
    await ctx.database.transaction(async (tx) => {
      for (const [name, values] of changes) await repository.updateLocked(org.id, idOf(`${name}-single`), values, tx);
    });
    const rows = await builderRows(org);
    const without = (row: CustomerRow) => ({
      ...row,
      id: undefined,
      externalId: undefined,
      email: undefined,
      createdAt: undefined,
      updatedAt: undefined,
    });
    for (const [name] of changes) {
      const bulk = rows.find((row) => row.externalId === `${name}-bulk`)!;
      const single = rows.find((row) => row.externalId === `${name}-single`)!;
      expect(without(bulk)).toEqual(without(single));
      expect(stamped.get(bulk.id)).toEqual(bulk.updatedAt);
    }
    expect(rows.find((row) => row.externalId === 'gil-bulk')).toMatchObject({
      businessName: null,
      designatedServices: ['FIN-LOANS'],
      riskAnswers: { isNewCustomer: false, metFaceToFace: true },
      nextReviewAt: new Date('2028-01-02T03:04:05.678Z'),
    });
    expect(stamped.size).toBe(2);
  });
});
