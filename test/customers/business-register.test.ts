import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { buildApp } from '../../src/app.js';
import {
  checkBusinessRegister,
  type BusinessRegister,
  type BusinessRegisterStatus,
} from '../../src/modules/customers/business-register.js';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { customerRow, person } from './customers-fixtures.js';

let ctx: TestContext;
let org: TestOrg;
const apps: FastifyInstance[] = [];
beforeAll(async () => {
  ctx = await createTestContext();
  org = await ctx.createOrg();
});
afterAll(async () => {
  for (const app of apps) await app.close();
  await ctx?.close();
});

/** An app wired with the given register (as a deployment would plug one in), on this file's database. */
async function appWith(register: BusinessRegister | undefined): Promise<FastifyInstance> {
  const app = await buildApp({
    config: ctx.config,
    database: ctx.database,
    logger: false,
    validateResponses: true,
    businessRegister: register,
  });
  await app.ready();
  apps.push(app);
  return app;
}

async function ingestSoleTrader(register: BusinessRegister | undefined, body: Record<string, unknown> = {}) {
  const app = await appWith(register);
  const response = await ctx.request(
    'POST',
    '/v1/customers',
    { key: org.key, body: person({ type: 'SOLE_TRADER', businessName: 'Acme', abn: '51 824 753 556', ...body }) },
    app,
  );
  expect(response.statusCode, response.body).toBe(201);
  return customerRow(ctx, response.json().id);
}

describe('ABN business-register lookup for sole traders', () => {
  it('when no register is configured, the ABN is recorded as NOT_CHECKED', async () => {
    expect((await ingestSoleTrader(undefined)).business_register_status).toBe('NOT_CHECKED');
  });

  it('when the register answers ACTIVE, the business is marked register-verified (looked up with the spaces stripped)', async () => {
    const asked: string[] = [];
    const row = await ingestSoleTrader({ lookupAbn: async (abn) => (asked.push(abn), 'ACTIVE') });
    expect(row.business_register_status).toBe('REGISTER_VERIFIED');
    expect(asked).toEqual(['51824753556']);
  });

  it('when the register answers INACTIVE, ingest still succeeds and records REGISTER_INACTIVE', async () => {
    expect((await ingestSoleTrader({ lookupAbn: async () => 'INACTIVE' })).business_register_status).toBe('REGISTER_INACTIVE');
  });

  it('when the register misses, ingest still succeeds and records REGISTER_NOT_FOUND', async () => {
    expect((await ingestSoleTrader({ lookupAbn: async () => 'NOT_FOUND' })).business_register_status).toBe('REGISTER_NOT_FOUND');
  });

  it('when the register is down, ingest still succeeds and records REGISTER_UNAVAILABLE', async () => {
    const row = await ingestSoleTrader({ lookupAbn: async () => Promise.reject(new Error('ECONNREFUSED')) });
    expect(row).toMatchObject({ business_register_status: 'REGISTER_UNAVAILABLE', abn: '51824753556' });
  });

  it('when the register never answers, ingest completes after the lookup timeout and records REGISTER_UNAVAILABLE', async () => {
    // Without the timeout this request would never be answered.
    const row = await ingestSoleTrader({ lookupAbn: () => new Promise(() => {}) });
    expect(row.business_register_status).toBe('REGISTER_UNAVAILABLE');
  });

  it('when an upsert sends no ABN, the register is not asked and the stored status is kept', async () => {
    let calls = 0;
    const register: BusinessRegister = { lookupAbn: async () => (calls++, 'ACTIVE') };
    const body = person({ externalId: `crm-abn-${Date.now()}` });
    const created = await ingestSoleTrader(register, body);
    const app = await appWith(register);
    const response = await ctx.request(
      'POST',
      '/v1/customers',
      { key: org.key, body: { externalId: body.externalId, phone: '0400 000 000' } },
      app,
    );
    expect(response.statusCode, response.body).toBe(200);
    expect(calls).toBe(1);
    expect((await customerRow(ctx, created.id)).business_register_status).toBe('REGISTER_VERIFIED');
  });
});

describe('the lookup timeout (a fake clock)', () => {
  it('when the register has not answered after 2 s, the lookup gives up with REGISTER_UNAVAILABLE, and not a millisecond before', async () => {
    vi.useFakeTimers();
    try {
      let status: BusinessRegisterStatus | undefined;
      void checkBusinessRegister({ lookupAbn: () => new Promise(() => {}) }, '51824753556').then((settled) => (status = settled));
      await vi.advanceTimersByTimeAsync(1_999);
      expect(status).toBeUndefined();
      await vi.advanceTimersByTimeAsync(1);
      expect(status).toBe('REGISTER_UNAVAILABLE');
    } finally {
      vi.useRealTimers();
    }
  });

  it('when the register answers just inside the 2 s, its answer is recorded', async () => {
    vi.useFakeTimers();
    try {
      let answer!: (value: 'ACTIVE') => void;
      let status: BusinessRegisterStatus | undefined;
      void checkBusinessRegister({ lookupAbn: () => new Promise((resolve) => (answer = resolve)) }, '51824753556').then(
        (settled) => (status = settled),
      );
      await vi.advanceTimersByTimeAsync(1_999);
      answer('ACTIVE');
      await vi.advanceTimersByTimeAsync(1);
      expect(status).toBe('REGISTER_VERIFIED');
    } finally {
      vi.useRealTimers();
    }
  });
});
