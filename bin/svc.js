#!/usr/bin/env node
// In production (NODE_ENV=production, as in the container) this runs the compiled build; elsewhere it
// runs the TypeScript sources through tsx, so `npm install && npm start` needs no build step and a
// stale dist/ never shadows the code being edited.
import { existsSync } from 'node:fs';
import { setFlagsFromString } from 'node:v8';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { dirname, join } from 'node:path';

// V8 lets the old generation grow to several times its live size between full collections in a
// process it sees as throughput-bound: under sustained load the server's RSS climbed from ~130 MB to
// 250–310 MB of garbage awaiting collection. Growing it by at most 50% a step keeps the peak under
// ~180 MB for about 10 µs of extra (mostly concurrent) marking per request; 20% kept it at ~155 MB but
// cost ~30 µs (bench/README.md). It has to be set here, before the application's modules load: set
// later, the limits V8 already grew to stay.
setFlagsFromString('--heap-growing-percent=50');

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const compiled = join(root, 'dist', 'cli', 'main.js');
if (process.env.NODE_ENV === 'production' && existsSync(compiled)) {
  await import(pathToFileURL(compiled).href);
} else {
  const { register } = await import('tsx/esm/api');
  register();
  await import(pathToFileURL(join(root, 'src', 'cli', 'main.ts')).href);
}
