import type { AddressInfo, Socket } from 'node:net';
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Config } from '../../src/config/config.js';
import { buildApp } from '../../src/app.js';
import { MAX_DOCUMENT_BYTES } from '../../src/modules/documents/document-types.js';
import { loggerOptions } from '../../src/shared/logging.js';
import { openRequest } from '../document-requests/document-requests-fixtures.js';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { collectInto } from '../helpers/log-collector.js';
import { answerOf, openSocket, trickle, until } from '../helpers/raw-http.js';
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

describe('a client that stalls or trickles its body', () => {
  /** A body that pauses this long is cut; the whole request may take a minute. */
  const stalling = { requestTimeouts: { requestTimeoutMs: 60_000, bodyIdleTimeoutMs: 300 } };
  /** The whole request must arrive within 1.5 s; pauses are allowed up to a second. */
  const trickling = { requestTimeouts: { requestTimeoutMs: 1_500, bodyIdleTimeoutMs: 1_000 } };

  function expectTimeoutAnswer(route: 'api' | 'page' | 'json', answer: { status: number; headers: string; body: string }) {
    expect(answer.status).toBe(408);
    expect(answer.headers).toContain('connection: close');
    if (route === 'page') {
      expect(answer.headers).toContain('content-type: text/html');
      expect(answer.headers).toContain("content-security-policy: default-src 'none'");
      expect(answer.body).toContain('The upload took too long to arrive');
    } else {
      expect(JSON.parse(answer.body)).toEqual({ error: { code: 'request_timeout', message: expect.any(String) } });
    }
  }

  function expectTimedOutLine(lines: Entry[], requestId: string, route: string, timeout: string) {
    const mine = lines.filter((entry) => entry.reqId === requestId);
    expect(mine.filter((entry) => entry.level >= 40)).toEqual([]);
    expect(mine.filter((entry) => entry.level === 30)).toEqual([
      expect.objectContaining({ msg: 'request timed out', timeout, method: 'POST', route }),
    ]);
  }

  it.each(ROUTES)(
    'when the body of an upload on %s stops arriving, the connection is cut with a 408 and the temp file is removed',
    async (_name, route, pattern) => {
      const lines: Entry[] = [];
      const { app, port } = await listeningApp(lines, stalling);
      const requestId = `stall-${route}`;
      try {
        const socket = await openSocket(port);
        const answer = answerOf(socket);
        socket.write(uploadStart(route, requestId));
        socket.write(pdfBytes(256 * 1024));
        await until('the file to be spooled', async () => (await spooledFiles()).length > 0);
        // Nothing more is sent: the server ends it.
        expectTimeoutAnswer(route, await answer);
        await expectNoSpooledFiles();
        await until('the request line', () => lines.some((entry) => entry.reqId === requestId && entry.level === 30));
      } finally {
        await app.close();
      }
      expectTimedOutLine(lines, requestId, pattern, 'body_idle');
    },
  );

  it.each(ROUTES)(
    'when an upload on %s trickles in past the request timeout, the connection is cut with a 408 and the temp file is removed',
    async (_name, route, pattern) => {
      const lines: Entry[] = [];
      const { app, port } = await listeningApp(lines, trickling);
      const requestId = `trickle-${route}`;
      try {
        const socket = await openSocket(port);
        const answer = answerOf(socket);
        socket.write(uploadStart(route, requestId));
        socket.write(pdfBytes(16 * 1024));
        trickle(socket, Buffer.alloc(64 * 1024, 0x41));
        expectTimeoutAnswer(route, await answer);
        await expectNoSpooledFiles();
        await until('the request line', () => lines.some((entry) => entry.reqId === requestId && entry.level === 30));
      } finally {
        await app.close();
      }
      expectTimedOutLine(lines, requestId, pattern, 'request');
    },
  );

  it.each([
    ['stops arriving', stalling, 'body_idle', (socket: Socket) => socket.write('{"fullName": "Jane')],
    [
      'trickles in past the request timeout',
      trickling,
      'request',
      (socket: Socket) => trickle(socket, Buffer.from(`{"fullName": "${'J'.repeat(500)}`)),
    ],
  ] as const)(
    'when the body of a JSON request %s, the connection is cut with a 408 in the envelope',
    async (_name, settings, timeout, send) => {
      const lines: Entry[] = [];
      const { app, port } = await listeningApp(lines, settings);
      const requestId = `json-${timeout}`;
      try {
        const socket = await openSocket(port);
        const answer = answerOf(socket);
        socket.write(
          'POST /v1/customers HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n' +
            `Authorization: Bearer ${org.key}\r\nX-Request-Id: ${requestId}\r\n\r\n`,
        );
        send(socket);
        expectTimeoutAnswer('json', await answer);
        await until('the request line', () => lines.some((entry) => entry.reqId === requestId && entry.level === 30));
      } finally {
        await app.close();
      }
      expectTimedOutLine(lines, requestId, '/v1/customers', timeout);
    },
  );
});
