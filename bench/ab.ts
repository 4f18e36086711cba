/**
 * `npm run bench:ab`: the before/after of a change, measured in one run. The build of this checkout
 * ("after") and of another commit ("before", BENCH_AB_BEFORE, default HEAD~1) serve the same scratch
 * database side by side, and take turns with the bare baseline (ABBA order, BENCH_ROUNDS rounds, 6 by
 * default) on each scenario of BENCH_SCENARIOS (`get`, `upsert`; default `upsert`). Reports each
 * side's median req/s and CPU per request, the after/before change and the ratio to the baseline.
 * One full run per build would not do: on this VM throughput drifts by ±20% between runs, more than
 * most changes move it.
 *
 * Both builds run as `npm run bench` runs the project: production build, default settings (LOG_LEVEL
 * info), logs to files; the baseline is the same bare server with named prepared statements.
 * BENCH_LOG_LEVEL makes it a diagnostic run (both builds at that level), labelled as such.
 */
import { execFileSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  baselineServerEnv,
  build,
  buildBaseline,
  createScratchDatabase,
  DIAGNOSTIC_LOG_LEVEL,
  freeLoopbackPort,
  load,
  LOG_DIR,
  logVolume,
  median,
  projectServerEnv,
  root,
  seed,
  startProcess,
  upsertLoad,
  type Measure,
} from './harness.js';

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
  const servers: ChildProcess[] = [];
  let scratch: Awaited<ReturnType<typeof createScratchDatabase>> | undefined;
  try {
    // This checkout's build; its CLI makes the scratch database (and applies its migrations).
    build();
    const baselineScript = buildBaseline();
    scratch = await createScratchDatabase('svc_ab');
    const ports = { before: await freeLoopbackPort(), after: await freeLoopbackPort(), baseline: await freeLoopbackPort() };
    const ready = (side: Side) => `http://127.0.0.1:${ports[side]}${side === 'baseline' ? '/healthz' : '/readyz'}`;
    const start = async (side: Side, args: string[], env: NodeJS.ProcessEnv) => {
      const child = await startProcess(args, env, ready(side), side);
      servers.push(child);
      return child;
    };
    const server = {
      before: await start('before', [join(before.directory, 'bin', 'svc.js'), 'serve'], projectServerEnv(scratch.url, ports.before)),
      after: await start('after', ['bin/svc.js', 'serve'], projectServerEnv(scratch.url, ports.after)),
      baseline: await start('baseline', [baselineScript], baselineServerEnv(scratch.url, ports.baseline, scratch.org.id)),
    };
    const auth = { authorization: `Bearer ${scratch.key}`, 'content-type': 'application/json' };
    const json = { 'content-type': 'application/json' };
    await seed(scratch.pool, scratch.org.id, 10_000);
    const created = await fetch(`http://127.0.0.1:${ports.after}/v1/customers`, {
      method: 'POST',
      headers: auth,
      body: JSON.stringify({ externalId: 'bench-read', fullName: 'Bench Reader', email: 'reader@bench.test' }),
    });
    if (!created.ok) throw new Error(`seeding the read's customer answered ${created.status}: ${await created.text()}`);
    const seeded = (await created.json()) as { id: string };

    const runs: Record<string, (side: Side, duration?: number) => Promise<Measure>> = {
      get: (side, duration) =>
        load(server[side], {
          url: `http://127.0.0.1:${ports[side]}${side === 'baseline' ? '/customers/' : '/v1/customers/'}${seeded.id}`,
          headers: side === 'baseline' ? {} : auth,
          ...(duration ? { duration } : {}),
        }),
      upsert: (side, duration) =>
        upsertLoad(
          server[side],
          `http://127.0.0.1:${ports[side]}${side === 'baseline' ? '/customers' : '/v1/customers'}`,
          side === 'baseline' ? json : auth,
          duration,
        ),
    };

    const lines: string[] = [
      `# A/B: ${BEFORE} (before) against this checkout (after), ${ROUNDS} rounds, ABBA, medians`,
      '',
      DIAGNOSTIC_LOG_LEVEL
        ? `**DIAGNOSTIC: both builds at LOG_LEVEL=${DIAGNOSTIC_LOG_LEVEL}, not the default configuration.**`
        : 'Both builds at the default configuration (production build, LOG_LEVEL info); the baseline with named prepared statements.',
      '',
    ];
    for (const scenario of SCENARIOS) {
      const run = runs[scenario];
      if (!run) throw new Error(`Unknown scenario ${scenario}: use get or upsert`);
      // Warm-up on every side (it also creates the upsert's 1,000 records), then statistics for the planner.
      for (const side of ['before', 'after', 'baseline'] as const) await run(side, 2);
      await scratch.pool.query('ANALYZE customers');
      const measures: Record<Side, Measure[]> = { before: [], after: [], baseline: [] };
      for (let round = 0; round < ROUNDS; round += 1) {
        const order: Side[] = round % 2 === 0 ? ['before', 'after', 'baseline'] : ['baseline', 'after', 'before'];
        for (const side of order) measures[side].push(await run(side));
      }
      const rps = (side: Side) => Math.round(median(measures[side].map((measure) => measure.rps)));
      const cpu = (side: Side) =>
        `${median(measures[side].map((measure) => measure.serverCpuUs))} / ${median(measures[side].map((measure) => measure.postgresCpuUs))}`;
      const ratios = (side: Side) =>
        measures[side].map((measure, index) => (measure.rps / measures.baseline[index]!.rps).toFixed(2)).join(', ');
      const change = ((rps('after') / rps('before') - 1) * 100).toFixed(1);
      const ahead = measures.after.filter((measure, index) => measure.rps > measures.before[index]!.rps).length;
      lines.push(
        `## ${scenario}`,
        '',
        '| Side | req/s | CPU µs per request, server / PostgreSQL | Ratio to the baseline, per round |',
        '|---|---:|---|---|',
        ...(['before', 'after', 'baseline'] as const).map(
          (side) => `| ${side} | ${rps(side)} | ${cpu(side)} | ${side === 'baseline' ? '' : ratios(side)} |`,
        ),
        '',
        `After against before: ${Number(change) >= 0 ? '+' : ''}${change}% req/s; after ahead in ${ahead} of ${ROUNDS} rounds.`,
        '',
      );
    }
    lines.push(
      `Log lines written: before ${logVolume('before').lines.toLocaleString('en')}, after ${logVolume('after').lines.toLocaleString('en')}.`,
      '',
    );
    process.stdout.write(`${lines.join('\n')}\n`);
  } finally {
    for (const child of servers) child.kill('SIGTERM');
    await scratch?.drop();
    before.remove();
    if (!process.env.BENCH_LOG_DIR) rmSync(LOG_DIR, { recursive: true, force: true });
  }
}

await main();
