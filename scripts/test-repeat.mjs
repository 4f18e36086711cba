#!/usr/bin/env node
// `npm run test:repeat -- N`: runs the whole `npm test` N times, one after the other, and lists every
// test that failed in any run with the runs it failed in. Exits non-zero when any run failed.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const runs = Number(process.argv[2] ?? 5);
if (!Number.isInteger(runs) || runs < 1) {
  console.error('usage: npm run test:repeat -- N (a whole number of runs, at least 1)');
  process.exit(2);
}

const folder = mkdtempSync(join(tmpdir(), 'test-repeat-'));
/** test name (file > suite > test) → the runs it failed in */
const failures = new Map();
const summaries = [];
try {
  for (let run = 1; run <= runs; run += 1) {
    const report = join(folder, `run-${run}.json`);
    const started = Date.now();
    const result = spawnSync('npm', ['test'], {
      stdio: ['ignore', 'inherit', 'inherit'],
      env: { ...process.env, TEST_REPORT_JSON: report },
    });
    const seconds = Math.round((Date.now() - started) / 1000);
    let passed = 0;
    let failed = 0;
    try {
      const { testResults } = JSON.parse(readFileSync(report, 'utf8'));
      for (const file of testResults) {
        if (file.status === 'failed' && file.assertionResults.every((test) => test.status !== 'failed')) {
          // A file that failed outside its tests (a hook, an import): count it as one failure.
          failed += 1;
          const name = `${file.name} (the file: ${String(file.message ?? '').split('\n')[0]})`;
          failures.set(name, [...(failures.get(name) ?? []), run]);
        }
        for (const test of file.assertionResults) {
          if (test.status === 'passed') passed += 1;
          if (test.status !== 'failed') continue;
          failed += 1;
          const name = `${file.name.replace(`${process.cwd()}/`, '')} > ${test.fullName}`;
          failures.set(name, [...(failures.get(name) ?? []), run]);
        }
      }
    } catch {
      failed += 1;
      failures.set(`run ${run}: no report (vitest exited ${result.status})`, [run]);
    }
    summaries.push(`run ${run}: ${passed} passed, ${failed} failed, exit ${result.status}, ${seconds} s`);
  }
} finally {
  rmSync(folder, { recursive: true, force: true });
}

console.log(`\n${runs} runs of npm test`);
for (const line of summaries) console.log(`  ${line}`);
if (failures.size === 0) {
  console.log('No test failed in any run.');
} else {
  console.log('Failed:');
  for (const [name, inRuns] of failures) console.log(`  ${name}: run${inRuns.length > 1 ? 's' : ''} ${inRuns.join(', ')}`);
}
process.exit(failures.size === 0 ? 0 : 1);
