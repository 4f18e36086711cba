import fc from 'fast-check';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { arbitraryFor } from './json-schema-arbitrary.js';
import { pool } from './processes.js';

type Operation = {
  parameters?: Array<{ in: string; name: string; schema?: Record<string, unknown>; required?: boolean }>;
  requestBody?: { content?: Record<string, { schema?: Record<string, unknown> }> };
};
type Document = {
  servers?: Array<{ url: string }>;
  paths: Record<string, Record<string, Operation>>;
  components?: { schemas?: Record<string, Record<string, unknown>> };
};

const REQUESTS = Number(process.env.FUZZ_REQUESTS ?? 10_000);

let ctx: TestContext;
let own: TestOrg;
let other: TestOrg;
const ids: string[] = [];

beforeAll(async () => {
  ctx = await createTestContext({ rateLimit: { burst: 1_000_000, daily: 1_000_000_000 } });
  own = await ctx.createOrg({ credits: 1_000_000 });
  other = await ctx.createOrg();
  // Some real records of both organisations for the generated ids to hit.
  for (const org of [own, other]) {
    const person = await ctx.request('POST', '/v1/customers', {
      key: org.key,
      body: { externalId: `fz-${org.id.slice(0, 4)}`, fullName: 'Fuzz Person', email: 'fuzz@test.dev' },
    });
    const entity = await ctx.request('POST', '/v1/entities', {
      key: org.key,
      body: {
        externalId: `fze-${org.id.slice(0, 4)}`,
        type: 'COMPANY',
        name: 'Fuzz Pty Ltd',
        contact: { fullName: 'Fuzz Contact', email: 'fc@test.dev' },
      },
    });
    ids.push(JSON.parse(person.body).id, JSON.parse(entity.body).id, `fz-${org.id.slice(0, 4)}`, `fze-${org.id.slice(0, 4)}`);
  }
});
afterAll(async () => ctx?.close());

it(`when ${REQUESTS.toLocaleString('en')} requests generated from the OpenAPI document hit every route, none answers 5xx and every error uses the envelope`, async () => {
  const document = (ctx.app as unknown as { swagger(): Document }).swagger();
  const components = (document.components?.schemas ?? {}) as never;
  // Paths in the document are relative to its server URL (/v1).
  const base = (document.servers?.[0]?.url ?? '').replace(/\/$/, '');
  const operations = Object.entries(document.paths)
    .map(([path, methods]) => [`${base}${path}`, methods] as const)
    .filter(([path]) => path.startsWith('/v1/'))
    .flatMap(([path, methods]) => Object.entries(methods).map(([method, operation]) => ({ path, method: method.toUpperCase(), operation })))
    .filter(({ method }) => ['GET', 'POST', 'PATCH', 'PUT'].includes(method));
  expect(operations.length).toBeGreaterThanOrEqual(15);

  const idArbitrary = fc.oneof(
    fc.constantFrom(...ids),
    fc.uuid(),
    fc.string({ maxLength: 30 }),
    fc.constantFrom('%00', '..', '%2F', 'a'.repeat(300)),
  );
  const requestArbitrary = fc.record({
    operation: fc.constantFrom(...operations),
    mode: fc.constantFrom('schema', 'schema', 'schema', 'random', 'mutated'),
    id: idArbitrary,
    uboId: fc.oneof(fc.uuid(), fc.string({ maxLength: 10 })),
    random: fc.jsonValue({ maxDepth: 3 }),
    extraKey: fc.string({ minLength: 1, maxLength: 12 }),
    key: fc.constantFrom('own', 'own', 'own', 'own', 'other', 'none', 'garbage'),
    idempotencyKey: fc.option(fc.string({ minLength: 0, maxLength: 300 }), { freq: 4 }),
    seed: fc.integer(),
  });
  const samples = fc.sample(requestArbitrary, REQUESTS);

  const problems: string[] = [];
  let errors = 0;
  await pool(samples.length, 8, async (index) => {
    const sample = samples[index]!;
    const { operation, path, method } = sample.operation;
    const url = path.replace('{id}', encodeURIComponent(sample.id)).replace('{uboId}', encodeURIComponent(sample.uboId));
    const query: Record<string, string> = {};
    for (const parameter of operation.parameters ?? []) {
      if (parameter.in !== 'query' || Math.random() < 0.5) continue;
      const [value] = fc.sample(arbitraryFor(parameter.schema as never, components), { numRuns: 1, seed: sample.seed });
      query[parameter.name] = typeof value === 'string' ? value : JSON.stringify(value);
    }
    const bodySchema = operation.requestBody?.content?.['application/json']?.schema;
    let body: unknown;
    if (method !== 'GET') {
      if (sample.mode === 'random' || !bodySchema) body = sample.random;
      else {
        [body] = fc.sample(arbitraryFor(bodySchema as never, components), { numRuns: 1, seed: sample.seed });
        if (sample.mode === 'mutated' && body && typeof body === 'object' && !Array.isArray(body)) {
          body = { ...body, [sample.extraKey]: sample.random };
        }
      }
    }
    const headers: Record<string, string> = {};
    const key = sample.key === 'own' ? own.key : sample.key === 'other' ? other.key : sample.key === 'garbage' ? 'svc_live_garbage' : null;
    if (key) headers.authorization = `Bearer ${key}`;
    if (sample.idempotencyKey !== null && method !== 'GET') headers['idempotency-key'] = sample.idempotencyKey;
    const response = await ctx.app.inject({
      method: method as 'POST',
      url,
      query,
      headers: body === undefined ? headers : { ...headers, 'content-type': 'application/json' },
      payload: body === undefined ? undefined : JSON.stringify(body),
    });
    if (response.statusCode >= 500) {
      problems.push(`${method} ${url} → ${response.statusCode} ${response.body.slice(0, 200)} body=${JSON.stringify(body)?.slice(0, 200)}`);
    }
    if (response.statusCode >= 400) {
      errors += 1;
      const parsed = JSON.parse(response.body) as { error?: { code?: unknown; message?: unknown } };
      if (Object.keys(parsed).join() !== 'error' || typeof parsed.error?.code !== 'string' || typeof parsed.error?.message !== 'string') {
        problems.push(`${method} ${url} → ${response.statusCode} without the envelope: ${response.body.slice(0, 200)}`);
      }
    }
  });
  process.stderr.write(
    `fuzz: ${samples.length} requests over ${operations.length} operations, ${errors} error responses, ${problems.length} problems\n`,
  );
  expect(problems.slice(0, 20)).toEqual([]);
});
