import { and, asc, desc, eq, gt, sql, type SQL } from 'drizzle-orm';
import type { Executor } from '../../db/client.js';
import { importRows, imports, type ImportRow, type ImportRowRow } from '../../db/schema.js';

export type NewImport = typeof imports.$inferInsert;
export type ImportStatus = ImportRow['status'];
export type RowOutcome = NonNullable<ImportRowRow['outcome']>;
export type Counts = { created: number; updated: number; unchanged: number; failed: number };
/** A row's result as the worker records it. */
export type RowResult = { rowNumber: number; outcome: RowOutcome; customerId: string | null; error: unknown };
type Position = { createdAt: Date; id: string };

/** The first key of the two-key advisory lock a worker holds on an import for a batch ('impo'). */
const IMPORT_LOCK_CLASS = 0x696d706f;

/** Imports (POST /v1/imports) and their rows. Every statement names the organisation first. */
export function createImportsRepository() {
  const byId = (orgId: string, id: string) => and(eq(imports.orgId, orgId), eq(imports.id, id));
  const find = async (orgId: string, id: string, executor: Executor): Promise<ImportRow | undefined> => {
    const [row] = await executor.select().from(imports).where(byId(orgId, id)).limit(1);
    return row;
  };

  return {
    async insert(values: NewImport, tx: Executor): Promise<ImportRow> {
      const [row] = await tx.insert(imports).values(values).returning();
      return row!;
    },

    /**
     * Rows `firstRow`, `firstRow + 1`, … from their JSON texts, in one statement. They travel as one JSON
     * array (their texts joined): an array parameter would escape every character of every row.
     */
    async insertRows(orgId: string, importId: string, firstRow: number, jsonRows: string[], tx: Executor): Promise<void> {
      await tx.execute(sql`
        INSERT INTO import_rows (org_id, import_id, row_number, data)
        SELECT ${orgId}::uuid, ${importId}::uuid, ${firstRow - 1}::int + row.ordinality, row.data
          FROM jsonb_array_elements(${`[${jsonRows.join(',')}]`}::jsonb) WITH ORDINALITY AS row (data, ordinality)`);
    },

    find,

    /** Newest first (created_at, then id, descending), a page strictly before `before`. */
    async list(orgId: string, page: { before?: Position; limit: number }, executor: Executor): Promise<ImportRow[]> {
      const conditions: SQL[] = [eq(imports.orgId, orgId)];
      if (page.before) {
        conditions.push(
          sql`(${imports.createdAt}, ${imports.id}) < (${page.before.createdAt.toISOString()}::timestamptz, ${page.before.id}::uuid)`,
        );
      }
      return executor
        .select()
        .from(imports)
        .where(and(...conditions))
        .orderBy(desc(imports.createdAt), desc(imports.id))
        .limit(page.limit);
    },

    /** The rows after `afterRow`, in row order, optionally of one outcome (`PENDING`: none yet). */
    async rows(
      orgId: string,
      importId: string,
      page: { afterRow: number; limit: number; outcome?: RowOutcome | 'PENDING' },
      executor: Executor,
    ): Promise<ImportRowRow[]> {
      const conditions: SQL[] = [eq(importRows.orgId, orgId), eq(importRows.importId, importId), gt(importRows.rowNumber, page.afterRow)];
      if (page.outcome === 'PENDING') conditions.push(sql`${importRows.outcome} IS NULL`);
      else if (page.outcome) conditions.push(eq(importRows.outcome, page.outcome));
      return executor
        .select()
        .from(importRows)
        .where(and(...conditions))
        .orderBy(asc(importRows.rowNumber))
        .limit(page.limit);
    },

    /** Starts (or resumes) the import: QUEUED or RUNNING → RUNNING; undefined once it finished (or never was). */
    async claim(orgId: string, id: string, tx: Executor): Promise<ImportRow | undefined> {
      const [row] = await tx
        .update(imports)
        .set({ status: 'RUNNING', startedAt: sql`coalesce(${imports.startedAt}, clock_timestamp())` })
        .where(and(byId(orgId, id), sql`${imports.status} IN ('QUEUED', 'RUNNING')`))
        .returning();
      return row;
    },

    /**
     * Serialises the workers of one import until this transaction ends (a second attempt of its job on
     * another instance waits, then finds the rows the first applied), and reads the import.
     */
    async lockForBatch(orgId: string, id: string, tx: Executor): Promise<ImportRow | undefined> {
      await tx.execute(sql`SELECT pg_advisory_xact_lock(${IMPORT_LOCK_CLASS}, hashtext(${id}))`);
      return find(orgId, id, tx);
    },

    /**
     * Refreshes the planner's statistics of the tables an import grows (PostgreSQL's advice after a
     * bulk load): its lookups probe indexes by key, which the planner prefers only once it knows how
     * many rows an organisation has; autovacuum's analyze follows a fast import too late. `import_rows`
     * only by the columns its statements filter on: sampling the rows' cells was most of the cost.
     * `customers` whole: its name and email probes use expression indexes, analysed only without a column list.
     */
    async refreshStatistics(executor: Executor): Promise<void> {
      await executor.execute(sql`ANALYZE customers, import_rows (org_id, import_id, row_number, outcome)`);
    },

    /** Which of `rowNumbers` have no outcome yet (under the batch lock). */
    async stillPending(orgId: string, importId: string, rowNumbers: number[], tx: Executor): Promise<Set<number>> {
      const { rows } = await tx.execute<{ row_number: number }>(sql`
        SELECT row_number FROM import_rows
         WHERE org_id = ${orgId} AND import_id = ${importId} AND row_number = ANY (${sql.param(rowNumbers)}::int[]) AND outcome IS NULL`);
      return new Set(rows.map((row) => row.row_number));
    },

    /** Writes a batch's outcomes and adds them to the import's progress and counts, in two statements. */
    async recordBatch(orgId: string, importId: string, results: RowResult[], tx: Executor): Promise<void> {
      if (results.length === 0) return;
      const document = JSON.stringify(
        results.map((result) => ({
          row_number: result.rowNumber,
          outcome: result.outcome,
          customer_id: result.customerId,
          error: result.error,
        })),
      );
      await tx.execute(sql`
        UPDATE import_rows r
           SET outcome = result.outcome, customer_id = result.customer_id, error = result.error
          FROM jsonb_to_recordset(${document}::jsonb) AS result (row_number int, outcome text, customer_id uuid, error jsonb)
         WHERE r.org_id = ${orgId} AND r.import_id = ${importId} AND r.row_number = result.row_number`);
      const count = (outcome: RowOutcome) => results.filter((result) => result.outcome === outcome).length;
      await tx
        .update(imports)
        .set({
          rowsDone: sql`${imports.rowsDone} + ${results.length}`,
          createdCount: sql`${imports.createdCount} + ${count('CREATED')}`,
          updatedCount: sql`${imports.updatedCount} + ${count('UPDATED')}`,
          unchangedCount: sql`${imports.unchangedCount} + ${count('UNCHANGED')}`,
          failedCount: sql`${imports.failedCount} + ${count('FAILED')}`,
        })
        .where(byId(orgId, importId));
    },

    /** Ends a running import: COMPLETED, CANCELLED or FAILED (with its error). */
    async finish(
      orgId: string,
      id: string,
      status: 'COMPLETED' | 'CANCELLED' | 'FAILED',
      error: unknown,
      tx: Executor,
    ): Promise<ImportRow | undefined> {
      const [row] = await tx
        .update(imports)
        .set({ status, error: error ?? null, finishedAt: sql`clock_timestamp()` })
        .where(and(byId(orgId, id), eq(imports.status, 'RUNNING')))
        .returning();
      return row;
    },

    /**
     * Cancels an import: a QUEUED one at once (CANCELLED), a RUNNING one is marked for its worker, which
     * stops before its next batch. Undefined when it had finished (or never was).
     */
    async requestCancel(orgId: string, id: string, tx: Executor): Promise<ImportRow | undefined> {
      const [row] = await tx
        .update(imports)
        .set({
          cancelRequestedAt: sql`coalesce(${imports.cancelRequestedAt}, clock_timestamp())`,
          status: sql`CASE WHEN ${imports.status} = 'QUEUED' THEN 'CANCELLED' ELSE ${imports.status} END`,
          finishedAt: sql`CASE WHEN ${imports.status} = 'QUEUED' THEN clock_timestamp() ELSE ${imports.finishedAt} END`,
        })
        .where(and(byId(orgId, id), sql`${imports.status} IN ('QUEUED', 'RUNNING')`))
        .returning();
      return row;
    },
  };
}
export type ImportsRepository = ReturnType<typeof createImportsRepository>;
