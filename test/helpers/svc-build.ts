import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, utimesSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
/**
 * Builds live under the project (ignored by git as `.vitest-*`), one level down like dist/: the
 * compiled code resolves its packages from the project's node_modules and finds migrations/ from there.
 */
const BUILDS = join(ROOT, '.vitest-build');
/** A build no run has started on for this long (longer than any run lasts) is removed by the next run. */
const STALE_MS = 6 * 60 * 60 * 1000;

/** Every file under `dir`, sorted, as paths relative to the project. */
function filesUnder(dir: string): string[] {
  const files: string[] = [];
  const walk = (current: string) => {
    for (const entry of readdirSync(current, { withFileTypes: true })) {
      const path = join(current, entry.name);
      if (entry.isDirectory()) walk(path);
      else if (entry.isFile()) files.push(relative(ROOT, path));
    }
  };
  walk(dir);
  return files.sort();
}

/** What the build is made of: the sources, the compiler settings and the compiler's version. */
function sourceHash(typescript: string): string {
  const hash = createHash('sha256');
  hash.update(readFileSync(join(dirname(typescript), '..', 'package.json')));
  for (const file of [...filesUnder(join(ROOT, 'src')), 'tsconfig.json', 'tsconfig.build.json']) {
    hash.update(`\0${file}\0`);
    hash.update(readFileSync(join(ROOT, file)));
  }
  return hash.digest('hex').slice(0, 16);
}

function removeStaleBuilds(keep: string): void {
  if (!existsSync(BUILDS)) return;
  for (const name of readdirSync(BUILDS)) {
    const path = join(BUILDS, name);
    if (path === keep) continue;
    try {
      if (Date.now() - statSync(path).mtimeMs > STALE_MS) rmSync(path, { recursive: true, force: true });
    } catch {
      // removed by another run meanwhile
    }
  }
}

/**
 * `npm run build` (tsconfig.build.json) of the current sources, compiled once per distinct source state
 * and shared by concurrent and later runs: the directory is named after a hash of what it is built from,
 * so a change anywhere under src/ makes a new one. The spawned `svc` processes run it (bin/svc.js with
 * SVC_BUILD_DIR) instead of compiling the sources through tsx each time. Type checking is left to
 * `npm run typecheck`: `--noCheck` only emits, in a few seconds.
 */
export async function buildForTests(): Promise<string> {
  const typescript = createRequire(join(ROOT, 'package.json')).resolve('typescript/bin/tsc');
  for (let attempt = 1; ; attempt += 1) {
    const hash = sourceHash(typescript);
    const target = join(BUILDS, hash);
    removeStaleBuilds(target);
    if (existsSync(join(target, 'cli', 'main.js'))) {
      const now = new Date();
      utimesSync(target, now, now); // in use: not stale
      return target;
    }
    mkdirSync(BUILDS, { recursive: true });
    const scratch = join(BUILDS, `.tmp-${process.pid}-${Date.now().toString(36)}`);
    try {
      await promisify(execFile)(process.execPath, [typescript, '-p', join(ROOT, 'tsconfig.build.json'), '--outDir', scratch, '--noCheck'], {
        cwd: ROOT,
      });
      // A source edited while it compiled: the output may hold either version, so it is not published under this hash.
      if (sourceHash(typescript) !== hash && attempt < 3) continue;
      try {
        renameSync(scratch, target);
      } catch (error) {
        // Another run published the same build first: use theirs.
        if (!existsSync(join(target, 'cli', 'main.js'))) throw error;
      }
      return target;
    } catch (error) {
      const failure = error as { stdout?: string; stderr?: string };
      throw new Error(`compiling src/ for the spawned svc processes failed\n${failure.stdout ?? ''}${failure.stderr ?? ''}`, {
        cause: error,
      });
    } finally {
      rmSync(scratch, { recursive: true, force: true });
    }
  }
}
