import { and, asc, eq, inArray, lte, sql } from 'drizzle-orm';
import type { Executor } from '../../db/client.js';
import { organisationsWith } from '../../db/skip-scan.js';
import { documentRequests, documentRequestTokens, entityDocuments, type DocumentRequestRow } from '../../db/schema.js';

export type NewDocumentRequest = typeof documentRequests.$inferInsert;
/** A document that answers a request: its id and type, in the order received. */
export type RequestDocument = { documentRequestId: string; id: string; type: string };

export function createDocumentRequestsRepository() {
  return {
    async insert(values: NewDocumentRequest, tx: Executor): Promise<DocumentRequestRow> {
      const [row] = await tx.insert(documentRequests).values(values).returning();
      return row!;
    },

    /** The directory entry of an upload link: only the SHA-256 of its token is kept. */
    async insertToken(values: { tokenHash: string; orgId: string; documentRequestId: string }, tx: Executor): Promise<void> {
      await tx.insert(documentRequestTokens).values(values);
    },

    /** Where a token's hash points, before the organisation is known; undefined for an unknown or spent token. */
    async findToken(tokenHash: string, tx: Executor): Promise<{ orgId: string; documentRequestId: string } | undefined> {
      const [row] = await tx
        .select({ orgId: documentRequestTokens.orgId, documentRequestId: documentRequestTokens.documentRequestId })
        .from(documentRequestTokens)
        .where(eq(documentRequestTokens.tokenHash, tokenHash));
      return row;
    },

    /** A spent link (fulfilled or expired request) opens nothing again. */
    async deleteTokens(orgId: string, documentRequestId: string, tx: Executor): Promise<void> {
      await tx
        .delete(documentRequestTokens)
        .where(and(eq(documentRequestTokens.orgId, orgId), eq(documentRequestTokens.documentRequestId, documentRequestId)));
    },

    async findById(orgId: string, id: string, tx: Executor, lock: { forUpdate?: boolean } = {}): Promise<DocumentRequestRow | undefined> {
      const query = tx
        .select()
        .from(documentRequests)
        .where(and(eq(documentRequests.orgId, orgId), eq(documentRequests.id, id)));
      const [row] = await (lock.forUpdate ? query.for('update') : query);
      return row;
    },

    /** An entity's requests, oldest first, as every list of the API. */
    async listForEntity(orgId: string, entityId: string, tx: Executor): Promise<DocumentRequestRow[]> {
      return tx
        .select()
        .from(documentRequests)
        .where(and(eq(documentRequests.orgId, orgId), eq(documentRequests.entityId, entityId)))
        .orderBy(asc(documentRequests.createdAt), asc(documentRequests.id));
    },

    /** The documents received for each of the requests, in the order received. */
    async documentsOf(orgId: string, entityId: string, requestIds: readonly string[], tx: Executor): Promise<RequestDocument[]> {
      if (requestIds.length === 0) return [];
      const rows = await tx
        .select({ documentRequestId: entityDocuments.documentRequestId, id: entityDocuments.id, type: entityDocuments.type })
        .from(entityDocuments)
        // entity_id in the predicate: the entity's index (org_id, entity_id, created_at, id) serves it.
        .where(
          and(
            eq(entityDocuments.orgId, orgId),
            eq(entityDocuments.entityId, entityId),
            inArray(entityDocuments.documentRequestId, [...requestIds]),
          ),
        )
        .orderBy(asc(entityDocuments.createdAt), asc(entityDocuments.id));
      return rows as RequestDocument[];
    },

    /** Moves an OPEN request on; undefined when it was no longer OPEN. */
    async close(
      orgId: string,
      id: string,
      change: { status: 'FULFILLED'; fulfilledAt: Date } | { status: 'EXPIRED'; expiredAt: Date },
      tx: Executor,
    ): Promise<DocumentRequestRow | undefined> {
      const [row] = await tx
        .update(documentRequests)
        .set({ ...change, updatedAt: sql`clock_timestamp()` })
        .where(and(eq(documentRequests.orgId, orgId), eq(documentRequests.id, id), eq(documentRequests.status, 'OPEN')))
        .returning();
      return row;
    },

    /** A change that is not a status change (a document arrived): only updated_at moves. */
    async touch(orgId: string, id: string, tx: Executor): Promise<void> {
      await tx
        .update(documentRequests)
        .set({ updatedAt: sql`clock_timestamp()` })
        .where(and(eq(documentRequests.orgId, orgId), eq(documentRequests.id, id)));
    },

    /**
     * Organisations after `after` (org_id order) with an OPEN request due by `now`, at most `limit`:
     * a skip scan of document_requests_open_due_idx, one probe per organisation with open requests.
     */
    async organisationsWithDueRequests(after: string, limit: number, now: Date, tx: Executor): Promise<string[]> {
      return organisationsWith(tx, {
        table: 'document_requests',
        pending: sql`status = 'OPEN'`,
        due: sql`due_at <= ${now.toISOString()}::timestamptz`,
        after,
        limit,
      });
    },

    /**
     * Locks up to `limit` OPEN requests of one organisation due by `now` (SKIP LOCKED: expiry runs on
     * several instances share them, and a request an upload holds is left for the next pass).
     */
    async claimDue(orgId: string, limit: number, now: Date, tx: Executor): Promise<DocumentRequestRow[]> {
      return tx
        .select()
        .from(documentRequests)
        .where(and(eq(documentRequests.orgId, orgId), eq(documentRequests.status, 'OPEN'), lte(documentRequests.dueAt, now)))
        .orderBy(asc(documentRequests.dueAt))
        .limit(limit)
        .for('update', { skipLocked: true });
    },
  };
}
export type DocumentRequestsRepository = ReturnType<typeof createDocumentRequestsRepository>;
