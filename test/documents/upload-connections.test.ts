import { connect, type AddressInfo, type Socket } from 'node:net';
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Config } from '../../src/config/config.js';
import { buildApp } from '../../src/app.js';
import { MAX_DOCUMENT_BYTES } from '../../src/modules/documents/document-types.js';
import { loggerOptions } from '../../src/shared/logging.js';
import { openRequest } from '../document-requests/document-requests-fixtures.js';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { collectInto } from '../helpers/log-collector.js';
import { createEntity } from '../verification/verification-fixtures.js';
import { expectNoSpooledFiles, pdfBytes, spooledFiles, usePrivateTempDir } from './document-helpers.js';

/*
 * Uploads over real sockets, from clients that go away or stall in the middle of the body, on both
 * upload routes: the API's POST /v1/entities/{id}/documents and the contact's POST /documents/{token}
 * (one multipart intake), and on a JSON route.
 */

type Entry = Record<string, unknown> & { level: number; msg?: string; reqId?: string };

let ctx: TestContext;
let org: TestOrg;
let entityId: string;
let token: string;
let restoreTempDir: (() => Promise<void>) | undefined;

beforeAll(async () => {
  // Spool files are counted here: other test files' uploads must not land in the same directory.
  restoreTempDir = await usePrivateTempDir();
  ctx = await createTestContext();
  org = await ctx.createOrg({ credits: 100 });
  entityId = (await createEntity(ctx, org)).id;
  ({ token } = await openRequest(ctx, org, entityId, { types: ['CERTIFICATE_OF_REGISTRATION', 'ID_OF_OFFICEHOLDER'] }));
});
afterAll(async () => {
  await ctx?.close();
  await restoreTempDir?.();
});

/** An app listening on a free port, logging at debug into `lines`. */
async function listeningApp(lines: Entry[], overrides: Partial<Config> = {}): Promise<{ app: FastifyInstance; port: number }> {
  const app = await buildApp({
    config: { ...ctx.config, ...overrides },
    database: ctx.database,
    logger: {
      ...loggerOptions({ logLevel: 'debug' }),
      stream: collectInto({
        write: (chunk: string) => {
          for (const line of chunk.split('\n').filter(Boolean)) lines.push(JSON.parse(line) as Entry);
        },
      }),
    },
  });
  await app.listen({ host: '127.0.0.1', port: 0 });
  return { app, port: (app.server.address() as AddressInfo).port };
}

/** Waits until `condition` holds, or fails naming `what` after `ms`. */
async function until(what: string, condition: () => boolean | Promise<boolean>, ms = 5_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

const BOUNDARY = 'svc-connection-test';

/** The head of a multipart upload whose file part (named `field`) is under way, and the request head announcing 10 MiB. */
function uploadStart(route: 'api' | 'page', requestId: string): string {
  const path = route === 'api' ? `/v1/entities/${entityId}/documents` : `/documents/${token}`;
  const field = route === 'api' ? 'file' : 'CERTIFICATE_OF_REGISTRATION';
  const authorization = route === 'api' ? `Authorization: Bearer ${org.key}\r\n` : '';
  const typePart = route === 'api' ? `--${BOUNDARY}\r\nContent-Disposition: form-data; name="type"\r\n\r\nTRUST_DEED\r\n` : '';
  return (
    `POST ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data; boundary=${BOUNDARY}\r\n` +
    `Content-Length: ${MAX_DOCUMENT_BYTES}\r\n${authorization}X-Request-Id: ${requestId}\r\n\r\n` +
    `${typePart}--${BOUNDARY}\r\nContent-Disposition: form-data; name="${field}"; filename="deed.pdf"\r\nContent-Type: application/pdf\r\n\r\n`
  );
}

async function openSocket(port: number): Promise<Socket> {
  const socket = connect(port, '127.0.0.1');
  socket.on('error', () => {});
  await new Promise<void>((resolve) => socket.once('connect', () => resolve()));
  return socket;
}

const ROUTES = [
  ['the API upload route', 'api', '/v1/entities/:id/documents'],
  ['the upload page', 'page', '/documents/:token'],
] as const;

describe('a client that hangs up in the middle of an upload', () => {
  it.each(ROUTES)(
    'when a client hangs up in the middle of a file on %s, it is logged at info as the client aborting, never as the database being unavailable',
    async (_name, route, pattern) => {
      const lines: Entry[] = [];
      const { app, port } = await listeningApp(lines);
      const requestId = `hangup-${route}`;
      const mine = () => lines.filter((entry) => entry.reqId === requestId);
      try {
        const socket = await openSocket(port);
        socket.write(uploadStart(route, requestId));
        socket.write(pdfBytes(256 * 1024));
        await until('the file to be spooled', async () => (await spooledFiles()).length > 0);
        socket.destroy();
        // The error handler's line (whatever it says) and the request's own line both come.
        await until(
          'the error handler and the request line',
          () =>
            mine().some((entry) => entry.msg === 'request aborted by the client') &&
            mine().some((entry) => entry.level !== 30 && entry.err !== undefined),
        );
        await expectNoSpooledFiles();
      } finally {
        await app.close();
      }
      expect(mine().filter((entry) => entry.level >= 40)).toEqual([]);
      expect(JSON.stringify(lines)).not.toContain('database unavailable');
      expect(mine().filter((entry) => entry.level === 30)).toEqual([
        expect.objectContaining({ msg: 'request aborted by the client', aborted: true, method: 'POST', route: pattern }),
      ]);
      expect(mine()).toContainEqual(
        expect.objectContaining({
          level: 20,
          msg: 'client aborted the request while sending its body',
          route: pattern,
          err: expect.objectContaining({ code: 'ECONNRESET' }),
        }),
      );
    },
  );
});
