import net from 'node:net';

/**
 * A loopback TCP proxy in front of PostgreSQL for fault tests: it forwards bytes both ways and, when
 * armed, cuts connections at random byte offsets or right after a given backend message.
 */
export type PgProxy = {
  port: number;
  /** The target URL with the proxy's host/port and the given database name, user postgres. */
  url(database: string): string;
  /** While armed, every connection (new or open) is destroyed after a random number (1..maxBytes) of bytes forwarded in either direction since arming/connecting. */
  cutAfterRandomBytes(maxBytes: number): void;
  /** The next `count` (default 1) times a backend→client message of this type (e.g. 'C' CommandComplete, 'D' DataRow, 'Z' ReadyForQuery, 'T' RowDescription, '1' ParseComplete) passes, forward the bytes up to and including that message, then destroy both sockets of that connection (so e.g. 'C' cuts between CommandComplete and ReadyForQuery). */
  cutAfterBackendMessage(type: string, count?: number): void;
  /** Stop cutting. */
  disarm(): void;
  /** Destroy every open connection now. */
  cutAll(): void;
  /** How many connections it has cut so far. */
  cuts(): number;
  close(): Promise<void>;
};

const SSL_REQUEST_CODE = 80877103;
const GSSENC_REQUEST_CODE = 80877104;
const CANCEL_REQUEST_CODE = 80877102;

type Connection = {
  client: net.Socket;
  server: net.Socket;
  closed: boolean;
  /** Bytes forwarded (both directions) since this connection was opened or the random cut was armed. */
  forwarded: number;
  /** Cut once `forwarded` reaches this; Infinity while the random cut is disarmed. */
  cutAt: number;
  // Frontend startup phase (untyped messages: Int32 length, Int32 code, ...).
  frontendStartupDone: boolean;
  frontendHeader: Buffer;
  frontendSkip: number;
  /** SSLRequest/GSSENCRequest answers (a single byte each) still expected from the server. */
  pendingSingleByteReplies: number;
  /** After the server accepted SSL/GSS encryption the stream is opaque: no message parsing. */
  opaque: boolean;
  // Backend typed-message parser.
  backendHeader: Buffer;
  backendHeaderLength: number;
  backendRemaining: number;
};

export function startPgProxy(target: { host: string; port: number }): Promise<PgProxy> {
  const connections = new Set<Connection>();
  let randomMaxBytes = 0; // 0 = disarmed
  const messageCuts = new Map<string, number>();
  let cutCount = 0;

  const randomThreshold = () => (randomMaxBytes > 0 ? 1 + Math.floor(Math.random() * randomMaxBytes) : Infinity);

  const destroyConnection = (connection: Connection, counted: boolean) => {
    if (connection.closed) return;
    connection.closed = true;
    connections.delete(connection);
    if (counted) cutCount += 1;
    connection.client.destroy();
    connection.server.destroy();
  };

  /** Writes `bytes` to `to`, then destroys the whole connection once they have left (or soon, regardless). */
  const forwardThenCut = (connection: Connection, to: net.Socket, bytes: Buffer) => {
    if (connection.closed) return;
    connection.closed = true; // nothing more is forwarded from here on
    connections.delete(connection);
    cutCount += 1;
    const other = to === connection.client ? connection.server : connection.client;
    other.destroy();
    let done = false;
    const finish = () => {
      if (done) return;
      done = true;
      to.destroy();
    };
    if (bytes.length > 0 && !to.destroyed) {
      try {
        to.write(bytes, () => finish());
      } catch {
        finish();
      }
      setTimeout(finish, 50).unref();
    } else {
      finish();
    }
  };

  const write = (connection: Connection, from: net.Socket, to: net.Socket, bytes: Buffer) => {
    if (bytes.length === 0 || connection.closed || to.destroyed) return;
    try {
      if (!to.write(bytes)) {
        from.pause();
        to.once('drain', () => {
          if (!connection.closed) from.resume();
        });
      }
    } catch {
      destroyConnection(connection, false);
    }
  };

  /** Applies the random-bytes cut to a chunk; returns the part to forward and whether to cut after it. */
  const randomCut = (connection: Connection, chunk: Buffer): { bytes: Buffer; cut: boolean } => {
    if (connection.cutAt === Infinity) return { bytes: chunk, cut: false };
    const allowed = connection.cutAt - connection.forwarded;
    if (chunk.length < allowed) {
      connection.forwarded += chunk.length;
      return { bytes: chunk, cut: false };
    }
    const bytes = chunk.subarray(0, Math.max(0, allowed));
    connection.forwarded += bytes.length;
    return { bytes, cut: true };
  };

  /** Follows the frontend's untyped startup messages (SSLRequest, GSSENCRequest, StartupMessage, CancelRequest). */
  const trackFrontend = (connection: Connection, chunk: Buffer) => {
    let at = 0;
    while (!connection.frontendStartupDone && at < chunk.length) {
      if (connection.frontendSkip > 0) {
        const skip = Math.min(connection.frontendSkip, chunk.length - at);
        connection.frontendSkip -= skip;
        at += skip;
        continue;
      }
      const need = 8 - connection.frontendHeader.length;
      const take = Math.min(need, chunk.length - at);
      connection.frontendHeader = Buffer.concat([connection.frontendHeader, chunk.subarray(at, at + take)]);
      at += take;
      if (connection.frontendHeader.length < 8) return;
      const length = connection.frontendHeader.readInt32BE(0);
      const code = connection.frontendHeader.readInt32BE(4);
      connection.frontendHeader = Buffer.alloc(0);
      connection.frontendSkip = Math.max(0, length - 8);
      if (code === SSL_REQUEST_CODE || code === GSSENC_REQUEST_CODE) {
        connection.pendingSingleByteReplies += 1;
      } else if (code === CANCEL_REQUEST_CODE) {
        connection.frontendStartupDone = true; // no reply; the server closes
      } else {
        connection.frontendStartupDone = true; // StartupMessage: typed messages from here on
      }
    }
  };

  /**
   * Parses backend bytes into messages; returns the offset just after the first message whose type
   * is armed for a cut (consuming one of its count), or -1.
   */
  const scanBackend = (connection: Connection, chunk: Buffer): number => {
    let at = 0;
    while (at < chunk.length) {
      if (connection.opaque) return -1;
      if (connection.pendingSingleByteReplies > 0 && connection.backendHeaderLength === 0 && connection.backendRemaining === 0) {
        const reply = chunk[at]!;
        at += 1;
        connection.pendingSingleByteReplies -= 1;
        if (reply === 0x53 /* 'S' */ || reply === 0x47 /* 'G' */) connection.opaque = true;
        continue;
      }
      if (connection.backendRemaining > 0) {
        const skip = Math.min(connection.backendRemaining, chunk.length - at);
        connection.backendRemaining -= skip;
        at += skip;
        if (connection.backendRemaining === 0) {
          const end = messageEnd(connection, at);
          if (end !== -1) return end;
        }
        continue;
      }
      const byte = chunk[at]!;
      connection.backendHeader[connection.backendHeaderLength] = byte;
      connection.backendHeaderLength += 1;
      at += 1;
      if (connection.backendHeaderLength === 5) {
        const length = connection.backendHeader.readInt32BE(1);
        connection.backendRemaining = Math.max(0, length - 4);
        if (connection.backendRemaining === 0) {
          const end = messageEnd(connection, at);
          if (end !== -1) return end;
        }
      }
    }
    return -1;
  };

  /** Called when a backend message completes at `at`: resets the header and checks the armed cuts. */
  const messageEnd = (connection: Connection, at: number): number => {
    const type = String.fromCharCode(connection.backendHeader[0]!);
    connection.backendHeaderLength = 0;
    const remaining = messageCuts.get(type);
    if (remaining !== undefined && remaining > 0) {
      if (remaining === 1) messageCuts.delete(type);
      else messageCuts.set(type, remaining - 1);
      return at;
    }
    return -1;
  };

  const server = net.createServer((client) => {
    client.setNoDelay(true);
    const upstream = net.connect({ host: target.host, port: target.port });
    upstream.setNoDelay(true);
    const connection: Connection = {
      client,
      server: upstream,
      closed: false,
      forwarded: 0,
      cutAt: randomThreshold(),
      frontendStartupDone: false,
      frontendHeader: Buffer.alloc(0),
      frontendSkip: 0,
      pendingSingleByteReplies: 0,
      opaque: false,
      backendHeader: Buffer.alloc(5),
      backendHeaderLength: 0,
      backendRemaining: 0,
    };
    connections.add(connection);

    client.on('data', (chunk: Buffer) => {
      if (connection.closed) return;
      const { bytes, cut } = randomCut(connection, chunk);
      if (!connection.frontendStartupDone) trackFrontend(connection, bytes);
      if (cut) forwardThenCut(connection, upstream, bytes);
      else write(connection, client, upstream, bytes);
    });

    upstream.on('data', (chunk: Buffer) => {
      if (connection.closed) return;
      const { bytes: allowed, cut: randomCutHere } = randomCut(connection, chunk);
      const messageCutAt = scanBackend(connection, allowed);
      if (messageCutAt !== -1) {
        forwardThenCut(connection, client, allowed.subarray(0, messageCutAt));
        return;
      }
      if (randomCutHere) forwardThenCut(connection, client, allowed);
      else write(connection, upstream, client, allowed);
    });

    const closeBoth = () => destroyConnection(connection, false);
    client.on('error', closeBoth);
    upstream.on('error', closeBoth);
    client.on('close', closeBoth);
    upstream.on('close', closeBoth);
    client.on('end', () => {
      if (!connection.closed) upstream.end();
    });
    upstream.on('end', () => {
      if (!connection.closed) client.end();
    });
  });
  server.on('error', () => {});

  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      server.off('error', reject);
      const port = (server.address() as net.AddressInfo).port;
      resolve({
        port,
        url: (database) => `postgres://postgres@127.0.0.1:${port}/${database}`,
        cutAfterRandomBytes(maxBytes) {
          randomMaxBytes = Math.max(1, Math.floor(maxBytes));
          for (const connection of connections) {
            connection.forwarded = 0;
            connection.cutAt = randomThreshold();
          }
        },
        cutAfterBackendMessage(type, count = 1) {
          if (type.length !== 1) throw new Error(`a backend message type is one character, got ${JSON.stringify(type)}`);
          messageCuts.set(type, (messageCuts.get(type) ?? 0) + count);
        },
        disarm() {
          randomMaxBytes = 0;
          messageCuts.clear();
          for (const connection of connections) connection.cutAt = Infinity;
        },
        cutAll() {
          for (const connection of [...connections]) destroyConnection(connection, true);
        },
        cuts: () => cutCount,
        close() {
          randomMaxBytes = 0;
          messageCuts.clear();
          for (const connection of [...connections]) destroyConnection(connection, false);
          return new Promise<void>((done) => server.close(() => done()));
        },
      });
    });
  });
}
