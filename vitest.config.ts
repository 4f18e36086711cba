import { defineConfig } from 'vitest/config';
import { LogScanReporter } from './test/helpers/log-scan.js';

export default defineConfig({
  test: {
    include: ['src/**/*.test.ts', 'test/**/*.test.ts'],
    exclude: [
      'test/reliability/**',
      'node_modules/**',
      // The partitioned run (npm run test:partitioned) leaves out the files that never use the template
      // database: they build theirs from scratch, so the schema variant cannot change what they test.
      ...(process.env.TEST_SCHEMA_VARIANT === 'partitioned'
        ? ['test/foundation/migrations.test.ts', 'test/foundation/embedded-lifecycle.test.ts', 'test/foundation/npm-test-exit-code.test.ts']
        : []),
    ],
    globalSetup: ['./test/global-setup.ts'],
    pool: 'forks',
    // Three workers on the 2-core machines the suite runs on: many files spend much of their time waiting
    // (on spawned processes, PostgreSQL, paced requests), and a third worker fills that time; a fourth only
    // queues for the CPU.
    maxWorkers: 3,
    // Each file still gets its own database (test/helpers/harness.ts); the module graph is shared within a
    // worker because importing the app costs about a second on Node 22+, where the ESM loader re-reads
    // drizzle-orm's package.json for each of its files. Isolating every file paid that once per file.
    isolate: false,
    testTimeout: 30_000,
    hookTimeout: 60_000,
    // The log scan fails the run when a log line holds personal data, SQL text or a key (test/helpers/log-scan.ts).
    // TEST_REPORT_JSON: also write vitest's JSON report there (scripts/test-repeat.mjs reads it).
    reporters: [
      'default',
      new LogScanReporter(),
      ...(process.env.TEST_REPORT_JSON ? [['json', { outputFile: process.env.TEST_REPORT_JSON }] as ['json', { outputFile: string }]] : []),
    ],
  },
});
