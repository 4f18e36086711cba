import { defineConfig } from 'vitest/config';

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
  },
});
