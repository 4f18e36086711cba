import { createHash } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { createTestContext, type TestContext, testServices } from '../helpers/harness.js';
import { runSvcInProcess } from '../helpers/cli-in-process.js';

// The svc commands run in this process (runSvcInProcess).
vi.setConfig({ testTimeout: 120_000 });

let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

const KEY_FORMAT = /^svc_live_[0-9A-Za-z]{32,}$/;

async function createOrgId(): Promise<string> {
  const { id } = await ctx.createOrg();
  return id;
}

describe('API key creation and storage', () => {
  it('when a key is created with svc, only its SHA-256 hash and a short display prefix are stored', async () => {
    const orgId = await createOrgId();
    const result = await runSvcInProcess(['key', 'create', '--org', orgId, '--scopes', 'customers:read', '--label', 'storage check'], {
      DATABASE_URL: ctx.databaseUrl,
    });
    expect(result.code).toBe(0);
    const created = JSON.parse(result.stdout) as { id: string; key: string; prefix: string };
    expect(created.key).toMatch(KEY_FORMAT);
    const secret = created.key.slice('svc_live_'.length);

    const { rows } = await ctx.database.pool.query('SELECT * FROM api_keys WHERE id = $1', [created.id]);
    expect(rows).toHaveLength(1);
    const row = rows[0] as Record<string, unknown>;
    expect(row.key_hash).toBe(createHash('sha256').update(created.key).digest('hex'));
    expect(row.display_prefix).toBe(created.prefix);
    expect(created.key.startsWith(String(row.display_prefix))).toBe(true);
    expect(String(row.display_prefix).length).toBeLessThanOrEqual('svc_live_'.length + 4);
    // No column, in any representation, holds the plaintext or a meaningful part of its secret.
    const stored = JSON.stringify(row);
    expect(stored).not.toContain(created.key);
    expect(stored).not.toContain(secret.slice(0, 12));
    expect(stored).not.toContain(secret.slice(-12));
  });

  it('when a key is created, its plaintext is svc_live_ plus at least 32 base62 characters and differs every time', async () => {
    const orgId = await createOrgId();
    const keys = testServices(ctx.database).apiKeys;
    const created = await Promise.all(Array.from({ length: 20 }, () => keys.create({ orgId, scopes: ['customers:read'] })));
    for (const key of created) expect(key.key).toMatch(KEY_FORMAT);
    expect(new Set(created.map((key) => key.key)).size).toBe(created.length);
    // 20 keys of 40 random base62 characters use far more of the alphabet than a biased generator would.
    const alphabet = new Set(created.flatMap((key) => [...key.key.slice('svc_live_'.length)]));
    expect(alphabet.size).toBeGreaterThan(55);
  });

  it('when keys are read back (list, revoke), the plaintext is never returned again', async () => {
    const orgId = await createOrgId();
    const keys = testServices(ctx.database).apiKeys;
    const created = await keys.create({ orgId, scopes: ['customers:read'] });
    const listed = await keys.list(orgId);
    const revoked = await keys.revoke(created.id);
    for (const view of [...listed, revoked]) {
      expect(view).not.toHaveProperty('key');
      expect(JSON.stringify(view)).not.toContain(created.key);
    }
  });

  it('when a key is revoked, revoked_at is stored and a second revoke keeps the first time', async () => {
    const orgId = await createOrgId();
    const keys = testServices(ctx.database).apiKeys;
    const created = await keys.create({ orgId, scopes: ['customers:read'] });
    const revoked = await keys.revoke(created.id);
    const { rows } = await ctx.database.pool.query('SELECT revoked_at FROM api_keys WHERE id = $1', [created.id]);
    expect(rows[0].revoked_at).toBeInstanceOf(Date);
    expect((rows[0].revoked_at as Date).toISOString()).toBe(revoked.revoked_at);
    expect((await keys.revoke(created.id)).revoked_at).toBe(revoked.revoked_at);
  });
});
