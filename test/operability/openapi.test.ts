import { execFile, spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { Validator } from '@seriousme/openapi-schema-validator';
import Fastify, { type FastifyInstance } from 'fastify';
import { serializerCompiler, validatorCompiler } from 'fastify-type-provider-zod';
import type { OpenAPIV3_1 } from 'openapi-types';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { buildApp } from '../../src/app.js';
import { loadConfig } from '../../src/config/config.js';
import { createDatabase, type Database } from '../../src/db/client.js';
import { apiModules } from '../../src/modules/index.js';
import { generateOpenApiDocument, serializeOpenApiDocument } from '../../src/plugins/openapi-document.js';
import { API_TITLE, openapiPlugin } from '../../src/plugins/openapi.plugin.js';
import { ROUTE_SCOPES } from '../../src/plugins/route-scopes.js';
import { type Scope } from '../../src/shared/scopes.js';
import { errorEnvelopeSchema } from '../../src/shared/error-envelope.schema.js';
import { findChromium } from '../helpers/chromium.js';

const ROOT = join(import.meta.dirname, '..', '..');
const COMMITTED = join(ROOT, 'openapi', 'openapi.json');
const COMMITTED_CLIENT = join(ROOT, 'clients', 'typescript', 'schema.d.ts');
const CHROMIUM = findChromium();

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
        walk(body.schema, `${where} body`, new Set());
        if (!JSON.stringify(body).includes('"example')) withoutExample.push(`${where} body`);
      }
      for (const [status, response] of Object.entries(operation.responses ?? {})) {
        const content = (response as OpenAPIV3_1.ResponseObject).content?.['application/json'];
        if (!status.startsWith('2') || !content) continue;
        walk(content.schema, `${where} ${status}`, new Set());
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

  it('when a newcomer reads it, it is titled with the API name and bearer authentication applies to the whole document', () => {
    const document = JSON.parse(readFileSync(COMMITTED, 'utf8')) as OpenAPIV3_1.Document;
    expect(document.info.title).toBe(API_TITLE);
    // Without a top-level requirement the reference page says "No authentication selected".
    expect(document.security).toEqual([{ bearerAuth: [] }]);
    for (const [where, operation] of operationsOf(document)) {
      expect(operation.security, where).toEqual([{ bearerAuth: expect.any(Array) }]);
    }
  });

  it('when a newcomer reads it, every tag an operation uses is declared with a description', () => {
    const document = JSON.parse(readFileSync(COMMITTED, 'utf8')) as OpenAPIV3_1.Document;
    const used = new Set(operationsOf(document).flatMap(([, operation]) => operation.tags ?? []));
    expect(used.size).toBeGreaterThan(3);
    const declared = new Map((document.tags ?? []).map((tag) => [tag.name, tag.description ?? '']));
    for (const tag of used) expect(declared.get(tag), `tag ${tag}`).toMatch(/\w{3,}.{40,}/);
  });

  it('when an error status is documented, its description names every error code the code base answers it with', () => {
    const document = JSON.parse(readFileSync(COMMITTED, 'utf8')) as OpenAPIV3_1.Document;
    const codesByStatus = appErrorCodesByStatus();
    // Sanity: the scan finds the codes of the spec's error table.
    expect(codesByStatus.get('409')).toEqual(new Set(['conflict', 'idempotency_conflict', 'record_locked']));
    expect(codesByStatus.get('403')).toEqual(new Set(['forbidden_scope', 'feature_disabled']));
    const responses = (document.components?.responses ?? {}) as Record<string, OpenAPIV3_1.ResponseObject>;
    const problems: string[] = [];
    let checked = 0;
    for (const [where, operation] of operationsOf(document)) {
      for (const [status, value] of Object.entries(operation.responses ?? {})) {
        if (!/^4\d\d$/.test(status)) continue;
        const response = '$ref' in value ? responses[value.$ref.split('/').pop()!]! : value;
        const expected = codesByStatus.get(status);
        if (!expected) {
          problems.push(`${where} ${status}: no AppError in src/ answers this status`);
          continue;
        }
        for (const code of expected) {
          checked += 1;
          if (!response.description.includes(`\`${code}\``))
            problems.push(`${where} ${status}: "${response.description}" does not name \`${code}\``);
        }
      }
    }
    expect(checked).toBeGreaterThan(100);
    expect(problems).toEqual([]);
  });

  it('when a list is read, `limit` is an integer from 1 to 100 (default 50), not a string', () => {
    const document = JSON.parse(readFileSync(COMMITTED, 'utf8')) as OpenAPIV3_1.Document;
    const limits = operationsOf(document).flatMap(([where, operation]) =>
      ((operation.parameters ?? []) as OpenAPIV3_1.ParameterObject[])
        .filter((p) => p.in === 'query' && p.name === 'limit')
        .map((p) => [where, p.schema] as const),
    );
    expect(limits.map(([where]) => where).sort()).toEqual([
      'GET /audit-events',
      'GET /customers',
      'GET /customers/{id}/reviews',
      'GET /entities',
      'GET /entities/{id}/reviews',
      'GET /events',
      'GET /imports',
      'GET /imports/{id}/rows',
      'GET /webhook-endpoints',
      'GET /webhook-endpoints/{id}/deliveries',
    ]);
    for (const [, schema] of limits) expect(schema).toEqual({ type: 'integer', minimum: 1, maximum: 100, default: 50 });
  });
});

const HTTP_METHODS = ['get', 'put', 'post', 'delete', 'patch'] as const;

function operationsOf(document: OpenAPIV3_1.Document): Array<[string, OpenAPIV3_1.OperationObject]> {
  return Object.entries(document.paths ?? {}).flatMap(([path, item]) =>
    HTTP_METHODS.filter((method) => item?.[method]).map(
      (method) => [`${method.toUpperCase()} ${path}`, item![method]!] as [string, OpenAPIV3_1.OperationObject],
    ),
  );
}

/** Every `new AppError('code', status` (and error subclass `super('code', status`) in src/, by status. */
function appErrorCodesByStatus(): Map<string, Set<string>> {
  const byStatus = new Map<string, Set<string>>();
  const walk = (dir: string): string[] =>
    readdirSync(dir).flatMap((name) => {
      const path = join(dir, name);
      return statSync(path).isDirectory() ? walk(path) : path.endsWith('.ts') && !path.endsWith('.test.ts') ? [path] : [];
    });
  for (const file of walk(join(ROOT, 'src'))) {
    for (const match of readFileSync(file, 'utf8').matchAll(/(?:new AppError|super)\(\s*'([a-z_]+)',\s*(\d{3})\b/g)) {
      const [, code, status] = match as unknown as [string, string, string];
      if (!byStatus.has(status)) byStatus.set(status, new Set());
      byStatus.get(status)!.add(code);
    }
  }
  return byStatus;
}

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
    const result = await new Validator().validate(document);
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
    expect(Object.keys(post.responses ?? {})).toEqual(['201', '400', '401', '402', '403', '409', '413', '415', '422', '429', '500', '503']);
    // No path parameter, no input, no body: no 404, 422 or 400; open to any valid key: no 403.
    expect(Object.keys(operation('/test-catalog', 'get').responses ?? {})).toEqual(['200', '401', '429', '500', '503']);
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
    expect(document.components?.parameters?.IdempotencyKey).toMatchObject({
      in: 'header',
      name: 'Idempotency-Key',
      schema: { maxLength: 255 },
    });
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

  it("when /docs is opened, the page is titled with the API name and configured without Scalar's hosted-service buttons", async () => {
    const page = await app.inject({ method: 'GET', url: '/docs/' });
    expect(page.statusCode).toBe(200);
    expect(page.body).toMatch(new RegExp(`<title>${API_TITLE}\\b[^<]*</title>`));
    const configuration = servedReferenceConfiguration(page.body);
    expect(configuration).toMatchObject({
      url: '/openapi.json',
      metaData: { title: expect.stringContaining(API_TITLE) },
      // "Open API Client", "Ask AI", "Generate MCP" and the developer toolbar (Deploy, Share …) are
      // Scalar's hosted services, on by default when the page is opened on localhost.
      hideClientButton: true,
      agent: { disabled: true },
      mcp: { disabled: true },
      showDeveloperTools: 'never',
      telemetry: false,
      withDefaultFonts: false,
      authentication: { preferredSecurityScheme: 'bearerAuth' },
    });
  });

  it('when GET / is opened, it answers a JSON index whose links (the reference page, the document) resolve', async () => {
    const response = await app.inject({ method: 'GET', url: '/' });
    expect(response.statusCode).toBe(200);
    expect(response.headers['content-type']).toMatch(/^application\/json/);
    const index = response.json();
    expect(index).toMatchObject({ name: API_TITLE, version: document.info.version, api_base_path: document.servers?.[0]?.url });
    expect(index.links).toEqual({ docs: expect.stringMatching(/^\/docs\/?$/), openapi: '/openapi.json' });
    const docs = await app.inject({ method: 'GET', url: index.links.docs });
    expect(docs.statusCode).toBe(200);
    expect(docs.headers['content-type']).toMatch(/^text\/html/);
    const openapi = await app.inject({ method: 'GET', url: index.links.openapi });
    expect(openapi.statusCode).toBe(200);
    expect(openapi.json()).toEqual(document);
    // Not part of the API: not in the document, no key needed.
    expect(Object.keys(document.paths ?? {})).not.toContain('/');
  });

  it.skipIf(!CHROMIUM)(
    'when /docs is rendered by a headless Chromium on localhost, it shows the API and bearer authentication and no hosted-service button',
    async () => {
      await app.listen({ port: 0, host: '127.0.0.1' });
      const url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}/docs/`;
      const dom = await renderInChromium(url);
      expect(dom).toMatch(new RegExp(`<title>${API_TITLE}\\b[^<]*</title>`));
      const text = dom
        .replace(/<style[\s\S]*?<\/style>|<script[\s\S]*?<\/script>/g, ' ')
        .replace(/<[^>]+>/g, ' ')
        .replace(/\s+/g, ' ');
      // Rendered: the document's operations and its bearer scheme, selected.
      expect(text).toContain('AML block of an individual');
      expect(text).toMatch(/Auth Type: bearerAuth|Bearer Token/);
      expect(text).not.toContain('No authentication selected');
      for (const button of [/\bAsk AI\b/, /\bGenerate MCP\b/, /\bDeploy\b/, /\bShare\b/, /Open API Client/])
        expect(text).not.toMatch(button);
    },
    90_000,
  );
});

describe('operations outside /v1', () => {
  it('when a route outside /v1 is documented, it needs no key: its operation overrides the document-wide security with []', async () => {
    const app = Fastify({ logger: false });
    app.setValidatorCompiler(validatorCompiler);
    app.setSerializerCompiler(serializerCompiler);
    await app.register(openapiPlugin);
    app.get('/status-page', { schema: { response: { 200: z.object({ ok: z.boolean() }) } } }, async () => ({ ok: true }));
    await app.ready();
    const document = app.swagger() as OpenAPIV3_1.Document;
    expect(document.security).toEqual([{ bearerAuth: [] }]);
    expect(document.paths?.['/status-page']?.get?.security).toEqual([]);
    await app.close();
  });
});

/** The configuration object the page hands to `createApiReference('#app', …)`, as served. */
function servedReferenceConfiguration(html: string): Record<string, unknown> {
  const match = /createApiReference\(\s*['"]#app['"]\s*,\s*(\{[\s\S]*?\})\s*\)\s*<\/script>/.exec(html);
  expect(match, 'the /docs page no longer calls createApiReference with a JSON configuration').not.toBeNull();
  return JSON.parse(match![1]!) as Record<string, unknown>;
}

/** The page's DOM once its scripts have run (and fetched what they fetch), from a headless Chromium. */
async function renderInChromium(url: string): Promise<string> {
  const profile = mkdtempSync(join(tmpdir(), 'chromium-'));
  try {
    const child = spawn(
      CHROMIUM!,
      [
        '--headless',
        '--no-sandbox',
        '--disable-gpu',
        '--no-first-run',
        `--user-data-dir=${profile}`,
        '--virtual-time-budget=20000',
        '--dump-dom',
        url,
      ],
      { stdio: ['ignore', 'pipe', 'ignore'] },
    );
    let dom = '';
    child.stdout.setEncoding('utf8').on('data', (chunk: string) => (dom += chunk));
    const timer = setTimeout(() => child.kill('SIGKILL'), 60_000);
    await new Promise<void>((resolve, reject) => {
      child.once('error', reject);
      child.once('close', () => resolve());
    });
    clearTimeout(timer);
    return dom;
  } finally {
    rmSync(profile, { recursive: true, force: true, maxRetries: 10, retryDelay: 100 });
  }
}
