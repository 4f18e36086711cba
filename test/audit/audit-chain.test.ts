import { randomUUID } from 'node:crypto';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { createDatabase, type Database } from '../../src/db/client.js';
import { startBackgroundJobs } from '../../src/jobs.js';
import { chainHash, GENESIS_HASH, type ChainRow } from '../../src/modules/audit/audit-chain.js';
import { createAuditChainSealer, type AuditChainSealer } from '../../src/modules/audit/audit-chain.sealer.js';
import { createAuditRepository } from '../../src/modules/audit/audit.repository.js';
import { createTestContext, type TestContext, testServices } from '../helpers/harness.js';

let ctx: TestContext;
let sealer: AuditChainSealer;
beforeAll(async () => {
  ctx = await createTestContext();
  // Sealed on demand (sealOnce), so each test decides what is sealed when.
  sealer = createAuditChainSealer({ database: ctx.database, pollIntervalMs: 60_000 });
});
afterAll(async () => {
  await sealer?.stop();
  await ctx?.close();
});

type StoredRow = { id: number; sequence: number | null; hash: string | null; created_at: Date };

/** Writes one audit row in a transaction of its own, as a change would. */
async function writeRow(orgId: string, n: number, database: Database = ctx.database): Promise<number> {
  const audit = createAuditRepository();
  await database.transaction((tx) =>
    audit.record(
      {
        orgId,
        actor: { type: 'operator', id: 'cli:test', requestId: `req-${n}` },
        action: 'test.changed',
        subjectType: 'test',
        subjectId: randomUUID(),
        before: { n: n - 1, name: 'Ada' },
        after: { n, name: 'Ada' },
      },
      tx,
    ),
  );
  return n;
}

async function rowsOf(orgId: string): Promise<StoredRow[]> {
  const { rows } = await ctx.database.pool.query<StoredRow>(
    'SELECT id, sequence, hash, created_at FROM audit_log WHERE org_id = $1 ORDER BY sequence NULLS LAST, created_at, id',
    [orgId],
  );
  return rows;
}

async function sql(text: string, values: unknown[] = []) {
  return ctx.database.pool.query(text, values);
}

/** An organisation with `count` sealed rows; returns it and its rows in chain order. */
async function sealedChain(count: number): Promise<{ orgId: string; rows: StoredRow[] }> {
  const org = await ctx.createOrg();
  for (let n = 1; n <= count; n += 1) await writeRow(org.id, n);
  await sealer.sealOnce();
  const rows = await rowsOf(org.id);
  expect(rows.map((row) => row.sequence)).toEqual(rows.map((_, index) => index + 1));
  return { orgId: org.id, rows };
}

const service = () => testServices(ctx.database).audit;

/** The canonical content of a stored row, read back as the sealer reads it. */
async function chainRowOf(orgId: string, id: number): Promise<ChainRow> {
  const { rows } = await sql(
    `SELECT org_id, id, sequence, created_at, actor_type, actor_id, action, subject_type, subject_id, before, after, request_id, idempotency_key
       FROM audit_log WHERE org_id = $1 AND id = $2`,
    [orgId, id],
  );
  const row = rows[0];
  return {
    orgId: row.org_id,
    id: row.id,
    sequence: row.sequence,
    createdAt: row.created_at,
    actorType: row.actor_type,
    actorId: row.actor_id,
    action: row.action,
    subjectType: row.subject_type,
    subjectId: row.subject_id,
    before: row.before,
    after: row.after,
    requestId: row.request_id,
    idempotencyKey: row.idempotency_key,
  };
}

/** Inserts a forged row at `sequence` (after moving the rows from there on up by one) with the given hash. */
async function forgeAt(orgId: string, sequence: number, hash: (row: ChainRow) => string): Promise<number> {
  // Two steps: the unique (org_id, sequence) index is checked row by row.
  await sql('UPDATE audit_log SET sequence = -sequence - 1 WHERE org_id = $1 AND sequence >= $2', [orgId, sequence]);
  await sql('UPDATE audit_log SET sequence = -sequence WHERE org_id = $1 AND sequence < 0', [orgId]);
  const { rows } = await sql(
    `INSERT INTO audit_log (org_id, actor_type, actor_id, action, subject_type, before, after, sequence, hash, created_at)
     VALUES ($1, 'operator', 'cli:mallory', 'test.changed', 'test', '{"n": 0}', '{"n": 1}', $2, 'pending', now() - interval '1 hour') RETURNING id`,
    [orgId, sequence],
  );
  const id = rows[0].id as number;
  await sql('UPDATE audit_log SET hash = $3 WHERE org_id = $1 AND id = $2', [orgId, id, hash(await chainRowOf(orgId, id))]);
  return id;
}

async function swap(orgId: string, a: number, b: number): Promise<void> {
  await sql('UPDATE audit_log SET sequence = -1 WHERE org_id = $1 AND sequence = $2', [orgId, a]);
  await sql('UPDATE audit_log SET sequence = $3 WHERE org_id = $1 AND sequence = $2', [orgId, b, a]);
  await sql('UPDATE audit_log SET sequence = $2 WHERE org_id = $1 AND sequence = -1', [orgId, b]);
}

describe('sealing', () => {
  it('when rows commit one after another, they get sequences 1..n in commit order, each hash chained to the one before', async () => {
    const org = await ctx.createOrg();
    for (let n = 1; n <= 5; n += 1) await writeRow(org.id, n);
    expect(await sealer.sealOnce()).toBeGreaterThanOrEqual(7); // five rows, and the organisation's and its key's creation
    const rows = await rowsOf(org.id);
    expect(rows.map((row) => row.sequence)).toEqual([1, 2, 3, 4, 5, 6, 7]);
    const byCommit = [...rows].sort((x, y) => x.created_at.getTime() - y.created_at.getTime() || x.id - y.id);
    expect(byCommit.map((row) => row.id)).toEqual(rows.map((row) => row.id));
    let previous = GENESIS_HASH;
    for (const row of rows) {
      expect(row.hash).toBe(chainHash(previous, await chainRowOf(org.id, row.id)));
      previous = row.hash!;
    }
    const head = await service().head(org.id);
    expect(head).toMatchObject({ org_id: org.id, sequence: 7, hash: rows[6]!.hash });
    expect(Date.parse(head.sealed_at!)).not.toBeNaN();
  });

  it('when a transaction commits after a later one, its row comes after the rows that committed before it, although it was written first', async () => {
    const org = await ctx.createOrg();
    await sealer.sealOnce();
    const audit = createAuditRepository();
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let written!: () => void;
    const wrote = new Promise<void>((resolve) => (written = resolve));
    const late = ctx.database.transaction(async (tx) => {
      await audit.record(
        {
          orgId: org.id,
          actor: { type: 'system', id: null },
          action: 'test.late',
          subjectType: 'test',
          subjectId: null,
          before: null,
          after: { late: true },
        },
        tx,
      );
      written();
      await held;
    });
    await wrote;
    await writeRow(org.id, 1);
    await sealer.sealOnce();
    release();
    await late;
    await sealer.sealOnce();
    const { rows } = await sql('SELECT action, sequence, created_at FROM audit_log WHERE org_id = $1 ORDER BY sequence', [org.id]);
    expect(rows.map((row) => [row.action, Number(row.sequence)])).toEqual([
      ['organisation.created', 1],
      ['api_key.created', 2],
      ['test.changed', 3],
      ['test.late', 4],
    ]);
    // The late row was written first: its id, drawn from a sequence at insert, is the smaller. (created_at is
    // the wall clock, clock_timestamp(), which a machine's time adjustment can move back between two inserts.)
    const { rows: order } = await sql(
      `SELECT (SELECT id FROM audit_log WHERE org_id = $1 AND action = 'test.late')
            < (SELECT id FROM audit_log WHERE org_id = $1 AND action = 'test.changed') AS written_first`,
      [org.id],
    );
    expect(order[0].written_first).toBe(true);
    expect(await service().verify(org.id)).toMatchObject({ ok: true, rows: 4 });
  });

  it('when two sealers on two database handles race over many concurrent commits, sequences are 1..N with no duplicate and no gap, and the chain verifies', async () => {
    const org = await ctx.createOrg();
    const other = createDatabase(ctx.databaseUrl, { poolSize: 10 });
    const sealers = [
      createAuditChainSealer({ database: ctx.database, batchSize: 7 }),
      createAuditChainSealer({ database: other, batchSize: 7 }),
    ];
    try {
      let writing = true;
      const racing = sealers.map(async (one) => {
        while (writing) await one.sealOnce();
      });
      const writers = Array.from({ length: 8 }, async (_, writer) => {
        for (let n = 0; n < 25; n += 1) await writeRow(org.id, writer * 100 + n, writer % 2 === 0 ? ctx.database : other);
      });
      await Promise.all(writers);
      writing = false;
      await Promise.all(racing);
      for (const one of sealers) await one.sealOnce();
      const rows = await rowsOf(org.id);
      expect(rows).toHaveLength(202);
      expect(rows.map((row) => row.sequence)).toEqual(rows.map((_, index) => index + 1));
      expect(await service().verify(org.id)).toMatchObject({ ok: true, rows: 202, first_sequence: 1, last_sequence: 202, unsealed: 0 });
    } finally {
      for (const one of sealers) await one.stop();
      await other.close();
    }
  });

  it("when another sealer holds the organisation's head, a pass skips the organisation instead of waiting for it", async () => {
    const org = await ctx.createOrg();
    await sql('INSERT INTO audit_chain_heads (org_id) VALUES ($1)', [org.id]);
    await writeRow(org.id, 1);
    const warnings: unknown[] = [];
    const logger = { warn: (...args: unknown[]) => void warnings.push(args), error: (...args: unknown[]) => void warnings.push(args) };
    const watched = createAuditChainSealer({ database: ctx.database, pollIntervalMs: 60_000, logger });
    const client = await ctx.database.pool.connect();
    try {
      await client.query('BEGIN');
      await client.query('SELECT 1 FROM audit_chain_heads WHERE org_id = $1 FOR UPDATE', [org.id]);
      // The head stays locked until after the pass, so a pass that waited for it would end at the pool's
      // lock_timeout with 55P03, which the sealer logs as a failed organisation: no warning, no wait.
      await watched.sealOnce();
      expect(warnings).toEqual([]);
      expect((await rowsOf(org.id)).every((row) => row.sequence === null)).toBe(true);
      await client.query('ROLLBACK');
    } finally {
      client.release();
      await watched.stop();
    }
    await sealer.sealOnce();
    expect((await rowsOf(org.id)).map((row) => row.sequence)).toEqual([1, 2, 3]);
  });

  it('when rows were written before the chain existed (no head, never sealed), the sealer chains them like any other', async () => {
    const org = await ctx.createOrg();
    await sealer.sealOnce();
    // As an upgrade finds them: sequence and hash null, and no head row.
    await sql('UPDATE audit_log SET sequence = NULL, hash = NULL WHERE org_id = $1', [org.id]);
    await sql('DELETE FROM audit_chain_heads WHERE org_id = $1', [org.id]);
    await sql(
      `INSERT INTO audit_log (org_id, actor_type, action, subject_type, created_at) VALUES ($1, 'system', 'legacy.row', 'test', now() - interval '1 day')`,
      [org.id],
    );
    await sealer.sealOnce();
    const { rows } = await sql('SELECT action, sequence FROM audit_log WHERE org_id = $1 ORDER BY sequence', [org.id]);
    expect(rows.map((row) => [row.action, Number(row.sequence)])).toEqual([
      ['legacy.row', 1],
      ['organisation.created', 2],
      ['api_key.created', 3],
    ]);
    expect(await service().verify(org.id)).toMatchObject({ ok: true, rows: 3 });
  });

  it('when the background jobs of a running instance are up, a change through the API is sealed without anyone calling the sealer', async () => {
    const database = createDatabase(ctx.databaseUrl, { poolSize: 5 });
    const jobs = await startBackgroundJobs({ config: ctx.config, database, logger: pino({ level: 'silent' }), webhookWorker: false });
    try {
      const org = await ctx.createOrg();
      const created = await ctx.request('POST', '/v1/customers', {
        key: org.key,
        body: { fullName: 'Grace Hopper', email: 'grace@example.com' },
      });
      expect(created.statusCode, created.body).toBe(201);
      // How soon after the commit is bounded in test/reliability/service-timing.test.ts.
      await vi.waitFor(
        async () => {
          const { rows } = await sql("SELECT sequence FROM audit_log WHERE org_id = $1 AND action = 'customer.created'", [org.id]);
          expect(rows[0]?.sequence ?? null).not.toBeNull();
        },
        { timeout: 20_000, interval: 50 },
      );
    } finally {
      await jobs.stop();
      await database.close();
    }
  });
});

describe('svc audit verify finds tampering', () => {
  it('when nothing was touched, the chain verifies: every row, its first and last sequence and the head hash', async () => {
    const { orgId, rows } = await sealedChain(5);
    const verdict = await service().verify(orgId);
    expect(verdict).toEqual({
      ok: true,
      org_id: orgId,
      rows: 7,
      first_sequence: 1,
      last_sequence: 7,
      head_hash: rows[6]!.hash,
      unsealed: 0,
    });
    expect((await service().head(orgId)).hash).toBe(rows[6]!.hash);
  });

  it('when a row is edited in SQL (its after changed), verify names that row as edited', async () => {
    const { orgId, rows } = await sealedChain(5);
    await sql(`UPDATE audit_log SET after = '{"n": 99, "name": "Eve"}' WHERE org_id = $1 AND sequence = 3`, [orgId]);
    expect(await service().verify(orgId)).toMatchObject({
      ok: false,
      broken_at: { sequence: 3, id: String(rows[2]!.id), problem: 'edited' },
    });
  });

  it('when a row is edited and its hash recomputed, verify names the row as edited (its follower no longer chains)', async () => {
    const { orgId, rows } = await sealedChain(5);
    await sql(`UPDATE audit_log SET actor_id = 'cli:eve' WHERE org_id = $1 AND sequence = 3`, [orgId]);
    await sql('UPDATE audit_log SET hash = $3 WHERE org_id = $1 AND id = $2', [
      orgId,
      rows[2]!.id,
      chainHash(rows[1]!.hash!, await chainRowOf(orgId, rows[2]!.id)),
    ]);
    const verdict = await service().verify(orgId);
    expect(verdict).toMatchObject({ ok: false, broken_at: { sequence: 4, id: String(rows[3]!.id), problem: 'edited' } });
  });

  it('when a row is deleted in SQL, verify names its sequence as deleted', async () => {
    const { orgId } = await sealedChain(5);
    await sql('DELETE FROM audit_log WHERE org_id = $1 AND sequence = 3', [orgId]);
    const verdict = await service().verify(orgId);
    expect(verdict).toMatchObject({ ok: false, broken_at: { sequence: 3, id: null, problem: 'deleted' } });
  });

  it('when a row is deleted and the rows after it renumbered to close the gap, verify names the sequence as deleted', async () => {
    const { orgId } = await sealedChain(5);
    await sql('DELETE FROM audit_log WHERE org_id = $1 AND sequence = 3', [orgId]);
    await sql('UPDATE audit_log SET sequence = -(sequence - 1) WHERE org_id = $1 AND sequence > 3', [orgId]);
    await sql('UPDATE audit_log SET sequence = -sequence WHERE org_id = $1 AND sequence < 0', [orgId]);
    const verdict = await service().verify(orgId);
    expect(verdict).toMatchObject({ ok: false, broken_at: { sequence: 3, id: null, problem: 'deleted' } });
  });

  it('when the first row is deleted, verify names sequence 1 as deleted', async () => {
    const { orgId } = await sealedChain(3);
    await sql('DELETE FROM audit_log WHERE org_id = $1 AND sequence = 1', [orgId]);
    expect(await service().verify(orgId)).toMatchObject({ ok: false, broken_at: { sequence: 1, id: null, problem: 'deleted' } });
  });

  it('when the last rows are deleted (a truncated tail), verify compares with the head and names the first missing sequence', async () => {
    const { orgId } = await sealedChain(5);
    await sql('DELETE FROM audit_log WHERE org_id = $1 AND sequence >= 6', [orgId]);
    expect(await service().verify(orgId)).toMatchObject({ ok: false, broken_at: { sequence: 6, id: null, problem: 'truncated' } });
  });

  it('when a forged row is inserted in the middle with the followers renumbered, verify names the forged row as inserted', async () => {
    const { orgId } = await sealedChain(5);
    const forged = await forgeAt(orgId, 3, () => 'f'.repeat(64));
    expect(await service().verify(orgId)).toMatchObject({ ok: false, broken_at: { sequence: 3, id: String(forged), problem: 'inserted' } });
  });

  it('when a forged row is inserted with a valid-looking hash chained to the row before it, verify still names the forged row as inserted', async () => {
    const { orgId, rows } = await sealedChain(5);
    const forged = await forgeAt(orgId, 3, (row) => chainHash(rows[1]!.hash!, row));
    expect(await service().verify(orgId)).toMatchObject({ ok: false, broken_at: { sequence: 3, id: String(forged), problem: 'inserted' } });
  });

  it('when a forged row is appended after the head with a valid hash, verify names it as inserted', async () => {
    const { orgId, rows } = await sealedChain(3);
    const { rows: inserted } = await sql(
      `INSERT INTO audit_log (org_id, actor_type, action, subject_type, sequence, hash) VALUES ($1, 'system', 'test.forged', 'test', 6, 'pending') RETURNING id`,
      [orgId],
    );
    const id = inserted[0].id as number;
    await sql('UPDATE audit_log SET hash = $3 WHERE org_id = $1 AND id = $2', [
      orgId,
      id,
      chainHash(rows[4]!.hash!, await chainRowOf(orgId, id)),
    ]);
    expect(await service().verify(orgId)).toMatchObject({ ok: false, broken_at: { sequence: 6, id: String(id), problem: 'inserted' } });
  });

  it('when two rows swap sequences (adjacent or apart), verify names the first of them as reordered', async () => {
    for (const [a, b] of [
      [3, 4],
      [2, 5],
    ] as const) {
      const { orgId, rows } = await sealedChain(5);
      await swap(orgId, a, b);
      const verdict = await service().verify(orgId);
      expect(verdict, `${a} <-> ${b}`).toMatchObject({
        ok: false,
        broken_at: { sequence: a, id: String(rows[b - 1]!.id), problem: 'reordered' },
      });
    }
  });

  it('when rows are committed but not sealed yet, verify checks the sealed chain and counts the others', async () => {
    const { orgId } = await sealedChain(2);
    await writeRow(orgId, 3);
    expect(await service().verify(orgId)).toMatchObject({ ok: true, rows: 4, last_sequence: 4, unsealed: 1 });
  });
});
