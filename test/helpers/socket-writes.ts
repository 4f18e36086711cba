import type pg from 'pg';

/**
 * Calls `onWrite` with the bytes of every socket write of a pg client from now on (one call per
 * write, so statements that share a write arrive together). Tests use it to see what left together.
 */
export function onSocketWrites(client: pg.ClientBase, onWrite: (bytes: Buffer) => void): void {
  const stream = (client as unknown as { connection: { stream: Record<string, (...args: any[]) => unknown> } }).connection.stream;
  const write = stream._write!.bind(stream);
  const writev = stream._writev!.bind(stream);
  stream._write = (chunk: Buffer, encoding: unknown, callback: unknown) => {
    onWrite(Buffer.from(chunk));
    return write(chunk, encoding, callback);
  };
  stream._writev = (chunks: Array<{ chunk: Buffer }>, callback: unknown) => {
    onWrite(Buffer.concat(chunks.map((entry) => Buffer.from(entry.chunk))));
    return writev(chunks, callback);
  };
}

/** Sync messages ('S', length 4) in `bytes`: PostgreSQL sends one reply, and flushes once, per Sync. */
export function syncsIn(bytes: Buffer): number {
  const sync = Buffer.from([0x53, 0, 0, 0, 4]);
  let count = 0;
  for (let at = bytes.indexOf(sync); at !== -1; at = bytes.indexOf(sync, at + 1)) count += 1;
  return count;
}

/** Describe messages for the unnamed portal ('D', length 6, 'P', empty name) in `bytes`: each asks PostgreSQL for a RowDescription. */
export function portalDescribesIn(bytes: Buffer): number {
  const describe = Buffer.from([0x44, 0, 0, 0, 6, 0x50, 0]);
  let count = 0;
  for (let at = bytes.indexOf(describe); at !== -1; at = bytes.indexOf(describe, at + 1)) count += 1;
  return count;
}
