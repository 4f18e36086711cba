import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext } from '../../test/helpers/harness.js';
import { sendQuery } from './pipelined-pool.js';

let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

const EVERY_KIND = `SELECT 1::int AS n, 2::int8 AS big, 'text'::text AS t, NULL::text AS nothing, true AS yes,
  '2025-06-01T10:11:12.345Z'::timestamptz AS at, '{a,b}'::text[] AS list, '{"k": [1, null]}'::jsonb AS doc, '2020-02-29'::date AS day`;

/** pg's Result carries the row template it builds for object rows; the patch leaves it unbuilt for array rows. */
type WithTemplate = { _prebuiltEmptyResultObject: unknown };

describe('results read as arrays (src/db/pg-array-rows.ts)', () => {
  it('when a result is read as arrays, pg builds no per-result object of the column names', async () => {
    const result = await ctx.database.pool.query({ text: EVERY_KIND, rowMode: 'array' });
    expect((result as unknown as WithTemplate)._prebuiltEmptyResultObject).toBeNull();
    expect(result.fields.map((field) => field.name)).toEqual(['n', 'big', 't', 'nothing', 'yes', 'at', 'list', 'doc', 'day']);
  });

  it('when a result is read as arrays, every value is parsed exactly as it is for a result read as objects', async () => {
    const asArrays = await ctx.database.pool.query({ text: EVERY_KIND, rowMode: 'array' });
    const asObjects = await ctx.database.pool.query(EVERY_KIND);
    const names = asObjects.fields.map((field) => field.name);
    expect(asArrays.rows[0]).toEqual(names.map((name) => asObjects.rows[0][name]));
    expect(asArrays.rows[0]).toEqual([1, 2, 'text', null, true, new Date('2025-06-01T10:11:12.345Z'), ['a', 'b'], { k: [1, null] }, expect.any(Date)]);
  });

  it('when a result is read as objects, pg still builds its rows from the template, keyed by column name', async () => {
    const result = await ctx.database.pool.query(`SELECT 1 AS "__proto__", 2 AS constructor`);
    expect((result as unknown as WithTemplate)._prebuiltEmptyResultObject).not.toBeNull();
    expect(Object.getOwnPropertyDescriptor(result.rows[0], '__proto__')?.value).toBe(1);
    expect(result.rows[0].constructor).toBe(2);
  });
});

describe('statements sent through pg callbacks (sendQuery)', () => {
  it('when the statement succeeds, it resolves with pg\'s result', async () => {
    const result = await sendQuery(ctx.database.pool, { text: 'SELECT $1::int + 1 AS n', values: [41] });
    expect(result.rows).toEqual([{ n: 42 }]);
  });

  it('when PostgreSQL refuses the statement, it rejects with PostgreSQL\'s error', async () => {
    await expect(sendQuery(ctx.database.pool, 'SELECT 1 / 0')).rejects.toMatchObject({ code: '22012' });
  });
});
