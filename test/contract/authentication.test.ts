import { request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import { sql } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext, type TestOrg, testServices } from '../helpers/harness.js';

let ctx: TestContext;
let org: TestOrg;
let reference401: { body: string; headers: Record<string, unknown> };

beforeAll(async () => {
  ctx = await createTestContext();
  org = await ctx.createOrg();
  const response = await ctx.request('GET', '/v1/customers');
  reference401 = { body: response.body, headers: response.headers };
});
afterAll(async () => ctx?.close());

async function expectUnauthorized(response: { statusCode: number; body: string; headers: Record<string, unknown> }) {
  expect(response.statusCode).toBe(401);
  expect(response.headers['www-authenticate']).toBe('Bearer');
  expect(response.body).toBe(reference401.body);
}

async function lastUsedAt(keyId: string): Promise<Date | null> {
  const result = await ctx.database.db.execute<{ last_used_ms: number | null }>(
    sql`SELECT (extract(epoch FROM last_used_at) * 1000)::float8 AS last_used_ms FROM api_keys WHERE id = ${keyId}`,
  );
  const ms = result.rows[0]!.last_used_ms;
  return ms === null ? null : new Date(ms);
}

describe('401 unauthorized', () => {
  it('when the Authorization header is missing, it answers 401 unauthorized with WWW-Authenticate: Bearer', async () => {
    const response = await ctx.request('GET', '/v1/customers');
    expect(response.statusCode).toBe(401);
    expect(response.headers['www-authenticate']).toBe('Bearer');
    expect(response.json()).toEqual({ error: { code: 'unauthorized', message: expect.any(String) } });
  });

  it.each([
    ['Basic scheme', (key: string) => `Basic ${Buffer.from(`user:${key}`).toString('base64')}`],
    ['Bearer alone', () => 'Bearer'],
    ['Bearer with an empty token', () => 'Bearer '],
    ['lowercase scheme with a non-key token', () => 'bearer x'],
    ['a tab before the token', (key: string) => `Bearer\t${key}`],
    ['two tokens', (key: string) => `Bearer ${key} ${key}`],
    ['the key without a scheme', (key: string) => key],
  ])('when the header is malformed (%s), it answers the same 401', async (_name, header) => {
    await expectUnauthorized(await ctx.request('GET', '/v1/customers', { headers: { authorization: header(org.key) } }));
  });

  it('when the scheme is written in lower case with a valid key, it is accepted (RFC 9110: schemes are case-insensitive)', async () => {
    const response = await ctx.request('GET', '/v1/customers', { headers: { authorization: `bearer ${org.key}` } });
    expect(response.statusCode).toBe(200);
  });

  it('when several spaces separate scheme and key, it is accepted (RFC 6750: "Bearer" 1*SP token)', async () => {
    const response = await ctx.request('GET', '/v1/customers', { headers: { authorization: `Bearer   ${org.key}` } });
    expect(response.statusCode).toBe(200);
  });

  it('when the key has the wrong prefix, it answers the same 401', async () => {
    const wrongPrefix = org.key.replace('svc_live_', 'svc_test_');
    await expectUnauthorized(await ctx.request('GET', '/v1/customers', { key: wrongPrefix }));
  });

  it('when the key is well-formed but unknown, it answers the same 401', async () => {
    const unknown = `svc_live_${'A'.repeat(40)}`;
    await expectUnauthorized(await ctx.request('GET', '/v1/customers', { key: unknown }));
  });

  it('when the key has expired, it answers the same 401', async () => {
    const expired = await ctx.createKey(org.id, { expiresAt: new Date(Date.now() - 1000) });
    await expectUnauthorized(await ctx.request('GET', '/v1/customers', { key: expired.key }));
  });

  it('when the key expires in the future, it is accepted', async () => {
    const live = await ctx.createKey(org.id, { expiresAt: new Date(Date.now() + 3_600_000) });
    expect((await ctx.request('GET', '/v1/customers', { key: live.key })).statusCode).toBe(200);
  });

  it('when the key has been revoked, it answers the same 401', async () => {
    const key = await ctx.createKey(org.id);
    expect((await ctx.request('GET', '/v1/customers', { key: key.key })).statusCode).toBe(200);
    await testServices(ctx.database).apiKeys.revoke(key.id);
    await expectUnauthorized(await ctx.request('GET', '/v1/customers', { key: key.key }));
  });

  it.each(['api_key', 'key', 'access_token'])(
    'when a valid key is passed in the query string (?%s=), it is never accepted',
    async (name) => {
      const response = await ctx.request('GET', '/v1/customers', { query: { [name]: org.key } });
      await expectUnauthorized(response);
    },
  );

  it('when a valid key is sent, it is accepted (the 401 cases above fail for their own reason)', async () => {
    expect((await ctx.request('GET', '/v1/customers', { key: org.key })).statusCode).toBe(200);
  });
});

/** A request over a real socket, so the headers are framed and parsed by Node as a client would send them. */
function socketRequest(
  port: number,
  headers: Record<string, string | string[]>,
): Promise<{ statusCode: number; body: string; headers: Record<string, unknown> }> {
  return new Promise((resolve, reject) => {
    const request = httpRequest({ host: '127.0.0.1', port, path: '/v1/customers', headers }, (response) => {
      let body = '';
      response.setEncoding('utf8');
      response.on('data', (chunk: string) => (body += chunk));
      response.on('end', () => resolve({ statusCode: response.statusCode ?? 0, body, headers: response.headers }));
    });
    request.on('error', reject);
    request.end();
  });
}

describe('repeated Authorization headers', () => {
  let port = 0;
  beforeAll(async () => {
    const server = await ctx.buildInstance();
    await server.listen({ port: 0, host: '127.0.0.1' });
    port = (server.server.address() as AddressInfo).port;
  });

  it.each([
    ['the same valid key twice', (key: string) => [`Bearer ${key}`, `Bearer ${key}`]],
    ['a valid key, then a bogus one', (key: string) => [`Bearer ${key}`, 'Bearer svc_live_bogus']],
    ['a bogus key, then a valid one', (key: string) => ['Bearer svc_live_bogus', `Bearer ${key}`]],
    ['a valid key and an empty header', (key: string) => [`Bearer ${key}`, '']],
  ])('when a request carries %s in two Authorization headers over a socket, it answers the same 401', async (_name, values) => {
    await expectUnauthorized(await socketRequest(port, { authorization: values(org.key) }));
  });

  it('when one Authorization header is sent over a socket, it is accepted (the refusal above is for the repetition)', async () => {
    expect((await socketRequest(port, { authorization: `Bearer ${org.key}` })).statusCode).toBe(200);
  });

  it('when two Authorization headers are injected, it answers the same 401', async () => {
    // Capitalised: the typed lower-case `authorization` field takes one string, an array means repeated lines.
    await expectUnauthorized(
      await ctx.app.inject({ method: 'GET', url: '/v1/customers', headers: { Authorization: [`Bearer ${org.key}`, `Bearer ${org.key}`] } }),
    );
  });
});

describe('HEAD requests', () => {
  it('when HEAD is sent without a key, it answers 401 (the implicit HEAD route is authenticated like its GET)', async () => {
    const response = await ctx.request('HEAD', '/v1/customers');
    expect(response.statusCode).toBe(401);
    expect(response.headers['www-authenticate']).toBe('Bearer');
  });

  it('when HEAD is sent with a key lacking the GET scope, it answers 403', async () => {
    const key = await ctx.createKey(org.id, { scopes: ['aml:read'] });
    expect((await ctx.request('HEAD', '/v1/customers', { key: key.key })).statusCode).toBe(403);
  });

  it('when HEAD is sent with a valid key, it answers 200 without a body', async () => {
    const response = await ctx.request('HEAD', '/v1/customers', { key: org.key });
    expect(response.statusCode).toBe(200);
    expect(response.body).toBe('');
  });
});

describe('revocation', () => {
  it('when a key is revoked, the very next request on a second app instance answers 401', async () => {
    const key = await ctx.createKey(org.id);
    const second = await ctx.buildInstance();
    expect((await ctx.request('GET', '/v1/customers', { key: key.key }, second)).statusCode).toBe(200);
    await testServices(ctx.database).apiKeys.revoke(key.id);
    await expectUnauthorized(await ctx.request('GET', '/v1/customers', { key: key.key }, second));
  });
});

describe('last_used_at', () => {
  it('when a key is used for the first time, it sets last_used_at', async () => {
    const key = await ctx.createKey(org.id);
    expect(await lastUsedAt(key.id)).toBeNull();
    const before = Date.now();
    await ctx.request('GET', '/v1/customers', { key: key.key });
    const used = await lastUsedAt(key.id);
    expect(used).toBeInstanceOf(Date);
    expect(Math.abs(used!.getTime() - before)).toBeLessThan(60_000);
  });

  it('when a key is used twice within a minute, it does not rewrite last_used_at', async () => {
    const key = await ctx.createKey(org.id);
    await ctx.request('GET', '/v1/customers', { key: key.key });
    const first = await lastUsedAt(key.id);
    await new Promise((resolve) => setTimeout(resolve, 20));
    await ctx.request('GET', '/v1/customers', { key: key.key });
    expect((await lastUsedAt(key.id))!.getTime()).toBe(first!.getTime());
  });

  it('when the last use is more than a minute old, it writes last_used_at again', async () => {
    const key = await ctx.createKey(org.id);
    await ctx.database.db.execute(sql`UPDATE api_keys SET last_used_at = now() - interval '2 minutes' WHERE id = ${key.id}`);
    const stale = await lastUsedAt(key.id);
    await ctx.request('GET', '/v1/customers', { key: key.key });
    expect((await lastUsedAt(key.id))!.getTime()).toBeGreaterThan(stale!.getTime() + 60_000);
  });

  it('when a request is refused (revoked key), it does not touch last_used_at', async () => {
    const key = await ctx.createKey(org.id);
    await testServices(ctx.database).apiKeys.revoke(key.id);
    await ctx.request('GET', '/v1/customers', { key: key.key });
    expect(await lastUsedAt(key.id)).toBeNull();
  });
});

describe('IP allowlist', () => {
  const allowIps = ['203.0.113.0/24', '2001:db8::/32'];

  it.each(['203.0.113.9', '2001:db8::1', '::ffff:203.0.113.9'])(
    'when the request comes from an allowed address (%s), it passes',
    async (address) => {
      const key = await ctx.createKey(org.id, { allowIps });
      const response = await ctx.request('GET', '/v1/customers', { key: key.key, remoteAddress: address });
      expect(response.statusCode).toBe(200);
    },
  );

  it.each(['198.51.100.1', '2001:db9::1', '127.0.0.1'])(
    'when the request comes from another address (%s), it answers the same 401',
    async (address) => {
      const key = await ctx.createKey(org.id, { allowIps });
      await expectUnauthorized(await ctx.request('GET', '/v1/customers', { key: key.key, remoteAddress: address }));
    },
  );

  it('when the client address cannot be parsed, no allowlist matches it (not even 0.0.0.0/0)', async () => {
    const key = await ctx.createKey(org.id, { allowIps: ['0.0.0.0/0', '::/0'] });
    await expectUnauthorized(await ctx.request('GET', '/v1/customers', { key: key.key, remoteAddress: 'not-an-address' }));
    expect((await ctx.request('GET', '/v1/customers', { key: key.key, remoteAddress: '198.51.100.1' })).statusCode).toBe(200);
  });

  it('when a key has no allowlist, any address may use it', async () => {
    const key = await ctx.createKey(org.id);
    expect((await ctx.request('GET', '/v1/customers', { key: key.key, remoteAddress: 'not-an-address' })).statusCode).toBe(200);
  });

  it('when a request is refused for its address, the key is neither touched nor charged', async () => {
    const key = await ctx.createKey(org.id, { allowIps });
    await ctx.request('GET', '/v1/customers', { key: key.key, remoteAddress: '198.51.100.1' });
    expect(await lastUsedAt(key.id)).toBeNull();
    const usage = await ctx.database.db.execute(sql`SELECT 1 FROM api_key_usage WHERE api_key_id = ${key.id}`);
    expect(usage.rows).toHaveLength(0);
  });

  it('when a key lacking the scope calls from a wrong address, it answers 401 (the IP check runs before scopes)', async () => {
    const key = await ctx.createKey(org.id, { allowIps, scopes: ['aml:read'] });
    await expectUnauthorized(await ctx.request('GET', '/v1/customers', { key: key.key, remoteAddress: '198.51.100.1' }));
    const allowed = await ctx.request('GET', '/v1/customers', { key: key.key, remoteAddress: '203.0.113.9' });
    expect(allowed.statusCode).toBe(403);
  });

  it('when a request from a trusted proxy carries X-Forwarded-For of an allowed client, it passes', async () => {
    const proxied = await ctx.buildInstance({ trustProxy: ['127.0.0.1'] });
    const key = await ctx.createKey(org.id, { allowIps });
    const response = await ctx.request(
      'GET',
      '/v1/customers',
      { key: key.key, remoteAddress: '127.0.0.1', headers: { 'x-forwarded-for': '203.0.113.9' } },
      proxied,
    );
    expect(response.statusCode).toBe(200);
  });

  it('when a trusted proxy forwards a disallowed client, it answers 401', async () => {
    const proxied = await ctx.buildInstance({ trustProxy: ['127.0.0.1'] });
    const key = await ctx.createKey(org.id, { allowIps });
    const response = await ctx.request(
      'GET',
      '/v1/customers',
      { key: key.key, remoteAddress: '127.0.0.1', headers: { 'x-forwarded-for': '198.51.100.1' } },
      proxied,
    );
    await expectUnauthorized(response);
  });

  it('when a client behind the trusted proxy puts a spoofed address in front of its real one, the address the proxy appended decides', async () => {
    const proxied = await ctx.buildInstance({ trustProxy: ['127.0.0.1'] });
    const key = await ctx.createKey(org.id, { allowIps });
    // The client sent "X-Forwarded-For: 203.0.113.9"; the proxy appended the address it saw.
    const spoofed = await ctx.request(
      'GET',
      '/v1/customers',
      { key: key.key, remoteAddress: '127.0.0.1', headers: { 'x-forwarded-for': '203.0.113.9, 198.51.100.1' } },
      proxied,
    );
    await expectUnauthorized(spoofed);
    const genuine = await ctx.request(
      'GET',
      '/v1/customers',
      { key: key.key, remoteAddress: '127.0.0.1', headers: { 'x-forwarded-for': '198.51.100.1, 203.0.113.9' } },
      proxied,
    );
    expect(genuine.statusCode).toBe(200);
  });

  it('when an untrusted socket sends a spoofed X-Forwarded-For, it changes nothing', async () => {
    const proxied = await ctx.buildInstance({ trustProxy: ['127.0.0.1'] });
    const key = await ctx.createKey(org.id, { allowIps });
    const response = await ctx.request(
      'GET',
      '/v1/customers',
      { key: key.key, remoteAddress: '198.51.100.7', headers: { 'x-forwarded-for': '203.0.113.9' } },
      proxied,
    );
    await expectUnauthorized(response);
  });

  it('when TRUST_PROXY is not configured, X-Forwarded-For is ignored even from localhost', async () => {
    const key = await ctx.createKey(org.id, { allowIps });
    const response = await ctx.request('GET', '/v1/customers', {
      key: key.key,
      remoteAddress: '127.0.0.1',
      headers: { 'x-forwarded-for': '203.0.113.9' },
    });
    await expectUnauthorized(response);
  });
});
