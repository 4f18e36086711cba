import { defineConfig } from 'vitest/config';
import { LogScanReporter } from './test/helpers/log-scan.js';

export default defineConfig({
  test: {
    include: ['src/**/*.test.ts', 'test/**/*.test.ts'],
    exclude: ['test/reliability/**', 'node_modules/**'],
    globalSetup: ['./test/global-setup.ts'],
    pool: 'forks',
    maxWorkers: 4,
    testTimeout: 30_000,
    hookTimeout: 60_000,
    // The log scan fails the run when a log line holds personal data, SQL text or a key (test/helpers/log-scan.ts).
    reporters: ['default', new LogScanReporter()],
  },
});
