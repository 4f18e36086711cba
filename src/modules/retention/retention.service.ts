import type { RetentionSettings } from '../../config/config.js';
import type { DataAccess } from '../../db/client.js';
import type { AuditPurge } from '../audit/audit-purge.js';
import type { Actor } from '../../shared/actor.js';
import { RETENTION_TABLES, type RetentionRepository, type RetentionTable } from './retention.repository.js';

export { RETENTION_TABLES, type RetentionTable };

export type PurgeCounts = Record<RetentionTable, number>;

/** Small enough that one batch is a short transaction, holding its row locks for milliseconds. */
const DEFAULT_PURGE_BATCH_SIZE = 1_000;
const ORGANISATION_PAGE = 500;
/** Documents per batch: each takes up to 40 chunk rows (10 MiB in 256 KiB chunks) with it. */
const DOCUMENTS_PER_BATCH_DIVISOR = 20;
/** Failures in a row after which a run gives up: the database, not one organisation's rows, is at fault. */
const CONSECUTIVE_FAILURES_TO_STOP = 3;

const SYSTEM: Actor = { type: 'system', id: null };

const noCounts = (): PurgeCounts => Object.fromEntries(RETENTION_TABLES.map((table) => [table, 0])) as PurgeCounts;

export type RetentionOptions = {
  batchSize?: number;
  /** Called after each committed batch that removed rows (the metrics counter). */
  onPurged?: (table: RetentionTable, rows: number) => void;
  /** An organisation whose purge failed; the run goes on with the next one. */
  onOrganisationFailed?: (orgId: string, error: unknown) => void;
};

/**
 * Purges what is older than each table's retention, organisation by organisation and batch by
 * batch; each batch commits on its own. A run that is stopped (the signal) ends after the batch in
 * flight; the next run takes up where the rows are. Audit rows leave through `auditPurge`, the
 * checkpointed purge of `svc audit purge`, built with the same batch size and `onPurged`.
 */
export function createRetentionService(
  deps: RetentionOptions & { database: DataAccess; settings: RetentionSettings; retention: RetentionRepository; auditPurge: AuditPurge },
) {
  const { database, settings, retention: repository, auditPurge } = deps;
  const batchSize = deps.batchSize ?? DEFAULT_PURGE_BATCH_SIZE;

  function record(counts: PurgeCounts, table: RetentionTable, rows: number): void {
    if (rows <= 0) return;
    counts[table] += rows;
    deps.onPurged?.(table, rows);
  }

  /** Runs `batch` until one comes back short (nothing more to take now, or the rest is locked). */
  /** Runs `batch` until it returns fewer rows than `size` (a full batch may have more behind it). */
  async function drain(signal: AbortSignal | undefined, batch: () => Promise<number>, size = batchSize): Promise<void> {
    while (!signal?.aborted && (await batch()) >= size) {
      /* next batch, in a transaction of its own */
    }
  }

  async function purgeOrganisation(orgId: string, options: { signal?: AbortSignal } = {}): Promise<PurgeCounts> {
    const counts = noCounts();
    const { signal } = options;
    await drain(signal, async () => {
      const rows = await repository.purgeIdempotencyKeys(orgId, settings.idempotencyHours, batchSize, database.db);
      record(counts, 'idempotency_keys', rows);
      return rows;
    });
    // Deliveries before events: an event goes only once no delivery references it.
    await drain(signal, async () => {
      const { deliveries, attempts } = await repository.purgeWebhookDeliveries(orgId, settings.webhookDeliveryDays, batchSize, database.db);
      record(counts, 'webhook_deliveries', deliveries);
      record(counts, 'webhook_attempts', attempts);
      return deliveries;
    });
    await drain(signal, async () => {
      const { locked, deleted } = await database.transaction((tx) =>
        repository.purgeOutboxEvents(orgId, settings.eventDays, batchSize, tx),
      );
      record(counts, 'outbox_events', deleted);
      return locked;
    });
    await drain(signal, async () => {
      const rows = await repository.purgeEmails(orgId, settings.emailDays, batchSize, database.db);
      record(counts, 'emails', rows);
      return rows;
    });
    // Documents before requests: a request goes only once no document of it remains.
    const documentBatch = Math.max(1, Math.floor(batchSize / DOCUMENTS_PER_BATCH_DIVISOR));
    await drain(
      signal,
      async () => {
        const { documents, chunks } = await repository.purgeDocuments(orgId, settings.documentYears, documentBatch, database.db);
        record(counts, 'entity_documents', documents);
        record(counts, 'document_chunks', chunks);
        return documents;
      },
      documentBatch,
    );
    await drain(signal, async () => {
      const rows = await repository.purgeDocumentRequests(orgId, settings.documentYears, batchSize, database.db);
      record(counts, 'document_requests', rows);
      return rows;
    });
    await drain(signal, async () => {
      const rows = await repository.purgeCustomerReviews(orgId, settings.reviewYears, batchSize, database.db);
      record(counts, 'customer_reviews', rows);
      return rows;
    });
    // An import's rows before the import: its cascade would delete up to 100,000 rows in one go.
    await drain(signal, async () => {
      const rows = await repository.purgeImportRows(orgId, settings.importDays, batchSize, database.db);
      record(counts, 'import_rows', rows);
      return rows;
    });
    await drain(signal, async () => {
      const rows = await repository.purgeImports(orgId, settings.importDays, batchSize, database.db);
      record(counts, 'imports', rows);
      return rows;
    });
    if (!signal?.aborted) {
      // Last: a chain the purge refuses (broken) fails the organisation after its other tables are done.
      // Whole days only: at most one checkpoint (and one audit_log.purged row) per organisation a day.
      const cutoff = await auditPurge.retentionCutoff(settings.auditYears);
      const before = new Date(Date.UTC(cutoff.getUTCFullYear(), cutoff.getUTCMonth(), cutoff.getUTCDate()));
      const { purged } = await auditPurge.purge(orgId, before, { actor: SYSTEM, retentionYears: settings.auditYears, signal });
      counts.audit_log += purged;
    }
    return counts;
  }

  return {
    purgeOrganisation,

    /** One pass over every organisation; returns the rows purged per table. */
    async runOnce(options: { signal?: AbortSignal } = {}): Promise<PurgeCounts> {
      const totals = noCounts();
      let after: string | undefined;
      let failuresInARow = 0;
      while (!options.signal?.aborted) {
        const ids = await repository.organisationIds(after, ORGANISATION_PAGE, database.db);
        for (const orgId of ids) {
          if (options.signal?.aborted) break;
          try {
            const counts = await purgeOrganisation(orgId, options);
            for (const table of RETENTION_TABLES) totals[table] += counts[table];
            failuresInARow = 0;
          } catch (error) {
            // One organisation's failure must not hold back every organisation after it in id order.
            failuresInARow += 1;
            if (failuresInARow >= CONSECUTIVE_FAILURES_TO_STOP) throw error;
            deps.onOrganisationFailed?.(orgId, error);
          }
        }
        if (ids.length < ORGANISATION_PAGE) break;
        after = ids.at(-1);
      }
      return totals;
    },
  };
}
