import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCustomersService } from '../../src/modules/customers/customers.service.js';
import type { BusinessRegister } from '../../src/modules/customers/business-register.js';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { customerRow, person } from './customers-fixtures.js';

let ctx: TestContext;
let org: TestOrg;
beforeAll(async () => {
  ctx = await createTestContext();
  org = await ctx.createOrg();
});
afterAll(async () => ctx?.close());

async function ingestSoleTrader(register: BusinessRegister | undefined) {
  const service = createCustomersService({ database: ctx.database, businessRegister: register });
  const body = person({ type: 'SOLE_TRADER', businessName: 'Acme', abn: '51824753556' }) as Parameters<typeof service.upsert>[1];
  const result = await service.upsert({ orgId: org.id, actor: { type: 'system', id: null } }, body);
  return customerRow(ctx, result.customer.id);
}

describe('ABN business-register lookup for sole traders', () => {
  it('when no register is configured, the ABN is recorded as NOT_CHECKED', async () => {
    expect((await ingestSoleTrader(undefined)).business_register_status).toBe('NOT_CHECKED');
  });

  it('when the register answers ACTIVE, the business is marked register-verified', async () => {
    expect((await ingestSoleTrader({ lookupAbn: async () => 'ACTIVE' })).business_register_status).toBe('REGISTER_VERIFIED');
  });

  it('when the register misses, ingest still succeeds and records REGISTER_NOT_FOUND', async () => {
    expect((await ingestSoleTrader({ lookupAbn: async () => 'NOT_FOUND' })).business_register_status).toBe('REGISTER_NOT_FOUND');
  });

  it('when the register is down, ingest still succeeds and records REGISTER_UNAVAILABLE', async () => {
    const row = await ingestSoleTrader({ lookupAbn: async () => Promise.reject(new Error('ECONNREFUSED')) });
    expect(row).toMatchObject({ business_register_status: 'REGISTER_UNAVAILABLE', abn: '51824753556' });
  });
});
