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

// Node 20 reached its end of life in April 2026. It still runs the service (the test suite runs on it
// too), but the server and the worker say so when they start; operator commands stay quiet, their
// stderr being for their own messages. Supported: Node 24 LTS (the container's) and Node 22.
const major = Number(process.versions.node.split('.')[0]);
if (major < 22 && ['serve', 'worker'].includes(process.argv[2] ?? '')) {
  process.stderr.write(
    `Warning: Node.js ${process.versions.node} is past its end of life (April 2026) and no longer supported; ` +
      'use Node.js 24 LTS (or 22).\n',
  );
}

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
