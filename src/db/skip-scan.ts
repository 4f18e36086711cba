import { sql, type SQL } from 'drizzle-orm';
import type { Executor } from './client.js';

/**
 * Organisations after `after` (org_id order) with a row of `table` matching `pending`, at most `limit`:
 * a skip scan, one probe per organisation, jumping from one org_id to the next on an index that leads
 * with org_id and whose predicate is `pending` (a small partial index: only the rows with work). With
 * `due`, an organisation counts only if one of its pending rows also matches `due` (e.g. its time has
 * come), checked by one more probe. Background claimers use it to find whom to serve (fair-claims.ts).
 *
 * `pending` and `due` are fixed SQL over the table's own columns, unqualified.
 */
export async function organisationsWith(
  tx: Executor,
  query: { table: string; pending: SQL; due?: SQL; after: string; limit: number },
): Promise<string[]> {
  const table = sql.identifier(query.table);
  const result = await tx.execute<{ org_id: string }>(sql`
    WITH RECURSIVE found AS (
      (SELECT org_id FROM ${table} WHERE ${query.pending} AND org_id > ${query.after}::uuid ORDER BY org_id LIMIT 1)
      UNION ALL
      SELECT (SELECT t.org_id FROM ${table} t WHERE ${query.pending} AND t.org_id > found.org_id ORDER BY t.org_id LIMIT 1)
        FROM found
       WHERE found.org_id IS NOT NULL
    )
    SELECT org_id FROM found
     WHERE org_id IS NOT NULL
       ${query.due ? sql`AND EXISTS (SELECT 1 FROM ${table} t WHERE t.org_id = found.org_id AND ${query.pending} AND ${query.due})` : sql``}
     LIMIT ${query.limit}`);
  return result.rows.map((row) => row.org_id);
}
