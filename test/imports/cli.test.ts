import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCliOutcome } from '../../src/cli/program.js';
import { runSvcInProcess } from '../helpers/cli-in-process.js';
import { createTestContext, TEST_LINK_ENCRYPTION_KEY, type TestContext, type TestOrg } from '../helpers/harness.js';
import { allRows, count, csv, type ImportDto } from './import-helpers.js';

let ctx: TestContext;
const folder = mkdtempSync(join(tmpdir(), 'svc-import-cli-'));
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => {
  await ctx?.close();
  rmSync(folder, { recursive: true, force: true });
});

const env = () => ({ DATABASE_URL: ctx.databaseUrl, LOG_LEVEL: 'silent', LINK_ENCRYPTION_KEY: TEST_LINK_ENCRYPTION_KEY });

async function svc(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const { code, stdout, stderr } = await runSvcInProcess(args, env());
  return { code: code ?? 1, stdout, stderr };
}

let files = 0;
function writeFile(text: string, extension = 'csv'): string {
  files += 1;
  const path = join(folder, `clients-${files}.${extension}`);
  writeFileSync(path, text);
  return path;
}

const post = (org: TestOrg, body: unknown) => ctx.request('POST', '/v1/customers', { key: org.key, body });
const customersOf = (org: TestOrg) => count(ctx, 'SELECT count(*) AS n FROM customers WHERE org_id = $1', [org.id]);
const customerAuditOf = (org: TestOrg) =>
  count(ctx, `SELECT count(*) AS n FROM audit_log WHERE org_id = $1 AND subject_type = 'customer'`, [org.id]);

/** An organisation with two records the file matches: crm-1 (the file changes its phone) and crm-2 (the file repeats it). */
async function orgWithRecords(): Promise<TestOrg> {
  const org = await ctx.createOrg();
  expect((await post(org, { externalId: 'crm-1', fullName: 'Ada Existing', email: 'ada@example.com' })).statusCode).toBe(201);
  const same = await post(org, { externalId: 'crm-2', fullName: 'Bo Same', email: 'bo@example.com', phone: '0400 111 222' });
  expect(same.statusCode, same.body).toBe(201);
  return org;
}

const MIXED = csv([
  'externalId,fullName,email,phone,risk.isNewCustomer,designatedServices',
  'crm-new,Cy New,cy@example.com,,true,PRO-REAL-ESTATE;PRO-CLIENT-MONEY',
  'crm-1,Ada Existing,ada@example.com,0400 999 888,,',
  'crm-2,Bo Same,bo@example.com,0400 111 222,,',
  'crm-bad,Di Bad,not-an-email,,,',
]);

describe('svc import', () => {
  it('when a CSV is imported, it runs the import to its end and prints the COMPLETED import with its counts, exit 0 even with failed rows', async () => {
    const org = await orgWithRecords();
    const result = await svc('import', '--org', org.id, '--kind', 'individuals', '--file', writeFile(MIXED));
    expect(result.code, result.stderr).toBe(0);
    // Not a terminal: no progress bar, stderr stays empty.
    expect(result.stderr).toBe('');
    const finished = JSON.parse(result.stdout) as ImportDto & { file_name: string };
    expect(finished).toMatchObject({
      kind: 'individuals',
      format: 'csv',
      status: 'COMPLETED',
      dry_run: false,
      rows_total: 4,
      rows_done: 4,
      counts: { created: 1, updated: 1, unchanged: 1, failed: 1 },
      error: null,
    });
    expect(finished.file_name).toMatch(/^clients-\d+\.csv$/);
    expect(await customersOf(org)).toBe(3);

    // The same import the API reads, its rows by outcome, the records added via BULK_IMPORT by the operator.
    const shown = await ctx.request('GET', `/v1/imports/${finished.id}`, { key: org.key });
    expect(shown.json()).toEqual(finished);
    const rows = await allRows(ctx, org, finished.id);
    expect(rows.map((row) => row.outcome)).toEqual(['CREATED', 'UPDATED', 'UNCHANGED', 'FAILED']);
    expect(rows[3]!.error).toMatchObject({ code: 'validation_failed' });
    const { rows: created } = await ctx.database.pool.query<{ added_via: string; designated_services: string[] }>(
      `SELECT added_via, designated_services FROM customers WHERE org_id = $1 AND external_id = 'crm-new'`,
      [org.id],
    );
    expect(created).toEqual([{ added_via: 'BULK_IMPORT', designated_services: ['PRO-REAL-ESTATE', 'PRO-CLIENT-MONEY'] }]);
    const { rows: audit } = await ctx.database.pool.query<{ action: string; actor_type: string; actor_id: string }>(
      `SELECT action, actor_type, actor_id FROM audit_log WHERE org_id = $1 AND subject_id = $2 ORDER BY id`,
      [org.id, finished.id],
    );
    expect(audit.map((row) => row.action)).toEqual(['import.created', 'import.completed']);
    expect(audit[0]).toMatchObject({ actor_type: 'operator', actor_id: expect.stringMatching(/^cli:/) });
  });

  it('when --dry-run is given, it reports the outcomes the rows would have and writes no record nor its audit row', async () => {
    const org = await orgWithRecords();
    const [customersBefore, auditBefore] = [await customersOf(org), await customerAuditOf(org)];
    const result = await svc('import', '--org', org.id, '--kind', 'individuals', '--file', writeFile(MIXED), '--dry-run');
    expect(result.code, result.stderr).toBe(0);
    expect(JSON.parse(result.stdout)).toMatchObject({
      status: 'COMPLETED',
      dry_run: true,
      counts: { created: 1, updated: 1, unchanged: 1, failed: 1 },
    });
    expect(await customersOf(org)).toBe(customersBefore);
    expect(await customerAuditOf(org)).toBe(auditBefore);
    const phone = await ctx.database.pool.query<{ phone: string | null }>(
      `SELECT phone FROM customers WHERE org_id = $1 AND external_id = 'crm-1'`,
      [org.id],
    );
    expect(phone.rows[0]!.phone).toBeNull();
  });

  it('when the file has the extension .ndjson, its lines are read as request bodies', async () => {
    const org = await ctx.createOrg();
    const file = writeFile(
      [
        JSON.stringify({ externalId: 'nd-1', fullName: 'Ed Lines', email: 'ed@example.com', risk: { isNewCustomer: true } }),
        JSON.stringify({ externalId: 'nd-2', fullName: 'Flo Lines', email: 'flo@example.com' }),
      ].join('\n'),
      'ndjson',
    );
    const result = await svc('import', '--org', org.id, '--kind', 'individuals', '--file', file);
    expect(result.code, result.stderr).toBe(0);
    expect(JSON.parse(result.stdout)).toMatchObject({ format: 'ndjson', status: 'COMPLETED', counts: { created: 2, failed: 0 } });
  });

  it('when the file is refused (a ragged row), it exits 1 with the error naming the row and line on stderr, prints nothing and stores nothing', async () => {
    const org = await ctx.createOrg();
    const file = writeFile(csv(['externalId,fullName,email', 'crm-a,Ann,ann@example.com', 'crm-b,Ben,ben@example.com,extra']));
    const result = await svc('import', '--org', org.id, '--kind', 'individuals', '--file', file);
    expect(result.code).toBe(1);
    expect(result.stdout).toBe('');
    expect(result.stderr).toMatch(/^error: The file cannot be imported: Row 2, line 3: the row has 4 cells but the header has 3 columns/);
    expect(await count(ctx, 'SELECT count(*) AS n FROM imports WHERE org_id = $1', [org.id])).toBe(0);
    expect(await customersOf(org)).toBe(0);
  });

  it('when a column is unknown for the kind, the file is missing, or the organisation does not exist, it exits 1 and says so', async () => {
    const org = await ctx.createOrg();
    const unknown = await svc(
      'import',
      '--org',
      org.id,
      '--kind',
      'individuals',
      '--file',
      writeFile(csv(['fullName,shoeSize', 'Ann,42'])),
    );
    expect(unknown.code).toBe(1);
    expect(unknown.stderr).toContain('column "shoeSize"');

    const missing = await svc('import', '--org', org.id, '--kind', 'individuals', '--file', join(folder, 'nowhere.csv'));
    expect(missing.code).toBe(1);
    expect(missing.stderr).toContain('ENOENT');

    const noOrg = await svc('import', '--org', '00000000-0000-4000-8000-000000000000', '--kind', 'individuals', '--file', writeFile(MIXED));
    expect(noOrg.code).toBe(1);
    expect(noOrg.stderr).toMatch(/not found/i);

    const badKind = await svc('import', '--org', org.id, '--kind', 'people', '--file', writeFile(MIXED));
    expect(badKind.code).not.toBe(0);
    expect(badKind.stderr).toContain('must be one of individuals, entities');
    expect(await count(ctx, 'SELECT count(*) AS n FROM imports WHERE org_id = $1', [org.id])).toBe(0);
  });

  it('when stderr is a terminal, it draws a progress bar there (rows, rows/s, ETA) and stdout still carries only the JSON', async () => {
    const org = await ctx.createOrg();
    const text = { stdout: '', stderr: '' };
    const sink = (name: 'stdout' | 'stderr') =>
      new Writable({
        write(chunk: Buffer, _encoding, callback) {
          text[name] += chunk.toString();
          callback();
        },
      });
    const stderr = Object.assign(sink('stderr'), { isTTY: true, columns: 120 });
    const { code } = await runCliOutcome(['import', '--org', org.id, '--kind', 'individuals', '--file', writeFile(MIXED)], {
      stdout: sink('stdout'),
      stderr,
      env: { PATH: process.env.PATH, HOME: process.env.HOME, ...env() },
    });
    expect(code, text.stderr).toBe(0);
    expect(JSON.parse(text.stdout)).toMatchObject({ status: 'COMPLETED', rows_done: 4 });
    expect(text.stderr).toContain('100% 4/4 rows');
    expect(text.stderr).toMatch(/rows\/s {2}ETA /);
  });
});
