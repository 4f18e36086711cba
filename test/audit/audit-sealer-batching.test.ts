import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../../src/db/client.js';
import { createAuditChainSealer } from '../../src/modules/audit/audit-chain.sealer.js';
import { createTestContext, type TestContext } from '../helpers/harness.js';

let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => {
  await ctx?.close();
});

/** The test's database, counting the transactions the sealer opens (one per batch it seals). */
function countingTransactions(): { database: Database; transactions(): number } {
  let transactions = 0;
  const database: Database = {
    ...ctx.database,
    transaction: (work, config) => {
      transactions += 1;
      return ctx.database.transaction(work, config);
    },
  };
  return { database, transactions: () => transactions };
}

/** Upserts `count` changes one after the other (each its own commit and wake), then waits until all are sealed. */
async function streamOfCommits(orgKey: string, orgId: string, count: number): Promise<number> {
  for (let n = 0; n < count; n += 1) {
    const response = await ctx.request('POST', '/v1/customers', {
      key: orgKey,
      body: { externalId: 'stream', fullName: 'Stream Person', email: 'stream@example.com', phone: String(n) },
    });
    expect(response.statusCode, response.body).toBeLessThan(300);
  }
  const started = Date.now();
  for (;;) {
    const { rows } = await ctx.database.pool.query<{ count: number }>(
      'SELECT count(*)::int AS count FROM audit_log WHERE org_id = $1 AND sequence IS NULL',
      [orgId],
    );
    if (rows[0]!.count === 0) return Date.now() - started;
    if (Date.now() - started > 5_000) throw new Error(`${rows[0]!.count} rows still unsealed after 5 s`);
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

describe('the audit chain sealer under a stream of commits', () => {
  it('when every change commits on its own, it seals them a batch per transaction, not a transaction per commit, and still within 5 s', async () => {
    const org = await ctx.createOrg();
    const counting = countingTransactions();
    // Woken in-process after each commit (as in `svc serve`), never by the poll.
    const sealer = createAuditChainSealer({ database: counting.database, listen: false, pollIntervalMs: 60_000 });
    await sealer.start();
    try {
      const commits = 60;
      await streamOfCommits(org.key, org.id, commits);
      // One transaction per commit without the pause between passes (measured: about one per commit).
      expect(counting.transactions()).toBeLessThan(commits / 3);
    } finally {
      await sealer.stop();
    }
    const { rows } = await ctx.database.pool.query<{ sequences: string[] }>(
      'SELECT array_agg(sequence ORDER BY sequence) AS sequences FROM audit_log WHERE org_id = $1',
      [org.id],
    );
    expect(rows[0]!.sequences.map(Number)).toEqual(rows[0]!.sequences.map((_, index) => index + 1));
  });

  it('when it is stopped during the pause between passes, it stops at once', async () => {
    await ctx.createOrg();
    const sealer = createAuditChainSealer({ database: ctx.database, listen: false, pollIntervalMs: 60_000, minPassIntervalMs: 60_000 });
    await sealer.start();
    await new Promise((resolve) => setTimeout(resolve, 500)); // the first pass is over: it pauses now
    const stopping = performance.now();
    await sealer.stop();
    expect(performance.now() - stopping).toBeLessThan(1_000);
  });
});
