/**
 * `npm run bench:webhooks-ab`: webhook delivery throughput before and after a change, in one run. The
 * delivery benchmark (webhooks.bench.ts) of this checkout ("after") and of another commit ("before",
 * BENCH_AB_BEFORE, default HEAD~1) take turns in ABBA order for BENCH_ROUNDS rounds (4 by default),
 * each in a scratch database of its own, each against its own bare signed-POST loop. Reports each
 * side's median events/s, its ratio to the bare POSTs, and the after/before change.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { median, root } from './harness.js';

const ROUNDS = Math.max(1, Number(process.env.BENCH_ROUNDS ?? 4));
const BEFORE = process.env.BENCH_AB_BEFORE ?? 'HEAD~1';

type Report = {
  worker: { events_per_second: number };
  baseline: { posts_per_second: number };
  worker_to_baseline_ratio: number;
  undelivered: number;
};

function checkoutOf(commit: string): { directory: string; remove(): void } {
  const directory = mkdtempSync(join(tmpdir(), 'svc-webhooks-ab-'));
  execFileSync('git', ['worktree', 'add', '--detach', directory, commit], { cwd: root, stdio: 'ignore' });
  symlinkSync(join(root, 'node_modules'), join(directory, 'node_modules'));
  return {
    directory,
    remove() {
      execFileSync('git', ['worktree', 'remove', '--force', directory], { cwd: root, stdio: 'ignore' });
      if (existsSync(directory)) rmSync(directory, { recursive: true, force: true });
    },
  };
}

function runIn(directory: string): Report {
  const output = execFileSync(process.execPath, ['--import', 'tsx', 'bench/webhooks.bench.ts'], {
    cwd: directory,
    env: process.env,
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  return JSON.parse(output.slice(output.indexOf('{'))) as Report;
}

const before = checkoutOf(BEFORE);
try {
  const results: Record<'before' | 'after', Report[]> = { before: [], after: [] };
  for (let round = 0; round < ROUNDS; round += 1) {
    const order: Array<'before' | 'after'> = round % 2 === 0 ? ['before', 'after'] : ['after', 'before'];
    for (const side of order) {
      const report = runIn(side === 'before' ? before.directory : root);
      results[side].push(report);
      process.stderr.write(
        `round ${round + 1} ${side}: ${report.worker.events_per_second} events/s, bare ${report.baseline.posts_per_second}/s, undelivered ${report.undelivered}\n`,
      );
    }
  }
  const summary = (side: 'before' | 'after') => ({
    events_per_second: median(results[side].map((report) => report.worker.events_per_second)),
    range: [
      Math.min(...results[side].map((report) => report.worker.events_per_second)),
      Math.max(...results[side].map((report) => report.worker.events_per_second)),
    ],
    to_bare_posts: median(results[side].map((report) => report.worker_to_baseline_ratio)),
    undelivered: results[side].reduce((sum, report) => sum + report.undelivered, 0),
  });
  const after = summary('after');
  const was = summary('before');
  process.stdout.write(
    `${JSON.stringify({ before: { commit: BEFORE, ...was }, after: after, change: +(after.events_per_second / was.events_per_second - 1).toFixed(3) }, null, 2)}\n`,
  );
} finally {
  before.remove();
}
