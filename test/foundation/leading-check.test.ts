import { sql } from 'drizzle-orm';
import type pg from 'pg';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createDatabase, type Database, type LeadingCheck } from '../../src/db/client.js';
import { createTestContext, type TestContext } from '../helpers/harness.js';
import { onSocketWrites, syncsIn } from '../helpers/socket-writes.js';
import { StatementBatch } from '../../src/db/statement-batch.js';

/**
 * The leading check at the database layer (src/db/pipelined-pool.ts, src/db/leading-check.ts):
 * a check statement rides ahead of a unit of work's first statement, on its connection and in its
 * socket write, and gates what the work may see and commit.
 */

let ctx: TestContext;
let database: Database;
/** Every socket write of the pool's connections: which connection, and the bytes that left. */
let writes: Array<{ client: number; bytes: Buffer }>;
/** Every statement handed to a connection of the pool (client.query), with its connection. */
let statements: Array<{ client: number; text: string }>;

class Denied extends Error {
  constructor() {
    super('denied by the leading check');
  }
}

beforeAll(async () => {
  ctx = await createTestContext();
  await ctx.database.pool.query('CREATE TABLE scratch_items (id serial PRIMARY KEY, label text NOT NULL)');
  await ctx.database.pool.query('CREATE TABLE scratch_check_log (id serial PRIMARY KEY, label text NOT NULL)');
  await ctx.database.pool.query(`INSERT INTO scratch_items (label) VALUES ('seeded')`);

  database = createDatabase(ctx.databaseUrl, { poolSize: 4 });
  let clients = 0;
  database.pool.on('connect', (client: pg.PoolClient) => {
    const id = (clients += 1);
    const query = client.query.bind(client) as (...args: unknown[]) => unknown;
    (client as unknown as { query: (...args: unknown[]) => unknown }).query = (...args: unknown[]) => {
      const config = args[0] as string | { text?: string };
      // A batch (src/db/statement-batch.ts) hands the connection several statements at once.
      const texts = config instanceof StatementBatch ? config.statementTexts : [typeof config === 'string' ? config : (config.text ?? '')];
      for (const text of texts) statements.push({ client: id, text });
      return query(...args);
    };
    onSocketWrites(client, (bytes) => writes.push({ client: id, bytes }));
  });
});
afterAll(async () => {
  await database?.close();
  await ctx?.close();
});
beforeEach(() => {
  writes = [];
  statements = [];
});

/** A check whose statement is `text`; `judge` decides on its result (throws to deny). */
function checkOf(text: string, judge: (result: pg.QueryResult) => void): LeadingCheck {
  return database.leadingCheck({ text }, judge);
}

/** A check whose statement writes nothing: it shares its Sync, and its transaction, with the work's first statements. */
function readOnlyCheckOf(text: string, judge: (result: pg.QueryResult) => void | Promise<void>): LeadingCheck {
  return database.leadingCheck({ text }, judge, true);
}

/** The denial a statement rejected with (Drizzle wraps driver errors as "Failed query: …", the original in `cause`). */
function isDenial(error: unknown): boolean {
  for (let current = error, depth = 0; current && depth < 5; depth += 1) {
    if (current instanceof Denied) return true;
    current = (current as { cause?: unknown }).cause;
  }
  return false;
}

async function rejectsWithDenial(promise: Promise<unknown>): Promise<void> {
  const error = await promise.then(
    () => new Error('resolved instead of rejecting with the denial'),
    (reason: unknown) => reason,
  );
  expect(isDenial(error), String(error)).toBe(true);
}

const passing = (onVerdict: () => void = () => {}) => () => onVerdict();
const denying = () => () => {
  throw new Denied();
};

/** The socket writes whose bytes contain `marker` (statement texts carry distinctive comments). */
function writesCarrying(marker: string): number[] {
  return writes.flatMap((entry, index) => (entry.bytes.includes(marker) ? [index] : []));
}

/**
 * Runs a transaction under `check` whose first statement inserts `label` (its text carrying
 * `insertMarker`), and returns the one socket write that carried both the check (`checkMarker`) and
 * that statement.
 */
async function firstTransactionWrite(check: LeadingCheck, checkMarker: string, insertMarker: string, label: string): Promise<Buffer> {
  await database.withLeadingCheck(check, () =>
    database.transaction(async (tx) => {
      await tx.execute(sql`INSERT /* ${sql.raw(insertMarker)} */ INTO scratch_items (label) VALUES (${label})`);
    }),
  );
  const withCheck = writesCarrying(checkMarker);
  expect(withCheck).toHaveLength(1);
  expect(writesCarrying(insertMarker)).toEqual(withCheck);
  return writes[withCheck[0]!]!.bytes;
}

async function labels(table: 'scratch_items' | 'scratch_check_log'): Promise<string[]> {
  const { rows } = await ctx.database.pool.query<{ label: string }>(`SELECT label FROM ${table} ORDER BY id`);
  return rows.map((row) => row.label);
}

describe('a leading check ahead of a read', () => {
  it('when a read is the work\'s first statement, the check and the read leave in one socket write on one connection, and the read\'s result arrives only after a passing verdict', async () => {
    const events: string[] = [];
    const check = checkOf('SELECT /* lc-check-1 */ 1 AS ok', passing(() => events.push('verdict')));

    const rows = await database.withLeadingCheck(check, async () => {
      const result = await database.db.execute(sql`SELECT /* lc-read-1 */ label FROM scratch_items ORDER BY id`);
      events.push(`read resolved, check passed: ${check.passed}`);
      return result.rows;
    });

    expect(rows).toEqual([{ label: 'seeded' }]);
    expect(events).toEqual(['verdict', 'read resolved, check passed: true']);
    // Both statements were handed to the same connection, the check first.
    const relevant = statements.filter((entry) => /lc-(check|read)-1/.test(entry.text));
    expect(relevant.map((entry) => (entry.text.includes('lc-check-1') ? 'check' : 'read'))).toEqual(['check', 'read']);
    expect(new Set(relevant.map((entry) => entry.client)).size).toBe(1);
    // ... and left in one socket write.
    const withCheck = writesCarrying('lc-check-1');
    expect(withCheck).toHaveLength(1);
    expect(writesCarrying('lc-read-1')).toEqual(withCheck);
    const bytes = writes[withCheck[0]!]!.bytes;
    expect(bytes.indexOf('lc-check-1')).toBeLessThan(bytes.indexOf('lc-read-1'));
  });

  it('when the check denies, the work\'s read rejects with the denial error and its rows are never handed out', async () => {
    const check = checkOf('SELECT /* lc-check-2 */ 1 AS ok', denying());
    let released: unknown = 'nothing';

    const outcome = database.withLeadingCheck(check, async () => {
      released = await database.db.execute(sql`SELECT /* lc-read-2 */ label FROM scratch_items`);
      return released;
    });

    await rejectsWithDenial(outcome);
    expect(released).toBe('nothing');
    await rejectsWithDenial(check.verdict());
  });

  it('when the check denies, every later statement of the work rejects with the denial too', async () => {
    const check = checkOf('SELECT /* lc-check-3 */ 1 AS ok', denying());
    const results = await database.withLeadingCheck(check, async () =>
      Promise.allSettled([
        database.db.execute(sql`SELECT /* lc-read-3a */ 1`),
        database.db.execute(sql`SELECT /* lc-read-3b */ 2`),
      ]),
    );
    expect(results.map((result) => result.status)).toEqual(['rejected', 'rejected']);
    for (const result of results) expect(isDenial((result as PromiseRejectedResult).reason)).toBe(true);
  });
});

describe('a leading check ahead of a write', () => {
  it('when the work\'s first statement outside a transaction is an INSERT and the check denies, the INSERT is never executed', async () => {
    const check = checkOf('SELECT /* lc-check-4 */ 1 AS ok', denying());

    // Awaited inside the work: Drizzle's query promises are lazy, sent when first awaited.
    const outcome = database.withLeadingCheck(check, async () => {
      await database.db.execute(sql`INSERT /* lc-insert-4 */ INTO scratch_items (label) VALUES ('written before a denial')`);
    });

    await rejectsWithDenial(outcome);
    expect(await labels('scratch_items')).not.toContain('written before a denial');
    // Not even sent: outside a transaction only a read may go ahead of the verdict.
    expect(statements.some((entry) => entry.text.includes('lc-insert-4'))).toBe(false);
    expect(writesCarrying('lc-insert-4')).toEqual([]);
  });

  it('when the work\'s first statement outside a transaction is an INSERT and the check passes, the INSERT runs after the verdict', async () => {
    const events: string[] = [];
    const check = checkOf('SELECT /* lc-check-5 */ 1 AS ok', passing(() => events.push('verdict')));

    await database.withLeadingCheck(check, async () => {
      await database.db.execute(sql`INSERT /* lc-insert-5 */ INTO scratch_items (label) VALUES ('written after a pass')`);
      events.push('insert done');
    });

    expect(events).toEqual(['verdict', 'insert done']);
    expect(await labels('scratch_items')).toContain('written after a pass');
  });

  it('when the check denies inside a transaction whose work catches and ignores the denial error, nothing the transaction wrote is committed', async () => {
    const check = checkOf('SELECT /* lc-check-6 */ 1 AS ok', denying());
    const swallowed: unknown[] = [];

    const outcome = database.withLeadingCheck(check, () =>
      database.transaction(async (tx) => {
        try {
          await tx.execute(sql`INSERT /* lc-insert-6a */ INTO scratch_items (label) VALUES ('tx write before the verdict')`);
        } catch (error) {
          swallowed.push(error);
        }
        try {
          await tx.execute(sql`INSERT /* lc-insert-6b */ INTO scratch_items (label) VALUES ('tx write after the verdict')`);
        } catch (error) {
          swallowed.push(error);
        }
        return 'work finished';
      }),
    );

    await rejectsWithDenial(outcome);
    expect(swallowed).toHaveLength(2);
    for (const error of swallowed) expect(isDenial(error)).toBe(true);
    const stored = await labels('scratch_items');
    expect(stored).not.toContain('tx write before the verdict');
    expect(stored).not.toContain('tx write after the verdict');
    // The first INSERT did reach the server (it rode behind the check): only withholding COMMIT saved it.
    expect(writesCarrying('lc-insert-6a')).toHaveLength(1);
    expect(statements.some((entry) => /^\s*commit/i.test(entry.text))).toBe(false);
  });

  it('when the check passes inside a transaction, what the transaction wrote is committed', async () => {
    const check = checkOf('SELECT /* lc-check-7 */ 1 AS ok', passing());
    await database.withLeadingCheck(check, () =>
      database.transaction(async (tx) => {
        await tx.execute(sql`INSERT /* lc-insert-7 */ INTO scratch_items (label) VALUES ('tx write with a pass')`);
      }),
    );
    expect(await labels('scratch_items')).toContain('tx write with a pass');
  });

  it('when the check statement itself writes and the work\'s transaction rolls back, the check\'s write is still committed', async () => {
    const check = checkOf(`INSERT /* lc-check-8 */ INTO scratch_check_log (label) VALUES ('written by the check') RETURNING id`, (result) => {
      if (result.rows.length !== 1) throw new Denied();
    });

    const outcome = database.withLeadingCheck(check, () =>
      database.transaction(async (tx) => {
        await tx.execute(sql`INSERT /* lc-insert-8 */ INTO scratch_items (label) VALUES ('rolled back with the work')`);
        throw new Error('the work fails');
      }),
    );

    await expect(outcome).rejects.toThrow('the work fails');
    expect(check.passed).toBe(true);
    expect(await labels('scratch_check_log')).toContain('written by the check');
    expect(await labels('scratch_items')).not.toContain('rolled back with the work');
    // It really rode with the transaction's first statement, in the same write.
    const withCheck = writesCarrying('lc-check-8');
    expect(withCheck).toHaveLength(1);
    expect(writesCarrying('lc-insert-8')).toEqual(withCheck);
  });

  it('when the check statement itself writes and then denies, its own write is committed while the work\'s transaction commits nothing', async () => {
    const check = checkOf(`INSERT /* lc-check-9 */ INTO scratch_check_log (label) VALUES ('written by a denying check') RETURNING id`, () => {
      throw new Denied();
    });

    const outcome = database.withLeadingCheck(check, () =>
      database.transaction(async (tx) => {
        await tx.execute(sql`INSERT /* lc-insert-9 */ INTO scratch_items (label) VALUES ('written under a denial')`).catch(() => {});
      }),
    );

    await rejectsWithDenial(outcome);
    expect(await labels('scratch_check_log')).toContain('written by a denying check');
    expect(await labels('scratch_items')).not.toContain('written under a denial');
  });
});

describe('transactions on the pipelined pool', () => {
  it('when a transaction starts, BEGIN and its first statement leave in one socket write', async () => {
    await database.transaction(async (tx) => {
      await tx.execute(sql`INSERT /* lc-insert-10 */ INTO scratch_items (label) VALUES ('first statement of a transaction')`);
      await tx.execute(sql`SELECT /* lc-read-10 */ 1`);
    });

    const begins = writes.flatMap((entry, index) => (/\bbegin\b/i.test(entry.bytes.toString('latin1')) ? [index] : []));
    expect(begins).toHaveLength(1);
    expect(writesCarrying('lc-insert-10')).toEqual(begins);
    const bytes = writes[begins[0]!]!.bytes.toString('latin1');
    expect(bytes.search(/\bbegin\b/i)).toBeLessThan(bytes.indexOf('lc-insert-10'));
    // One batch: both are answered in one reply.
    expect(syncsIn(writes[begins[0]!]!.bytes)).toBe(1);
    expect(await labels('scratch_items')).toContain('first statement of a transaction');
  });

  it('when a transaction under a leading check starts, the check, BEGIN and the first statement leave in one socket write, the check ahead of BEGIN', async () => {
    const check = checkOf('SELECT /* lc-check-11 */ 1 AS ok', passing());
    const bytes = (await firstTransactionWrite(check, 'lc-check-11', 'lc-insert-11', 'first statement under a check')).toString('latin1');
    const begin = bytes.search(/\bbegin\b/i);
    expect(begin).toBeGreaterThan(bytes.indexOf('lc-check-11'));
    expect(begin).toBeLessThan(bytes.indexOf('lc-insert-11'));
  });
});

describe('a COMMIT sent behind the transaction\'s last statements (commitAfter)', () => {
  /** The socket write that carried `marker`, as text. */
  function writeWith(marker: string): string {
    const found = writesCarrying(marker);
    expect(found, `one write carries ${marker}`).toHaveLength(1);
    return writes[found[0]!]!.bytes.toString('latin1');
  }

  it('when the work announces its last two statements, both and the COMMIT leave in one socket write, COMMIT last, and both rows are committed', async () => {
    await database.transaction(async (tx, control) => {
      await tx.execute(sql`INSERT /* ca-1a */ INTO scratch_items (label) VALUES ('ca first')`);
      control.commitAfter(2);
      const second = tx.execute(sql`INSERT /* ca-1b */ INTO scratch_items (label) VALUES ('ca second')`);
      const third = tx.execute(sql`INSERT /* ca-1c */ INTO scratch_items (label) VALUES ('ca third')`);
      await Promise.all([second, third]);
    });

    const bytes = writeWith('ca-1c');
    expect(writesCarrying('ca-1b')).toEqual(writesCarrying('ca-1c'));
    expect(bytes.lastIndexOf('COMMIT')).toBeGreaterThan(bytes.indexOf('ca-1c'));
    // One batch: the two statements and the COMMIT are answered in one reply.
    expect(syncsIn(writes[writesCarrying('ca-1c')[0]!]!.bytes)).toBe(1);
    // Drizzle's own COMMIT waited for that one instead of sending a second.
    expect(statements.filter((entry) => /^\s*commit\b/i.test(entry.text))).toHaveLength(1);
    expect(await labels('scratch_items')).toEqual(expect.arrayContaining(['ca first', 'ca second', 'ca third']));
  });

  it('when a statement sent ahead of the COMMIT fails, nothing the transaction wrote is committed and the work fails with that statement\'s error', async () => {
    const outcome = database.transaction(async (tx, control) => {
      await tx.execute(sql`INSERT /* ca-2a */ INTO scratch_items (label) VALUES ('ca-2 before')`);
      control.commitAfter(2);
      const failing = tx.execute(sql`INSERT /* ca-2b */ INTO scratch_items (label) VALUES (NULL)`);
      const behind = tx.execute(sql`INSERT /* ca-2c */ INTO scratch_items (label) VALUES ('ca-2 behind the failure')`);
      behind.catch(() => {});
      await failing;
      await behind;
    });

    await expect(outcome).rejects.toMatchObject({ cause: { code: '23502' } });
    expect(writeWith('ca-2c').lastIndexOf('COMMIT')).toBeGreaterThan(0);
    const stored = await labels('scratch_items');
    expect(stored).not.toContain('ca-2 before');
    expect(stored).not.toContain('ca-2 behind the failure');
  });

  it('when a statement ahead of the COMMIT in its batch fails, PostgreSQL skips that COMMIT, so the transaction is rolled back before its connection goes back to the pool', async () => {
    const outcome = database.transaction(async (tx, control) => {
      await tx.execute(sql`INSERT /* ca-6a */ INTO scratch_items (label) VALUES ('ca-6 before')`);
      control.commitAfter(1);
      await tx.execute(sql`INSERT /* ca-6b */ INTO scratch_items (label) VALUES (NULL)`);
    });

    await expect(outcome).rejects.toMatchObject({ cause: { code: '23502' } });
    expect(statements.filter((entry) => /^\s*rollback\b/i.test(entry.text))).toHaveLength(1);
    const { rows } = await ctx.database.pool.query(
      `SELECT count(*)::int AS stuck FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'`,
    );
    expect(rows[0].stuck).toBe(0);
    // The pool's connections all work: none was handed back inside the failed transaction.
    await Promise.all([1, 2, 3, 4].map(() => database.transaction(async (tx) => tx.execute(sql`SELECT 1`))));
    expect(await labels('scratch_items')).not.toContain('ca-6 before');
  });

  it('when fewer statements come than announced, no COMMIT is sent ahead: the transaction commits as usual, in a write of its own', async () => {
    await database.transaction(async (tx, control) => {
      control.commitAfter(3);
      await tx.execute(sql`INSERT /* ca-3a */ INTO scratch_items (label) VALUES ('ca-3 only')`);
    });

    expect(writeWith('ca-3a')).not.toMatch(/COMMIT/);
    expect(writes.some((entry) => /COMMIT/i.test(entry.bytes.toString('latin1')))).toBe(true);
    expect(await labels('scratch_items')).toContain('ca-3 only');
  });

  it('when the work fails before the last announced statement, the statements held for the COMMIT are never sent and the transaction rolls back', async () => {
    let held: Promise<unknown> | undefined;
    const outcome = database.transaction(async (tx, control) => {
      await tx.execute(sql`INSERT /* ca-7a */ INTO scratch_items (label) VALUES ('ca-7 before')`);
      control.commitAfter(2);
      // Once: Drizzle runs a statement again each time its result is asked for.
      held = Promise.resolve(tx.execute(sql`INSERT /* ca-7b */ INTO scratch_items (label) VALUES ('ca-7 held')`));
      held.catch(() => {});
      // Drizzle sends a statement a few promise turns after it is asked for: let it reach the
      // connection, where it is held (held statements go out only at the end of the event loop's turn).
      for (let turn = 0; turn < 20; turn += 1) await Promise.resolve();
      throw new Error('the work fails before its last statement');
    });

    await expect(outcome).rejects.toThrow('the work fails before its last statement');
    await expect(held).rejects.toMatchObject({ cause: { message: expect.stringMatching(/rolled back before this statement was sent/) } });
    expect(writesCarrying('ca-7b')).toEqual([]);
    const stored = await labels('scratch_items');
    expect(stored).not.toContain('ca-7 before');
    expect(stored).not.toContain('ca-7 held');
  });

  it('when a statement comes after its transaction ended, it is refused instead of running outside the transaction', async () => {
    let late: Promise<unknown> | undefined;
    await database.transaction(async (tx) => {
      await tx.execute(sql`INSERT /* ca-8a */ INTO scratch_items (label) VALUES ('ca-8 inside')`);
      // Not awaited by the work: Drizzle sends it once the transaction has committed.
      late = new Promise((resolve) => setImmediate(resolve)).then(() => tx.execute(sql`INSERT /* ca-8b */ INTO scratch_items (label) VALUES ('ca-8 late')`));
      late.catch(() => {});
    });

    await expect(late).rejects.toMatchObject({ cause: { message: expect.stringMatching(/after its transaction ended/) } });
    const stored = await labels('scratch_items');
    expect(stored).toContain('ca-8 inside');
    expect(stored).not.toContain('ca-8 late');
  });

  it('when the work joined a transaction an outer scope opened, it sends no COMMIT ahead: the outer scope\'s failure still rolls its writes back', async () => {
    const outcome = database.transaction(async (outer) => {
      await outer.execute(sql`INSERT /* ca-4a */ INTO scratch_items (label) VALUES ('ca-4 outer')`);
      await database.transaction(async (tx, control) => {
        control.commitAfter(1);
        await tx.execute(sql`INSERT /* ca-4b */ INTO scratch_items (label) VALUES ('ca-4 joined')`);
      });
      throw new Error('the outer scope fails after the joined work');
    });

    await expect(outcome).rejects.toThrow('the outer scope fails');
    expect(writeWith('ca-4b')).not.toMatch(/COMMIT/);
    const stored = await labels('scratch_items');
    expect(stored).not.toContain('ca-4 outer');
    expect(stored).not.toContain('ca-4 joined');
  });

  it('when the leading check has not answered yet, no COMMIT goes ahead of its verdict: a denial still commits nothing', async () => {
    const check = checkOf('SELECT /* ca-check-5 */ 1 AS ok', denying());

    const outcome = database.withLeadingCheck(check, () =>
      database.transaction(async (tx, control) => {
        control.commitAfter(1);
        await tx.execute(sql`INSERT /* ca-5a */ INTO scratch_items (label) VALUES ('ca-5 under a denied check')`);
      }),
    );

    await rejectsWithDenial(outcome);
    expect(writeWith('ca-5a')).not.toMatch(/COMMIT/);
    expect(await labels('scratch_items')).not.toContain('ca-5 under a denied check');
  });
});

describe('transactions that send nothing, and connections released inside one', () => {
  it('when a transaction under a leading check sends no statement, neither BEGIN nor COMMIT is sent, and the check still goes out and is answered', async () => {
    let judged = false;
    const check = checkOf('SELECT /* nt-check-1 */ 1 AS ok', passing(() => (judged = true)));
    const result = await database.withLeadingCheck(check, () => database.transaction(async () => 'nothing to write'));

    expect(result).toBe('nothing to write');
    expect(judged).toBe(true);
    await expect(check.verdict()).resolves.toBeUndefined();
    expect(statements.map((entry) => entry.text)).toEqual(['SELECT /* nt-check-1 */ 1 AS ok']);
  });

  it('when a connection is released while its transaction is still open, it is closed instead of going back to the pool', async () => {
    const connection = await database.db.$client.connect();
    await connection.query('BEGIN');
    await connection.query({ text: `INSERT /* rl-1 */ INTO scratch_items (label) VALUES ('rl-1 never committed')` });
    const before = database.pool.totalCount;
    connection.release();

    expect(database.pool.totalCount).toBe(before - 1);
    expect(await labels('scratch_items')).not.toContain('rl-1 never committed');
  });
});

describe('named prepared statements in a request\'s transactions', () => {
  /** Prepared statements of the connection the transaction runs on, read inside it. */
  async function preparedIn(tx: Parameters<Parameters<Database['transaction']>[0]>[0]): Promise<string[]> {
    const result = await tx.execute(sql`SELECT statement FROM pg_prepared_statements`);
    return (result.rows as Array<{ statement: string }>).map((row) => row.statement);
  }

  it('when a request\'s transaction writes, its INSERT is prepared under a name once per connection; its plain reads are not', async () => {
    const check = checkOf('SELECT /* ps-check-1 */ 1 AS ok', passing());
    const prepared = await database.withLeadingCheck(check, () =>
      database.transaction(async (tx) => {
        await tx.execute(sql`SELECT /* ps-read-1 */ label FROM scratch_items WHERE label = ${'x'}`);
        await tx.execute(sql`INSERT /* ps-insert-1 */ INTO scratch_items (label) VALUES (${'ps-1 first'})`);
        await tx.execute(sql`INSERT /* ps-insert-1 */ INTO scratch_items (label) VALUES (${'ps-1 second'})`);
        return preparedIn(tx);
      }),
    );

    expect(prepared.filter((text) => text.includes('ps-insert-1'))).toHaveLength(1);
    expect(prepared.some((text) => text.includes('ps-read-1'))).toBe(false);
    // The second INSERT bound the named statement without sending its text again.
    const inserts = writes.filter((entry) => entry.bytes.includes('ps-1 second'));
    expect(inserts).toHaveLength(1);
    expect(inserts[0]!.bytes.includes('ps-insert-1')).toBe(false);
    expect(await labels('scratch_items')).toEqual(expect.arrayContaining(['ps-1 first', 'ps-1 second']));
  });

  it('when a transaction runs outside a request (a worker, the CLI), its statements stay unnamed', async () => {
    const prepared = await database.transaction(async (tx) => {
      await tx.execute(sql`INSERT /* ps-insert-2 */ INTO scratch_items (label) VALUES (${'ps-2'})`);
      return preparedIn(tx);
    });
    expect(prepared.some((text) => text.includes('ps-insert-2'))).toBe(false);
  });
});

describe('when the database cannot be reached', () => {
  it('when the statement that claimed the check cannot get a connection, the check fails with that error instead of waiting for a verdict forever', async () => {
    // Nothing listens on port 1: connecting is refused at once.
    const unreachable = createDatabase('postgres://postgres@127.0.0.1:1/none', { poolSize: 1 });
    try {
      const check = unreachable.leadingCheck({ text: 'SELECT 1' }, () => {});
      // Awaited inside the work: Drizzle sends a query only when it is awaited.
      await expect(unreachable.withLeadingCheck(check, async () => await unreachable.db.execute(sql`SELECT 1`))).rejects.toThrow();
      await expect(check.settle()).rejects.toThrow(/ECONNREFUSED|connect/);
    } finally {
      await unreachable.close();
    }
  });
});

describe('a read-only leading check (it writes nothing)', () => {
  it('when it leads a read outside a transaction, the check and the read leave in one socket write with one Sync, and the read\'s rows arrive only after a passing verdict', async () => {
    const events: string[] = [];
    const check = readOnlyCheckOf('SELECT /* ro-check-1 */ 1 AS ok', passing(() => events.push('verdict')));

    const rows = await database.withLeadingCheck(check, async () => {
      const result = await database.db.execute(sql`SELECT /* ro-read-1 */ label FROM scratch_items ORDER BY id LIMIT 1`);
      events.push(`read resolved, check passed: ${check.passed}`);
      return result.rows;
    });

    expect(rows).toEqual([{ label: 'seeded' }]);
    expect(events).toEqual(['verdict', 'read resolved, check passed: true']);
    const withCheck = writesCarrying('ro-check-1');
    expect(withCheck).toHaveLength(1);
    expect(writesCarrying('ro-read-1')).toEqual(withCheck);
    expect(syncsIn(writes[withCheck[0]!]!.bytes)).toBe(1);
  });

  it('when it denies ahead of a read outside a transaction, the read rejects with the denial and its rows are never handed out', async () => {
    const check = readOnlyCheckOf('SELECT /* ro-check-2 */ 1 AS ok', denying());
    let released: unknown = 'nothing';
    const outcome = database.withLeadingCheck(check, async () => {
      released = await database.db.execute(sql`SELECT /* ro-read-2 */ label FROM scratch_items`);
    });
    await rejectsWithDenial(outcome);
    expect(released).toBe('nothing');
  });

  it('when its statement fails, the read sharing its Sync rejects with the check\'s error, not a bare "not run"', async () => {
    const check = readOnlyCheckOf('SELECT /* ro-check-3 */ 1 / 0 AS ok', passing());
    const outcome = database.withLeadingCheck(check, async () => {
      await database.db.execute(sql`SELECT /* ro-read-3 */ 1`);
    });
    const error = await outcome.then(() => undefined, (reason: unknown) => reason);
    expect(String((error as { cause?: unknown })?.cause ?? error)).toMatch(/division by zero/);
    await expect(check.verdict()).rejects.toThrow(/division by zero/);
  });

  it('when it leads a transaction, it leaves behind BEGIN and ahead of the first statement, all three under one Sync, and what the transaction wrote commits after a pass', async () => {
    const check = readOnlyCheckOf('SELECT /* ro-check-4 */ 1 AS ok', passing());
    const bytes = await firstTransactionWrite(check, 'ro-check-4', 'ro-insert-4', 'written under a read-only check');
    const text = bytes.toString('latin1');
    const begin = text.search(/\bbegin\b/i);
    expect(begin).toBeGreaterThan(-1);
    expect(begin).toBeLessThan(text.indexOf('ro-check-4'));
    expect(text.indexOf('ro-check-4')).toBeLessThan(text.indexOf('ro-insert-4'));
    expect(syncsIn(bytes)).toBe(1);
    expect(await labels('scratch_items')).toContain('written under a read-only check');
  });

  it('when it denies inside a transaction, nothing the transaction wrote is committed', async () => {
    const check = readOnlyCheckOf('SELECT /* ro-check-5 */ 1 AS ok', denying());
    const outcome = database.withLeadingCheck(check, () =>
      database.transaction(async (tx) => {
        await tx.execute(sql`INSERT /* ro-insert-5 */ INTO scratch_items (label) VALUES ('written before a read-only denial')`);
      }),
    );
    await rejectsWithDenial(outcome);
    expect(await labels('scratch_items')).not.toContain('written before a read-only denial');
    expect(statements.some((entry) => /^\s*commit/i.test(entry.text))).toBe(false);
  });

  it('when its verdict takes a further round trip (a promise), the transaction\'s results and its COMMIT wait for it, and a late denial still commits nothing', async () => {
    let decide!: (passed: boolean) => void;
    const decided = new Promise<boolean>((resolve) => (decide = resolve));
    const check = readOnlyCheckOf('SELECT /* ro-check-6 */ 1 AS ok', () =>
      decided.then((passed) => {
        if (!passed) throw new Denied();
      }),
    );
    let readResolved = false;
    const outcome = database.withLeadingCheck(check, () =>
      database.transaction(async (tx) => {
        await tx.execute(sql`INSERT /* ro-insert-6 */ INTO scratch_items (label) VALUES ('written before a late denial')`);
        readResolved = true;
      }),
    );
    await new Promise((resolve) => setTimeout(resolve, 100));
    // The INSERT's answer is in, but it is not handed out before the verdict.
    expect(writesCarrying('ro-insert-6')).toHaveLength(1);
    expect(readResolved).toBe(false);
    decide(false);
    await rejectsWithDenial(outcome);
    expect(await labels('scratch_items')).not.toContain('written before a late denial');
  });
});
