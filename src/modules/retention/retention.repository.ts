import { sql } from 'drizzle-orm';
import type { Executor } from '../../db/client.js';

/** The tables the retention job bounds; also the `table` label of the purged-rows metric. */
export const RETENTION_TABLES = [
  'idempotency_keys',
  'audit_log',
  'webhook_deliveries',
  'webhook_attempts',
  'outbox_events',
  'emails',
  'entity_documents',
  'document_chunks',
  'document_requests',
  'customer_reviews',
  'import_rows',
  'imports',
] as const;
export type RetentionTable = (typeof RETENTION_TABLES)[number];

/**
 * One batch per call, for one organisation. Every statement carries `org_id` and names rows by their
 * key within it (no global time scan, no ctid: both fail on a table distributed or partitioned by
 * org_id). Rows are chosen `FOR UPDATE SKIP LOCKED`: a row a writer holds is left for the next run,
 * never waited on. The age test is evaluated on the database's clock.
 */
export function createRetentionRepository() {
  const count = (result: { rows: Array<Record<string, unknown>> }, column: string) => Number(result.rows[0]?.[column] ?? 0);

  return {
    /** Organisations in id order, a page after `after` (a keyset walk: no offset). */
    async organisationIds(after: string | undefined, limit: number, tx: Executor): Promise<string[]> {
      const result = await tx.execute<{ id: string }>(sql`
        SELECT id FROM organisations
         WHERE ${after === undefined ? sql`true` : sql`id > ${after}`}
         ORDER BY id
         LIMIT ${limit}`);
      return result.rows.map((row) => row.id);
    },

    /** Past the replay window the record is no longer honoured (claim reclaims it); purging it changes nothing a client sees. */
    async purgeIdempotencyKeys(orgId: string, hours: number, limit: number, tx: Executor): Promise<number> {
      const result = await tx.execute(sql`
        WITH chosen AS (
          SELECT api_key_id, key FROM idempotency_keys
           WHERE org_id = ${orgId} AND created_at < clock_timestamp() - make_interval(hours => ${hours}::int)
           LIMIT ${limit}
           FOR UPDATE SKIP LOCKED)
        DELETE FROM idempotency_keys k USING chosen
         WHERE k.org_id = ${orgId} AND k.api_key_id = chosen.api_key_id AND k.key = chosen.key`);
      return result.rowCount ?? 0;
    },

    /**
     * Settled deliveries (succeeded or failed) past retention, with their attempts. A pending one is
     * kept whatever its age: it is work not yet done (the retry schedule settles every delivery within
     * days, so only a deployment with no worker keeps them), and a worker may hold it mid-send. The
     * attempts are deleted by this statement rather than by the foreign key's cascade so they are
     * counted; the cascade then finds nothing.
     */
    async purgeWebhookDeliveries(
      orgId: string,
      days: number,
      limit: number,
      tx: Executor,
    ): Promise<{ deliveries: number; attempts: number }> {
      const result = await tx.execute<{ deliveries: number; attempts: number }>(sql`
        WITH chosen AS (
          SELECT id FROM webhook_deliveries
           WHERE org_id = ${orgId} AND created_at < clock_timestamp() - make_interval(days => ${days}::int)
             AND status <> 'pending'
           LIMIT ${limit}
           FOR UPDATE SKIP LOCKED),
        gone_attempts AS (
          DELETE FROM webhook_attempts a USING chosen
           WHERE a.org_id = ${orgId} AND a.delivery_id = chosen.id
          RETURNING 1),
        gone_deliveries AS (
          DELETE FROM webhook_deliveries d USING chosen
           WHERE d.org_id = ${orgId} AND d.id = chosen.id
          RETURNING 1)
        SELECT (SELECT count(*) FROM gone_deliveries)::int AS deliveries, (SELECT count(*) FROM gone_attempts)::int AS attempts`);
      return { deliveries: count(result, 'deliveries'), attempts: count(result, 'attempts') };
    },

    /**
     * Events past retention that no delivery references any more: an event stays while a delivery of
     * it does (the delivery is sent and shown from its payload), so the foreign key's cascade never
     * removes a delivery here. Two statements in the caller's transaction: the first locks the
     * candidates; the second, on a snapshot taken after those locks, deletes only the ones still
     * unreferenced (a delivery inserted for one, as a resend does, holds a key-share lock the first
     * statement skips, or committed before it and is seen by the second).
     */
    async purgeOutboxEvents(orgId: string, days: number, limit: number, tx: Executor): Promise<{ locked: number; deleted: number }> {
      const locked = await tx.execute<{ id: string }>(sql`
        SELECT e.id FROM outbox_events e
         WHERE e.org_id = ${orgId} AND e.created_at < clock_timestamp() - make_interval(days => ${days}::int)
           AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.org_id = ${orgId} AND d.event_id = e.id)
         LIMIT ${limit}
         FOR UPDATE OF e SKIP LOCKED`);
      if (locked.rows.length === 0) return { locked: 0, deleted: 0 };
      const ids = locked.rows.map((row) => row.id);
      const result = await tx.execute(sql`
        DELETE FROM outbox_events e
         WHERE e.org_id = ${orgId} AND e.id IN (${sql.join(
           ids.map((id) => sql`${id}`),
           sql`, `,
         )})
           AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.org_id = ${orgId} AND d.event_id = e.id)`);
      return { locked: ids.length, deleted: result.rowCount ?? 0 };
    },

    /** Queued emails are kept whatever their age (not yet sent); sent, recorded and failed ones go. */
    async purgeEmails(orgId: string, days: number, limit: number, tx: Executor): Promise<number> {
      const result = await tx.execute(sql`
        WITH chosen AS (
          SELECT id FROM emails
           WHERE org_id = ${orgId} AND created_at < clock_timestamp() - make_interval(days => ${days}::int)
             AND status <> 'queued'
           LIMIT ${limit}
           FOR UPDATE SKIP LOCKED)
        DELETE FROM emails m USING chosen
         WHERE m.org_id = ${orgId} AND m.id = chosen.id`);
      return result.rowCount ?? 0;
    },

    /**
     * Documents past retention, with their bytes (document_chunks in PostgreSQL storage). The credit
     * ledger keeps its rows: their link to a purged document is cleared in the same statement, so the
     * ledger's amounts and balances never change (a data-modifying WITH query always runs to completion,
     * and the foreign keys are checked at the end of the statement, after it). The chunks are deleted by this statement rather than
     * by the foreign key's cascade so they are counted; the cascade then finds nothing.
     */
    async purgeDocuments(orgId: string, years: number, limit: number, tx: Executor): Promise<{ documents: number; chunks: number }> {
      const result = await tx.execute<{ documents: number; chunks: number }>(sql`
        WITH chosen AS (
          SELECT id FROM entity_documents
           WHERE org_id = ${orgId} AND created_at < clock_timestamp() - make_interval(years => ${years}::int)
           LIMIT ${limit}
           FOR UPDATE SKIP LOCKED),
        unlinked AS (
          UPDATE credit_ledger l SET document_id = NULL FROM chosen
           WHERE l.org_id = ${orgId} AND l.document_id = chosen.id
          RETURNING 1),
        gone_chunks AS (
          DELETE FROM document_chunks c USING chosen
           WHERE c.org_id = ${orgId} AND c.document_id = chosen.id
          RETURNING 1),
        gone AS (
          DELETE FROM entity_documents d USING chosen
           WHERE d.org_id = ${orgId} AND d.id = chosen.id
          RETURNING 1)
        SELECT (SELECT count(*) FROM gone)::int AS documents, (SELECT count(*) FROM gone_chunks)::int AS chunks`);
      return { documents: count(result, 'documents'), chunks: count(result, 'chunks') };
    },

    /**
     * Closed (FULFILLED or EXPIRED) document requests past retention that no document references any
     * more: a request stays while a document uploaded through it does, so a document never loses its
     * provenance. An OPEN request is kept whatever its age. Their token rows go by the cascade.
     */
    async purgeDocumentRequests(orgId: string, years: number, limit: number, tx: Executor): Promise<number> {
      const result = await tx.execute(sql`
        WITH chosen AS (
          SELECT r.id FROM document_requests r
           WHERE r.org_id = ${orgId} AND r.created_at < clock_timestamp() - make_interval(years => ${years}::int)
             AND r.status <> 'OPEN'
             AND NOT EXISTS (SELECT 1 FROM entity_documents d WHERE d.org_id = ${orgId} AND d.document_request_id = r.id)
           LIMIT ${limit}
           FOR UPDATE OF r SKIP LOCKED),
        unlinked AS (
          UPDATE credit_ledger l SET document_request_id = NULL FROM chosen
           WHERE l.org_id = ${orgId} AND l.document_request_id = chosen.id
          RETURNING 1)
        DELETE FROM document_requests r USING chosen
         WHERE r.org_id = ${orgId} AND r.id = chosen.id`);
      return result.rowCount ?? 0;
    },

    /**
     * Rows of imports that finished longer ago than retention, a batch at a time (an import may hold
     * 100,000 of them: its own delete would be one long transaction); the import goes once it has none.
     */
    async purgeImportRows(orgId: string, days: number, limit: number, tx: Executor): Promise<number> {
      const result = await tx.execute(sql`
        WITH chosen AS (
          SELECT r.import_id, r.row_number
            FROM imports i
            JOIN import_rows r ON r.org_id = i.org_id AND r.import_id = i.id
           WHERE i.org_id = ${orgId} AND i.finished_at < clock_timestamp() - make_interval(days => ${days}::int)
           LIMIT ${limit}
           FOR UPDATE OF r SKIP LOCKED)
        DELETE FROM import_rows r USING chosen
         WHERE r.org_id = ${orgId} AND r.import_id = chosen.import_id AND r.row_number = chosen.row_number`);
      return result.rowCount ?? 0;
    },

    /** Imports that finished longer ago than retention and whose rows are gone (purgeImportRows first). */
    async purgeImports(orgId: string, days: number, limit: number, tx: Executor): Promise<number> {
      const result = await tx.execute(sql`
        WITH chosen AS (
          SELECT id FROM imports i
           WHERE org_id = ${orgId} AND finished_at < clock_timestamp() - make_interval(days => ${days}::int)
             AND NOT EXISTS (SELECT 1 FROM import_rows r WHERE r.org_id = i.org_id AND r.import_id = i.id)
           LIMIT ${limit}
           FOR UPDATE SKIP LOCKED)
        DELETE FROM imports i USING chosen
         WHERE i.org_id = ${orgId} AND i.id = chosen.id`);
      return result.rowCount ?? 0;
    },

    /** Reviews recorded longer ago than retention (the record's own review columns keep its latest one). */
    async purgeCustomerReviews(orgId: string, years: number, limit: number, tx: Executor): Promise<number> {
      const result = await tx.execute(sql`
        WITH chosen AS (
          SELECT id FROM customer_reviews
           WHERE org_id = ${orgId} AND created_at < clock_timestamp() - make_interval(years => ${years}::int)
           LIMIT ${limit}
           FOR UPDATE SKIP LOCKED)
        DELETE FROM customer_reviews r USING chosen
         WHERE r.org_id = ${orgId} AND r.id = chosen.id`);
      return result.rowCount ?? 0;
    },
  };
}
export type RetentionRepository = ReturnType<typeof createRetentionRepository>;
