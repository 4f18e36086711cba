import { mkdtemp, readdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import type { FastifyInstance } from 'fastify';

export { multipart, MultipartBody, type Part } from '../helpers/multipart.js';
import { multipart, type Part } from '../helpers/multipart.js';

function padded(head: Buffer, size: number): Buffer {
  const data = Buffer.alloc(size, 0x41);
  head.copy(data, 0, 0, Math.min(head.length, size));
  // Varied content, so two files of one size differ.
  if (size > head.length + 8) data.writeDoubleLE(Math.random(), size - 8);
  return data;
}
export const pdfBytes = (size = 2048) => padded(Buffer.from('%PDF-1.7\n'), size);
export const pngBytes = (size = 2048) => padded(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), size);
export const jpegBytes = (size = 2048) => padded(Buffer.from([0xff, 0xd8, 0xff, 0xe0]), size);

export async function upload(
  app: FastifyInstance,
  key: string | null,
  entityRef: string,
  parts: Part[],
  headers: Record<string, string> = {},
) {
  const { payload, contentType } = multipart(parts);
  return app.inject({
    method: 'POST',
    url: `/v1/entities/${encodeURIComponent(entityRef)}/documents`,
    headers: { 'content-type': contentType, ...(key ? { authorization: `Bearer ${key}` } : {}), ...headers },
    payload,
  });
}

/**
 * Points this test process's temporary directory (os.tmpdir(), where uploads are spooled) at a fresh
 * one of its own, so spool files are counted without other test files' uploads running beside it.
 * Returns the undo.
 */
export async function usePrivateTempDir(): Promise<() => Promise<void>> {
  const previous = process.env.TMPDIR;
  const dir = await mkdtemp(join(tmpdir(), 'svc-documents-test-'));
  process.env.TMPDIR = dir;
  return async () => {
    if (previous === undefined) delete process.env.TMPDIR;
    else process.env.TMPDIR = previous;
    await rm(dir, { recursive: true, force: true });
  };
}

/** The upload spool files currently in the temp directory. */
export async function spooledFiles(): Promise<string[]> {
  return (await readdir(tmpdir())).filter((name) => name.startsWith('svc-upload-'));
}

/** Waits until no spool file is left (removal runs when the response closes), or fails after `ms`. */
export async function expectNoSpooledFiles(ms = 3000): Promise<void> {
  const deadline = Date.now() + ms;
  for (;;) {
    const left = await spooledFiles();
    if (left.length === 0) return;
    if (Date.now() > deadline) throw new Error(`spooled files left: ${left.join(', ')}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}
