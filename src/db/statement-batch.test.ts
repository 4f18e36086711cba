import pg from 'pg';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext } from '../../test/helpers/harness.js';
import { onSocketWrites, portalDescribesIn, syncsIn } from '../../test/helpers/socket-writes.js';
import { StatementBatch, StatementNotRun, type BatchedStatement } from './statement-batch.js';

let ctx: TestContext;
let client: pg.Client;
let writes: Buffer[];

beforeAll(async () => {
  ctx = await createTestContext();
  await ctx.database.pool.query('CREATE TABLE batch_items (id serial PRIMARY KEY, label text NOT NULL)');
  // A pipelined client, as the project's pool makes them (a batch is refused on no other kind by design of pg).
  client = new pg.Client({ connectionString: ctx.databaseUrl, pipeline: true } as pg.ClientConfig);
  await client.connect();
  onSocketWrites(client, (bytes) => writes.push(bytes));
});
afterAll(async () => {
  await client?.end();
  await ctx?.close();
});
beforeEach(() => {
  writes = [];
});

type Outcome = { result?: pg.QueryResult; error?: Error };

/** Sends `statements` as one batch; resolves once every statement's callback has been called. */
function sendBatch(statements: Array<Omit<BatchedStatement, 'callback'>>): Promise<Outcome[]> {
  return new Promise((resolve) => {
    const outcomes: Outcome[] = [];
    let pending = statements.length;
    const batch = new StatementBatch(
      statements.map((statement, index) => ({
        ...statement,
        callback: (error, result) => {
          outcomes[index] = error ? { error } : { result };
          if ((pending -= 1) === 0) resolve(outcomes);
        },
      })),
    );
    (client.query as unknown as (query: StatementBatch) => void).call(client, batch);
  });
}

async function labels(): Promise<string[]> {
  const { rows } = await ctx.database.pool.query<{ label: string }>('SELECT label FROM batch_items ORDER BY id');
  return rows.map((row) => row.label);
}

describe('statements sent as one batch (src/db/statement-batch.ts)', () => {
  it('when statements share a batch, they leave with one Sync and each gets its own result, in its own row mode', async () => {
    const [asObjects, asArrays, inserted] = await sendBatch([
      { config: { text: 'SELECT 1::int AS one, $1::text AS label', values: ['objects'] }, values: undefined },
      { config: { text: 'SELECT 2::int8 AS two, now() AS at', rowMode: 'array' } as pg.QueryConfig, values: undefined },
      { config: { text: 'INSERT INTO batch_items (label) VALUES ($1) RETURNING label', name: 'batch_insert_1' }, values: ['batched'] },
    ]);

    expect(syncsIn(Buffer.concat(writes))).toBe(1);
    expect(asObjects!.result!.rows).toEqual([{ one: 1, label: 'objects' }]);
    expect(asArrays!.result!.rows).toEqual([[2, expect.any(Date)]]);
    expect(inserted!.result!.command).toBe('INSERT');
    expect(inserted!.result!.rows).toEqual([{ label: 'batched' }]);
    expect(await labels()).toContain('batched');
  });

  it('when a batch is sent, all its messages go to the socket as one buffer, in one write call', async () => {
    const stream = (client as unknown as { connection: { stream: { write(bytes: Buffer): boolean } } }).connection.stream;
    const write = stream.write;
    const calls: Buffer[] = [];
    stream.write = function (this: unknown, bytes: Buffer) {
      calls.push(bytes);
      return write.call(this, bytes);
    } as typeof stream.write;
    try {
      await sendBatch([
        { config: { text: 'SELECT $1::int AS n', name: 'batch_one_write' }, values: [1] },
        { config: { text: 'SELECT $1::text AS t' }, values: ['two'] },
      ]);
    } finally {
      stream.write = write;
    }
    expect(calls).toHaveLength(1);
    expect(syncsIn(calls[0]!)).toBe(1);
  });

  it('when the last statement of a batch is answered, the connection already shows the transaction status the batch ended in', async () => {
    const status = () => (client as unknown as { _txStatus: string })._txStatus;
    const seen: string[] = [];
    await new Promise<void>((resolve, reject) => {
      const batch = new StatementBatch([
        { config: 'BEGIN', values: undefined, callback: () => seen.push(`begin:${status()}`) },
        { config: 'SELECT 1', values: undefined, callback: (error) => (error ? reject(error) : (seen.push(`last:${status()}`), resolve())) },
      ]);
      (client.query as unknown as (query: StatementBatch) => void).call(client, batch);
    });
    await client.query('ROLLBACK');

    // BEGIN is answered mid-batch, before the batch's ReadyForQuery; the last statement after it.
    expect(seen).toEqual(['begin:I', 'last:T']);
  });

  it('when a statement fails, those ahead keep their results, it gets PostgreSQL\'s error, and those behind it fail with StatementNotRun without running', async () => {
    const [ahead, failing, behind] = await sendBatch([
      { config: 'SELECT 41 + 1 AS answer', values: undefined },
      { config: { text: 'INSERT INTO batch_items (label) VALUES ($1)' }, values: [null] },
      { config: { text: 'INSERT INTO batch_items (label) VALUES ($1)' }, values: ['behind the failure'] },
    ]);

    expect(ahead!.result!.rows).toEqual([{ answer: 42 }]);
    expect(failing!.error).toMatchObject({ code: '23502' });
    expect(behind!.error).toBeInstanceOf(StatementNotRun);
    expect((behind!.error as StatementNotRun).cause).toBe(failing!.error);
    expect(await labels()).not.toContain('behind the failure');
    // The connection is usable, and idle: the failure ended the batch's implicit transaction.
    expect((await client.query('SELECT 1 AS ok')).rows).toEqual([{ ok: 1 }]);
    expect((client as unknown as { _txStatus: string })._txStatus).toBe('I');
  });

  it('when a named statement failed to parse, or sat behind a failure, the next batch parses it again instead of binding a statement PostgreSQL does not have', async () => {
    const first = await sendBatch([
      { config: { text: 'SELEC broken', name: 'batch_broken_2' }, values: undefined },
      { config: { text: 'SELECT $1::int + 1 AS next', name: 'batch_behind_2' }, values: [1] },
    ]);
    expect(first[0]!.error).toMatchObject({ code: '42601' });
    expect(first[1]!.error).toBeInstanceOf(StatementNotRun);

    const again = await sendBatch([
      { config: { text: 'SELECT $1::int + 1 AS next', name: 'batch_behind_2' }, values: [2] },
      { config: 'SELECT 1 AS ok', values: undefined },
    ]);
    expect(again[0]!.result!.rows).toEqual([{ next: 3 }]);
    // The statement that failed to parse is not taken for parsed either: its name can be parsed anew.
    const [fixed] = await sendBatch([
      { config: { text: 'SELECT 7 AS seven', name: 'batch_broken_2' }, values: undefined },
      { config: 'SELECT 1 AS ok', values: undefined },
    ]);
    expect(fixed!.result!.rows).toEqual([{ seven: 7 }]);
  });

  it('when a named statement was parsed and then failed to run, the next batch binds it again without re-parsing it', async () => {
    const first = await sendBatch([
      { config: { text: 'SELECT 1 / $1::int AS quotient', name: 'batch_divide_3' }, values: [0] },
      { config: 'SELECT 1 AS ok', values: undefined },
    ]);
    expect(first[0]!.error).toMatchObject({ code: '22012' });
    writes = [];

    const again = await sendBatch([
      { config: { text: 'SELECT 1 / $1::int AS quotient', name: 'batch_divide_3' }, values: [1] },
      { config: 'SELECT 2 AS ok', values: undefined },
    ]);
    expect(again[0]!.result!.rows).toEqual([{ quotient: 1 }]);
    expect(Buffer.concat(writes).includes('SELECT 1 / $1')).toBe(false);
  });

  it('when a value cannot be encoded, no statement of the batch is written and every one of them fails', async () => {
    const unencodable = {
      toPostgres() {
        throw new Error('cannot encode this value');
      },
    };
    const outcomes = await sendBatch([
      { config: { text: 'INSERT INTO batch_items (label) VALUES ($1)' }, values: ['ahead of a bad value'] },
      { config: { text: 'INSERT INTO batch_items (label) VALUES ($1)' }, values: [unencodable] },
    ]);

    expect(outcomes[0]!.error?.message).toBe('cannot encode this value');
    expect(outcomes[1]!.error).toBeInstanceOf(StatementNotRun);
    expect(writes).toEqual([]);
    expect(await labels()).not.toContain('ahead of a bad value');
    expect((await client.query('SELECT 1 AS ok')).rows).toEqual([{ ok: 1 }]);
  });

  describe('a named statement run again on its connection', () => {
    const describesSent = () => portalDescribesIn(Buffer.concat(writes.splice(0)));

    it('when it runs again, it goes without a Describe and its rows still come back decoded, as objects and as arrays', async () => {
      const read = { text: 'SELECT $1::int8 AS n, now() AS at, $2::text AS label', name: 'batch_described_read' };
      const asArrays = { ...read, name: 'batch_described_read_arrays', rowMode: 'array' } as pg.QueryConfig;
      const first = await sendBatch([
        { config: read, values: [7, 'first'] },
        { config: asArrays, values: [8, 'first'] },
      ]);
      expect(describesSent()).toBe(2);

      const again = await sendBatch([
        { config: read, values: [9, 'again'] },
        { config: asArrays, values: [10, 'again'] },
      ]);
      expect(describesSent()).toBe(0);
      expect(again[0]!.result!.rows).toEqual([{ n: 9, at: expect.any(Date), label: 'again' }]);
      expect(again[1]!.result!.rows).toEqual([[10, expect.any(Date), 'again']]);
      expect(again[0]!.result!.fields.map((field) => field.name)).toEqual(first[0]!.result!.fields.map((field) => field.name));
    });

    it('when its later runs are read as arrays with one type source, they share the parsers made for the first, and a run with other types gets its own', async () => {
      const text = 'SELECT $1::int8 AS n, now() AS at';
      const parsersOf = (outcome: Outcome) => (outcome.result as unknown as { _parsers: unknown[] })._parsers;
      const asText = (value: string) => value;
      const timestampsAsText = { getTypeParser: (oid: number) => (oid === 1184 ? asText : pg.types.getTypeParser(oid)) };
      const run = (n: number, types?: unknown) =>
        sendBatch([{ config: { text, name: 'batch_shared_parsers', rowMode: 'array', ...(types ? { types } : {}) } as pg.QueryConfig, values: [n] }]).then(([outcome]) => outcome!);
      await run(1);
      const second = await run(2);
      const third = await run(3);
      expect(parsersOf(third)).toBe(parsersOf(second));
      expect(third.result!.rows).toEqual([[3, expect.any(Date)]]);

      const withOtherTypes = await run(4, timestampsAsText);
      expect(parsersOf(withOtherTypes)).not.toBe(parsersOf(second));
      expect(withOtherTypes.result!.rows).toEqual([[4, expect.any(String)]]);
      expect((await run(5)).result!.rows).toEqual([[5, expect.any(Date)]]);
    });

    it('when a batch opens or ends a transaction, its BEGIN and COMMIT go without a Describe even the first time, and answer as usual', async () => {
      const [begin, inserted, commit] = await sendBatch([
        { config: 'BEGIN', values: undefined },
        { config: { text: 'INSERT INTO batch_items (label) VALUES ($1)' }, values: ['in a transaction'] },
        { config: 'COMMIT', values: undefined },
      ]);
      expect(describesSent()).toBe(1);
      expect([begin!.result!.command, inserted!.result!.command, commit!.result!.command]).toEqual(['BEGIN', 'INSERT', 'COMMIT']);
      expect(await labels()).toContain('in a transaction');
    });

    it('when it returns no rows, it runs again without a Describe and still reports its command and row count', async () => {
      const insert = { text: 'INSERT INTO batch_items (label) VALUES ($1)', name: 'batch_described_insert' };
      await sendBatch([{ config: insert, values: ['no rows 1'] }]);
      expect(describesSent()).toBe(1);

      const [again] = await sendBatch([{ config: insert, values: ['no rows 2'] }]);
      expect(describesSent()).toBe(0);
      expect(again!.result!.command).toBe('INSERT');
      expect(again!.result!.rowCount).toBe(1);
      expect(again!.result!.rows).toEqual([]);
      expect(await labels()).toContain('no rows 2');
    });

    it('when it fails, its next run asks for the description again', async () => {
      const divide = { text: 'SELECT 10 / $1::int AS quotient', name: 'batch_described_divide' };
      await sendBatch([{ config: divide, values: [2] }]);
      const [undescribed] = await sendBatch([{ config: divide, values: [5] }]);
      expect(undescribed!.result!.rows).toEqual([{ quotient: 2 }]);
      const [failed] = await sendBatch([{ config: divide, values: [0] }]);
      expect(failed!.error!.message).toMatch(/division by zero/);
      writes.splice(0);

      const [after] = await sendBatch([{ config: divide, values: [10] }]);
      expect(describesSent()).toBe(1);
      expect(after!.result!.rows).toEqual([{ quotient: 1 }]);
    });
  });
});
