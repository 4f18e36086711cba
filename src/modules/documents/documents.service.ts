import type { Readable } from 'node:stream';
import type { DataAccess, Executor } from '../../db/client.js';
import type { EntityDocumentRow } from '../../db/schema.js';
import { AppError } from '../../shared/app-error.js';
import { isUuid } from '../../shared/ids.js';
import type { AuditWriter } from '../../shared/audit-writer.js';
import type { Actor } from '../../shared/actor.js';
import type { RequestContext } from '../../shared/request-context.js';
import type { CustomersRepository } from '../customers/customers.repository.js';
import type { CreditCharger } from '../organisations/credits.service.js';
import type { DocumentStorage } from './document-storage.js';
import { DOCUMENT_PRICE, type DocumentTypeCode } from './document-types.js';
import type { DocumentsRepository } from './documents.repository.js';
import type { DocumentDto, UploadDocumentBody } from './documents.schemas.js';
import { openSpooledFile, type SpooledFile } from './multipart-intake.js';
import { postgresDocumentStorage } from './postgres-document-storage.js';

/** The stores by the name `entity_documents.storage` holds; new documents go to `postgres`. */
const STORAGES: Readonly<Record<string, DocumentStorage>> = { postgres: postgresDocumentStorage };

function toDocumentDto(row: EntityDocumentRow): DocumentDto {
  return {
    id: row.id,
    object: 'document',
    entity_id: row.entityId,
    type: row.type as DocumentDto['type'],
    description: row.description,
    file_name: row.fileName,
    media_type: row.mediaType as DocumentDto['media_type'],
    size_bytes: row.sizeBytes,
    sha256: row.sha256,
    uploaded_by: row.uploadedBy,
    document_request_id: row.documentRequestId,
    created_at: row.createdAt.toISOString(),
  };
}

export type StoreDocumentInput = {
  orgId: string;
  actor: Actor;
  /** The entity's UUID (already looked up in this organisation by the caller). */
  entityId: string;
  type: DocumentTypeCode;
  description?: string | null;
  /** A file the intake spooled (multipart-intake.ts): its bytes are read from disk here. */
  file: SpooledFile;
  uploadedBy: 'organization' | 'contact';
  /** The uploading API key (organisation uploads). */
  apiKeyId?: string | null;
  /** The request a contact's upload answers. */
  documentRequestId?: string | null;
  /**
   * Runs once the metadata row exists and before any byte is written: where a charge naming the
   * document goes (credit_ledger.document_id refers to the row), so a refused charge costs no write.
   */
  beforeContent?: (row: EntityDocumentRow) => Promise<void>;
};

/** An opened document: its metadata and a stream of its bytes (read from the store as consumed). */
export type DocumentContent = { document: EntityDocumentRow; open(): Readable };

export function createDocumentsService(deps: {
  database: DataAccess;
  customers: CustomersRepository;
  documents: DocumentsRepository;
  charge: CreditCharger;
  audit: AuditWriter;
}) {
  const { database, customers, documents, charge, audit } = deps;

  /**
   * Stores a document in the caller's transaction `tx`: its metadata row, its bytes (streamed from the
   * spooled file into the storage, never whole in memory) and the `entity.document_uploaded` audit row
   * (subject the entity; after = the metadata, never the content). Nothing is charged here. Throws, and
   * so rolls the caller back, when the bytes written are not as many as the intake measured.
   */
  async function store(tx: Executor, input: StoreDocumentInput): Promise<EntityDocumentRow> {
    const storage = postgresDocumentStorage;
    const row = await documents.insert(
      {
        orgId: input.orgId,
        entityId: input.entityId,
        type: input.type,
        description: input.description ?? null,
        fileName: input.file.fileName,
        mediaType: input.file.mediaType,
        sizeBytes: input.file.size,
        sha256: input.file.sha256,
        uploadedBy: input.uploadedBy,
        apiKeyId: input.apiKeyId ?? null,
        documentRequestId: input.documentRequestId ?? null,
        storage: storage.kind,
      },
      tx,
    );
    await input.beforeContent?.(row);
    const written = await storage.write({ orgId: row.orgId, documentId: row.id }, openSpooledFile(input.file), tx);
    // The intake hashed the bytes as they arrived; the spool is this process's own 0600 file, so its
    // length is the check that it is still whole.
    if (written.size !== row.sizeBytes) {
      throw new Error(
        `document ${row.id}: the spooled file changed between intake (${row.sizeBytes} bytes) and storage (${written.size} bytes)`,
      );
    }
    await audit.record(
      {
        orgId: input.orgId,
        actor: input.actor,
        action: 'entity.document_uploaded',
        subjectType: 'entity',
        subjectId: input.entityId,
        before: null,
        after: toDocumentDto(row),
      },
      tx,
    );
    return row;
  }

  async function requireEntity(ctx: RequestContext, ref: string, tx: Executor) {
    // Only entities: an individual's id is as unknown here as another organisation's.
    const entity = await customers.findByRef(ctx.orgId, 'entity', ref, tx);
    if (!entity) throw AppError.notFound('Entity');
    return entity;
  }

  return {
    store,

    /** POST /entities/{id}/documents: the organisation pays DOCUMENT_PRICE, the document is stored, one transaction. */
    async upload(ctx: RequestContext, ref: string, body: UploadDocumentBody, file: SpooledFile): Promise<DocumentDto> {
      return ctx.transaction(async (tx) => {
        const entity = await requireEntity(ctx, ref, tx);
        const row = await store(tx, {
          orgId: ctx.orgId,
          actor: ctx.actor,
          entityId: entity.id,
          type: body.type,
          description: body.description === undefined || body.description === '' ? null : body.description,
          file,
          uploadedBy: 'organization',
          apiKeyId: ctx.actor.type === 'api_key' ? ctx.actor.id : null,
          beforeContent: (document) =>
            charge(
              ctx,
              { cost: DOCUMENT_PRICE, reason: 'document_upload', customerId: entity.id, documentId: document.id, what: 'This upload' },
              tx,
            ),
        });
        return toDocumentDto(row);
      });
    },

    async list(ctx: RequestContext, ref: string): Promise<{ object: 'list'; data: DocumentDto[] }> {
      const tx = database.db;
      const entity = await requireEntity(ctx, ref, tx);
      return { object: 'list', data: (await documents.listForEntity(ctx.orgId, entity.id, tx)).map(toDocumentDto) };
    },

    /** The document of this entity, with its bytes' stream; another entity's or organisation's is a 404. */
    async content(ctx: RequestContext, ref: string, documentId: string): Promise<DocumentContent> {
      const tx = database.db;
      const entity = await requireEntity(ctx, ref, tx);
      const document = isUuid(documentId) ? await documents.findForEntity(ctx.orgId, entity.id, documentId, tx) : undefined;
      if (!document) throw AppError.notFound('Document');
      const storage = STORAGES[document.storage];
      if (!storage) throw new Error(`document ${document.id}: unknown storage ${document.storage}`);
      return {
        document,
        // Each chunk on a pooled connection of its own: a download holds no connection between chunks.
        open: () => storage.read({ orgId: document.orgId, documentId: document.id }, { sizeBytes: document.sizeBytes, db: database.db }),
      };
    },
  };
}
export type DocumentsService = ReturnType<typeof createDocumentsService>;
