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
 * Another store (an S3-compatible one, say) would plug in beside it, not instead of it; the plan is
 * in docs/decisions.md, "Storage".
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
