#!/usr/bin/env node
// Runs a compiled build: dist/ in production (NODE_ENV=production, as in the container), or the
// directory SVC_BUILD_DIR names (same layout as dist/; the test suite compiles once and sets it).
// Otherwise it runs the TypeScript sources through tsx (a dev dependency), so `npm install && npm start`
// needs no build step and a stale dist/ never shadows the code being edited.
import { existsSync } from 'node:fs';
import { setFlagsFromString } from 'node:v8';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { dirname, join, resolve } from 'node:path';

// V8 lets the old generation grow to several times its live size between full collections in a
// process it sees as throughput-bound: under sustained load the server's RSS climbed from ~130 MB to
// 250–310 MB of garbage awaiting collection. Growing it by at most 50% a step keeps the peak under
// ~180 MB for about 10 µs of extra (mostly concurrent) marking per request; 20% kept it at ~155 MB but
// cost ~30 µs (bench/README.md). It has to be set here, before the application's modules load: set
// later, the limits V8 already grew to stay.
setFlagsFromString('--heap-growing-percent=50');

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const build = process.env.SVC_BUILD_DIR
  ? resolve(process.env.SVC_BUILD_DIR)
  : process.env.NODE_ENV === 'production' && existsSync(join(root, 'dist', 'cli', 'main.js'))
    ? join(root, 'dist')
    : undefined;
if (build) {
  await import(pathToFileURL(join(build, 'cli', 'main.js')).href);
} else {
  let tsx;
  try {
    tsx = await import('tsx/esm/api');
  } catch (error) {
    if (error?.code !== 'ERR_MODULE_NOT_FOUND') throw error;
    process.stderr.write(
      'svc: nothing to run. There is no compiled build (dist/, run with NODE_ENV=production after `npm run build`) ' +
        'and tsx, which runs the sources, is not installed (a dev dependency: `npm install`).\n',
    );
    process.exit(1);
  }
  tsx.register();
  await import(pathToFileURL(join(root, 'src', 'cli', 'main.ts')).href);
}
