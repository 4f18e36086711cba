#!/usr/bin/env node
// In production (NODE_ENV=production, as in the container) this runs the compiled build; elsewhere it
// runs the TypeScript sources through tsx, so `npm install && npm start` needs no build step and a
// stale dist/ never shadows the code being edited.
import { existsSync } from 'node:fs';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { dirname, join } from 'node:path';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const compiled = join(root, 'dist', 'cli', 'main.js');
if (process.env.NODE_ENV === 'production' && existsSync(compiled)) {
  await import(pathToFileURL(compiled).href);
} else {
  const { register } = await import('tsx/esm/api');
  register();
  await import(pathToFileURL(join(root, 'src', 'cli', 'main.ts')).href);
}
