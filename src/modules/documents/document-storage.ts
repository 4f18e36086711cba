import type { Readable } from 'node:stream';
import type { Executor } from '../../db/client.js';

/** Which stored document: the bytes are keyed by organisation and document id, nothing else. */
export type DocumentRef = { orgId: string; documentId: string };

/** The bytes to store, read once from start to end (a file's read stream, or any async source of buffers). */
export type DocumentSource = Readable | AsyncIterable<Buffer | Uint8Array>;

/** What a write stored, counted on the bytes themselves (the caller compares it with what the intake measured). */
export type WrittenContent = { size: number };

/**
 * Where the bytes of entity documents live. `entity_documents.storage` names the store that holds a
 * document's bytes, so documents written under one store stay readable after the service moves to
 * another; a reader picks the store by that column, never by the current configuration.
 *
 * The one store today is PostgreSQL (postgres-document-storage.ts): the bytes commit or roll back with
 * the metadata, the audit row and the ledger row, in the caller's transaction.
 *
 * An S3-compatible object store would plug in beside it, not instead of it:
 * - `kind: 's3'` (and the column value `s3`), chosen for new documents by configuration read in
 *   src/config only: `DOCUMENT_STORAGE=s3` with `DOCUMENT_S3_BUCKET`, `DOCUMENT_S3_ENDPOINT` (any
 *   S3-compatible endpoint), `DOCUMENT_S3_REGION`, and credentials from `DOCUMENT_S3_ACCESS_KEY_ID` /
 *   `DOCUMENT_S3_SECRET_ACCESS_KEY` (or the SDK's default chain); `DOCUMENT_STORAGE=postgres`, the default,
 *   keeps today's behaviour.
 * - `write` uploads the object under the key `<org_id>/<document_id>` (a multipart upload streamed from
 *   the source, so memory stays bounded) BEFORE the caller's transaction commits, and returns its size
 *   and SHA-256 like this store does; `tx` is unused. An object store cannot join the transaction, so a
 *   rollback after the upload leaves an orphan object: a periodic sweep deletes objects older than an
 *   hour whose key has no `entity_documents` row (and the write path deletes the object itself when the
 *   transaction visibly fails). The opposite failure (a committed row without its object) cannot happen,
 *   because the object exists before the commit.
 * - `read` streams the object (GetObject's body) and fails the stream when it is missing or shorter than
 *   `sizeBytes`; deleting an entity's documents deletes their objects after the rows' commit.
 */
export interface DocumentStorage {
  readonly kind: 'postgres';
  /** Stores the bytes of `ref` from `source` inside the caller's transaction `tx`. */
  write(ref: DocumentRef, source: DocumentSource, tx: Executor): Promise<WrittenContent>;
  /**
   * The bytes of `ref` as a stream that reads from the store only as fast as it is consumed. It fails
   * (destroys with an error) when the stored bytes are missing or differ in length from `sizeBytes`.
   */
  read(ref: DocumentRef, options: { sizeBytes: number; db: Executor }): Readable;
}
