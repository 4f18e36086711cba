import { createHash } from 'node:crypto';
import { DrizzleQueryError, fillPlaceholders, getTableColumns, is, sql, SQL, type InferSelectModel, type Query, type Table } from 'drizzle-orm';
import { PgDialect } from 'drizzle-orm/pg-core';
import pg from 'pg';
import type { Executor } from './client.js';

const dialect = new PgDialect();

type Buildable = SQL | { toSQL(): Query };

/**
 * A hot statement whose SQL Drizzle builds once, with `sql.placeholder`s, and which then runs on
 * whichever executor it is given (the pool or the caller's transaction), binding only the values.
 * Building a query costs far more than running it (a 45-column select is ~150 SQL chunks walked per
 * call, the largest share of an upsert's CPU in bench/README.md); a Drizzle `.prepare()` would build
 * once too, but is bound to the pool and cannot run inside a transaction. It is also a named
 * prepared statement: PostgreSQL parses and plans it once per connection. Its name is `prefix`
 * and a digest of its text, so two texts can never share a name.
 */
export type BuiltOnce = {
  /**
   * Runs the statement on `executor` with the placeholders' values. Rows come as arrays, in the
   * order of the statement's columns (a whole-table select or `RETURNING` lists the table's columns
   * in order: see rowMapper), with timestamps as PostgreSQL's text, as Drizzle reads them.
   */
  run(executor: Executor, values: Record<string, unknown>): Promise<{ rows: unknown[][] }>;
};

/** What a built-once statement runs on: the executor's session client (the pipelined pool, or a transaction's connection). */
type SessionClient = { query(config: pg.QueryConfig, values: unknown[]): Promise<pg.QueryResult> };

const asText = (value: string) => value;
const TIMESTAMP_AND_INTERVAL_TYPES = new Set<number>([
  pg.types.builtins.TIMESTAMPTZ,
  pg.types.builtins.TIMESTAMP,
  pg.types.builtins.DATE,
  pg.types.builtins.INTERVAL,
  1115, // timestamp[]
  1182, // date[]
  1185, // timestamptz[]
  1187, // interval[]
  1231, // numeric[]
]);
/**
 * Values decoded as Drizzle's own prepared queries decode them (drizzle-orm/node-postgres): date,
 * time and interval types (and their arrays, and numeric arrays) stay PostgreSQL's text, for the
 * columns' mapFromDriverValue; everything else as pg decodes it.
 */
const DRIZZLE_TYPES = {
  getTypeParser: (typeId: number, format?: string) =>
    TIMESTAMP_AND_INTERVAL_TYPES.has(typeId) ? asText : pg.types.getTypeParser(typeId, format as 'text'),
};

export function builtOnce(prefix: string, build: () => Buildable): BuiltOnce {
  let built: { query: Query; config: pg.QueryConfig } | undefined;
  const once = () => {
    if (built) return built;
    const source = build();
    const query = is(source, SQL) ? dialect.sqlToQuery(source) : source.toSQL();
    const name = `${prefix}_${createHash('sha256').update(query.sql).digest('hex').slice(0, 12)}`;
    // Array mode: pg makes no per-result object of the column names (see pg-array-rows.ts). pg copies the config before using it.
    built = { query, config: { name, text: query.sql, rowMode: 'array', types: DRIZZLE_TYPES } as pg.QueryConfig };
    return built;
  };
  return {
    run(executor, values) {
      const { query, config } = once();
      const params = fillPlaceholders(query.params, values);
      // The executor's own session client (a transaction's connection, or the pool): the statement
      // runs where the caller's other statements run. Straight to it, not through a Drizzle prepared
      // query, whose wrappers (a query object and type parser per call, tracing spans, a cache
      // check) cost more than the statement's own handling here; its errors are wrapped as Drizzle wraps them.
      const client = (executor._.session as unknown as { client: SessionClient }).client;
      return client.query(config, params).then(
        (result) => ({ rows: result.rows as unknown[][] }),
        (error: unknown) => Promise.reject(new DrizzleQueryError(query.sql, params, error as Error)),
      );
    },
  };
}

/**
 * A placeholder bound exactly as given: the caller encodes the value. (A bare `sql.placeholder` in a
 * column's place is encoded by the column when bound, which writes a null as jsonb 'null' and fails
 * on a null array or timestamp.)
 */
export function boundAsGiven(name: string): SQL {
  return sql`${sql.placeholder(name)}`;
}

/**
 * Maps a whole-table row read by a built-once statement (`db.select().from(table)` or
 * `.returning()`, which list the table's columns in their declared order) to the table's select
 * model, decoding each value as Drizzle's own select would (`mapFromDriverValue`).
 */
export function rowMapper<T extends Table>(table: T): (raw: unknown[]) => InferSelectModel<T> {
  const columns = Object.entries(getTableColumns(table)).map(([key, column]) => ({ key, column }));
  return (raw) => {
    if (raw.length !== columns.length) throw new Error(`A row of ${raw.length} columns cannot be a whole row of a ${columns.length}-column table`);
    const row: Record<string, unknown> = {};
    for (let index = 0; index < columns.length; index++) {
      const { key, column } = columns[index]!;
      const value = raw[index];
      row[key] = value === null || value === undefined ? null : column.mapFromDriverValue(value);
    }
    return row as InferSelectModel<T>;
  };
}
