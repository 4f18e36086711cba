import { Readable } from 'node:stream';
import { and, eq } from 'drizzle-orm';
import type { Executor } from '../../db/client.js';
import { documentChunks } from '../../db/schema.js';
import type { DocumentRef, DocumentSource, DocumentStorage, WrittenContent } from './document-storage.js';

/** 256 KiB: a 10 MiB document is 40 rows; each statement carries one chunk, bounded memory per document. */
export const DOCUMENT_CHUNK_BYTES = 256 * 1024;

/**
 * Documents in `document_chunks`, one row per 256 KiB chunk (seq from 0). Writes run one INSERT per
 * chunk in the caller's transaction; reads run one SELECT per chunk, issued only when the consumer wants
 * more, so neither side ever holds a document whole.
 */
function createPostgresDocumentStorage(chunkBytes = DOCUMENT_CHUNK_BYTES): DocumentStorage {
  async function insertChunk(ref: DocumentRef, seq: number, data: Buffer, tx: Executor): Promise<void> {
    // pg sends a Buffer parameter in binary format: no hex expansion on the wire.
    await tx.insert(documentChunks).values({ orgId: ref.orgId, documentId: ref.documentId, seq, data });
  }

  async function readChunk(ref: DocumentRef, seq: number, db: Executor): Promise<Buffer | undefined> {
    const [row] = await db
      .select({ data: documentChunks.data })
      .from(documentChunks)
      .where(and(eq(documentChunks.orgId, ref.orgId), eq(documentChunks.documentId, ref.documentId), eq(documentChunks.seq, seq)));
    return row?.data;
  }

  return {
    kind: 'postgres',

    async write(ref: DocumentRef, source: DocumentSource, tx: Executor): Promise<WrittenContent> {
      // One buffer, refilled: an INSERT's parameters are on the wire once its promise settles.
      const pending = Buffer.allocUnsafe(chunkBytes);
      let filled = 0;
      let size = 0;
      let seq = 0;
      for await (const piece of source as AsyncIterable<Buffer | Uint8Array>) {
        const bytes = Buffer.isBuffer(piece) ? piece : Buffer.from(piece.buffer, piece.byteOffset, piece.byteLength);
        size += bytes.length;
        let offset = 0;
        while (offset < bytes.length) {
          const taken = Math.min(chunkBytes - filled, bytes.length - offset);
          bytes.copy(pending, filled, offset, offset + taken);
          filled += taken;
          offset += taken;
          if (filled === chunkBytes) {
            await insertChunk(ref, seq++, pending, tx);
            filled = 0;
          }
        }
      }
      if (filled > 0) await insertChunk(ref, seq, pending.subarray(0, filled), tx);
      return { size };
    },

    read(ref: DocumentRef, options: { sizeBytes: number; db: Executor }): Readable {
      let seq = 0;
      let sent = 0;
      return new Readable({
        // Buffer about one chunk ahead: read() runs again only once the consumer has taken it.
        highWaterMark: chunkBytes,
        read() {
          readChunk(ref, seq, options.db).then(
            (data) => {
              if (this.destroyed) return;
              if (data === undefined) {
                if (sent === options.sizeBytes) this.push(null);
                else this.destroy(new Error(`document ${ref.documentId}: stored bytes end at ${sent} of ${options.sizeBytes}`));
                return;
              }
              seq += 1;
              sent += data.length;
              if (sent > options.sizeBytes) {
                this.destroy(new Error(`document ${ref.documentId}: stored bytes exceed ${options.sizeBytes}`));
                return;
              }
              this.push(data);
            },
            (error: unknown) => this.destroy(error as Error),
          );
        },
      });
    },
  };
}

/** The PostgreSQL store, stateless: the transaction or pool to use comes with each call. */
export const postgresDocumentStorage = createPostgresDocumentStorage();
