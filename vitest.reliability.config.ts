import { defineConfig } from 'vitest/config';
import { LogScanReporter } from './test/helpers/log-scan.js';

/** `npm run test:reliability`: multi-process, crash, outage and fuzz suites (slower; run by .ci/run). */
export default defineConfig({
  test: {
    include: ['test/reliability/**/*.test.ts'],
    globalSetup: ['./test/global-setup.ts'],
    pool: 'forks',
    maxWorkers: 1,
    fileParallelism: false,
    testTimeout: 180_000,
    hookTimeout: 120_000,
    // The log scan fails the run when a log line holds personal data, SQL text or a key (test/helpers/log-scan.ts).
    reporters: ['default', new LogScanReporter()],
  },
});
