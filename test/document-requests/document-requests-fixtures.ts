import { and, asc, eq } from 'drizzle-orm';
import { PNG } from 'pngjs';
import { expect } from 'vitest';
import { documentRequests, documentRequestTokens, emails, entityDocuments } from '../../src/db/schema.js';
import type { TestContext, TestOrg } from '../helpers/harness.js';
import { multipart as buildMultipart } from '../helpers/multipart.js';
import { testLinkSealer } from '../helpers/harness.js';
import { createEmailsRepository } from '../../src/modules/emails/emails.repository.js';

/** A small but real PDF (one empty page). */
export const PDF = Buffer.from(
  '%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n2 0 obj<</Type/Pages/Kids[3 0 R]/Count 1>>endobj\n' +
    '3 0 obj<</Type/Page/Parent 2 0 R/MediaBox[0 0 200 200]>>endobj\ntrailer<</Root 1 0 R>>\n%%EOF\n',
  'latin1',
);

/** A real PNG of `size`×`size` pixels, a diagonal gradient. */
export function pngOf(size = 16): Buffer {
  const png = new PNG({ width: size, height: size });
  for (let y = 0; y < size; y += 1) {
    for (let x = 0; x < size; x += 1) {
      const at = (y * size + x) * 4;
      png.data[at] = (x * 255) / size;
      png.data[at + 1] = (y * 255) / size;
      png.data[at + 2] = 128;
      png.data[at + 3] = 255;
    }
  }
  return PNG.sync.write(png);
}

/**
 * A multipart/form-data body as a browser builds it: `parts` are [field, bytes, file name]; a file
 * input left empty is ['FIELD', empty, ''], sent with filename="" as browsers do.
 */
export function multipart(parts: Array<[string, Buffer, string]>): { body: Buffer; contentType: string } {
  const form = buildMultipart(
    parts.map(([name, data, filename]) => ({
      name,
      data,
      filename,
      contentType: filename === '' ? 'application/octet-stream' : filename.endsWith('.png') ? 'image/png' : 'application/pdf',
    })),
  );
  return { body: form.payload, contentType: form.contentType };
}

/** POSTs files to an upload page. */
export async function upload(ctx: TestContext, token: string, parts: Array<[string, Buffer, string]>) {
  const { body, contentType } = multipart(parts);
  return ctx.app.inject({ method: 'POST', url: `/documents/${token}`, headers: { 'content-type': contentType }, payload: body });
}

export async function createRequest(
  ctx: TestContext,
  org: TestOrg,
  entityId: string,
  body: Record<string, unknown>,
  headers: Record<string, string> = {},
) {
  return ctx.request('POST', `/v1/entities/${entityId}/document-requests`, { key: org.key, body, headers });
}

/** Creates a request and returns its DTO and link token (checked to be what the email carries). */
export async function openRequest(
  ctx: TestContext,
  org: TestOrg,
  entityId: string,
  body: Record<string, unknown> = { types: ['CERTIFICATE_OF_REGISTRATION'] },
) {
  const response = await createRequest(ctx, org, entityId, body);
  expect(response.statusCode, response.body).toBe(201);
  const dto = response.json<{ id: string; upload_url: string; status: string }>();
  const token = tokenOf(dto.upload_url);
  return { dto, token };
}

export function tokenOf(url: string): string {
  const match = /\/documents\/([A-Za-z0-9_-]{43})$/.exec(url);
  expect(match, url).not.toBeNull();
  return match![1]!;
}

export async function requestRow(ctx: TestContext, id: string) {
  const [row] = await ctx.database.db.select().from(documentRequests).where(eq(documentRequests.id, id));
  return row!;
}

export async function requestsOf(ctx: TestContext, orgId: string) {
  return ctx.database.db.select().from(documentRequests).where(eq(documentRequests.orgId, orgId));
}

export async function tokensOf(ctx: TestContext, orgId: string) {
  return ctx.database.db.select().from(documentRequestTokens).where(eq(documentRequestTokens.orgId, orgId));
}

export async function documentsOf(ctx: TestContext, orgId: string, requestId?: string) {
  return ctx.database.db
    .select()
    .from(entityDocuments)
    .where(and(eq(entityDocuments.orgId, orgId), requestId ? eq(entityDocuments.documentRequestId, requestId) : undefined))
    .orderBy(asc(entityDocuments.createdAt), asc(entityDocuments.id));
}

/** The organisation's emails, oldest first, with their body and link opened (they are sealed at rest). */
export async function emailsTo(ctx: TestContext, orgId: string) {
  const repository = createEmailsRepository(testLinkSealer());
  const rows = await ctx.database.db.select().from(emails).where(eq(emails.orgId, orgId)).orderBy(asc(emails.createdAt));
  return rows.map((row) => repository.openRow(row));
}

/** Moves a request's due time into the past, as the clock would. */
export async function makeOverdue(ctx: TestContext, id: string) {
  await ctx.database.db
    .update(documentRequests)
    .set({ dueAt: new Date(Date.now() - 60_000) })
    .where(eq(documentRequests.id, id));
}
