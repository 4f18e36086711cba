import type { FastifyInstance } from 'fastify';
import type { Client } from 'openapi-fetch';
import openapiTS, { astToString } from 'openapi-typescript';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { createVerificationClient } from '../../clients/typescript/client.js';
import { apiModules } from '../../src/modules/index.js';
import { ROUTE_SCOPES, type Scope } from '../../src/plugins/route-scopes.js';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';

/** v1 routes of this test only: they answer with what the client sent. */
const probeRoutes = async (app: FastifyInstance) => {
  app.get(
    '/client-probe/:id',
    { schema: { params: z.object({ id: z.string() }), response: { 200: z.object({ id: z.string(), org: z.string() }).strict() } } },
    async (request) => ({ id: (request.params as { id: string }).id, org: request.auth.orgId }),
  );
  app.post(
    '/client-probe',
    {
      schema: {
        body: z.object({ name: z.string() }).strict(),
        response: { 201: z.object({ name: z.string(), idempotencyKey: z.string().nullable() }).strict() },
      },
    },
    // Returns its body (the idempotency layer stores what the handler returns).
    async (request, reply) => {
      reply.code(201);
      return { name: (request.body as { name: string }).name, idempotencyKey: (request.headers['idempotency-key'] as string | undefined) ?? null };
    },
  );
};
const scopes = ROUTE_SCOPES as Record<string, Scope | null>;

/** The shape openapi-typescript generates for the two probe routes (the committed schema has no such paths). */
type ProbePaths = {
  '/client-probe/{id}': {
    get: {
      parameters: { path: { id: string } };
      responses: { 200: { content: { 'application/json': { id: string; org: string } } } };
    };
  };
  '/client-probe': {
    post: {
      parameters: { header?: { 'Idempotency-Key'?: string } };
      requestBody: { content: { 'application/json': { name: string } } };
      responses: {
        201: { content: { 'application/json': { name: string; idempotencyKey: string | null } } };
        401: { content: { 'application/json': { error: { code: string; message: string } } } };
      };
    };
  };
};

let ctx: TestContext;
let org: TestOrg;
let app: FastifyInstance;
let baseUrl: string;
beforeAll(async () => {
  scopes['GET /v1/client-probe/:id'] = null;
  scopes['POST /v1/client-probe'] = null;
  apiModules.push(probeRoutes);
  ctx = await createTestContext();
  org = await ctx.createOrg();
  app = await ctx.buildInstance();
  await app.listen({ port: 0, host: '127.0.0.1' });
  baseUrl = `http://127.0.0.1:${(app.server.address() as { port: number }).port}/v1`;
});
afterAll(async () => {
  apiModules.splice(apiModules.indexOf(probeRoutes), 1);
  delete scopes['GET /v1/client-probe/:id'];
  delete scopes['POST /v1/client-probe'];
  await ctx?.close();
});

const client = (apiKey: string) => createVerificationClient({ baseUrl, apiKey }) as unknown as Client<ProbePaths>;

describe('typed client (clients/typescript)', () => {
  it('when the served document is turned into types, every v1 operation is there with its path parameters', async () => {
    const document = (await ctx.request('GET', '/openapi.json', {}, app)).json();
    const source = astToString(await openapiTS(document));
    expect(source).toContain('"/client-probe/{id}": {');
    expect(source).toMatch(/path: \{\s*id: string;/);
    expect(source).toContain('"Idempotency-Key"?: components["parameters"]["IdempotencyKey"]');
  });

  it('when calling a path of the document, it sends the key to base URL + path and returns the typed body', async () => {
    const { data, error, response } = await client(org.key).GET('/client-probe/{id}', { params: { path: { id: 'abc' } } });
    expect(error).toBeUndefined();
    expect(response.status).toBe(200);
    expect(data).toEqual({ id: 'abc', org: org.id });
  });

  it('when posting without an Idempotency-Key, it adds one; a key the caller sets is kept', async () => {
    const generated = await client(org.key).POST('/client-probe', { body: { name: 'first' } });
    expect(generated.data?.idempotencyKey).toMatch(/^[0-9a-f-]{36}$/);
    const chosen = await client(org.key).POST('/client-probe', { body: { name: 'second' }, params: { header: { 'Idempotency-Key': 'my-key-1' } } });
    expect(chosen.data).toEqual({ name: 'second', idempotencyKey: 'my-key-1' });
    const replay = await client(org.key).POST('/client-probe', { body: { name: 'second' }, params: { header: { 'Idempotency-Key': 'my-key-1' } } });
    expect(replay.response.headers.get('idempotent-replayed')).toBe('true');
  });

  it('when the key is refused, the error envelope comes back as `error`', async () => {
    const { data, error, response } = await client('svc_live_not-a-real-key-000000000000000').POST('/client-probe', { body: { name: 'x' } });
    expect(data).toBeUndefined();
    expect(response.status).toBe(401);
    expect(error).toEqual({ error: { code: 'unauthorized', message: expect.any(String) } });
  });
});
