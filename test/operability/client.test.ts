import { execFile, spawn } from 'node:child_process';
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import vm from 'node:vm';
// esbuild comes with tsx (a dependency) and vite: the bundler a browser project would use.
import { build } from 'esbuild';
import type { FastifyInstance } from 'fastify';
import type { Client } from 'openapi-fetch';
import openapiTS, { astToString } from 'openapi-typescript';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { createVerificationClient } from '../../clients/typescript/client.js';
import { apiModules } from '../../src/modules/index.js';
import { ROUTE_SCOPES } from '../../src/plugins/route-scopes.js';
import { type Scope } from '../../src/shared/scopes.js';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { findChromium } from '../helpers/chromium.js';

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
      return {
        name: (request.body as { name: string }).name,
        idempotencyKey: (request.headers['idempotency-key'] as string | undefined) ?? null,
      };
    },
  );
};
const scopes = ROUTE_SCOPES as Record<string, Scope | null>;

const ROOT = join(import.meta.dirname, '..', '..');
const CLIENT_DIR = join(ROOT, 'clients', 'typescript');
const TSC = join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc');
const CHROMIUM = findChromium();

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
    const chosen = await client(org.key).POST('/client-probe', {
      body: { name: 'second' },
      params: { header: { 'Idempotency-Key': 'my-key-1' } },
    });
    expect(chosen.data).toEqual({ name: 'second', idempotencyKey: 'my-key-1' });
    const replay = await client(org.key).POST('/client-probe', {
      body: { name: 'second' },
      params: { header: { 'Idempotency-Key': 'my-key-1' } },
    });
    expect(replay.response.headers.get('idempotent-replayed')).toBe('true');
  });

  it('when a NodeNext project compiles the README example verbatim, it type-checks: the import carries .js and `limit` is a number', async () => {
    const example = readmeClientExample();
    expect(example).toContain("from './clients/typescript/client.js'");
    expect(example).toMatch(/limit: \d+/);
    const dir = consumerProject({ 'package.json': '{ "type": "module" }\n', 'example.ts': example });
    try {
      const args = [
        '--strict',
        '--module',
        'nodenext',
        '--moduleResolution',
        'nodenext',
        '--target',
        'es2022',
        '--types',
        'node',
        '--skipLibCheck',
        'example.ts',
      ];
      expect(await typecheck(dir, args)).toBe('');
      // And the type is what catches a string: `limit: '100'` no longer compiles.
      writeFileSync(join(dir, 'example.ts'), example.replace(/limit: (\d+)/, "limit: '$1'"));
      expect(await typecheck(dir, args)).toMatch(/error TS2322: Type 'string' is not assignable to type 'number'/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 120_000);

  it('when a browser project type-checks the client (DOM library, no Node types), it compiles: no Node built-in is imported', async () => {
    const tsconfig = {
      compilerOptions: {
        strict: true,
        noEmit: true,
        target: 'ES2022',
        module: 'ESNext',
        moduleResolution: 'Bundler',
        lib: ['ES2022', 'DOM'],
        types: [],
        skipLibCheck: true,
      },
      files: ['clients/typescript/client.ts'],
    };
    const dir = consumerProject({ 'tsconfig.json': JSON.stringify(tsconfig) });
    try {
      expect(await typecheck(dir, ['-p', 'tsconfig.json'])).toBe('');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 120_000);

  it('when bundled for the browser and run where only web globals exist (no require, process or Buffer), it calls the API', async () => {
    // esbuild refuses a Node built-in (node:crypto …) on the browser platform, so this is the first check.
    const { code, inputs } = await browserBundle();
    expect(inputs.filter((input) => input.startsWith('node:') || !/\.(ts|js|mjs|cjs)$/.test(input))).toEqual([]);
    const { client: bundled, nodeGlobals } = runInBrowserLikeContext(code, globalThis.crypto);
    expect(nodeGlobals).toBe('undefined,undefined,undefined,undefined,undefined');

    const api = bundled.createVerificationClient({ baseUrl, apiKey: org.key }) as unknown as Client<ProbePaths>;
    const got = await api.GET('/client-probe/{id}', { params: { path: { id: 'from-a-browser' } } });
    expect(got.response.status).toBe(200);
    expect(JSON.parse(JSON.stringify(got.data))).toEqual({ id: 'from-a-browser', org: org.id });
    const posted = await api.POST('/client-probe', { body: { name: 'bundled' } });
    expect(posted.response.status).toBe(201);
    expect(posted.data?.idempotencyKey).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
  });

  it('when the page is not a secure context (no crypto.randomUUID), Idempotency-Keys are still random version-4 UUIDs', async () => {
    const { code } = await browserBundle();
    const insecure: WebCrypto = { getRandomValues: (array) => globalThis.crypto.getRandomValues(array) };
    const { client: bundled } = runInBrowserLikeContext(code, insecure);
    const keys = Array.from({ length: 1000 }, () => bundled.randomUUID());
    for (const key of keys) expect(key).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    expect(new Set(keys).size).toBe(keys.length);
    const api = bundled.createVerificationClient({ baseUrl, apiKey: org.key }) as unknown as Client<ProbePaths>;
    const posted = await api.POST('/client-probe', { body: { name: 'insecure-context' } });
    expect(posted.data?.idempotencyKey).toMatch(/^[0-9a-f-]{36}$/);
  });

  it.skipIf(!CHROMIUM)(
    'when the bundled client runs in a headless Chromium page, it reads and posts through the API',
    async () => {
      const { code } = await browserBundle();
      const page = `<!doctype html><meta charset="utf-8"><title>client</title><script src="/client.js"></script>
<script type="module">
  const report = (value) => fetch('/result', { method: 'POST', body: JSON.stringify(value) });
  try {
    const api = VerificationClient.createVerificationClient({ baseUrl: location.origin + '/v1', apiKey: ${JSON.stringify(org.key)} });
    const got = await api.GET('/client-probe/{id}', { params: { path: { id: 'chromium' } } });
    const posted = await api.POST('/client-probe', { body: { name: 'chromium' } });
    await report({ got: got.data, posted: posted.data, status: [got.response.status, posted.response.status], secure: isSecureContext, userAgent: navigator.userAgent, process: typeof process });
  } catch (error) {
    await report({ error: String(error && error.stack || error) });
  }
</script>`;
      const origin = await pageOrigin(page, code, baseUrl.replace(/\/v1$/, ''));
      const profile = mkdtempSync(join(tmpdir(), 'chromium-'));
      const browser = spawn(
        CHROMIUM!,
        ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', `--user-data-dir=${profile}`, origin.url],
        { stdio: 'ignore', detached: true },
      );
      try {
        const timeout = new Promise<never>((_, reject) =>
          setTimeout(() => reject(new Error('the page reported nothing within 60 s')), 60_000).unref(),
        );
        const result = JSON.parse(await Promise.race([origin.result, timeout]));
        expect(result.error).toBeUndefined();
        expect(result.userAgent).toMatch(/Chrom/);
        expect(result.process).toBe('undefined');
        expect(result.status).toEqual([200, 201]);
        expect(result.got).toEqual({ id: 'chromium', org: org.id });
        expect(result.posted).toEqual({
          name: 'chromium',
          idempotencyKey: expect.stringMatching(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/),
        });
      } finally {
        // Its renderer and helper processes too (they share its process group), or they keep writing the profile.
        try {
          process.kill(-browser.pid!, 'SIGKILL');
        } catch {
          browser.kill('SIGKILL');
        }
        await new Promise((resolve) =>
          browser.exitCode !== null || browser.signalCode !== null ? resolve(undefined) : browser.once('exit', resolve),
        );
        await origin.close();
        rmSync(profile, { recursive: true, force: true, maxRetries: 10, retryDelay: 100 });
      }
    },
    90_000,
  );

  it('when the key is refused, the error envelope comes back as `error`', async () => {
    const { data, error, response } = await client('svc_live_not-a-real-key-000000000000000').POST('/client-probe', {
      body: { name: 'x' },
    });
    expect(data).toBeUndefined();
    expect(response.status).toBe(401);
    expect(error).toEqual({ error: { code: 'unauthorized', message: expect.any(String) } });
  });
});

/** The first ```ts block of the README's "Typed client" section, as an integrator would paste it. */
function readmeClientExample(): string {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
  const section = readme.slice(readme.indexOf('### Typed client'));
  const match = /```ts\n([\s\S]*?)```/.exec(section);
  expect(match, 'the README has no ```ts example under "Typed client"').not.toBeNull();
  return match![1]!;
}

/**
 * A consumer project in a temporary directory: the client folder copied in (as the README says),
 * the packages installed (this checkout's node_modules), `files` written. Removed by the caller.
 */
function consumerProject(files: Record<string, string>): string {
  const dir = mkdtempSync(join(tmpdir(), 'client-consumer-'));
  mkdirSync(join(dir, 'clients', 'typescript'), { recursive: true });
  for (const name of ['client.ts', 'schema.d.ts']) copyFileSync(join(CLIENT_DIR, name), join(dir, 'clients', 'typescript', name));
  symlinkSync(join(ROOT, 'node_modules'), join(dir, 'node_modules'), 'dir');
  for (const [name, text] of Object.entries(files)) writeFileSync(join(dir, name), text);
  return dir;
}

async function typecheck(dir: string, args: string[]): Promise<string> {
  try {
    await promisify(execFile)(process.execPath, [TSC, '--noEmit', '--pretty', 'false', ...args], { cwd: dir });
    return '';
  } catch (error) {
    return String((error as { stdout?: string }).stdout ?? error);
  }
}

/** The client bundled for a browser: one script defining the global `VerificationClient`. */
async function browserBundle(): Promise<{ code: string; inputs: string[] }> {
  const result = await build({
    entryPoints: [join(CLIENT_DIR, 'client.ts')],
    bundle: true,
    platform: 'browser',
    format: 'iife',
    globalName: 'VerificationClient',
    target: 'es2020',
    write: false,
    metafile: true,
    logLevel: 'silent',
  });
  return { code: result.outputFiles[0]!.text, inputs: Object.keys(result.metafile.inputs) };
}

type BundledClient = { createVerificationClient: typeof createVerificationClient; randomUUID(): string };

/** Runs the bundle in a fresh V8 context holding only what a browser page has (no require, process, Buffer…). */
type WebCrypto = { getRandomValues: typeof globalThis.crypto.getRandomValues; randomUUID?: () => string };

function runInBrowserLikeContext(code: string, webCrypto: WebCrypto) {
  const context = vm.createContext({
    fetch,
    Request,
    Response,
    Headers,
    FormData,
    Blob,
    URL,
    URLSearchParams,
    AbortController,
    AbortSignal,
    TextEncoder,
    TextDecoder,
    setTimeout,
    clearTimeout,
    console,
    crypto: webCrypto,
  });
  vm.runInContext(code, context, { filename: 'client.browser.js' });
  const nodeGlobals = vm.runInContext("[typeof require, typeof process, typeof Buffer, typeof module, typeof global].join(',')", context);
  return { client: (context as unknown as { VerificationClient: BundledClient }).VerificationClient, nodeGlobals: nodeGlobals as string };
}

/**
 * One origin for a browser page and the API, as a deployment behind a proxy gives it (the API sends
 * no CORS headers): `/` is `page`, `/client.js` the bundle, `/v1/…` is passed to the API, and the
 * page POSTs its findings to `/result`.
 */
async function pageOrigin(page: string, bundle: string, apiOrigin: string) {
  let report!: (body: string) => void;
  const result = new Promise<string>((resolve) => (report = resolve));
  const forward = async (request: IncomingMessage, response: ServerResponse) => {
    const chunks: Buffer[] = [];
    for await (const chunk of request) chunks.push(chunk as Buffer);
    const body = Buffer.concat(chunks);
    if (request.url === '/') return response.writeHead(200, { 'content-type': 'text/html; charset=utf-8' }).end(page);
    if (request.url === '/client.js') return response.writeHead(200, { 'content-type': 'text/javascript; charset=utf-8' }).end(bundle);
    if (request.url === '/result') {
      report(body.toString('utf8'));
      return response.writeHead(204).end();
    }
    if (!request.url?.startsWith('/v1/')) return response.writeHead(404).end();
    const headers = new Headers();
    for (const [name, value] of Object.entries(request.headers)) {
      if (typeof value === 'string' && !['host', 'connection', 'origin', 'referer'].includes(name)) headers.set(name, value);
    }
    const upstream = await fetch(`${apiOrigin}${request.url}`, { method: request.method, headers, body: body.length ? body : undefined });
    const forwarded: Record<string, string> = {};
    upstream.headers.forEach((value, name) => {
      if (!['content-encoding', 'content-length', 'transfer-encoding', 'connection'].includes(name)) forwarded[name] = value;
    });
    response.writeHead(upstream.status, forwarded).end(Buffer.from(await upstream.arrayBuffer()));
  };
  const server: Server = createServer((request, response) => void forward(request, response));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as { port: number }).port}/`,
    result,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}
