import { connect, type Socket } from 'node:net';
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp } from '../../src/app.js';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';

let ctx: TestContext;
let org: TestOrg;

beforeAll(async () => {
  ctx = await createTestContext();
  org = await ctx.createOrg();
});

afterAll(async () => {
  await ctx.close();
});

type RawResponse = { status: number; headers: Record<string, string>; body: unknown };

/** The HTTP/1.1 responses in `raw`, in order, each framed by its Content-Length. */
function parseResponses(raw: string): RawResponse[] {
  const responses: RawResponse[] = [];
  let rest = raw;
  while (rest.length > 0) {
    const headEnd = rest.indexOf('\r\n\r\n');
    if (headEnd < 0) break;
    const [statusLine, ...headerLines] = rest.slice(0, headEnd).split('\r\n');
    const headers = Object.fromEntries(
      headerLines.map((line) => [line.slice(0, line.indexOf(':')).toLowerCase(), line.slice(line.indexOf(':') + 1).trim()]),
    );
    const length = Number(headers['content-length'] ?? 0);
    const body = rest.slice(headEnd + 4, headEnd + 4 + length);
    responses.push({ status: Number(statusLine!.split(' ')[1]), headers, body: JSON.parse(body) });
    rest = rest.slice(headEnd + 4 + length);
  }
  return responses;
}

describe('a request that arrives while the server closes', () => {
  it('when a request reaches the server after closing has begun, it gets 503 service_unavailable in the error envelope with Retry-After and Connection: close', async () => {
    const app: FastifyInstance = await buildApp({ config: ctx.config, database: ctx.database, logger: false });
    await app.listen({ port: 0, host: '127.0.0.1' });
    const port = (app.server.address() as { port: number }).port;

    const socket: Socket = connect(port, '127.0.0.1');
    let received = '';
    socket.setEncoding('utf8');
    socket.on('data', (chunk: string) => (received += chunk));
    socket.on('error', () => {});
    const socketClosed = new Promise<void>((resolve) => socket.on('close', () => resolve()));
    await new Promise<void>((resolve) => socket.once('connect', () => resolve()));

    // A request whose headers have started to arrive: its connection is not idle, so closing keeps
    // it open, and the request is complete only once closing has begun.
    socket.write(`GET /v1/customers HTTP/1.1\r\nHost: x\r\n`);
    await new Promise((resolve) => setTimeout(resolve, 100));
    const closed = app.close();
    await new Promise((resolve) => setTimeout(resolve, 100));
    socket.write(`Authorization: Bearer ${org.key}\r\n\r\n`);
    await socketClosed;
    await closed;

    const responses = parseResponses(received);
    expect(responses).toHaveLength(1);
    expect(responses[0]).toMatchObject({
      status: 503,
      headers: { 'retry-after': '1', connection: 'close', 'content-type': expect.stringContaining('application/json') },
      body: { error: { code: 'service_unavailable', message: expect.any(String) } },
    });
  });
});
