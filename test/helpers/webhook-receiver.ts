import { createServer, type IncomingHttpHeaders, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Webhook } from 'standardwebhooks';

export type Receipt = {
  path: string;
  headers: IncomingHttpHeaders;
  body: string;
  webhookId: string;
  /** Null when the Standard Webhooks signature verified with the endpoint's secret, else why not. */
  verifyError: string | null;
  receivedAt: number;
};

/** What the receiver does with one request: answer (status, headers, delay), or never answer. */
export type Reply = { status?: number; headers?: Record<string, string>; delayMs?: number; hang?: boolean };

/**
 * A real HTTP receiver on a loopback port. Every request is verified with the reference
 * `standardwebhooks` library against the secret registered for its path.
 */
export async function startReceiver(reply: (receipt: Receipt, index: number) => Reply | Promise<Reply> = () => ({})) {
  const receipts: Receipt[] = [];
  const secrets = new Map<string, string>();
  const hanging = new Set<ServerResponse>();
  let handler = reply;

  const server = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('end', () => void respond());
    const respond = async () => {
      const body = Buffer.concat(chunks).toString('utf8');
      const path = request.url ?? '/';
      const secret = secrets.get(path);
      let verifyError: string | null = 'no secret registered for this path';
      if (secret) {
        try {
          new Webhook(secret).verify(body, request.headers as Record<string, string>);
          verifyError = null;
        } catch (error) {
          verifyError = (error as Error).message;
        }
      }
      const receipt: Receipt = {
        path,
        headers: request.headers,
        body,
        webhookId: String(request.headers['webhook-id']),
        verifyError,
        receivedAt: Date.now(),
      };
      receipts.push(receipt);
      const answer = await handler(receipt, receipts.length - 1);
      if (answer.hang) {
        hanging.add(response);
        return;
      }
      if (answer.delayMs) await new Promise((resolve) => setTimeout(resolve, answer.delayMs));
      if (response.destroyed) return;
      response.writeHead(answer.status ?? 200, { 'content-type': 'text/plain', ...(answer.headers ?? {}) });
      response.end('ok');
    };
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;

  return {
    port,
    receipts,
    url(path = '/hook') {
      return `http://127.0.0.1:${port}${path}`;
    },
    /** Registers the secret the receiver verifies requests on `path` with. */
    trust(path: string, secret: string) {
      secrets.set(path, secret);
    },
    setReply(next: typeof reply) {
      handler = next;
    },
    async close() {
      for (const response of hanging) response.destroy();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
export type Receiver = Awaited<ReturnType<typeof startReceiver>>;

/** Polls until `check` returns a truthy value (or throws after `timeoutMs`). */
export async function waitFor<T>(check: () => T | Promise<T>, timeoutMs = 20_000, what = 'condition'): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}
