import type pg from 'pg';
import { describe, expect, it } from 'vitest';
import { accessCheckRowOf } from './api-keys.repository.js';

/** An array-mode result as pg hands it over: fresh name strings for every result. */
function arrayResult(names: string[], values: unknown[][]): pg.QueryResult {
  return { rows: values, fields: names.map((name) => ({ name: `${name}` })) } as unknown as pg.QueryResult;
}

describe('the access check row (accessCheckRowOf)', () => {
  it('when the result has a row, it keys each value by its column name', () => {
    const row = accessCheckRowOf(arrayResult(['id', 'active', 'burst_granted'], [['k1', true, 3]]));
    expect(row).toEqual({ id: 'k1', active: true, burst_granted: 3 });
  });

  it("when a later result has other columns or another order, it keys by that result's names, not the ones kept from before", () => {
    accessCheckRowOf(arrayResult(['id', 'active'], [['k1', true]]));
    expect(accessCheckRowOf(arrayResult(['active', 'id'], [[false, 'k2']]))).toEqual({ active: false, id: 'k2' });
    expect(accessCheckRowOf(arrayResult(['active', 'id', 'day_count'], [[true, 'k3', 7]]))).toEqual({
      active: true,
      id: 'k3',
      day_count: 7,
    });
    expect(accessCheckRowOf(arrayResult(['id'], [['k4']]))).toEqual({ id: 'k4' });
  });

  it('when no key has the hash (no row), it is undefined', () => {
    expect(accessCheckRowOf(arrayResult(['id', 'active'], []))).toBeUndefined();
  });
});
