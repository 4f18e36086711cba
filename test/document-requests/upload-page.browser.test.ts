import { execFileSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { chromium, type Browser } from 'playwright-core';
import { PNG } from 'pngjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createEmailsRepository } from '../../src/modules/emails/emails.repository.js';
import { findChromium } from '../helpers/chromium.js';
import { createTestContext, type TestContext, testLinkSealer } from '../helpers/harness.js';
import { createEntity } from '../verification/verification-fixtures.js';
import { documentsOf, PDF, pngOf } from './document-requests-fixtures.js';

/**
 * The contact's journey in a real browser (Debian's Chromium, JavaScript off): the request by API, the
 * link from the queued email, the upload page, two files, the confirmation, FULFILLED through the API.
 * Screenshots before and after go to test-artifacts/ (gitignored) and are checked to be real, non-blank PNGs.
 */

const CHROMIUM = findChromium();
/** playwright-core wants a path; findChromium may answer a command name found on PATH. */
const CHROMIUM_PATH = CHROMIUM && !CHROMIUM.includes('/') ? execFileSync('which', [CHROMIUM]).toString().trim() : CHROMIUM;
const ARTIFACTS = join(process.cwd(), 'test-artifacts');

let ctx: TestContext;
let server: FastifyInstance;
let origin: string;
let browser: Browser | undefined;

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address() as { port: number };
      probe.close(() => resolve(port));
    });
  });
}

beforeAll(async () => {
  ctx = await createTestContext();
  const port = await freePort();
  origin = `http://127.0.0.1:${port}`;
  // The emailed link must point at this server.
  server = await ctx.buildInstance({ publicBaseUrl: origin });
  await server.listen({ host: '127.0.0.1', port });
  if (CHROMIUM_PATH) browser = await chromium.launch({ executablePath: CHROMIUM_PATH, headless: true, args: ['--no-sandbox'] });
}, 60_000);
afterAll(async () => {
  await browser?.close();
  await ctx?.close();
});

/** A screenshot's pixels: its size, the spread of its luminance, and how many distinct colours it has. */
function inspectPng(bytes: Buffer) {
  const png = PNG.sync.read(bytes);
  let sum = 0;
  let squares = 0;
  const colours = new Set<number>();
  const pixels = png.width * png.height;
  for (let index = 0; index < pixels; index += 1) {
    const at = index * 4;
    const luminance = 0.2126 * png.data[at]! + 0.7152 * png.data[at + 1]! + 0.0722 * png.data[at + 2]!;
    sum += luminance;
    squares += luminance * luminance;
    colours.add((png.data[at]! << 16) | (png.data[at + 1]! << 8) | png.data[at + 2]!);
  }
  const mean = sum / pixels;
  const pixel = (x: number, y: number) => Array.from(png.data.subarray((y * png.width + x) * 4, (y * png.width + x) * 4 + 3));
  return { width: png.width, height: png.height, variance: squares / pixels - mean * mean, colours: colours.size, pixel };
}

function checkScreenshot(bytes: Buffer, name: string) {
  mkdirSync(ARTIFACTS, { recursive: true });
  writeFileSync(join(ARTIFACTS, name), bytes);
  expect(bytes.subarray(0, 8)).toEqual(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]));
  expect(bytes.length).toBeGreaterThan(5_000);
  expect(bytes.length).toBeLessThan(5_000_000);
  const image = inspectPng(bytes);
  expect(image.width).toBeGreaterThanOrEqual(600);
  expect(image.height).toBeGreaterThanOrEqual(300);
  // Text, borders and a coloured background: not a blank page.
  expect(image.variance).toBeGreaterThan(50);
  expect(image.colours).toBeGreaterThan(20);
  // The page's stylesheet applied (its hash matched the CSP): the body's background, not the default white.
  expect(image.pixel(3, 3)).toEqual([0xf3, 0xf5, 0xf8]);
  return image;
}

describe('the upload page in a headless Chromium', () => {
  it.skipIf(!CHROMIUM_PATH)(
    'when the contact follows the emailed link and uploads both files without JavaScript, the request is FULFILLED and the page stays on its origin with no CSP violation',
    async () => {
      const org = await ctx.createOrg({ credits: 5 });
      const entity = await createEntity(ctx, org);
      const created = await ctx.request(
        'POST',
        `/v1/entities/${entity.id}/document-requests`,
        {
          key: org.key,
          body: { types: ['CERTIFICATE_OF_REGISTRATION', 'ID_OF_OFFICEHOLDER'], message: 'Please upload both before Friday.' },
        },
        server,
      );
      expect(created.statusCode, created.body).toBe(201);
      const emails = createEmailsRepository(testLinkSealer());
      const email = emails.openRow((await emails.list(org.id, {}, ctx.database.db))[0]!);
      expect(email.recipient).toBe(entity.contactEmail);
      const link = email.link!;
      expect(link.startsWith(`${origin}/documents/`)).toBe(true);
      expect(email.body).toContain(link);

      const context = await browser!.newContext({ javaScriptEnabled: false, viewport: { width: 1000, height: 800 } });
      const page = await context.newPage();
      const requested: string[] = [];
      const console: string[] = [];
      page.on('request', (request) => requested.push(request.url()));
      page.on('console', (message) => console.push(`${message.type()}: ${message.text()}`));
      page.on('pageerror', (error) => console.push(`pageerror: ${error.message}`));
      try {
        const opened = await page.goto(link);
        expect(opened!.status()).toBe(200);
        await expect(page.locator('h1').textContent()).resolves.toContain(String(entity.dto.name));
        await expect(page.locator('.message').textContent()).resolves.toBe('Please upload both before Friday.');
        checkScreenshot(await page.screenshot({ fullPage: true, type: 'png' }), 'upload-page-before.png');

        await page.setInputFiles('#file-CERTIFICATE_OF_REGISTRATION', {
          name: 'certificate.pdf',
          mimeType: 'application/pdf',
          buffer: PDF,
        });
        await page.setInputFiles('#file-ID_OF_OFFICEHOLDER', { name: 'licence.png', mimeType: 'image/png', buffer: pngOf(64) });
        await Promise.all([page.waitForURL(`${origin}/documents/received`), page.click('button[type=submit]')]);
        await expect(page.locator('h1').textContent()).resolves.toBe('Thank you');
        await expect(page.locator('.notice').textContent()).resolves.toContain('All requested documents have been received');
        checkScreenshot(await page.screenshot({ fullPage: true, type: 'png' }), 'upload-page-after.png');

        // The spent link now shows the invalid-link page.
        const reopened = await page.goto(link);
        expect(reopened!.status()).toBe(404);
      } finally {
        await context.close();
      }

      expect(requested.length).toBeGreaterThanOrEqual(3);
      expect(requested.filter((url) => !url.startsWith(`${origin}/`))).toEqual([]);
      expect(console.filter((line) => /content.security.policy|refused/i.test(line))).toEqual([]);

      const listed = await ctx.request('GET', `/v1/entities/${entity.id}/document-requests`, { key: org.key }, server);
      const [request] = listed.json().data;
      expect(request).toMatchObject({ status: 'FULFILLED', received_types: ['CERTIFICATE_OF_REGISTRATION', 'ID_OF_OFFICEHOLDER'] });
      expect(request.document_ids).toHaveLength(2);
      const documents = await documentsOf(ctx, org.id, request.id);
      expect(documents.map((document) => [document.type, document.uploadedBy, document.mediaType, document.fileName])).toEqual([
        ['CERTIFICATE_OF_REGISTRATION', 'contact', 'application/pdf', 'certificate.pdf'],
        ['ID_OF_OFFICEHOLDER', 'contact', 'image/png', 'licence.png'],
      ]);
      expect(documents.map((document) => document.id)).toEqual(request.document_ids);
    },
    60_000,
  );
});
