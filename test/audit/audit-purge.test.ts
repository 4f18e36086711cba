import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { checkpointSignature } from '../../src/modules/audit/audit-chain.js';
import { createAuditChainSealer, type AuditChainSealer } from '../../src/modules/audit/audit-chain.sealer.js';
import { createAuditPurge } from '../../src/modules/audit/audit-purge.js';
import { createAuditRepository } from '../../src/modules/audit/audit.repository.js';
import type { Actor } from '../../src/shared/actor.js';
import { createServiceSecretsRepository } from '../../src/modules/service-secrets/service-secrets.repository.js';
import { AppError } from '../../src/shared/app-error.js';
import { createTestContext, type TestContext, testServices } from '../helpers/harness.js';
import { runSvcInProcess } from '../helpers/cli-in-process.js';

// The svc commands run in this process (runSvcInProcess).
vi.setConfig({ testTimeout: 120_000 });

let ctx: TestContext;
let sealer: AuditChainSealer;
beforeAll(async () => {
  ctx = await createTestContext();
  // Sealed on demand (sealOnce), so each test decides what is in the chain when.
  sealer = createAuditChainSealer({ database: ctx.database, pollIntervalMs: 60_000 });
});
afterAll(async () => {
  await sealer?.stop();
  await ctx?.close();
});

const OPERATOR: Actor = { type: 'operator', id: 'cli:test' };
const YEARS = 7;

async function sql<R extends pg.QueryResultRow = Record<string, unknown>>(text: string, values: unknown[] = []): Promise<R[]> {
  return (await ctx.database.pool.query<R>(text, values)).rows;
}

/**
 * Writes `count` audit rows created 8 years ago (a second apart, in order), unsealed. Written and
 * aged before they are sealed, so their hashes cover the old created_at: a real chain, not a patched one.
 */
async function writeOldRows(orgId: string, count: number): Promise<void> {
  await sql(
    `INSERT INTO audit_log (org_id, actor_type, actor_id, action, subject_type, subject_id, before, after, created_at)
     SELECT $1, 'operator', 'cli:test', 'test.changed', 'test', gen_random_uuid(), jsonb_build_object('n', g - 1), jsonb_build_object('n', g),
            now() - interval '8 years' + g * interval '1 second'
       FROM generate_series(1, $2::int) AS g`,
    [orgId, count],
  );
}

/** One audit row written now, as a change writes it. */
async function writeRow(orgId: string, n: number): Promise<void> {
  const audit = createAuditRepository();
  await ctx.database.transaction((tx) =>
    audit.record(
      { orgId, actor: OPERATOR, action: 'test.changed', subjectType: 'test', subjectId: null, before: { n: n - 1 }, after: { n } },
      tx,
    ),
  );
}

/** An organisation whose chain holds `old` rows from 8 years ago (sequences 1..old), then its creation rows and `young` rows of today. */
async function agedChain(old: number, young = 2) {
  const org = await ctx.createOrg();
  await writeOldRows(org.id, old);
  for (let n = 1; n <= young; n += 1) await writeRow(org.id, n);
  await sealer.sealOnce();
  const rows = await sql<{ sequence: string; hash: string; created_at: Date }>(
    'SELECT sequence, hash, created_at FROM audit_log WHERE org_id = $1 ORDER BY sequence',
    [org.id],
  );
  return { org, rows, hashAt: (sequence: number) => rows.find((row) => Number(row.sequence) === sequence)!.hash };
}

/** A date past the retention: 7 years and a day ago. */
const pastRetention = () => new Date(Date.now() - (YEARS * 365 + 3) * 86_400_000);

const purger = (options: { batchSize?: number; onPurged?: (rows: number) => void } = {}) =>
  createAuditPurge({ database: ctx.database, secrets: createServiceSecretsRepository(), ...options });
const purge = (
  orgId: string,
  before = pastRetention(),
  options: { batchSize?: number; signal?: AbortSignal; onPurged?: (rows: number) => void } = {},
) => purger(options).purge(orgId, before, { actor: OPERATOR, retentionYears: YEARS, signal: options.signal });
const verify = (orgId: string) => testServices(ctx.database).audit.verify(orgId);
const sequences = async (orgId: string) =>
  (await sql<{ sequence: string | null }>('SELECT sequence FROM audit_log WHERE org_id = $1 ORDER BY sequence NULLS LAST', [orgId])).map(
    (row) => (row.sequence === null ? null : Number(row.sequence)),
  );
const checkpoints = (orgId: string) =>
  sql<{ sequence: number; hash: string; signature: string }>(
    'SELECT sequence, hash, signature FROM audit_checkpoints WHERE org_id = $1 ORDER BY sequence',
    [orgId],
  );

describe('svc audit purge: the retention boundary', () => {
  it('when the date is inside retention, it refuses with the latest date it accepts and deletes nothing', async () => {
    const { org } = await agedChain(3);
    const before = await sequences(org.id);
    const inside = new Date(Date.now() - (YEARS * 365 - 30) * 86_400_000);
    const refused = await purge(org.id, inside).catch((error: unknown) => error);
    expect(refused).toBeInstanceOf(AppError);
    expect((refused as AppError).code).toBe('validation_failed');
    expect(JSON.stringify((refused as AppError).details)).toMatch(/inside the audit retention of 7 years \(AUDIT_RETENTION_YEARS\)/);
    expect(await sequences(org.id)).toEqual(before);
    expect(await checkpoints(org.id)).toEqual([]);
  });

  it('when the CLI is given a date inside retention, it exits 1 with the reason on stderr, nothing on stdout, and deletes nothing', async () => {
    const { org } = await agedChain(2);
    const before = await sequences(org.id);
    const result = await runSvcInProcess(['audit', 'purge', '--org', org.id, '--before', new Date().toISOString().slice(0, 10)], {
      DATABASE_URL: ctx.databaseUrl,
    });
    expect(result.code).toBe(1);
    expect(result.stdout).toBe('');
    expect(result.stderr).toMatch(/The purge is refused[\s\S]*inside the audit retention of 7 years/);
    expect(await sequences(org.id)).toEqual(before);
  });
});

describe('svc audit purge: deleting behind a checkpoint', () => {
  it('when the date is past retention, the CLI deletes the sealed rows created before it, prints the checkpoint of the last one, and verify stays ok', async () => {
    const { org, hashAt } = await agedChain(5);
    const before = pastRetention().toISOString().slice(0, 10);
    const result = await runSvcInProcess(['audit', 'purge', '--org', org.id, '--before', before], { DATABASE_URL: ctx.databaseUrl });
    expect(result.code, result.stderr).toBe(0);
    expect(JSON.parse(result.stdout)).toEqual({ org_id: org.id, purged: 5, checkpoint: { sequence: 5, hash: hashAt(5) } });

    const [checkpoint] = await checkpoints(org.id);
    expect(checkpoint).toMatchObject({ sequence: 5, hash: hashAt(5), signature: expect.stringMatching(/^[0-9a-f]{64}$/) });
    const [remainingFirst] = await sequences(org.id);
    expect(remainingFirst).toBe(6);

    // The purge is in the trail itself, written with the checkpoint.
    const [recorded] = await sql<{ actor_type: string; actor_id: string; after: unknown }>(
      `SELECT actor_type, actor_id, after FROM audit_log WHERE org_id = $1 AND action = 'audit_log.purged'`,
      [org.id],
    );
    expect(recorded).toMatchObject({
      actor_type: 'operator',
      after: { before: new Date(before).toISOString(), checkpoint: { sequence: 5, hash: hashAt(5) } },
    });

    await sealer.sealOnce();
    expect(await verify(org.id)).toMatchObject({ ok: true, first_sequence: 6, unsealed: 0 });
  });

  it('when a row of today follows old ones, only the old ones before it go, and the checkpoint is at the last of them', async () => {
    const { org, hashAt } = await agedChain(3, 1);
    await writeOldRows(org.id, 2); // Unsealed rows from 8 years ago: not in the chain yet.
    const result = await purge(org.id);
    expect(result).toEqual({ org_id: org.id, purged: 3, checkpoint: { sequence: 3, hash: hashAt(3) } });
    expect((await sequences(org.id)).filter((sequence) => sequence === null)).toHaveLength(3); // two old unsealed, the purge's own row
    await sealer.sealOnce();
    expect(await verify(org.id)).toMatchObject({ ok: true, first_sequence: 4 });
  });

  it('when rows are not sealed yet, it never purges them, however old', async () => {
    const org = await ctx.createOrg();
    await writeOldRows(org.id, 4);
    expect(await purge(org.id)).toEqual({ org_id: org.id, purged: 0, checkpoint: null });
    expect(await sequences(org.id)).toEqual([null, null, null, null, null, null]); // the four, and the organisation's and its key's creation
  });

  it('when purged again later, it checkpoints from the previous checkpoint and verify starts after the latest', async () => {
    const { org } = await agedChain(2, 0);
    expect((await purge(org.id)).checkpoint?.sequence).toBe(2);
    await writeOldRows(org.id, 3); // older rows committing late: sealed after the organisation's creation rows
    await sealer.sealOnce();
    const chain = await sequences(org.id);
    expect(chain).toEqual([3, 4, 5, 6, 7, 8]); // creation rows, the three old ones, the purge's own row
    // Rows 3 and 4 (the creation of the organisation and its key) are young: the boundary stops before them.
    expect(await purge(org.id)).toMatchObject({ purged: 0, checkpoint: { sequence: 2 } });
    await sealer.sealOnce();
    expect(await verify(org.id)).toMatchObject({ ok: true, first_sequence: 3 });
  });

  it('when a purge stops after its first batch, the rows left at or below its checkpoint do not break verify, and the next purge deletes them', async () => {
    const { org } = await agedChain(7);
    const stop = new AbortController();
    const first = await purge(org.id, pastRetention(), { batchSize: 3, signal: stop.signal, onPurged: () => stop.abort() });
    expect(first).toMatchObject({ purged: 3, checkpoint: { sequence: 7 } });
    expect((await sequences(org.id)).slice(0, 4)).toEqual([4, 5, 6, 7]);
    await sealer.sealOnce();
    expect(await verify(org.id)).toMatchObject({ ok: true, first_sequence: 8 });

    expect(await purge(org.id, pastRetention(), { batchSize: 3 })).toMatchObject({ purged: 4, checkpoint: { sequence: 7 } });
    expect((await sequences(org.id))[0]).toBe(8);
    expect(await verify(org.id)).toMatchObject({ ok: true, first_sequence: 8 });
  });

  it('when the rows to purge no longer verify, it refuses and neither checkpoints nor deletes anything', async () => {
    const { org } = await agedChain(4);
    await sql(`UPDATE audit_log SET after = '{"n": 99}' WHERE org_id = $1 AND sequence = 2`, [org.id]);
    const before = await sequences(org.id);
    const refused = await purge(org.id).catch((error: unknown) => error);
    expect(refused).toBeInstanceOf(AppError);
    expect((refused as AppError).message).toMatch(/broken at sequence 2: it \(row \d+\) does not match its hash/);
    expect(await sequences(org.id)).toEqual(before);
    expect(await checkpoints(org.id)).toEqual([]);
  });

  it('when a checkpoint was made up without the key, the purge refuses to delete the rows below it', async () => {
    const { org, hashAt } = await agedChain(2, 3);
    // At the head: it would delete rows inside retention.
    await sql(`INSERT INTO audit_checkpoints (org_id, sequence, hash, signature) VALUES ($1, 7, $2, $3)`, [
      org.id,
      hashAt(7),
      'ab'.repeat(32),
    ]);
    const before = await sequences(org.id);
    await expect(purge(org.id)).rejects.toThrow(/checkpoint \(sequence 7\) whose signature does not match/);
    expect(await sequences(org.id)).toEqual(before);
  });
});

describe('svc audit verify after a purge', () => {
  async function purged() {
    const chain = await agedChain(4, 3);
    await purge(chain.org.id);
    await sealer.sealOnce();
    expect(await verify(chain.org.id)).toMatchObject({ ok: true, first_sequence: 5 });
    return chain;
  }

  it("when the checkpoint's hash is edited, verify names the checkpoint", async () => {
    const { org, hashAt } = await purged();
    await sql('UPDATE audit_checkpoints SET hash = $2 WHERE org_id = $1', [org.id, hashAt(5)]);
    expect(await verify(org.id)).toMatchObject({
      ok: false,
      rows_checked: 0,
      broken_at: { sequence: 4, id: null, problem: 'checkpoint', detail: expect.stringMatching(/does not match its signature/) },
    });
  });

  it("when the checkpoint's signature is edited, verify names the checkpoint", async () => {
    const { org } = await purged();
    await sql(`UPDATE audit_checkpoints SET signature = repeat('0', 64) WHERE org_id = $1`, [org.id]);
    expect(await verify(org.id)).toMatchObject({ ok: false, broken_at: { sequence: 4, problem: 'checkpoint' } });
  });

  it('when the checkpoint is moved to another sequence with a signature made with another key, verify names it', async () => {
    const { org, hashAt } = await purged();
    const forged = checkpointSignature(Buffer.alloc(32, 7), { orgId: org.id, sequence: 6, hash: hashAt(6) });
    await sql('UPDATE audit_checkpoints SET sequence = 6, hash = $2, signature = $3 WHERE org_id = $1', [org.id, hashAt(6), forged]);
    expect(await verify(org.id)).toMatchObject({ ok: false, broken_at: { sequence: 6, problem: 'checkpoint' } });
  });

  it('when the checkpoint is deleted, verify names the missing checkpoint and the audit row that recorded the purge', async () => {
    const { org } = await purged();
    await sql('DELETE FROM audit_checkpoints WHERE org_id = $1', [org.id]);
    const [recorded] = await sql<{ id: string }>(`SELECT id FROM audit_log WHERE org_id = $1 AND action = 'audit_log.purged'`, [org.id]);
    expect(await verify(org.id)).toMatchObject({
      ok: false,
      broken_at: {
        sequence: 4,
        id: null,
        problem: 'checkpoint',
        detail: expect.stringContaining(`recorded in row ${recorded!.id}, is missing`),
      },
    });
  });

  it('when the first row after the checkpoint is edited, verify names it as edited', async () => {
    const { org } = await purged();
    const [row] = await sql<{ id: string }>(`UPDATE audit_log SET after = '{"n": 99}' WHERE org_id = $1 AND sequence = 5 RETURNING id`, [
      org.id,
    ]);
    expect(await verify(org.id)).toMatchObject({ ok: false, broken_at: { sequence: 5, id: String(row!.id), problem: 'edited' } });
  });

  it('when a later row after the checkpoint is edited, verify names it as edited', async () => {
    const { org } = await purged();
    const [row] = await sql<{ id: string }>(`UPDATE audit_log SET action = 'test.other' WHERE org_id = $1 AND sequence = 7 RETURNING id`, [
      org.id,
    ]);
    expect(await verify(org.id)).toMatchObject({
      ok: false,
      rows_checked: 2,
      broken_at: { sequence: 7, id: String(row!.id), problem: 'edited' },
    });
  });

  it('when the first row after the checkpoint is deleted, verify names its sequence as deleted', async () => {
    const { org } = await purged();
    await sql('DELETE FROM audit_log WHERE org_id = $1 AND sequence = 5', [org.id]);
    expect(await verify(org.id)).toMatchObject({ ok: false, broken_at: { sequence: 5, id: null, problem: 'deleted' } });
  });
});

describe('the retention job', () => {
  it('when audit rows are past AUDIT_RETENTION_YEARS, the job purges them behind a checkpoint as the system, and verify stays ok', async () => {
    const { org, hashAt } = await agedChain(3);
    const retention = testServices(ctx.database, { config: ctx.config }).retention();
    expect((await retention.purgeOrganisation(org.id)).audit_log).toBe(3);
    expect(await checkpoints(org.id)).toMatchObject([{ sequence: 3, hash: hashAt(3) }]);
    const [recorded] = await sql<{ actor_type: string; actor_id: string | null }>(
      `SELECT actor_type, actor_id FROM audit_log WHERE org_id = $1 AND action = 'audit_log.purged'`,
      [org.id],
    );
    expect(recorded).toEqual({ actor_type: 'system', actor_id: null });
    await sealer.sealOnce();
    expect(await verify(org.id)).toMatchObject({ ok: true, first_sequence: 4 });
    // The next run finds nothing more and writes no second checkpoint.
    expect((await retention.purgeOrganisation(org.id)).audit_log).toBe(0);
    expect(await checkpoints(org.id)).toHaveLength(1);
  });
});

describe('writers are never blocked by a purge', () => {
  it('when a writer holds an open transaction with a new audit row, the purge runs to the end without waiting, and the writer then commits', async () => {
    const { org } = await agedChain(5);
    const writer = new pg.Client({ connectionString: ctx.databaseUrl });
    await writer.connect();
    try {
      await writer.query('BEGIN');
      await writer.query(
        `INSERT INTO audit_log (org_id, actor_type, action, subject_type) VALUES ($1, 'system', 'test.during_purge', 'test')`,
        [org.id],
      );
      // The writer stays open until after the purge, so a purge that waited for it would end at the pool's
      // lock_timeout with 55P03 and reject: resolving, all five rows purged, shows it never waited.
      const [setting] = await sql<{ lock_timeout: string }>('SHOW lock_timeout');
      expect(setting!.lock_timeout).not.toBe('0');
      expect(await purge(org.id, pastRetention(), { batchSize: 2 })).toMatchObject({ purged: 5 });
      await writer.query('COMMIT');
    } finally {
      await writer.end();
    }
    await sealer.sealOnce();
    expect(await verify(org.id)).toMatchObject({ ok: true, first_sequence: 6, unsealed: 0 });
  });

  it('when changes are written through the API while a purge of many batches runs, they commit during it, between its batches, and the chain verifies after', async () => {
    const { org } = await agedChain(3_000, 0);
    let purging = true;
    /** For each committed write, whether the purge was still running when its answer came. */
    const committedWhilePurging: boolean[] = [];
    const writes = (async () => {
      for (let n = 0; purging || n < 3; n += 1) {
        const created = await ctx.request('POST', '/v1/customers', {
          key: org.key,
          body: { fullName: `Person ${n}`, email: `p${n}@example.com` },
        });
        // A write held up past the pool's lock_timeout would fail here, not answer 201.
        expect(created.statusCode).toBe(201);
        committedWhilePurging.push(purging);
      }
    })();
    const result = await purge(org.id, pastRetention(), { batchSize: 50 }).finally(() => {
      purging = false;
    });
    await writes;
    expect(result).toMatchObject({ purged: 3_000, checkpoint: { sequence: 3_000 } });
    // More than one write committed while the purge ran: writers are not held for the whole purge.
    expect(committedWhilePurging.filter(Boolean).length).toBeGreaterThan(1);
    await sealer.sealOnce();
    expect(await verify(org.id)).toMatchObject({ ok: true, first_sequence: 3_001, unsealed: 0 });
  });
});
