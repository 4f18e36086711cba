import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOutboxRepository } from '../../src/shared/outbox.js';
import { createTestContext, TEST_LINK_ENCRYPTION_KEY, type TestContext, testServices } from '../helpers/harness.js';
import { collectProcessOutput } from '../helpers/log-collector.js';
import { PROJECT_ROOT } from '../helpers/svc-process.js';
import { runSvcInProcess } from '../helpers/cli-in-process.js';

/*
 * Every operator CLI example of the README, run exactly as written through a shell, placeholders
 * aside: DESIGN.md §5 promises exactly one JSON document on stdout, and a reader pipes it to jq.
 * An example is a code span (or a code block line) in the README's CLI form. Left out: `serve` and
 * `worker`, which run until stopped and print no document, and the syntax `… <command>` itself.
 */
const CLI_FORM = 'npm run -s svc -- ';
const readme = readFileSync(join(PROJECT_ROOT, 'README.md'), 'utf8');
const codeSpans = [...readme.matchAll(/`([^`\n]+)`/g)].map((match) => match[1]!);
const codeBlockLines = [...readme.matchAll(/^```[^\n]*\n([\s\S]*?)^```/gm)].flatMap((match) => match[1]!.split('\n'));
const examples = [
  ...new Set(
    [...codeSpans, ...codeBlockLines]
      .map((text) => text.trim())
      .filter((text) => text.startsWith(CLI_FORM))
      .filter((text) => !/^(serve|worker)\b/.test(text.slice(CLI_FORM.length)) && !/<[a-z ]+>/.test(text)),
  ),
];

let ctx: TestContext;
const folder = mkdtempSync(join(tmpdir(), 'svc-readme-'));
/** README placeholder → the real value of the fresh database it stands for. */
let substitutions: Array<[placeholder: string, value: string]> = [];

beforeAll(async () => {
  ctx = await createTestContext();
  const org = await ctx.createOrg({ credits: 100 });
  const spareKey = await ctx.createKey(org.id);
  // The README's customer, with its KYC started: `kyc submit` needs a check waiting for the person.
  const created = await ctx.request('POST', '/v1/customers', {
    key: org.key,
    body: { externalId: 'crm-42', fullName: 'Ada Lovelace', email: 'ada@example.com' },
  });
  expect(created.statusCode, created.body).toBe(201);
  const started = await ctx.request('POST', '/v1/customers/crm-42/kyc', { key: org.key });
  expect(started.statusCode, started.body).toBe(200);
  // One endpoint for `webhook disable`, another that keeps receiving, with an event delivered to it.
  const webhooks = testServices(ctx.database, { config: { webhookAllowPrivateUrls: true } }).webhooks;
  const toDisable = await webhooks.addEndpoint({ orgId: org.id, url: 'http://127.0.0.1:9/disabled' });
  await webhooks.addEndpoint({ orgId: org.id, url: 'http://127.0.0.1:9/live' });
  const eventId = await ctx.database.transaction((tx) =>
    createOutboxRepository().record({ orgId: org.id, type: 'webhook.test', customerId: null, customer: null }, tx),
  );
  const deliveries = await webhooks.listDeliveries({ orgId: org.id, eventId });
  // A third, for the commands that change an endpoint and keep it (update, rotate-secret, test --endpoint).
  const managed = await webhooks.addEndpoint({ orgId: org.id, url: 'http://127.0.0.1:9/managed' });
  const live = deliveries.find((delivery) => delivery.endpoint_id !== toDisable.id);
  expect(live).toBeDefined();
  const templateFile = join(folder, 'template.json');
  writeFileSync(
    templateFile,
    JSON.stringify({
      code: 'estate-admin',
      name: 'Deceased estate administration',
      industry: 'LEGAL',
      roles: [{ roleLabel: 'Executor', partyType: 'INDIVIDUAL', checkTrigger: 'ON_ADD' }],
    }),
  );
  // The file `import` reads: one new individual (no external id the other examples use).
  const clientsFile = join(folder, 'clients.csv');
  writeFileSync(clientsFile, 'externalId,fullName,email,designatedServices\ncrm-import-1,Grace Hopper,grace@example.com,PRO-REAL-ESTATE\n');
  substitutions = [
    ['3f0c…', org.id],
    ['9b2e…', spareKey.id],
    ['7a1e…', toDisable.id],
    ['2b8d…', managed.id],
    ['1d7a…', eventId],
    ['5c44…', live!.id],
    ['--file template.json', `--file ${templateFile}`],
    ['--file clients.csv', `--file ${clientsFile}`],
    // `audit export --out` writes the file `audit verify --file` reads, the example after it.
    ['audit.ndjson', join(folder, 'audit.ndjson')],
    // The reader's own receiver; this one is on loopback, which WEBHOOK_ALLOW_PRIVATE_URLS allows.
    ['https://crm.example.com/hooks', 'http://127.0.0.1:9/hooks'],
  ];
}, 60_000);

afterAll(async () => {
  await ctx?.close();
  rmSync(folder, { recursive: true, force: true });
});

function runInShell(command: string): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn('sh', ['-c', command], {
      cwd: PROJECT_ROOT,
      env: { PATH: process.env.PATH, HOME: process.env.HOME, DATABASE_URL: ctx.databaseUrl, WEBHOOK_ALLOW_PRIVATE_URLS: 'true' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    child.on('error', reject);
    child.on('close', (code) => {
      collectProcessOutput(stderr);
      resolve({ code, stdout, stderr });
    });
  });
}

describe('the README CLI examples', () => {
  it('when the README is read, it has an example of every operator command in the one form that prints only JSON', () => {
    expect(examples.length).toBeGreaterThanOrEqual(20);
    const commands = new Set(examples.map((example) => example.slice(CLI_FORM.length).split(' ').slice(0, 2).join(' ')));
    for (const command of [
      'migrate',
      'org create',
      'org list',
      'org show',
      'org update',
      'key create',
      'key list',
      'key revoke',
      'webhook add',
    ]) {
      expect(
        [...commands].some((found) => found === command || found.startsWith(`${command} `)),
        command,
      ).toBe(true);
    }
    // Plain `npm run svc --` prints npm's banner on stdout first; `npx svc` may fetch another package.
    expect(readme).not.toMatch(/`npm run svc -- /);
    expect(readme).not.toMatch(/`npx svc [a-z]/);
  });

  it('when an example runs as written through a shell (npm, bin/svc.js, a process of its own), stdout holds only its JSON document', async () => {
    const result = await runInShell(`${CLI_FORM}org list`);
    expect(result.code, result.stderr).toBe(0);
    expect(JSON.parse(result.stdout)).toEqual(expect.any(Array));
  });

  // The rest run in this process (the same program bin/svc.js runs), from the words the shell would pass.
  it.each(examples)(
    'when "%s" runs as written, it prints exactly one JSON document on stdout and exits 0',
    async (example) => {
      const command = substitutions.reduce((text, [placeholder, value]) => text.replaceAll(placeholder, value), example);
      expect(command, 'a placeholder this test does not know').not.toContain('…');
      const result = await runSvcInProcess(shellWords(command.slice(CLI_FORM.length)), {
        DATABASE_URL: ctx.databaseUrl,
        WEBHOOK_ALLOW_PRIVATE_URLS: 'true',
        // The test app's key, as a deployment sets one LINK_ENCRYPTION_KEY for the server and svc.
        LINK_ENCRYPTION_KEY: TEST_LINK_ENCRYPTION_KEY,
        LOG_LEVEL: undefined,
      });
      expect(result.code, result.stderr).toBe(0);
      expect(() => JSON.parse(result.stdout), result.stdout).not.toThrow();
    },
    60_000,
  );
});

/**
 * The words `sh` passes for a command of plain words and double-quoted strings, the only shell syntax
 * the README's examples use; anything else (pipes, variables, escapes, single quotes) is refused.
 */
function shellWords(command: string): string[] {
  expect(command, 'shell syntax beyond words and double quotes').toMatch(/^(?:[^"'\\$`|&;<>()]+|"[^"\\$`]*")+$/);
  return [...command.matchAll(/"([^"]*)"|(\S+)/g)].map((match) => match[1] ?? match[2]!);
}
