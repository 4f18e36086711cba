import { createHash } from 'node:crypto';
import { parse as parseContentDisposition } from 'content-disposition';
import { request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MAX_DOCUMENT_BYTES } from '../../src/modules/documents/document-types.js';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { createEntity, createIndividual, expectValidation, sql } from '../entities/entity-test-helpers.js';
import {
  expectNoSpooledFiles,
  jpegBytes,
  pdfBytes,
  pngBytes,
  spooledFiles,
  upload,
  usePrivateTempDir,
  type Part,
} from './document-helpers.js';

let ctx: TestContext;
let org: TestOrg;
let restoreTempDir: (() => Promise<void>) | undefined;
beforeAll(async () => {
  // Spool files are counted here: other test files' uploads must not land in the same directory.
  restoreTempDir = await usePrivateTempDir();
  ctx = await createTestContext();
  org = await ctx.createOrg({ credits: 1000 });
});
afterAll(async () => {
  await ctx?.close();
  await restoreTempDir?.();
});

const sha256 = (data: Buffer) => createHash('sha256').update(data).digest('hex');
const filePart = (data: Buffer, filename = 'deed.pdf', contentType = 'application/pdf'): Part => ({
  name: 'file',
  data,
  filename,
  contentType,
});
const typePart = (value = 'TRUST_DEED'): Part => ({ name: 'type', value });

async function documentCount(orgId = org.id): Promise<number> {
  const [row] = await sql<{ count: number }>(ctx, 'SELECT count(*)::int AS count FROM entity_documents WHERE org_id = $1', [orgId]);
  return row!.count;
}
async function chunkCount(orgId = org.id): Promise<number> {
  const [row] = await sql<{ count: number }>(ctx, 'SELECT count(*)::int AS count FROM document_chunks WHERE org_id = $1', [orgId]);
  return row!.count;
}
async function credits(orgId = org.id): Promise<number> {
  const [row] = await sql<{ credits: number }>(ctx, 'SELECT credits FROM organisations WHERE id = $1', [orgId]);
  return row!.credits;
}
async function download(entityRef: string, documentId: string, key = org.key, headers: Record<string, string> = {}) {
  return ctx.app.inject({
    method: 'GET',
    url: `/v1/entities/${encodeURIComponent(entityRef)}/documents/${documentId}/content`,
    headers: { authorization: `Bearer ${key}`, ...headers },
  });
}

describe('content sniffing', () => {
  it.each([
    ['a PDF', pdfBytes(), 'application/pdf'],
    ['a PNG', pngBytes(), 'image/png'],
    ['a JPEG', jpegBytes(), 'image/jpeg'],
  ])('when the file is %s, it is stored with that media type, its size and its SHA-256', async (_label, data, mediaType) => {
    const entity = await createEntity(ctx, org, { type: 'TRUST' });
    const response = await upload(ctx.app, org.key, entity.id, [filePart(data, 'upload.bin', 'application/octet-stream'), typePart()]);
    expect(response.statusCode, response.body).toBe(201);
    expect(response.json()).toMatchObject({
      object: 'document',
      entity_id: entity.id,
      media_type: mediaType,
      size_bytes: data.length,
      sha256: sha256(data),
    });
  });

  it('when a text file is named x.pdf and declared application/pdf, it answers 415 and stores nothing', async () => {
    const entity = await createEntity(ctx, org);
    const before = await documentCount();
    const response = await upload(ctx.app, org.key, entity.id, [
      filePart(Buffer.from('just some text, not a PDF at all\n'), 'x.pdf', 'application/pdf'),
      typePart(),
    ]);
    expect(response.statusCode, response.body).toBe(415);
    expect(response.json().error.code).toBe('unsupported_media_type');
    expect(await documentCount()).toBe(before);
    await expectNoSpooledFiles();
  });

  it('when a file shorter than any signature is sent, it answers 415', async () => {
    const entity = await createEntity(ctx, org);
    const response = await upload(ctx.app, org.key, entity.id, [filePart(Buffer.from('%PD'), 'x.pdf'), typePart()]);
    expect(response.statusCode, response.body).toBe(415);
  });

  it('when a PNG is declared application/pdf and named .pdf, it is stored as image/png', async () => {
    const entity = await createEntity(ctx, org);
    const response = await upload(ctx.app, org.key, entity.id, [filePart(pngBytes(), 'scan.pdf', 'application/pdf'), typePart()]);
    expect(response.statusCode, response.body).toBe(201);
    expect(response.json().media_type).toBe('image/png');
  });
});

describe('size', () => {
  it('when the file is exactly 10 MiB, it is accepted', async () => {
    const entity = await createEntity(ctx, org);
    const data = pdfBytes(MAX_DOCUMENT_BYTES);
    const response = await upload(ctx.app, org.key, entity.id, [filePart(data), typePart()]);
    expect(response.statusCode, response.body).toBe(201);
    expect(response.json().size_bytes).toBe(MAX_DOCUMENT_BYTES);
    const [row] = await sql<{ chunks: number }>(
      ctx,
      'SELECT count(*)::int AS chunks FROM document_chunks WHERE org_id = $1 AND document_id = $2',
      [org.id, response.json().id],
    );
    expect(row!.chunks).toBe(40);
    await expectNoSpooledFiles();
  });

  it('when the file is 10 MiB + 1 byte, it answers 413 in the envelope, stores and charges nothing, and removes the temp file', async () => {
    const entity = await createEntity(ctx, org);
    const [documentsBefore, chunksBefore, creditsBefore] = [await documentCount(), await chunkCount(), await credits()];
    const response = await upload(ctx.app, org.key, entity.id, [typePart(), filePart(pdfBytes(MAX_DOCUMENT_BYTES + 1))]);
    expect(response.statusCode, response.body).toBe(413);
    expect(response.json().error).toMatchObject({ code: 'payload_too_large', details: { max_bytes: MAX_DOCUMENT_BYTES } });
    expect([await documentCount(), await chunkCount(), await credits()]).toEqual([documentsBefore, chunksBefore, creditsBefore]);
    await expectNoSpooledFiles();
  });
});

describe('form validation', () => {
  it('when the body is not multipart/form-data, it answers 415', async () => {
    const entity = await createEntity(ctx, org);
    const response = await ctx.request('POST', `/v1/entities/${entity.id}/documents`, { key: org.key, body: { type: 'TRUST_DEED' } });
    expect(response.statusCode, response.body).toBe(415);
    expect(response.json().error.code).toBe('unsupported_media_type');
    const empty = await ctx.request('POST', `/v1/entities/${entity.id}/documents`, { key: org.key });
    expect(empty.statusCode, empty.body).toBe(415);
  });

  it('when the file is missing, it answers 422 on file', async () => {
    const entity = await createEntity(ctx, org);
    expectValidation(await upload(ctx.app, org.key, entity.id, [typePart()]), 'file');
  });

  it('when the type is not a catalogue code, it answers 422 on type and charges nothing', async () => {
    const entity = await createEntity(ctx, org);
    const before = await credits();
    expectValidation(await upload(ctx.app, org.key, entity.id, [filePart(pdfBytes()), typePart('PASSPORT')]), 'type');
    expect(await credits()).toBe(before);
    await expectNoSpooledFiles();
  });

  it('when an unknown field, a second file or an over-long description is sent, it answers 422 naming the field', async () => {
    const entity = await createEntity(ctx, org);
    expectValidation(
      await upload(ctx.app, org.key, entity.id, [filePart(pdfBytes()), typePart(), { name: 'colour', value: 'red' }]),
      'colour',
    );
    expectValidation(await upload(ctx.app, org.key, entity.id, [filePart(pdfBytes()), filePart(pdfBytes()), typePart()]), 'file');
    expectValidation(
      await upload(ctx.app, org.key, entity.id, [
        filePart(pdfBytes()),
        { name: 'attachment', data: pdfBytes(), filename: 'b.pdf' },
        typePart(),
      ]),
      'attachment',
    );
    expectValidation(
      await upload(ctx.app, org.key, entity.id, [filePart(pdfBytes()), typePart(), { name: 'description', value: 'x'.repeat(501) }]),
      'description',
    );
    expectValidation(await upload(ctx.app, org.key, entity.id, [{ name: 'file', value: 'not a file' }, typePart()]), 'file');
    expect(await documentCount()).toBeGreaterThanOrEqual(0);
    await expectNoSpooledFiles();
  });

  it('when the file name is longer than 255 characters, it answers 422 on file and stores nothing; 255 is accepted', async () => {
    const entity = await createEntity(ctx, org);
    const before = await documentCount();
    expectValidation(await upload(ctx.app, org.key, entity.id, [filePart(pdfBytes(), `${'n'.repeat(252)}.pdf`), typePart()]), 'file');
    expect(await documentCount()).toBe(before);
    const longest = `${'n'.repeat(251)}.pdf`;
    const accepted = await upload(ctx.app, org.key, entity.id, [filePart(pdfBytes(), longest), typePart()]);
    expect(accepted.statusCode, accepted.body).toBe(201);
    expect(accepted.json().file_name).toBe(longest);
  });

  it('when a description of 500 characters is sent, it is stored', async () => {
    const entity = await createEntity(ctx, org);
    const response = await upload(ctx.app, org.key, entity.id, [
      filePart(pdfBytes()),
      typePart('OTHER'),
      { name: 'description', value: 'é'.repeat(500) },
    ]);
    expect(response.statusCode, response.body).toBe(201);
    expect(response.json()).toMatchObject({ type: 'OTHER', description: 'é'.repeat(500) });
  });
});

describe('billing', () => {
  it('when a document is uploaded, the organisation pays 1 credit: ledger row, balance and credits_charged audit row', async () => {
    const entity = await createEntity(ctx, org);
    const before = await credits();
    const response = await upload(ctx.app, org.key, entity.id, [filePart(pdfBytes()), typePart()]);
    expect(response.statusCode, response.body).toBe(201);
    const id = response.json().id;
    expect(await credits()).toBe(before - 1);
    const ledger = await sql(ctx, 'SELECT delta, balance_after, reason FROM credit_ledger WHERE org_id = $1 AND document_id = $2', [
      org.id,
      id,
    ]);
    expect(ledger).toEqual([{ delta: -1, balance_after: before - 1, reason: 'document_upload' }]);
    const [charged] = await sql<{ after: Record<string, unknown> }>(
      ctx,
      `SELECT after FROM audit_log WHERE org_id = $1 AND action = 'organisation.credits_charged' AND after->>'document_id' = $2`,
      [org.id, id],
    );
    expect(charged!.after).toMatchObject({ reason: 'document_upload', document_id: id, customer_id: entity.id, credits: before - 1 });
  });

  it('when the organisation has no credits, it answers 402 insufficient_credits and stores nothing', async () => {
    const poor = await ctx.createOrg({ credits: 0 });
    const entity = await createEntity(ctx, poor);
    const response = await upload(ctx.app, poor.key, entity.id, [filePart(pdfBytes()), typePart()]);
    expect(response.statusCode, response.body).toBe(402);
    expect(response.json().error.code).toBe('insufficient_credits');
    expect([await documentCount(poor.id), await chunkCount(poor.id), await credits(poor.id)]).toEqual([0, 0, 0]);
    await expectNoSpooledFiles();
  });
});

describe('idempotency', () => {
  it('when the same key is sent with the same file, it replays: one document, one charge', async () => {
    const entity = await createEntity(ctx, org);
    const data = pdfBytes();
    const before = await credits();
    const first = await upload(ctx.app, org.key, entity.id, [filePart(data), typePart()], { 'idempotency-key': 'doc-replay-1' });
    const second = await upload(ctx.app, org.key, entity.id, [filePart(data), typePart()], { 'idempotency-key': 'doc-replay-1' });
    expect(first.statusCode, first.body).toBe(201);
    expect(second.statusCode, second.body).toBe(201);
    expect(second.headers['idempotent-replayed']).toBe('true');
    expect(second.json()).toEqual(first.json());
    expect(await credits()).toBe(before - 1);
    const [row] = await sql<{ count: number }>(
      ctx,
      'SELECT count(*)::int AS count FROM entity_documents WHERE org_id = $1 AND entity_id = $2',
      [org.id, entity.id],
    );
    expect(row!.count).toBe(1);
    await expectNoSpooledFiles();
  });

  it('when the same key is sent with a different file, it answers 409 idempotency_conflict', async () => {
    const entity = await createEntity(ctx, org);
    const first = await upload(ctx.app, org.key, entity.id, [filePart(pdfBytes()), typePart()], { 'idempotency-key': 'doc-conflict-1' });
    expect(first.statusCode, first.body).toBe(201);
    const other = await upload(ctx.app, org.key, entity.id, [filePart(pdfBytes()), typePart()], { 'idempotency-key': 'doc-conflict-1' });
    expect(other.statusCode, other.body).toBe(409);
    expect(other.json().error.code).toBe('idempotency_conflict');
  });
});

describe('isolation and scopes', () => {
  it("when another organisation's key names the entity or the document, upload, list and content answer 404", async () => {
    const entity = await createEntity(ctx, org);
    const stored = await upload(ctx.app, org.key, entity.id, [filePart(pdfBytes()), typePart()]);
    const other = await ctx.createOrg();
    const otherUpload = await upload(ctx.app, other.key, entity.id, [filePart(pdfBytes()), typePart()]);
    expect(otherUpload.statusCode, otherUpload.body).toBe(404);
    expect(otherUpload.json().error.code).toBe('not_found');
    const list = await ctx.request('GET', `/v1/entities/${entity.id}/documents`, { key: other.key });
    expect(list.statusCode, list.body).toBe(404);
    const content = await download(entity.id, stored.json().id, other.key);
    expect(content.statusCode, content.body).toBe(404);
    expect(content.json().error.code).toBe('not_found');
  });

  it("when the document belongs to another entity of the organisation, or the id is an individual's, it answers 404", async () => {
    const entity = await createEntity(ctx, org);
    const otherEntity = await createEntity(ctx, org);
    const stored = await upload(ctx.app, org.key, entity.id, [filePart(pdfBytes()), typePart()]);
    expect((await download(otherEntity.id, stored.json().id)).statusCode).toBe(404);
    expect((await download(entity.id, 'not-a-uuid')).statusCode).toBe(404);
    const person = await createIndividual(ctx, org);
    const response = await upload(ctx.app, org.key, person.id, [filePart(pdfBytes()), typePart()]);
    expect(response.statusCode, response.body).toBe(404);
  });

  it('when the key lacks verification:write, upload answers 403; without customers:read, list and content answer 403', async () => {
    const entity = await createEntity(ctx, org);
    const stored = await upload(ctx.app, org.key, entity.id, [filePart(pdfBytes()), typePart()]);
    const readOnly = await ctx.createKey(org.id, { scopes: ['customers:read'] });
    const denied = await upload(ctx.app, readOnly.key, entity.id, [filePart(pdfBytes()), typePart()]);
    expect(denied.statusCode, denied.body).toBe(403);
    expect(denied.json().error).toMatchObject({ code: 'forbidden_scope', details: { required_scope: 'verification:write' } });
    const writeOnly = await ctx.createKey(org.id, { scopes: ['verification:write'] });
    expect((await ctx.request('GET', `/v1/entities/${entity.id}/documents`, { key: writeOnly.key })).statusCode).toBe(403);
    expect((await download(entity.id, stored.json().id, writeOnly.key)).statusCode).toBe(403);
    // The catalogue is open to any valid key.
    const types = await ctx.request('GET', '/v1/document-types', { key: writeOnly.key });
    expect(types.statusCode, types.body).toBe(200);
    expect(types.json().data.find((type: { code: string }) => type.code === 'TRUST_DEED')).toEqual({
      code: 'TRUST_DEED',
      name: 'Trust deed',
      description: 'The deed establishing a trust, with any variations.',
      entity_types: ['TRUST'],
    });
  });
});

describe('audit, list and download', () => {
  it('when a document is uploaded, the audit row entity.document_uploaded names the entity and holds the metadata, never the content', async () => {
    const entity = await createEntity(ctx, org);
    const response = await upload(
      ctx.app,
      org.key,
      entity.id,
      [filePart(pdfBytes()), typePart(), { name: 'description', value: 'The deed' }],
      {
        'idempotency-key': 'doc-audit-1',
      },
    );
    expect(response.statusCode, response.body).toBe(201);
    const rows = await sql<{
      subject_type: string;
      subject_id: string;
      actor_id: string;
      idempotency_key: string;
      after: Record<string, unknown>;
    }>(
      ctx,
      `SELECT subject_type, subject_id, actor_id, idempotency_key, after FROM audit_log WHERE org_id = $1 AND action = 'entity.document_uploaded' AND subject_id = $2`,
      [org.id, entity.id],
    );
    expect(rows).toHaveLength(1);
    expect(rows[0]).toMatchObject({ subject_type: 'entity', subject_id: entity.id, actor_id: org.keyId, idempotency_key: 'doc-audit-1' });
    expect(rows[0]!.after).toEqual(response.json());
  });

  it('when an entity has documents, the list gives them oldest first without content', async () => {
    const entity = await createEntity(ctx, org, { externalId: `docs-list-${Math.random()}` });
    const first = await upload(ctx.app, org.key, entity.id, [filePart(pdfBytes()), typePart()]);
    const second = await upload(ctx.app, org.key, entity.id, [filePart(pngBytes(), 'p.png'), typePart('OTHER')]);
    const list = await ctx.request('GET', `/v1/entities/${encodeURIComponent(entity.external_id)}/documents`, { key: org.key });
    expect(list.statusCode, list.body).toBe(200);
    expect(list.json()).toEqual({ object: 'list', data: [first.json(), second.json()] });
  });

  it('when the content is downloaded, it is byte for byte what was uploaded, with its headers', async () => {
    const entity = await createEntity(ctx, org);
    const data = pdfBytes(700 * 1024 + 3);
    const stored = (await upload(ctx.app, org.key, entity.id, [filePart(data, 'Trust deed.pdf'), typePart()])).json();
    const response = await download(entity.id, stored.id);
    expect(response.statusCode, response.body).toBe(200);
    expect(response.rawPayload.equals(data)).toBe(true);
    expect(sha256(response.rawPayload)).toBe(stored.sha256);
    expect(response.headers).toMatchObject({
      'content-type': 'application/pdf',
      'content-length': String(data.length),
      etag: `"${stored.sha256}"`,
      'x-content-type-options': 'nosniff',
      'cache-control': 'private, no-cache',
      'content-disposition': 'attachment; filename="Trust deed.pdf"',
    });
  });

  it('when If-None-Match carries the ETag, it answers 304 without a body', async () => {
    const entity = await createEntity(ctx, org);
    const stored = (await upload(ctx.app, org.key, entity.id, [filePart(jpegBytes(), 'photo.jpg'), typePart()])).json();
    const response = await download(entity.id, stored.id, org.key, { 'if-none-match': `W/"other", "${stored.sha256}"` });
    expect(response.statusCode).toBe(304);
    expect(response.body).toBe('');
    expect(response.headers.etag).toBe(`"${stored.sha256}"`);
    const stale = await download(entity.id, stored.id, org.key, { 'if-none-match': '"something-else"' });
    expect(stale.statusCode).toBe(200);
  });

  it("when the uploaded name has an extension other than the recognised type, the download name takes the type's extension", async () => {
    const entity = await createEntity(ctx, org);
    const cases: Array<[name: string, bytes: Buffer, saved: string]> = [
      ['deed.html', pdfBytes(), 'deed.pdf'],
      ['scan.pdf', pngBytes(), 'scan.png'],
      ['photo.JPEG', jpegBytes(), 'photo.JPEG'],
      ['no-extension', pdfBytes(), 'no-extension.pdf'],
      ['statement.2026 final', pdfBytes(), 'statement.2026 final.pdf'],
    ];
    for (const [name, bytes, saved] of cases) {
      const stored = (await upload(ctx.app, org.key, entity.id, [filePart(bytes, name), typePart()])).json();
      expect(stored.file_name, name).toBe(name);
      const response = await download(entity.id, stored.id);
      expect(parseContentDisposition(String(response.headers['content-disposition'])).parameters.filename, name).toBe(saved);
    }
  });

  it('when the file name is not ASCII, Content-Disposition carries an ASCII fallback and the RFC 5987 UTF-8 name', async () => {
    const entity = await createEntity(ctx, org);
    const stored = (await upload(ctx.app, org.key, entity.id, [filePart(pdfBytes(), 'Résumé 履歴書.pdf'), typePart()])).json();
    expect(stored.file_name).toBe('Résumé 履歴書.pdf');
    const response = await download(entity.id, stored.id);
    expect(response.headers['content-disposition']).toBe(
      `attachment; filename="R?sum? ???.pdf"; filename*=UTF-8''R%C3%A9sum%C3%A9%20%E5%B1%A5%E6%AD%B4%E6%9B%B8.pdf`,
    );
  });
});

describe('over real HTTP', () => {
  let server: FastifyInstance;
  let port: number;
  beforeAll(async () => {
    server = await ctx.buildInstance();
    await server.listen({ port: 0, host: '127.0.0.1' });
    port = (server.server.address() as AddressInfo).port;
  });

  /** Sends the head and the first bytes of a large upload, then waits for an answer (or gives up). */
  function partialUpload(headers: Record<string, string>, first: Buffer, waitMs: number) {
    return new Promise<{ status?: number; body: string; request: ReturnType<typeof httpRequest> }>((resolve) => {
      const request = httpRequest({
        host: '127.0.0.1',
        port,
        method: 'POST',
        path: `/v1/entities/${crypto.randomUUID()}/documents`,
        headers,
      });
      const timer = setTimeout(() => resolve({ body: '', request }), waitMs);
      request.on('response', (response) => {
        let body = '';
        response.on('data', (chunk) => (body += chunk));
        response.on('end', () => {
          clearTimeout(timer);
          resolve({ status: response.statusCode, body, request });
        });
      });
      request.on('error', () => undefined);
      request.write(first);
    });
  }

  it('when an upload is unauthenticated, it answers 401 before the body is read', async () => {
    const result = await partialUpload(
      { 'content-type': 'multipart/form-data; boundary=x', 'content-length': String(MAX_DOCUMENT_BYTES) },
      Buffer.from('--x\r\nContent-Disposition: form-data; name="file"; filename="a.pdf"\r\n\r\n%PDF-1.7\n'),
      3000,
    );
    result.request.destroy();
    expect(await spooledFiles()).toEqual([]);
    expect(result.status, 'answered while most of the body was never sent').toBe(401);
    expect(JSON.parse(result.body).error.code).toBe('unauthorized');
  });

  it('when the client goes away in the middle of an upload, the temp file is removed', async () => {
    const entity = await createEntity(ctx, org);
    const head = Buffer.from(
      '--x\r\nContent-Disposition: form-data; name="type"\r\n\r\nTRUST_DEED\r\n--x\r\nContent-Disposition: form-data; name="file"; filename="a.pdf"\r\n\r\n',
    );
    const request = httpRequest({
      host: '127.0.0.1',
      port,
      method: 'POST',
      path: `/v1/entities/${entity.id}/documents`,
      headers: {
        authorization: `Bearer ${org.key}`,
        'content-type': 'multipart/form-data; boundary=x',
        'content-length': String(MAX_DOCUMENT_BYTES),
      },
    });
    request.on('error', () => undefined);
    const before = await documentCount();
    try {
      request.write(Buffer.concat([head, pdfBytes(512 * 1024)]));
      const deadline = Date.now() + 3000;
      while ((await spooledFiles()).length === 0 && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 10));
      expect((await spooledFiles()).length, 'the upload was being spooled').toBe(1);
    } finally {
      request.destroy();
    }
    await expectNoSpooledFiles();
    expect(await documentCount()).toBe(before);
  });
});
