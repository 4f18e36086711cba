import type { FastifySchemaCompiler } from 'fastify';
import { validatorCompiler } from 'fastify-type-provider-zod';
import type { z } from 'zod';
import { isDatabaseUnavailable, isLockTimeout, type DataAccess, type Tx } from '../../db/client.js';
import type { ImportRow, ImportRowRow } from '../../db/schema.js';
import { errorEnvelope, issuesFromValidation, type ValidationItem } from '../../plugins/errors.plugin.js';
import { cleanJsonTree } from '../../plugins/text-input.js';
import type { Actor } from '../../shared/actor.js';
import { AppError } from '../../shared/app-error.js';
import type { AuditWriter } from '../../shared/audit-writer.js';
import type { OpenTransaction, RequestContext } from '../../shared/request-context.js';
import type { OutboxRepository } from '../../shared/outbox.js';
import { timeSlicer } from '../../shared/time-slice.js';
import type { BusinessRegisterStatus } from '../customers/business-register.js';
import type { BulkUpsertItem, BulkUpsertResult } from '../customers/customers.service.js';
import type { UpsertCustomerBody } from '../customers/customers.schemas.js';
import type { UpsertEntityBody } from '../entities/entities.schemas.js';
import type { EntityBulkUpsertItem } from '../entities/entities.service.js';
import { BODY_SCHEMAS, csvRowToBody, type ImportKind } from './import-columns.js';
import type { ImportsRepository, RowResult } from './imports.repository.js';
import { toImportDto } from './import-dto.js';

/** Rows one batch applies in one transaction: its record locks last one batch. */
export const IMPORT_BATCH = 500;
/** Rows applied before an import first refreshes the planner's statistics again (then each time they double). */
const STATISTICS_MIN_ROWS = 1_000;
/** Business-register lookups in flight at once while a batch is prepared. */
const LOOKUP_CONCURRENCY = 8;
const SYSTEM: Actor = { type: 'system', id: null };

/** What the worker needs of the customers and entities services: their bulk upserts, each row as its single route runs it. */
export type ImportUpserts = {
  customers: {
    registerStatusOf(body: UpsertCustomerBody): Promise<BusinessRegisterStatus | undefined>;
    upsertMany(
      ctx: RequestContext,
      items: BulkUpsertItem[],
      options: { addedVia: 'BULK_IMPORT'; dryRun: boolean },
      tx: Tx,
    ): Promise<BulkUpsertResult[]>;
  };
  entities: {
    upsertMany(
      ctx: RequestContext,
      items: EntityBulkUpsertItem[],
      options: { addedVia: 'BULK_IMPORT'; dryRun: boolean },
      tx: Tx,
    ): Promise<BulkUpsertResult[]>;
  };
};

export type RunOptions = {
  /** Stops before the next batch (the process is shutting down): the run throws ImportInterrupted and its job is retried. */
  signal?: AbortSignal;
  /** Called after each batch committed (tests, the CLI's progress). */
  onBatch?: (progress: { rowsDone: number; rowsTotal: number }) => Promise<void> | void;
  /** Called when refreshing the planner's statistics failed (the job's log); the import goes on. */
  onStatisticsFailed?: (error: unknown) => void;
  /** Called with the error that stopped the import FAILED (the job's log). */
  onFailed?: (error: unknown) => void;
};

/** The run stopped between batches (shutdown); its job is retried and resumes at the first row without an outcome. */
export class ImportInterrupted extends Error {
  constructor() {
    super('the import stopped between batches; it resumes when its job is retried');
  }
}

/** A row read and checked before its batch's transaction: its request body, or the error its request would have had. */
type PreparedRow = { rowNumber: number; body?: Record<string, unknown>; error?: AppError; registerStatus?: BusinessRegisterStatus };

/** Thrown out of a dry run's savepoint to roll back what the upsert wrote, carrying its result. */
class DryRunResult<T> extends Error {
  constructor(readonly result: T) {
    super('dry run: rolled back');
  }
}

const compile = (schema: z.ZodType) =>
  (validatorCompiler as FastifySchemaCompiler<z.ZodType>)({ schema, method: 'POST', url: '/v1/imports', httpPart: 'body' });
const VALIDATORS: Record<ImportKind, ReturnType<typeof compile>> = {
  individuals: compile(BODY_SCHEMAS.individuals),
  entities: compile(BODY_SCHEMAS.entities),
};

/**
 * A row's body checked as its single-record request would be: the text rules of every request
 * (app.ts, text-input.ts), then the route's own schema through the app's validator compiler, and its
 * failures turned into the same 422 (errors.plugin.ts).
 */
export function validateRowBody(kind: ImportKind, body: Record<string, unknown>): { body: Record<string, unknown> } | { error: AppError } {
  const textIssues = cleanJsonTree(body, undefined);
  if (textIssues) return { error: AppError.validation(textIssues) };
  const result = VALIDATORS[kind](body) as { value?: unknown; error?: ValidationItem[] };
  if (result.error) return { error: AppError.validation(issuesFromValidation(result.error, 'body')) };
  return { body: result.value as Record<string, unknown> };
}

/** A failure worth retrying the batch for: the database unreachable, a lock wait, a deadlock or a serialisation failure. */
function isTransient(error: unknown): boolean {
  if (error instanceof ImportInterrupted || isDatabaseUnavailable(error) || isLockTimeout(error)) return true;
  for (let current: unknown = error, depth = 0; current && typeof current === 'object' && depth < 5; depth += 1) {
    const code = (current as { code?: unknown }).code;
    if (code === '40P01' || code === '40001') return true;
    current = (current as { cause?: unknown }).cause;
  }
  return false;
}

/** Runs `work` on each of `items`, `limit` of them in flight at once. */
async function forEachLimited<T>(items: T[], limit: number, work: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  const lane = async () => {
    while (next < items.length) await work(items[next++]!);
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, lane));
}

/**
 * Applies an import's rows (the job of QUEUES.importRun): claims it (QUEUED or RUNNING → RUNNING),
 * then takes the rows without an outcome in row order, a batch at a time, each batch in one
 * transaction under the import's advisory lock. Each row runs the single route's upsert in a
 * savepoint, so a refused row (409, 422) rolls back alone and records its error envelope while the
 * others commit; the rows' outcomes, the import's counts and the records' changes commit together,
 * so a run killed mid-batch loses the whole batch and the next run applies each row exactly once. A
 * dry run rolls every row's savepoint back (records, audit rows, events) and keeps only the outcomes.
 * Between batches a requested cancel ends it CANCELLED; after the last, COMPLETED with one
 * `import.completed` event.
 */
export function createImportWorker(
  deps: ImportUpserts & {
    database: DataAccess;
    imports: ImportsRepository;
    audit: AuditWriter;
    outbox: OutboxRepository;
    batchSize?: number;
  },
) {
  const { database, imports, audit, outbox, customers, entities } = deps;
  const batchSize = deps.batchSize ?? IMPORT_BATCH;

  async function prepare(row: ImportRow, pending: ImportRowRow[]): Promise<PreparedRow[]> {
    const kind = row.kind;
    const prepared: PreparedRow[] = [];
    const slice = timeSlicer();
    for (const item of pending) {
      // Checking rows is CPU work: in slices, so requests served by this process are not held behind it.
      await slice();
      const raw = row.format === 'csv' ? csvRowToBody(kind, item.data as Record<string, string>) : (item.data as Record<string, unknown>);
      const checked = validateRowBody(kind, raw);
      prepared.push(
        'error' in checked ? { rowNumber: item.rowNumber, error: checked.error } : { rowNumber: item.rowNumber, body: checked.body },
      );
    }
    // The lookups are network I/O: done here, before the batch's transaction opens, a few at a time.
    if (kind === 'individuals') {
      await forEachLimited(
        prepared.filter((checked) => checked.body),
        LOOKUP_CONCURRENCY,
        async (checked) => {
          checked.registerStatus = await customers.registerStatusOf(checked.body as UpsertCustomerBody);
        },
      );
    }
    return prepared;
  }

  /** The savepoint a row's upsert opens: released (kept) in a real run, always rolled back in a dry run. */
  function rowTransaction(tx: Tx, dryRun: boolean): OpenTransaction {
    if (!dryRun) return (work) => tx.transaction(work);
    return async <T>(work: (savepoint: Tx) => Promise<T>): Promise<T> => {
      try {
        await tx.transaction(async (savepoint) => {
          throw new DryRunResult(await work(savepoint));
        });
      } catch (error) {
        if (error instanceof DryRunResult) return error.result as T;
        throw error;
      }
      throw new Error('unreachable: a dry run savepoint always rolls back');
    };
  }

  const failedRow = (rowNumber: number, error: AppError): RowResult => ({
    rowNumber,
    outcome: 'FAILED',
    customerId: null,
    error: errorEnvelope(error).error,
  });

  /** A batch: the customers or entities service's bulk upsert, each row with the result its single request would have. */
  async function applyBatch(row: ImportRow, actor: Actor, batch: PreparedRow[], tx: Tx): Promise<RowResult[]> {
    const valid = batch.filter((prepared) => prepared.body && !prepared.error);
    const ctx: RequestContext = { orgId: row.orgId, actor, transaction: rowTransaction(tx, row.dryRun) };
    const options = { addedVia: 'BULK_IMPORT', dryRun: row.dryRun } as const;
    const upserted =
      row.kind === 'individuals'
        ? await customers.upsertMany(
            ctx,
            valid.map((prepared) => ({ body: prepared.body as UpsertCustomerBody, registerStatus: prepared.registerStatus })),
            options,
            tx,
          )
        : await entities.upsertMany(
            ctx,
            valid.map((prepared) => ({ body: prepared.body as UpsertEntityBody })),
            options,
            tx,
          );
    const byRow = new Map(valid.map((prepared, index) => [prepared.rowNumber, upserted[index]!]));
    return batch.map((prepared): RowResult => {
      const result = byRow.get(prepared.rowNumber);
      if (!result) return failedRow(prepared.rowNumber, prepared.error ?? AppError.validation({ body: ['Invalid row.'] }));
      if ('error' in result) return failedRow(prepared.rowNumber, result.error);
      const outcome = result.created ? 'CREATED' : result.changed ? 'UPDATED' : 'UNCHANGED';
      return { rowNumber: prepared.rowNumber, outcome, customerId: result.id, error: null };
    });
  }

  /** Ends the import in `tx` (under its batch lock): its audit row, and for COMPLETED the import.completed event. */
  async function finish(
    current: ImportRow,
    status: 'COMPLETED' | 'CANCELLED' | 'FAILED',
    error: { code: string; message: string } | null,
    tx: Tx,
  ): Promise<ImportRow> {
    const finished = await imports.finish(current.orgId, current.id, status, error, tx);
    if (!finished) return current;
    const dto = toImportDto(finished);
    await audit.record(
      {
        orgId: finished.orgId,
        actor: SYSTEM,
        action: `import.${status.toLowerCase()}`,
        subjectType: 'import',
        subjectId: finished.id,
        before: null,
        after: dto,
      },
      tx,
    );
    if (status === 'COMPLETED') {
      await outbox.record({ orgId: finished.orgId, type: 'import.completed', customerId: null, customer: null, data: { import: dto } }, tx);
    }
    return finished;
  }

  async function runBatches(claimed: ImportRow, options: RunOptions): Promise<ImportRow> {
    const { orgId, id } = claimed;
    // The uploader acts on each record; importId marks the events its rows cause (webhook opt-out).
    const actor: Actor = {
      type: claimed.actorType,
      id: claimed.actorId,
      ...(claimed.requestId ? { requestId: claimed.requestId } : {}),
      ...(claimed.idempotencyKey ? { idempotencyKey: claimed.idempotencyKey } : {}),
      importId: claimed.id,
    };
    // Statistics are refreshed at the start and each time the rows applied since double (1,000 at least).
    let appliedAtRefresh = 0;
    let applied = 0;
    const refreshStatistics = async () => {
      appliedAtRefresh = applied;
      await imports.refreshStatistics(database.db).catch((error: unknown) => options.onStatisticsFailed?.(error));
    };
    await refreshStatistics();
    const readAhead = (after: number) => {
      const read = (async () => {
        const pending = await imports.rows(orgId, id, { afterRow: after, limit: batchSize, outcome: 'PENDING' }, database.db);
        return { pending, prepared: await prepare(claimed, pending) };
      })();
      // Awaited by the next batch; a run that ends first leaves it unread, and its failure with it.
      read.catch(() => undefined);
      return read;
    };
    let next = readAhead(0);
    for (;;) {
      if (applied - appliedAtRefresh >= Math.max(STATISTICS_MIN_ROWS, appliedAtRefresh)) await refreshStatistics();
      if (options.signal?.aborted) throw new ImportInterrupted();
      const { pending, prepared } = await next;
      // The next batch is read and checked while this one's transaction runs: its rows are after this
      // batch's, which this transaction does not touch.
      if (pending.length > 0) next = readAhead(pending.at(-1)!.rowNumber);
      type Step = { ended: ImportRow } | { progress: { rowsDone: number; rowsTotal: number } };
      const step = await database.transaction(async (tx): Promise<Step> => {
        const current = await imports.lockForBatch(orgId, id, tx);
        if (!current || current.status !== 'RUNNING') return { ended: current ?? claimed };
        if (current.cancelRequestedAt) return { ended: await finish(current, 'CANCELLED', null, tx) };
        // Rows are taken in order, each batch once under the lock: none pending after the last batch means none at all.
        if (pending.length === 0) return { ended: await finish(current, 'COMPLETED', null, tx) };
        const still = await imports.stillPending(
          orgId,
          id,
          pending.map((row) => row.rowNumber),
          tx,
        );
        const batch = prepared.filter((row) => still.has(row.rowNumber));
        const results = await applyBatch(current, actor, batch, tx);
        await imports.recordBatch(orgId, id, results, tx);
        return { progress: { rowsDone: current.rowsDone + results.length, rowsTotal: current.rowsTotal } };
      });
      if ('ended' in step) return step.ended;
      applied += pending.length;
      await options.onBatch?.(step.progress);
    }
  }

  return {
    /**
     * Runs the import until it ends (or its organisation's row is gone); returns it as it ended, or as it is
     * when it had already. A transient failure (database, lock wait, deadlock, shutdown) is thrown for its
     * job to retry; any other stops the import FAILED with an `internal` error (and is given to onFailed).
     */
    async run(orgId: string, importId: string, options: RunOptions = {}): Promise<ImportRow | undefined> {
      const claimed = await database.transaction((tx) => imports.claim(orgId, importId, tx));
      if (!claimed) return imports.find(orgId, importId, database.db);
      try {
        return await runBatches(claimed, options);
      } catch (error) {
        if (isTransient(error)) throw error;
        options.onFailed?.(error);
        return database.transaction(async (tx) => {
          const current = await imports.lockForBatch(orgId, importId, tx);
          if (!current || current.status !== 'RUNNING') return current;
          return finish(
            current,
            'FAILED',
            { code: 'internal', message: 'The import stopped on an internal error; the rows applied so far stay.' },
            tx,
          );
        });
      }
    },
  };
}
export type ImportWorker = ReturnType<typeof createImportWorker>;
