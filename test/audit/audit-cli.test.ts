import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { createAuditChainSealer, type AuditChainSealer } from '../../src/modules/audit/audit-chain.sealer.js';
import { createTestContext, type TestContext } from '../helpers/harness.js';
import { type SvcResult } from '../helpers/svc-process.js';
import { runSvcInProcess } from '../helpers/cli-in-process.js';

// The svc commands run in this process (runSvcInProcess).
vi.setConfig({ testTimeout: 120_000 });

let ctx: TestContext;
let sealer: AuditChainSealer;
beforeAll(async () => {
  ctx = await createTestContext();
  sealer = createAuditChainSealer({ database: ctx.database, pollIntervalMs: 60_000 });
});
afterAll(async () => {
  await sealer?.stop();
  await ctx?.close();
});

function svc(...args: string[]): Promise<SvcResult> {
  return runSvcInProcess(args, { DATABASE_URL: ctx.databaseUrl });
}

/** An organisation with a few changes, all sealed. */
async function sealedOrganisation() {
  const org = await ctx.createOrg();
  for (const n of [1, 2, 3]) {
    const created = await ctx.request('POST', '/v1/customers', {
      key: org.key,
      body: { fullName: `Person ${n}`, email: `p${n}@example.com` },
    });
    expect(created.statusCode).toBe(201);
  }
  await sealer.sealOnce();
  return org;
}

describe('svc audit head', () => {
  it('when the chain has sealed rows, it prints the last sequence and hash as one JSON document', async () => {
    const org = await sealedOrganisation();
    const result = await svc('audit', 'head', '--org', org.id);
    expect(result.code, result.stderr).toBe(0);
    const head = JSON.parse(result.stdout);
    const { rows } = await ctx.database.pool.query(
      'SELECT sequence, hash FROM audit_log WHERE org_id = $1 ORDER BY sequence DESC LIMIT 1',
      [org.id],
    );
    expect(head).toEqual({ org_id: org.id, sequence: 5, hash: rows[0].hash, sealed_at: expect.any(String) });
  });

  it('when nothing is sealed yet, it prints sequence 0 and no hash; an unknown organisation exits 1 with nothing on stdout', async () => {
    const org = await ctx.createOrg();
    const empty = await svc('audit', 'head', '--org', org.id);
    expect(empty.code, empty.stderr).toBe(0);
    expect(JSON.parse(empty.stdout)).toEqual({ org_id: org.id, sequence: 0, hash: null, sealed_at: null });
    const unknown = await svc('audit', 'head', '--org', '00000000-0000-4000-8000-000000000000');
    expect(unknown.code).toBe(1);
    expect(unknown.stdout).toBe('');
    expect(unknown.stderr).toMatch(/Organisation not found/);
  });
});

describe('svc audit verify', () => {
  it('when the chain is intact, it prints ok with the rows, first and last sequence and head hash, and exits 0', async () => {
    const org = await sealedOrganisation();
    const result = await svc('audit', 'verify', '--org', org.id);
    expect(result.code, result.stderr).toBe(0);
    const head = JSON.parse((await svc('audit', 'head', '--org', org.id)).stdout);
    expect(JSON.parse(result.stdout)).toEqual({
      ok: true,
      org_id: org.id,
      rows: 5,
      first_sequence: 1,
      last_sequence: 5,
      head_hash: head.hash,
      unsealed: 0,
    });
  });

  it('when a row was edited in SQL, it prints the broken row on stdout as one JSON document, says so on stderr and exits 2', async () => {
    const org = await sealedOrganisation();
    const { rows } = await ctx.database.pool.query(
      `UPDATE audit_log SET after = jsonb_set(after, '{email}', '"someone.else@example.com"') WHERE org_id = $1 AND sequence = 4 RETURNING id`,
      [org.id],
    );
    const result = await svc('audit', 'verify', '--org', org.id);
    expect(result.code).toBe(2);
    expect(JSON.parse(result.stdout)).toMatchObject({
      ok: false,
      org_id: org.id,
      broken_at: { sequence: 4, id: String(rows[0].id), problem: 'edited' },
    });
    expect(result.stderr).toMatch(/audit chain broken at sequence 4 \(edited\)/);
  });

  it('when verify runs, its transaction is read only: a session that may not write still verifies', async () => {
    const org = await sealedOrganisation();
    // Every transaction of the session is read only unless it says otherwise: no migration, no write.
    const url = new URL(ctx.databaseUrl);
    url.searchParams.set('options', '-c default_transaction_read_only=on');
    const result = await runSvcInProcess(['audit', 'verify', '--org', org.id], { DATABASE_URL: url.toString() });
    expect(result.code, result.stderr).toBe(0);
    expect(JSON.parse(result.stdout)).toMatchObject({ ok: true, rows: 5 });
  });
});
