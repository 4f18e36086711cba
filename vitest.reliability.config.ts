import { defineConfig } from 'vitest/config';
import { LogScanReporter } from './test/helpers/log-scan.js';

/**
 * Files whose assertions hold under any load: they check what happened (rows applied once, a chain
 * unbroken, every event delivered), never how fast, so they share the machine two at a time once the
 * others have run. Those others bound recovery times, soak for fixed durations or measure memory, and
 * run one at a time on a machine left to them.
 */
const LOAD_TOLERANT = [
  'test/reliability/review-redating.test.ts',
  'test/reliability/import-crash.test.ts',
  'test/reliability/fuzz.test.ts',
  'test/reliability/audit-chain-instances.test.ts',
  'test/reliability/cross-organisation.test.ts',
  'test/reliability/multi-instance.test.ts',
];

/** What both groups run with (a project takes these from its own config, not from the root's). */
const settings = {
  pool: 'forks',
  testTimeout: 180_000,
  hookTimeout: 120_000,
  // The events feed's completeness test is in npm test too, with 5 s of writers; here it soaks for 20 s.
  env: { FEED_COMPLETENESS_SECONDS: '20' },
} as const;

/** `npm run test:reliability`: multi-process, crash, outage and fuzz suites (slower; run by .ci/run). */
export default defineConfig({
  test: {
    globalSetup: ['./test/global-setup.ts'],
    projects: [
      {
        test: {
          ...settings,
          name: 'alone',
          include: ['test/reliability/**/*.test.ts', 'test/events/events-feed-completeness.test.ts'],
          exclude: LOAD_TOLERANT,
          maxWorkers: 1,
          fileParallelism: false,
          sequence: { groupOrder: 1 },
        },
      },
      {
        test: {
          ...settings,
          name: 'load-tolerant',
          include: LOAD_TOLERANT,
          maxWorkers: 2,
          sequence: { groupOrder: 2 },
        },
      },
    ],
    // The log scan fails the run when a log line holds personal data, SQL text or a key (test/helpers/log-scan.ts).
    reporters: ['default', new LogScanReporter()],
  },
});
