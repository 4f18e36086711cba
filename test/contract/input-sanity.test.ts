import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';

let ctx: TestContext;
let org: TestOrg;
beforeAll(async () => {
  ctx = await createTestContext();
  org = await ctx.createOrg();
});
afterAll(async () => ctx?.close());

// Found by the OpenAPI fuzzer (test/reliability/fuzz.test.ts).
describe('hostile input', () => {
  it('when a body string contains U+0000, it answers 422 naming the field instead of failing at the database', async () => {
    const response = await ctx.request('POST', '/v1/customers', {
      key: org.key,
      body: { fullName: 'Nul\u0000Byte', email: 'nul@example.com' },
    });
    expect(response.statusCode).toBe(422);
    expect(response.json()).toEqual({
      error: {
        code: 'validation_failed',
        message: expect.any(String),
        details: { issues: { fullName: [expect.stringContaining('NUL')] } },
      },
    });
  });

  it('when a query parameter contains U+0000, it answers 422 naming the parameter', async () => {
    const response = await ctx.request('GET', '/v1/customers?external_id=a%00b', { key: org.key });
    expect(response.statusCode).toBe(422);
    expect(response.json().error.details.issues).toHaveProperty('external_id');
  });

  it('when an unknown property is named like an Object method, it answers 422 naming it', async () => {
    const response = await ctx.request('POST', '/v1/entities', {
      key: org.key,
      body: { type: 'COMPANY', name: 'Proto Pty Ltd', constructor: 'x', toString: 1 },
    });
    expect(response.statusCode).toBe(422);
    expect(Object.keys(response.json().error.details.issues).sort()).toEqual(['constructor', 'toString']);
  });
});
