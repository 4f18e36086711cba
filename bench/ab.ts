/**
 * `npm run bench:ab`: the before/after of a change, measured in one run. The build of this checkout
 * ("after") and of another commit ("before", BENCH_AB_BEFORE, default HEAD~1) serve the same scratch
 * database side by side, and take turns with the bare baseline (ABBA order, BENCH_ROUNDS rounds, 6 by
 * default) on each scenario of BENCH_SCENARIOS (`get`, `upsert`; default `upsert`). Reports each
 * side's median req/s and CPU per request, the after/before change and the ratio to the baseline.
 * One full run per build would not do: on this VM throughput drifts by ±20% between runs, more than
 * most changes move it.
 */
import { execFileSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { freeLoopbackPort } from '../src/db/embedded-postgres.js';
import { build, createScratchDatabase, load, median, projectServerEnv, root, seed, startProcess, upsertLoad, type Measure } from './harness.js';

const ROUNDS = Math.max(1, Number(process.env.BENCH_ROUNDS ?? 6));
const BEFORE = process.env.BENCH_AB_BEFORE ?? 'HEAD~1';
const SCENARIOS = (process.env.BENCH_AB_SCENARIOS ?? process.env.BENCH_SCENARIOS ?? 'upsert').split(',').map((name) => name.trim());

/** A worktree of `commit`, sharing this checkout's node_modules, built. */
function checkoutOf(commit: string): { directory: string; remove(): void } {
  const directory = mkdtempSync(join(tmpdir(), 'svc-ab-'));
  execFileSync('git', ['worktree', 'add', '--detach', directory, commit], { cwd: root, stdio: 'ignore' });
  symlinkSync(join(root, 'node_modules'), join(directory, 'node_modules'));
  build(directory);
  return {
    directory,
    remove() {
      execFileSync('git', ['worktree', 'remove', '--force', directory], { cwd: root, stdio: 'ignore' });
      if (existsSync(directory)) rmSync(directory, { recursive: true, force: true });
    },
  };
}

type Side = 'before' | 'after' | 'baseline';

async function main() {
  const before = checkoutOf(BEFORE);
  const scratch = await createScratchDatabase('svc_ab');
  const servers: ChildProcess[] = [];
  try {
    build();
    const ports = { before: await freeLoopbackPort(), after: await freeLoopbackPort(), baseline: await freeLoopbackPort() };
    const ready = (side: Side) => `http://127.0.0.1:${ports[side]}${side === 'baseline' ? '/healthz' : '/readyz'}`;
    const server = {
      before: await startProcess([join(before.directory, 'bin', 'svc.js'), 'serve'], projectServerEnv(scratch.url, ports.before), ready('before')),
      after: await startProcess(['bin/svc.js', 'serve'], projectServerEnv(scratch.url, ports.after), ready('after')),
      baseline: await startProcess(['--import', 'tsx', 'bench/baseline-server.ts'], { DATABASE_URL: scratch.url, PORT: String(ports.baseline), BENCH_ORG_ID: scratch.org.id }, ready('baseline')),
    };
    servers.push(server.before, server.after, server.baseline);
    const auth = { authorization: `Bearer ${scratch.key}`, 'content-type': 'application/json' };
    const json = { 'content-type': 'application/json' };
    await seed(scratch.database, scratch.org.id, 10_000);
    const seeded = (await fetch(`http://127.0.0.1:${ports.after}/v1/customers`, {
      method: 'POST',
      headers: auth,
      body: JSON.stringify({ externalId: 'bench-read', fullName: 'Bench Reader', email: 'reader@bench.test' }),
    }).then((response) => response.json())) as { id: string };

    const runs: Record<string, (side: Side, duration?: number) => Promise<Measure>> = {
      get: (side, duration) =>
        load(server[side], {
          url: `http://127.0.0.1:${ports[side]}${side === 'baseline' ? '/customers/' : '/v1/customers/'}${seeded.id}`,
          headers: side === 'baseline' ? {} : auth,
          ...(duration ? { duration } : {}),
        }),
      upsert: (side, duration) =>
        upsertLoad(server[side], `http://127.0.0.1:${ports[side]}${side === 'baseline' ? '/customers' : '/v1/customers'}`, side === 'baseline' ? json : auth, duration),
    };

    const lines: string[] = [`# A/B: ${BEFORE} (before) against this checkout (after), ${ROUNDS} rounds, ABBA, medians`, ''];
    for (const scenario of SCENARIOS) {
      const run = runs[scenario];
      if (!run) throw new Error(`Unknown scenario ${scenario}: use get or upsert`);
      // Warm-up on every side (it also creates the upsert's 1,000 records), then statistics for the planner.
      for (const side of ['before', 'after', 'baseline'] as const) await run(side, 2);
      await scratch.database.pool.query('ANALYZE customers');
      const measures: Record<Side, Measure[]> = { before: [], after: [], baseline: [] };
      for (let round = 0; round < ROUNDS; round += 1) {
        const order: Side[] = round % 2 === 0 ? ['before', 'after', 'baseline'] : ['baseline', 'after', 'before'];
        for (const side of order) measures[side].push(await run(side));
      }
      const rps = (side: Side) => Math.round(median(measures[side].map((measure) => measure.rps)));
      const cpu = (side: Side) => `${median(measures[side].map((measure) => measure.serverCpuUs))} / ${median(measures[side].map((measure) => measure.postgresCpuUs))}`;
      const ratios = (side: Side) => measures[side].map((measure, index) => (measure.rps / measures.baseline[index]!.rps).toFixed(2)).join(', ');
      const change = ((rps('after') / rps('before') - 1) * 100).toFixed(1);
      const ahead = measures.after.filter((measure, index) => measure.rps > measures.before[index]!.rps).length;
      lines.push(
        `## ${scenario}`,
        '',
        '| Side | req/s | CPU µs per request, server / PostgreSQL | Ratio to the baseline, per round |',
        '|---|---:|---|---|',
        ...(['before', 'after', 'baseline'] as const).map((side) => `| ${side} | ${rps(side)} | ${cpu(side)} | ${side === 'baseline' ? '' : ratios(side)} |`),
        '',
        `After against before: ${Number(change) >= 0 ? '+' : ''}${change}% req/s; after ahead in ${ahead} of ${ROUNDS} rounds.`,
        '',
      );
    }
    process.stdout.write(`${lines.join('\n')}\n`);
  } finally {
    for (const child of servers) child.kill('SIGTERM');
    await scratch.drop();
    before.remove();
  }
}

await main();
