import { and, asc, eq } from 'drizzle-orm';
import type { Executor } from '../../db/client.js';
import { entityDocuments, type EntityDocumentRow } from '../../db/schema.js';

export type NewEntityDocument = typeof entityDocuments.$inferInsert;

/** Document metadata; the bytes are the document storage's (document-storage.ts). */
export function createDocumentsRepository() {
  return {
    async insert(values: NewEntityDocument, tx: Executor): Promise<EntityDocumentRow> {
      const [row] = await tx.insert(entityDocuments).values(values).returning();
      return row!;
    },

    async findForEntity(orgId: string, entityId: string, documentId: string, tx: Executor): Promise<EntityDocumentRow | undefined> {
      const [row] = await tx
        .select()
        .from(entityDocuments)
        .where(and(eq(entityDocuments.orgId, orgId), eq(entityDocuments.entityId, entityId), eq(entityDocuments.id, documentId)));
      return row;
    },

    /** Oldest first (entity_documents_entity_idx). */
    async listForEntity(orgId: string, entityId: string, tx: Executor): Promise<EntityDocumentRow[]> {
      return tx
        .select()
        .from(entityDocuments)
        .where(and(eq(entityDocuments.orgId, orgId), eq(entityDocuments.entityId, entityId)))
        .orderBy(asc(entityDocuments.createdAt), asc(entityDocuments.id));
    },
  };
}
export type DocumentsRepository = ReturnType<typeof createDocumentsRepository>;
