import { DrizzleQueryError, sql } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext } from '../../test/helpers/harness.js';

let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext();
  await ctx.database.pool.query(`
    CREATE TABLE tx_parents (id int PRIMARY KEY);
    CREATE TABLE tx_children (id int PRIMARY KEY, parent_id int REFERENCES tx_parents (id) DEFERRABLE INITIALLY DEFERRED)`);
});
afterAll(async () => ctx?.close());

const childIds = async () => (await ctx.database.pool.query<{ id: number }>('SELECT id FROM tx_children ORDER BY id')).rows.map((row) => row.id);
const openTransactions = async () =>
  (await ctx.database.pool.query(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'`)).rows[0].n;

describe('Database.transaction (src/db/client.ts)', () => {
  it('when the work succeeds, its statements commit together and the connection goes back to the pool outside any transaction', async () => {
    await ctx.database.transaction(async (tx) => {
      await tx.execute(sql`INSERT INTO tx_parents (id) VALUES (1)`);
      await tx.execute(sql`INSERT INTO tx_children (id, parent_id) VALUES (10, 1)`);
    });
    expect(await childIds()).toContain(10);
    expect(await openTransactions()).toBe(0);
  });

  it('when the work fails, nothing of it is written and the work\'s own error is what the caller gets', async () => {
    const failing = ctx.database.transaction(async (tx) => {
      await tx.execute(sql`INSERT INTO tx_children (id, parent_id) VALUES (20, 1)`);
      throw new Error('work failed');
    });
    await expect(failing).rejects.toThrow('work failed');
    expect(await childIds()).not.toContain(20);
    expect(await openTransactions()).toBe(0);
  });

  it('when the COMMIT itself fails (a deferred constraint), the caller gets a DrizzleQueryError with PostgreSQL\'s error as its cause, and nothing is written', async () => {
    const error = await ctx.database
      .transaction(async (tx) => {
        await tx.execute(sql`INSERT INTO tx_children (id, parent_id) VALUES (30, 999)`);
      })
      .catch((failure: unknown) => failure);
    expect(error).toBeInstanceOf(DrizzleQueryError);
    expect((error as DrizzleQueryError).query).toBe('commit');
    expect(((error as DrizzleQueryError).cause as { code?: string }).code).toBe('23503');
    expect(await childIds()).not.toContain(30);
    expect(await openTransactions()).toBe(0);
  });

  it('when a nested transaction fails, only its savepoint rolls back and the outer work commits', async () => {
    await ctx.database.transaction(async (tx) => {
      await tx.execute(sql`INSERT INTO tx_children (id, parent_id) VALUES (40, 1)`);
      await tx
        .transaction(async (inner) => {
          await inner.execute(sql`INSERT INTO tx_children (id, parent_id) VALUES (41, 1)`);
          throw new Error('inner failed');
        })
        .catch(() => {});
    });
    const ids = await childIds();
    expect(ids).toContain(40);
    expect(ids).not.toContain(41);
  });
});
