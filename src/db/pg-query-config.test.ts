import { createRequire } from 'node:module';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext } from '../../test/helpers/harness.js';
import { sendQuery } from './pipelined-pool.js';

const require = createRequire(import.meta.url);
type Normalize = (config: unknown, values?: unknown, callback?: unknown) => Record<string, unknown>;
const pgUtils = require('pg/lib/utils.js') as { normalizeQueryConfig: Normalize };

let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

describe('query configs copied without property descriptors (src/db/pg-query-config.ts)', () => {
  it('when a plain object config is given, pg gets a copy through the cheap path and the caller\'s object is left as it was', () => {
    const config = { name: 'n', text: 'SELECT $1', values: [1], rowMode: 'array' };
    const callback = () => {};
    const copy = pgUtils.normalizeQueryConfig(config, [2], callback);
    expect(pgUtils.normalizeQueryConfig).toHaveProperty('__plainCopy', true);
    expect(copy).not.toBe(config);
    expect(copy).toEqual({ name: 'n', text: 'SELECT $1', values: [2], rowMode: 'array', callback });
    expect(Object.getPrototypeOf(copy)).toBe(Object.prototype);
    expect(config).toEqual({ name: 'n', text: 'SELECT $1', values: [1], rowMode: 'array' });
  });

  it('when the values argument is a function, it is taken as the callback, as pg does', () => {
    const callback = () => {};
    const copy = pgUtils.normalizeQueryConfig({ text: 'SELECT 1' }, callback);
    expect(copy).toEqual({ text: 'SELECT 1', callback });
  });

  it('when a config is a class instance, pg\'s own copy keeps its prototype and accessors', () => {
    class Statement {
      get text() {
        return 'SELECT 1';
      }
      values = [3];
    }
    const copy = pgUtils.normalizeQueryConfig(new Statement());
    expect(copy).toBeInstanceOf(Statement);
    expect(copy.text).toBe('SELECT 1');
    expect(copy.values).toEqual([3]);
  });

  it('when a config is a string, it becomes the text of a new config', () => {
    expect(pgUtils.normalizeQueryConfig('SELECT 1', [1])).toEqual({ text: 'SELECT 1', values: [1] });
  });

  it('when a named, array-mode statement runs twice through the cheap copy, PostgreSQL answers both with the values given', async () => {
    const config = { name: 'pg_query_config_probe', text: 'SELECT $1::int * 2 AS doubled', rowMode: 'array' as const };
    const first = await sendQuery(ctx.database.pool, config, [21]);
    const second = await sendQuery(ctx.database.pool, config, [50]);
    expect(first.rows).toEqual([[42]]);
    expect(second.rows).toEqual([[100]]);
    expect(config).not.toHaveProperty('values');
  });
});
