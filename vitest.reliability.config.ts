import { defineConfig } from 'vitest/config';
import { LogScanReporter } from './test/helpers/log-scan.js';

/** `npm run test:reliability`: multi-process, crash, outage and fuzz suites (slower; run by .ci/run). */
export default defineConfig({
  test: {
    // The events feed's completeness test is in npm test too, with 5 s of writers; here it soaks for 20 s.
    include: ['test/reliability/**/*.test.ts', 'test/events/events-feed-completeness.test.ts'],
    env: { FEED_COMPLETENESS_SECONDS: '20' },
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
