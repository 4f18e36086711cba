import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { Validator } from '@seriousme/openapi-schema-validator';
import type { FastifyInstance } from 'fastify';
import type { OpenAPIV3_1 } from 'openapi-types';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { buildApp } from '../../src/app.js';
import { loadConfig } from '../../src/config/config.js';
import { createDatabase, type Database } from '../../src/db/client.js';
import { apiModules } from '../../src/modules/index.js';
import { generateOpenApiDocument, serializeOpenApiDocument } from '../../src/plugins/openapi-document.js';
import { ROUTE_SCOPES, type Scope } from '../../src/plugins/route-scopes.js';
import { errorEnvelopeSchema } from '../../src/shared/error-envelope.schema.js';

const ROOT = join(import.meta.dirname, '..', '..');
const COMMITTED = join(ROOT, 'openapi', 'openapi.json');
const COMMITTED_CLIENT = join(ROOT, 'clients', 'typescript', 'schema.d.ts');

describe('committed OpenAPI document', () => {
  it('when the code changes the document, the committed openapi/openapi.json must be regenerated', async () => {
    const generated = serializeOpenApiDocument(await generateOpenApiDocument());
    const committed = readFileSync(COMMITTED, 'utf8');
    expect(committed, 'openapi/openapi.json is out of date: run `npm run openapi` and commit the result').toBe(generated);
  });

  it('when the document changes, the committed TypeScript client types must be regenerated', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'client-'));
    try {
      const out = join(dir, 'schema.d.ts');
      const bin = join(ROOT, 'node_modules', '.bin', 'openapi-typescript');
      await promisify(execFile)(bin, [COMMITTED, '--output', out], { cwd: ROOT });
      expect(readFileSync(COMMITTED_CLIENT, 'utf8'), 'clients/typescript/schema.d.ts is out of date: run `npm run openapi`').toBe(
        readFileSync(out, 'utf8'),
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 60_000); // spawns the generator, slow on a loaded machine

  it('when `svc openapi --out` runs with no reachable database, it writes the committed document and prints one JSON summary', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'openapi-'));
    try {
      const out = join(dir, 'openapi.json');
      const { stdout } = await promisify(execFile)(process.execPath, [join(ROOT, 'bin', 'svc.js'), 'openapi', '--out', out], {
        cwd: ROOT,
        // Unreachable on purpose: generating the document must not touch a database.
        env: { ...process.env, DATABASE_URL: 'postgres://nobody@127.0.0.1:1/none', NODE_ENV: 'development' },
      });
      const summary = JSON.parse(stdout) as { written: string; paths: number; operations: number };
      expect(summary.written).toBe(out);
      const committed = JSON.parse(readFileSync(COMMITTED, 'utf8')) as { paths: Record<string, object> };
      expect(summary.paths).toBe(Object.keys(committed.paths).length);
      expect(readFileSync(out, 'utf8')).toBe(readFileSync(COMMITTED, 'utf8'));
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 60_000);

  it('when validated against the OpenAPI 3.1 schema, the committed document is valid and every $ref resolves', async () => {
    const validator = new Validator();
    const result = await validator.validate(JSON.parse(readFileSync(COMMITTED, 'utf8')));
    expect(result.errors).toBeUndefined();
    expect(result.valid).toBe(true);
    expect(validator.version).toBe('3.1');
    expect(() => validator.resolveRefs()).not.toThrow();
  });
});

type JsonSchema = {
  $ref?: string;
  description?: string;
  example?: unknown;
  examples?: unknown;
  properties?: Record<string, JsonSchema>;
  items?: JsonSchema;
  anyOf?: JsonSchema[];
  oneOf?: JsonSchema[];
  allOf?: JsonSchema[];
};

/** Fields without a description and the parts (bodies, 2xx responses) without any example, by location. */
function undocumented(document: OpenAPIV3_1.Document): { fields: string[]; withoutExample: string[] } {
  const components = (document.components?.schemas ?? {}) as Record<string, JsonSchema>;
  const resolve = (schema: JsonSchema | undefined) => (schema?.$ref ? components[schema.$ref.split('/').pop()!] : schema);
  const described = (schema: JsonSchema) =>
    [schema, resolve(schema), ...(schema.anyOf ?? []), ...(schema.oneOf ?? [])].some((part) => Boolean(resolve(part)?.description));
  const fields = new Set<string>();
  const walk = (raw: JsonSchema | undefined, at: string, seen: Set<JsonSchema>) => {
    const schema = resolve(raw);
    if (!schema || seen.has(schema)) return;
    seen.add(schema);
    for (const [name, property] of Object.entries(schema.properties ?? {})) {
      if (!described(property)) fields.add(`${at}.${name}`);
      walk(property, `${at}.${name}`, seen);
    }
    walk(schema.items, `${at}[]`, seen);
    for (const part of [...(schema.anyOf ?? []), ...(schema.oneOf ?? []), ...(schema.allOf ?? [])]) walk(part, at, seen);
  };
  const withoutExample: string[] = [];
  for (const [path, item] of Object.entries(document.paths ?? {})) {
    for (const [method, value] of Object.entries(item ?? {})) {
      const operation = value as OpenAPIV3_1.OperationObject;
      const where = `${method.toUpperCase()} ${path}`;
      for (const parameter of (operation.parameters ?? []) as OpenAPIV3_1.ParameterObject[]) {
        if (!('$ref' in parameter) && !parameter.description) fields.add(`${where} parameter ${parameter.name}`);
      }
      const body = (operation.requestBody as OpenAPIV3_1.RequestBodyObject | undefined)?.content?.['application/json'];
      if (body) {
        walk(body.schema as JsonSchema, `${where} body`, new Set());
        if (!JSON.stringify(body).includes('"example')) withoutExample.push(`${where} body`);
      }
      for (const [status, response] of Object.entries(operation.responses ?? {})) {
        const content = (response as OpenAPIV3_1.ResponseObject).content?.['application/json'];
        if (!status.startsWith('2') || !content) continue;
        walk(content.schema as JsonSchema, `${where} ${status}`, new Set());
        if (!JSON.stringify(content).includes('"example')) withoutExample.push(`${where} ${status}`);
      }
    }
  }
  return { fields: [...fields], withoutExample };
}

describe('committed OpenAPI document for integrators', () => {
  it('when an integrator reads it, every parameter and every field of a request body or success response has a description', () => {
    const document = JSON.parse(readFileSync(COMMITTED, 'utf8')) as OpenAPIV3_1.Document;
    expect(Object.keys(document.paths ?? {}).length).toBeGreaterThan(10);
    expect(undocumented(document).fields).toEqual([]);
  });

  it('when an integrator reads it, every request body and success response carries an example', () => {
    const document = JSON.parse(readFileSync(COMMITTED, 'utf8')) as OpenAPIV3_1.Document;
    expect(undocumented(document).withoutExample).toEqual([]);
  });
});

/** A v1 module of this test only, so the per-operation additions are checked whatever routes exist. */
const testRoutes = async (app: FastifyInstance) => {
  app.get(
    '/test-widgets/:id',
    {
      schema: {
        params: z.object({ id: z.uuid() }),
        response: {
          200: z.object({ id: z.string() }).strict(),
          404: { description: 'No such widget in your organisation.', content: { 'application/json': { schema: errorEnvelopeSchema } } },
        },
      },
    },
    async (request) => ({ id: (request.params as { id: string }).id }),
  );
  app.post(
    '/test-widgets',
    {
      schema: {
        operationId: 'createTestWidget',
        tags: ['Widgets'],
        summary: 'Create a widget',
        body: z.object({ name: z.string().min(1).describe('The widget name.') }).strict(),
        response: { 201: z.object({ id: z.string() }).strict(), 402: errorEnvelopeSchema },
      },
    },
    async (_request, reply) => reply.code(201).send({ id: 'w_1' }),
  );
  app.get('/test-catalog', { schema: { response: { 200: z.object({ object: z.literal('list') }).strict() } } }, async () => ({
    object: 'list' as const,
  }));
};

describe('operations of v1 routes', () => {
  let app: FastifyInstance;
  let database: Database;
  let document: OpenAPIV3_1.Document;
  const scopes = ROUTE_SCOPES as Record<string, Scope | null>;
  const added = ['GET /v1/test-widgets/:id', 'POST /v1/test-widgets', 'GET /v1/test-catalog'];

  beforeAll(async () => {
    scopes['GET /v1/test-widgets/:id'] = 'customers:read';
    scopes['POST /v1/test-widgets'] = 'customers:write';
    scopes['GET /v1/test-catalog'] = null;
    apiModules.push(testRoutes);
    database = createDatabase('postgres://unused.invalid:5432/unused');
    app = await buildApp({ config: loadConfig({}), database, logger: false });
    await app.ready();
    const response = await app.inject({ method: 'GET', url: '/openapi.json' });
    expect(response.statusCode).toBe(200);
    expect(response.headers['content-type']).toMatch(/^application\/json/);
    document = response.json();
  });
  afterAll(async () => {
    apiModules.splice(apiModules.indexOf(testRoutes), 1);
    for (const key of added) delete scopes[key];
    await app?.close();
    await database?.close();
  });

  const operation = (path: string, method: 'get' | 'post') => document.paths?.[path]?.[method] as OpenAPIV3_1.OperationObject;

  it('when served at /openapi.json, the document with extra routes still validates', async () => {
    const result = await new Validator().validate(document as unknown as Parameters<Validator["validate"]>[0]);
    expect(result.errors).toBeUndefined();
    expect(result.valid).toBe(true);
  });

  it('when routes are registered under /v1, paths are relative to the /v1 server', () => {
    expect(document.servers).toEqual([{ url: '/v1', description: expect.any(String) }]);
    expect(Object.keys(document.paths ?? {})).toEqual(expect.arrayContaining(['/test-widgets/{id}', '/test-widgets', '/test-catalog']));
  });

  it('when a route has a scope in ROUTE_SCOPES, its operation requires bearerAuth with that scope and says so', () => {
    const get = operation('/test-widgets/{id}', 'get');
    expect(get.security).toEqual([{ bearerAuth: ['customers:read'] }]);
    expect(get.description).toContain('`customers:read`');
    expect(operation('/test-catalog', 'get').security).toEqual([{ bearerAuth: [] }]);
    expect(operation('/test-catalog', 'get').description).toContain('Any valid API key');
    expect(document.components?.securitySchemes?.bearerAuth).toMatchObject({ type: 'http', scheme: 'bearer', bearerFormat: 'svc_live_…' });
  });

  it('when a route sets no operationId, tags or summary, defaults are derived from method and path', () => {
    const get = operation('/test-widgets/{id}', 'get');
    expect(get.operationId).toBe('getTestWidgetsById');
    expect(get.tags).toEqual(['Test widgets']);
    expect(get.summary).toBe('GET /test-widgets/{id}');
  });

  it('when a route sets operationId, tags and summary, they are kept', () => {
    const post = operation('/test-widgets', 'post');
    expect(post).toMatchObject({ operationId: 'createTestWidget', tags: ['Widgets'], summary: 'Create a widget' });
    expect(document.tags?.map((tag) => tag.name)).toEqual(expect.arrayContaining(['Widgets', 'Test widgets']));
  });

  it('when an operation is documented, every error status refers to the Error envelope', () => {
    const get = operation('/test-widgets/{id}', 'get');
    expect(Object.keys(get.responses ?? {})).toEqual(['200', '401', '403', '404', '422', '429', '500', '503']);
    const post = operation('/test-widgets', 'post');
    expect(Object.keys(post.responses ?? {})).toEqual(['201', '401', '402', '403', '409', '413', '415', '422', '429', '500', '503']);
    // No path parameter, no input: no 404 and no 422.
    expect(Object.keys(operation('/test-catalog', 'get').responses ?? {})).toEqual(['200', '401', '403', '429', '500', '503']);
    for (const response of Object.values(document.components?.responses ?? {}) as OpenAPIV3_1.ResponseObject[]) {
      expect(response.content?.['application/json']?.schema).toEqual({ $ref: '#/components/schemas/Error' });
    }
    expect(document.components?.schemas?.Error).toMatchObject({ type: 'object', required: ['error'] });
  });

  it('when a route documents an error status itself, it keeps its schema and description and gets the standard ones where it has none', () => {
    const notFound = operation('/test-widgets/{id}', 'get').responses?.['404'] as OpenAPIV3_1.ResponseObject;
    expect(notFound.description).toBe('No such widget in your organisation.');
    expect(notFound.content?.['application/json']?.schema).toEqual({ $ref: '#/components/schemas/Error' });
    expect(Object.keys(notFound.headers ?? {})).toContain('RateLimit');
    const paymentRequired = operation('/test-widgets', 'post').responses?.['402'] as OpenAPIV3_1.ResponseObject;
    expect(paymentRequired.description).toMatch(/insufficient_credits/);
    expect(paymentRequired.content?.['application/json']?.schema).toEqual({ $ref: '#/components/schemas/Error' });
    expect((operation('/test-widgets/{id}', 'get').responses?.['200'] as OpenAPIV3_1.ResponseObject).description).toBe('OK');
    expect((operation('/test-widgets', 'post').responses?.['201'] as OpenAPIV3_1.ResponseObject).description).toBe('Created');
  });

  it('when a method is POST, PATCH or PUT, the Idempotency-Key header is a parameter; GET has none', () => {
    expect(operation('/test-widgets', 'post').parameters).toContainEqual({ $ref: '#/components/parameters/IdempotencyKey' });
    expect(operation('/test-widgets/{id}', 'get').parameters).not.toContainEqual({ $ref: '#/components/parameters/IdempotencyKey' });
    expect(document.components?.parameters?.IdempotencyKey).toMatchObject({ in: 'header', name: 'Idempotency-Key', schema: { maxLength: 255 } });
  });

  it('when a response is documented, it lists the rate-limit headers, and 429 adds Retry-After', () => {
    const ok = operation('/test-widgets/{id}', 'get').responses?.['200'] as OpenAPIV3_1.ResponseObject;
    expect(Object.keys(ok.headers ?? {})).toEqual(expect.arrayContaining(['RateLimit', 'RateLimit-Policy', 'X-Request-Id']));
    const created = operation('/test-widgets', 'post').responses?.['201'] as OpenAPIV3_1.ResponseObject;
    expect(Object.keys(created.headers ?? {})).toContain('Idempotent-Replayed');
    const limited = document.components?.responses?.RateLimited as OpenAPIV3_1.ResponseObject;
    expect(Object.keys(limited.headers ?? {})).toEqual(expect.arrayContaining(['Retry-After', 'RateLimit', 'RateLimit-Policy']));
  });

  it('when a route is operational (health, readiness, metrics, docs, the document itself), it is hidden', () => {
    const paths = Object.keys(document.paths ?? {});
    for (const hidden of ['/healthz', '/readyz', '/metrics', '/docs', '/docs/', '/openapi.json']) expect(paths).not.toContain(hidden);
    expect(paths.every((path) => !path.startsWith('/docs'))).toBe(true);
  });

  it('when /docs is opened, the reference page loads its script from this server, not from a CDN', async () => {
    const redirect = await app.inject({ method: 'GET', url: '/docs' });
    const page = redirect.statusCode === 301 ? await app.inject({ method: 'GET', url: redirect.headers.location as string }) : redirect;
    expect(page.statusCode).toBe(200);
    expect(page.headers['content-type']).toMatch(/^text\/html/);
    const scripts = [...page.body.matchAll(/<script[^>]*src="([^"]+)"/g)].map((match) => match[1]!);
    expect(scripts.length).toBeGreaterThan(0);
    for (const src of scripts) {
      expect(src).not.toMatch(/^(https?:)?\/\//);
      const asset = await app.inject({ method: 'GET', url: new URL(src, 'http://local/docs/').pathname });
      expect(asset.statusCode).toBe(200);
      expect(asset.headers['content-type']).toMatch(/javascript/);
    }
    expect(page.body).toContain('/openapi.json');
    expect(page.body).not.toMatch(/<link[^>]+href="https?:/);
  });
});
