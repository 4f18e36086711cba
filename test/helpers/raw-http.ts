import { connect, type Socket } from 'node:net';

/*
 * A client on a bare socket, for what an HTTP client library will not do: stop in the middle of a
 * body, trickle it, or see the answer while most of the body is still unsent.
 */

/** A connected socket to 127.0.0.1:`port`; its errors (a reset by the server) are the test's to look at, not thrown. */
export async function openSocket(port: number): Promise<Socket> {
  const socket = connect(port, '127.0.0.1');
  socket.on('error', () => {});
  await new Promise<void>((resolve) => socket.once('connect', () => resolve()));
  return socket;
}

export type RawAnswer = {
  /** 0: no status line came before the connection closed (or it was still open after the wait). */
  status: number;
  /** The head, lower-cased. */
  headers: string;
  body: string;
};

/** Everything the server writes on `socket` until it closes the connection, or until `ms` have passed (the socket is then closed here). */
export function answerOf(socket: Socket, ms = 10_000): Promise<RawAnswer> {
  return new Promise((resolve) => {
    let raw = '';
    const giveUp = setTimeout(() => socket.destroy(), ms);
    socket.on('data', (chunk) => (raw += String(chunk)));
    socket.once('close', () => {
      clearTimeout(giveUp);
      const [head = '', body = ''] = raw.split('\r\n\r\n', 2);
      resolve({ status: Number(/^HTTP\/1\.1 (\d{3})/.exec(head)?.[1] ?? 0), headers: head.toLowerCase(), body });
    });
  });
}

/** Writes `bytes` one at a time, a little apart, until they are all sent or the connection closes. */
export function trickle(socket: Socket, bytes: Buffer): void {
  let at = 0;
  const timer = setInterval(() => {
    if (socket.destroyed || at >= bytes.length) return clearInterval(timer);
    socket.write(bytes.subarray(at, at + 1));
    at += 1;
  }, 20);
  socket.once('close', () => clearInterval(timer));
}

/** Waits until `condition` holds, or fails naming `what` after `ms`. */
export async function until(what: string, condition: () => boolean | Promise<boolean>, ms = 5_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}
