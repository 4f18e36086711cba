import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
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
async function streamOfCommits(orgKey: string, orgId: string, count: number): Promise<void> {
  for (let n = 0; n < count; n += 1) {
    const response = await ctx.request('POST', '/v1/customers', {
      key: orgKey,
      body: { externalId: 'stream', fullName: 'Stream Person', email: 'stream@example.com', phone: String(n) },
    });
    expect(response.statusCode, response.body).toBeLessThan(300);
  }
  await vi.waitFor(
    async () => {
      const { rows } = await ctx.database.pool.query<{ count: number }>(
        'SELECT count(*)::int AS count FROM audit_log WHERE org_id = $1 AND sequence IS NULL',
        [orgId],
      );
      expect(rows[0]!.count, 'rows still unsealed').toBe(0);
    },
    { timeout: 20_000, interval: 25 },
  );
}

describe('the audit chain sealer under a stream of commits', () => {
  // How soon the stream is sealed is bounded in test/reliability/service-timing.test.ts.
  it('when every change commits on its own, it seals them all, a batch per transaction, not a transaction per commit', async () => {
    const org = await ctx.createOrg();
    const counting = countingTransactions();
    // Woken in-process after each commit (as in `svc serve`), never by the poll.
    const sealer = createAuditChainSealer({ database: counting.database, pollIntervalMs: 60_000 });
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

  it('when it is stopped during the pause between passes, it stops without waiting out the pause', async () => {
    await ctx.createOrg();
    const PAUSE_MS = 600_000;
    const sealer = createAuditChainSealer({ database: ctx.database, pollIntervalMs: PAUSE_MS, minPassIntervalMs: PAUSE_MS });
    await sealer.start();
    // sealOnce runs after the pass in flight (the first, at start): once it is done, the loop pauses.
    await sealer.sealOnce();
    let stopped = false;
    const stopping = sealer.stop().then(() => {
      stopped = true;
    });
    // A stop that waited for the pause to end would take 10 minutes. How soon it ends is bounded in
    // test/reliability/service-timing.test.ts.
    await vi.waitFor(() => expect(stopped).toBe(true), { timeout: 20_000, interval: 20 });
    await stopping;
  });
});
