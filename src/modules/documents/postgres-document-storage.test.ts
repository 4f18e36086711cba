import { createHash } from 'node:crypto';
import { sql } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createEntity } from '../../../test/entities/entity-test-helpers.js';
import { pdfBytes } from '../../../test/documents/document-helpers.js';
import { createTestContext, type TestContext, type TestOrg } from '../../../test/helpers/harness.js';
import type { Executor } from '../../db/client.js';
import { MAX_DOCUMENT_BYTES } from './document-types.js';
import type { DocumentRef } from './document-storage.js';
import { createDocumentsRepository } from './documents.repository.js';
import { DOCUMENT_CHUNK_BYTES, postgresDocumentStorage } from './postgres-document-storage.js';

/*
 * The "streamed in and out, never held whole in memory", proven on the store itself: writing
 * inserts each chunk as soon as its bytes have arrived, and reading fetches a chunk only when the
 * consumer wants more. (test/reliability/document-memory.test.ts measures the process's RSS.)
 */

let ctx: TestContext;
let org: TestOrg;
beforeAll(async () => {
  ctx = await createTestContext();
  org = await ctx.createOrg({ credits: 10 });
});
afterAll(async () => ctx?.close());

const PIECE_BYTES = 64 * 1024;
const sha256 = (data: Buffer) => createHash('sha256').update(data).digest('hex');

async function chunksWritten(ref: DocumentRef, tx: Executor): Promise<number> {
  const result = await tx.execute<{ count: number }>(
    sql`SELECT count(*)::int AS count FROM document_chunks WHERE org_id = ${ref.orgId} AND document_id = ${ref.documentId}`,
  );
  return result.rows[0]!.count;
}

/** A 10 MiB PDF's metadata row, and its bytes written through the store by `write` within the same transaction. */
async function storeTenMebibytes(
  write: (ref: DocumentRef, data: Buffer, tx: Executor) => Promise<void>,
): Promise<{ ref: DocumentRef; data: Buffer }> {
  const entity = await createEntity(ctx, org, { type: 'TRUST' });
  const data = pdfBytes(MAX_DOCUMENT_BYTES);
  let ref: DocumentRef | undefined;
  await ctx.database.db.transaction(async (tx) => {
    const row = await createDocumentsRepository().insert(
      {
        orgId: org.id,
        entityId: entity.id,
        type: 'TRUST_DEED',
        fileName: 'deed.pdf',
        mediaType: 'application/pdf',
        sizeBytes: data.length,
        sha256: sha256(data),
        uploadedBy: 'organization',
        storage: postgresDocumentStorage.kind,
      },
      tx,
    );
    ref = { orgId: row.orgId, documentId: row.id };
    await write(ref, data, tx);
  });
  return { ref: ref!, data };
}

describe('the PostgreSQL document store', () => {
  it('when a document is written, each chunk is inserted as soon as its bytes have arrived, before the source is read further', async () => {
    const seen: Array<{ received: number; chunks: number }> = [];
    await storeTenMebibytes(async (ref, data, tx) => {
      async function* source() {
        for (let offset = 0; offset < data.length; offset += PIECE_BYTES) {
          // Asked for the next piece: every chunk completed by the pieces before it is already a row.
          seen.push({ received: offset, chunks: await chunksWritten(ref, tx) });
          yield data.subarray(offset, offset + PIECE_BYTES);
        }
      }
      const written = await postgresDocumentStorage.write(ref, source(), tx);
      expect(written.size).toBe(data.length);
      expect(await chunksWritten(ref, tx)).toBe(data.length / DOCUMENT_CHUNK_BYTES);
    });

    expect(seen).toHaveLength(MAX_DOCUMENT_BYTES / PIECE_BYTES);
    for (const { received, chunks } of seen)
      expect({ received, chunks }).toEqual({ received, chunks: Math.floor(received / DOCUMENT_CHUNK_BYTES) });
  });

  it('when a document is read, the stream fetches a chunk only when the consumer wants more: left unread, it holds at most one chunk ahead, and read to the end it yields the bytes stored', async () => {
    const { ref, data } = await storeTenMebibytes(async (ref, bytes, tx) => {
      async function* whole() {
        yield bytes;
      }
      await postgresDocumentStorage.write(ref, whole(), tx);
    });

    const stream = postgresDocumentStorage.read(ref, { sizeBytes: data.length, db: ctx.database.db });
    const chunks = stream[Symbol.asyncIterator]();
    const first = await chunks.next();
    expect((first.value as Buffer).length).toBe(DOCUMENT_CHUNK_BYTES);
    // Time enough for an eager reader to fetch several more chunks.
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(stream.readableLength).toBeLessThanOrEqual(DOCUMENT_CHUNK_BYTES);

    const hash = createHash('sha256').update(first.value as Buffer);
    for (let next = await chunks.next(); !next.done; next = await chunks.next()) hash.update(next.value as Buffer);
    expect(hash.digest('hex')).toBe(sha256(data));
  });
});
