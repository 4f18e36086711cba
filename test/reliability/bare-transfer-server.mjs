// The baseline of test/reliability/document-memory.test.ts: the same transfer through Node's core
// modules only. POST spools the request body to a temporary file and answers {"id"}; GET /<id> streams
// that file back. It prints "PORT <n>" once listening. No framework, database or parsing: what a Node
// process's RSS does when 10 MiB go in and out, for comparison with the service's.
import { createReadStream, createWriteStream } from 'node:fs';
import { mkdtemp, rm, stat } from 'node:fs/promises';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pipeline } from 'node:stream/promises';

const directory = await mkdtemp(join(tmpdir(), 'bare-transfer-'));
let stored = 0;

const server = createServer((request, response) => {
  const handle = async () => {
    if (request.method === 'POST') {
      stored += 1;
      await pipeline(request, createWriteStream(join(directory, String(stored))));
      response.writeHead(201, { 'content-type': 'application/json' }).end(JSON.stringify({ id: stored }));
      return;
    }
    const path = join(directory, String(Number(request.url.slice(1))));
    const { size } = await stat(path);
    response.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': size });
    await pipeline(createReadStream(path), response);
  };
  handle().catch(() => response.destroy());
});

const close = () => server.close(() => rm(directory, { recursive: true, force: true }).then(() => process.exit(0)));
process.on('SIGTERM', close);
server.listen(0, '127.0.0.1', () => console.log(`PORT ${server.address().port}`));
