/**
 * What the write-budget test reads from pg_stat_statements, and how it judges it (kept apart from the
 * test so the rules can be read, and reused when the before/after table is measured).
 */

export type RouteBudget = { statements: number; fkChecks: number; walBytes: number };
export type BudgetFile = { routes: Record<string, RouteBudget> };

/** One pg_stat_statements entry of the measured request (the statistics were reset just before it). */
export type StatementRow = { query: string; calls: number; rows: number; toplevel: boolean };

/** A foreign key, as the catalog has it: the referencing table, and the referenced table and its key columns in key order. */
export type ForeignKey = { child: string; parent: string; parentColumns: string[] };

export type Measurement = RouteBudget & {
  /** Of `statements`, those the app sent; the rest ran inside functions and triggers. */
  topLevel: number;
  /** Statements that insert, update or delete (by their text), for the "a read writes nothing" rule. */
  writeStatements: string[];
  /** Foreign-key check text → how many times it ran. */
  fkCheckCalls: Record<string, number>;
  /** Table → rows that INSERT statements into it reported. */
  insertedRows: Record<string, number>;
  statementList: Array<{ query: string; calls: number; rows: number; toplevel: boolean }>;
};

/** Every entry of the app's database; run on another database, so this statement is not among them. */
export const MEASURED_SQL = `
  SELECT query, calls::int AS calls, rows::int AS rows, toplevel
    FROM pg_stat_statements
   WHERE dbid = $1 AND calls > 0
   ORDER BY toplevel DESC, query`;

/** The catalog's foreign keys; run on the app's database before anything is measured. */
export const FOREIGN_KEYS_SQL = `
  SELECT c.conrelid::regclass::text AS child, c.confrelid::regclass::text AS parent,
         array(SELECT a.attname::text
                 FROM unnest(c.confkey) WITH ORDINALITY AS k(attnum, n)
                 JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.attnum
                ORDER BY k.n) AS "parentColumns"
    FROM pg_constraint c
   WHERE c.contype = 'f'`;

/**
 * The statement PostgreSQL's referential-integrity trigger runs to check a referencing row
 * (ri_triggers.c, RI_FKey_check): `SELECT 1 FROM [ONLY] "schema"."parent" x WHERE "col" OPERATOR(pg_catalog.=) $1
 * [AND ...] FOR KEY SHARE OF x`. The same text serves every foreign key to that parent and key.
 */
const FK_CHECK = /^SELECT (?:1|\$\d+) FROM (?:ONLY )?(?:"([^"]+)"\.)?"([^"]+)" x WHERE (.*) FOR KEY SHARE OF x$/s;
const INSERT_INTO = /^\s*INSERT\s+INTO\s+(?:"?[\w]+"?\.)?"?(\w+)"?/i;
/** An INSERT inside a WITH (the outbox writes an event and its deliveries in one statement). */
const CTE_INSERT_INTO = /\bAS\s*\(\s*INSERT\s+INTO\s+(?:"?[\w]+"?\.)?"?(\w+)"?/gi;
const WRITES = /^\s*(?:WITH\b.*\b)?(?:INSERT|UPDATE|DELETE|MERGE)\b/is;

export function isFkCheck(query: string): boolean {
  return FK_CHECK.test(query.trim());
}

export function measurementOf(rows: StatementRow[], walBytes: number): Measurement {
  const fkCheckCalls: Record<string, number> = {};
  const insertedRows: Record<string, number> = {};
  const writeStatements: string[] = [];
  let statements = 0;
  let topLevel = 0;
  let fkChecks = 0;
  for (const row of rows) {
    const query = row.query.trim();
    if (isFkCheck(query)) {
      fkChecks += row.calls;
      fkCheckCalls[query] = (fkCheckCalls[query] ?? 0) + row.calls;
      continue;
    }
    statements += row.calls;
    if (row.toplevel) topLevel += row.calls;
    if (WRITES.test(query)) writeStatements.push(query);
    const inserted = INSERT_INTO.exec(query);
    if (inserted) insertedRows[inserted[1]!] = (insertedRows[inserted[1]!] ?? 0) + row.rows;
    // A WITH's inserts report no rows of their own: counted as one row per call, the least they can be
    // when they reference anything (the measured scenarios queue at most one delivery per event).
    for (const cte of query.matchAll(CTE_INSERT_INTO)) insertedRows[cte[1]!] = (insertedRows[cte[1]!] ?? 0) + row.calls;
  }
  return {
    statements,
    fkChecks,
    walBytes,
    topLevel,
    writeStatements,
    fkCheckCalls,
    insertedRows,
    statementList: rows.map(({ query, calls, rows: count, toplevel }) => ({
      query: query.replace(/\s+/g, ' ').trim(),
      calls,
      rows: count,
      toplevel,
    })),
  };
}

/**
 * WAL may exceed the recorded bytes by 10 % or 256 bytes, whichever is larger: the same request
 * writes slightly different WAL from run to run (an 8 KB WAL page boundary adds a 24-byte header, a
 * heap page that fills turns a HOT update into one with index entries, a B-tree page may split,
 * the background writer may log a running-transactions record of ~50 bytes meanwhile); a change of
 * what is written (a row, an index entry, a column) is larger than that on a small request, and a
 * tenth of a large one.
 */
export function walTolerance(recorded: number): number {
  return Math.max(256, Math.ceil(recorded * 0.1));
}

/** Why a measurement exceeds its budget (empty when it does not). Statements and FK checks are exact. */
export function compareWithBudget(measured: RouteBudget, budget: RouteBudget): string[] {
  const problems: string[] = [];
  if (measured.statements > budget.statements) problems.push(`statements: ${measured.statements} > budget ${budget.statements}`);
  if (measured.fkChecks > budget.fkChecks) problems.push(`FK checks: ${measured.fkChecks} > budget ${budget.fkChecks}`);
  if (measured.walBytes > budget.walBytes + walTolerance(budget.walBytes)) {
    problems.push(`WAL bytes: ${measured.walBytes} > budget ${budget.walBytes} + ${walTolerance(budget.walBytes)}`);
  }
  return problems;
}

let foreignKeys: ForeignKey[] = [];
/** The catalog's foreign keys (FOREIGN_KEYS_SQL), for fkCheckExcess. */
export function useForeignKeys(keys: ForeignKey[]): void {
  foreignKeys = keys;
}

const bareName = (name: string) => name.replace(/^.*\./, '').replace(/"/g, '');

/**
 * "No foreign-key check runs twice in one request": each FK check statement (one per referenced
 * table and key) may run at most once per row the request inserted into a table that references
 * that key. An INSERT checks each new row once; an UPDATE that keeps the key checks nothing, except
 * when the row was inserted in the same transaction: PostgreSQL then checks it again (it cannot
 * know the insert's check already ran), which is the double check this finds. An update that does
 * change a key is a legitimate check this rule would count against the inserts; none of the
 * measured routes does. Returns the checks that ran more often than that.
 */
export function fkCheckExcess(measured: Measurement): string[] {
  const excess: string[] = [];
  for (const [query, calls] of Object.entries(measured.fkCheckCalls)) {
    const match = FK_CHECK.exec(query)!;
    const parent = match[2]!;
    const columns = [...match[3]!.matchAll(/"([^"]+)" OPERATOR/g)].map((column) => column[1]!);
    const children = foreignKeys
      .filter((key) => bareName(key.parent) === parent && key.parentColumns.join(',') === columns.join(','))
      .map((key) => bareName(key.child));
    const allowed = children.reduce((sum, child) => sum + (measured.insertedRows[child] ?? 0), 0);
    if (calls > allowed)
      excess.push(`${parent}(${columns.join(', ')}): ${calls} checks for ${allowed} inserted rows of ${children.join(', ')}`);
  }
  return excess;
}
