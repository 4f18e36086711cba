import { createHash } from 'node:crypto';
import {
  DrizzleQueryError,
  fillPlaceholders,
  getTableColumns,
  is,
  sql,
  SQL,
  type InferSelectModel,
  type Query,
  type Table,
} from 'drizzle-orm';
import { PgDialect } from 'drizzle-orm/pg-core';
import pg from 'pg';
import { isStaleStatement, statementName, statementTargetOf, type Executor, type StatementTarget } from './client.js';

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
  let built: { query: Query; name: string } | undefined;
  const once = () => {
    if (built) return built;
    const source = build();
    const query = is(source, SQL) ? dialect.sqlToQuery(source) : source.toSQL();
    built = { query, name: `${prefix}_${createHash('sha256').update(query.sql).digest('hex').slice(0, 12)}` };
    return built;
  };
  const send = (target: StatementTarget, query: Query, name: string, params: unknown[]) =>
    target.on.query({ name: statementName(name, target.names), text: query.sql, values: params, rowMode: 'array', types: DRIZZLE_TYPES });
  return {
    async run(executor, values) {
      const { query, name } = once();
      const params = fillPlaceholders(query.params, values);
      // On the executor's own connection (a transaction's) or its pool: the statement runs where the
      // caller's other statements run. Errors are wrapped as Drizzle wraps its own.
      const target = statementTargetOf(executor);
      try {
        return { rows: (await send(target, query, name, params)).rows as unknown[][] };
      } catch (error) {
        // Outside a transaction a stale statement is retried here; inside one, the transaction is (Database.transaction).
        if (!target.inTransaction && isStaleStatement(error)) {
          target.names.generation += 1;
          try {
            return { rows: (await send(target, query, name, params)).rows as unknown[][] };
          } catch (again) {
            throw new DrizzleQueryError(query.sql, params, again as Error);
          }
        }
        throw new DrizzleQueryError(query.sql, params, error as Error);
      }
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
    if (raw.length !== columns.length)
      throw new Error(`A row of ${raw.length} columns cannot be a whole row of a ${columns.length}-column table`);
    const row: Record<string, unknown> = {};
    for (let index = 0; index < columns.length; index++) {
      const { key, column } = columns[index]!;
      const value = raw[index];
      row[key] = value === null || value === undefined ? null : column.mapFromDriverValue(value);
    }
    return row as InferSelectModel<T>;
  };
}
