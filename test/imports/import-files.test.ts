import { readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { parseCsvRow } from '../../src/shared/csv.js';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { multipart } from '../helpers/multipart.js';
import { count, csv, importAndRun, upload, uploadRaw, type ImportDto } from './import-helpers.js';

let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

const imports = (org: TestOrg) => count(ctx, 'SELECT count(*) AS n FROM imports WHERE org_id = $1', [org.id]);
const importRows = (org: TestOrg) => count(ctx, 'SELECT count(*) AS n FROM import_rows WHERE org_id = $1', [org.id]);
const spools = () => readdirSync(tmpdir()).filter((name) => name.startsWith('svc-import-')).length;

type ErrorBody = {
  error: { code: string; message: string; details?: { issues?: Record<string, string[]>; line?: number; row?: number; column?: string } };
};

describe('a file that cannot be imported is refused at once, and nothing of it is stored', () => {
  const cases: Array<[string, string | Buffer, { line?: number; row?: number; column?: string; message: RegExp }]> = [
    [
      'binary (a ZIP: an .xlsx workbook)',
      Buffer.from([0x50, 0x4b, 0x03, 0x04, 0x14, 0x00, 0x00, 0x00, 0x08, 0x00]),
      { line: 1, message: /binary/ },
    ],
    [
      'not UTF-8 (Latin-1)',
      Buffer.concat([Buffer.from('fullName,email\nJos'), Buffer.from([0xe9]), Buffer.from(',jose@example.com\n')]),
      { line: 2, message: /not valid UTF-8/ },
    ],
    ['UTF-16', Buffer.from('\uFEFFfullName,email\r\n', 'utf16le'), { line: 1, message: /UTF-16/ }],
    ['empty (no header)', '', { line: 1, message: /no header/ }],
    ['a header and no rows', 'fullName,email\n', { message: /no rows/ }],
    ['an unknown column', 'fullName,emial\nAda,ada@example.com\n', { line: 1, column: 'emial', message: /unknown column/ }],
    ['a column twice', 'fullName,email,email\nAda,a@example.com,b@example.com\n', { line: 1, column: 'email', message: /twice/ }],
    ['a ragged row', 'fullName,email\nAda,ada@example.com\nBo\n', { line: 3, row: 2, message: /ragged/ }],
    [
      'a cell over 64 KiB',
      `fullName,email\n${'x'.repeat(70_000)},ada@example.com\n`,
      { line: 2, row: 1, column: 'fullName', message: /at most 65536 characters/ },
    ],
    [
      'a 10 MiB single cell',
      `fullName,email\nAda,"${'y'.repeat(10 * 1024 * 1024)}"\n`,
      { line: 2, row: 1, column: 'email', message: /longer than/ },
    ],
    ['an unclosed quote', 'fullName,email\n"Ada,ada@example.com\n', { message: /not valid CSV/ }],
  ];

  it.each(cases)('when the file is %s, it answers 422 naming the line, row and column', async (_name, file, expected) => {
    const org = await ctx.createOrg();
    const response = await uploadRaw(ctx, org, file);
    expect(response.statusCode, response.body.slice(0, 500)).toBe(422);
    const body = response.json<ErrorBody>();
    expect(body.error.code).toBe('validation_failed');
    expect(body.error.message).toMatch(expected.message);
    expect(body.error.details?.issues?.file?.[0]).toMatch(expected.message);
    for (const key of ['line', 'row', 'column'] as const) {
      if (expected[key] !== undefined) expect(body.error.details?.[key], key).toBe(expected[key]);
    }
    expect(await imports(org)).toBe(0);
    expect(await importRows(org)).toBe(0);
  });

  it('when an NDJSON line is not a JSON object, or names an unknown field, it answers 422 naming the line', async () => {
    const org = await ctx.createOrg();
    const notJson = await uploadRaw(ctx, org, '{"fullName":"A","email":"a@example.com"}\n{oops\n', { contentType: 'application/x-ndjson' });
    expect(notJson.statusCode).toBe(422);
    expect(notJson.json<ErrorBody>().error.details).toMatchObject({ line: 2 });
    const unknown = await uploadRaw(ctx, org, '{"fullname":"A"}\n', { contentType: 'application/x-ndjson' });
    expect(unknown.statusCode).toBe(422);
    expect(unknown.json<ErrorBody>().error.details).toMatchObject({ line: 1, column: 'fullname' });
    expect(await imports(org)).toBe(0);
  });

  it('when the body is neither a form, CSV nor NDJSON, it answers 415; without kind, 422 before reading the file', async () => {
    const org = await ctx.createOrg();
    const json = await ctx.request('POST', '/v1/imports', { key: org.key, body: { rows: [] } });
    expect(json.statusCode).toBe(415);
    const latin1 = await uploadRaw(ctx, org, 'fullName,email\n', { contentType: 'text/csv; charset=iso-8859-1' });
    expect(latin1.statusCode).toBe(415);
    const noKind = await ctx.app.inject({
      method: 'POST',
      url: '/v1/imports',
      headers: { authorization: `Bearer ${org.key}`, 'content-type': 'text/csv' },
      payload: 'fullName,email\nA,a@example.com\n',
    });
    expect(noKind.statusCode).toBe(422);
    expect(noKind.json<ErrorBody>().error.details?.issues).toHaveProperty('kind');
    expect(await imports(org)).toBe(0);
  });

  it('when a key lacks imports:write, the upload is refused 403 before its body is read', async () => {
    const org = await ctx.createOrg();
    const reader = await ctx.createKey(org.id, { scopes: ['imports:read'] });
    const response = await uploadRaw(ctx, { ...org, key: reader.key }, csv(['fullName,email', 'A,a@example.com']));
    expect(response.statusCode).toBe(403);
    expect(response.json<ErrorBody>().error.details).toEqual({ required_scope: 'imports:write' });
  });

  it('when files are refused or accepted, no spooled copy is left behind', async () => {
    const org = await ctx.createOrg();
    const before = spools();
    await uploadRaw(ctx, org, 'fullName,nope\nA,b\n');
    await upload(ctx, org, csv(['fullName,email', 'A,a@example.com']));
    // Removed once the response has closed: waited for, not timed.
    await vi.waitFor(() => expect(spools()).toBe(before));
  });
});

describe('multipart uploads', () => {
  it('when the file comes as a form with kind and dry_run fields, it is imported as the raw body would be', async () => {
    const org = await ctx.createOrg();
    const response = await ctx.request('POST', '/v1/imports', {
      key: org.key,
      body: multipart([
        { name: 'kind', value: 'entities' },
        { name: 'dry_run', value: 'true' },
        {
          name: 'file',
          data: Buffer.from(csv(['type,name', 'COMPANY,Form Co Pty Ltd'])),
          filename: 'entities.csv',
          contentType: 'text/csv',
        },
      ]),
    });
    expect(response.statusCode, response.body).toBe(202);
    expect(response.json()).toMatchObject({ kind: 'entities', dry_run: true, file_name: 'entities.csv', rows_total: 1, status: 'QUEUED' });
  });

  it('when the form has an unknown column, an unknown field or no file, it answers 422 and stores nothing', async () => {
    const org = await ctx.createOrg();
    const send = (parts: Parameters<typeof multipart>[0]) => ctx.request('POST', '/v1/imports', { key: org.key, body: multipart(parts) });
    const unknownColumn = await send([
      { name: 'kind', value: 'individuals' },
      { name: 'file', data: Buffer.from('fullName,mail\nA,a\n'), filename: 'x.csv', contentType: 'text/csv' },
    ]);
    expect(unknownColumn.statusCode).toBe(422);
    expect(unknownColumn.json<ErrorBody>().error.details).toMatchObject({ line: 1, column: 'mail' });
    // The kind after the file: the header is checked once the kind is known.
    const kindLast = await send([
      { name: 'file', data: Buffer.from('fullName,mail\nA,a\n'), filename: 'x.csv', contentType: 'text/csv' },
      { name: 'kind', value: 'individuals' },
    ]);
    expect(kindLast.statusCode).toBe(422);
    expect(kindLast.json<ErrorBody>().error.details).toMatchObject({ column: 'mail' });
    const unknownField = await send([
      { name: 'kind', value: 'individuals' },
      { name: 'mode', value: 'fast' },
    ]);
    expect(unknownField.statusCode).toBe(422);
    expect(unknownField.json<ErrorBody>().error.details?.issues).toHaveProperty('mode');
    const noFile = await send([{ name: 'kind', value: 'individuals' }]);
    expect(noFile.statusCode).toBe(422);
    expect(noFile.json<ErrorBody>().error.details?.issues).toHaveProperty('file');
    const badKind = await send([
      { name: 'kind', value: 'people' },
      { name: 'file', data: Buffer.from('fullName,email\nA,a@example.com\n'), filename: 'x.csv', contentType: 'text/csv' },
    ]);
    expect(badKind.statusCode).toBe(422);
    expect(badKind.json<ErrorBody>().error.details?.issues).toHaveProperty('kind');
    expect(await imports(org)).toBe(0);
  });
});

describe('Idempotency-Key', () => {
  it('when an upload is retried with its key, the first import is answered again; the same key with another file is a 409', async () => {
    const org = await ctx.createOrg();
    const file = csv(['fullName,email', 'Ida Once,ida@example.com']);
    const headers = { 'idempotency-key': 'upload-1' };
    const first = await uploadRaw(ctx, org, file, { headers });
    const again = await uploadRaw(ctx, org, file, { headers });
    expect(first.statusCode, first.body).toBe(202);
    expect(again.statusCode).toBe(202);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.json<ImportDto>().id).toBe(first.json<ImportDto>().id);
    const other = await uploadRaw(ctx, org, csv(['fullName,email', 'Other,other@example.com']), { headers });
    expect(other.statusCode).toBe(409);
    expect(other.json<ErrorBody>().error.code).toBe('idempotency_conflict');
    const dry = await uploadRaw(ctx, org, file, { headers, dryRun: true });
    expect(dry.statusCode).toBe(409);
    expect(await imports(org)).toBe(1);
  });
});

describe('the rows download', () => {
  it('when the failed rows are downloaded as CSV, formula cells come back neutralised and the download imports again as it is', async () => {
    const org = await ctx.createOrg();
    const finished = await importAndRun(
      ctx,
      org,
      csv(['fullName,email,phone', '=HYPERLINK("https://evil.example"),not-an-email,+61 400 000 000', 'Fine Person,fine@example.com,']),
    );
    expect(finished.counts).toMatchObject({ created: 1, failed: 1 });
    // Stored as the text it is.
    const { rows } = await ctx.database.pool.query<{ data: Record<string, string> }>(
      `SELECT data FROM import_rows WHERE org_id = $1 AND row_number = 1`,
      [org.id],
    );
    expect(rows[0]!.data).toEqual({ fullName: '=HYPERLINK("https://evil.example")', email: 'not-an-email', phone: '+61 400 000 000' });

    const requests: Array<{ query: Record<string, string>; headers: Record<string, string> }> = [
      { query: { outcome: 'FAILED', format: 'csv' }, headers: {} },
      { query: { outcome: 'FAILED' }, headers: { accept: 'text/csv' } },
    ];
    for (const request of requests) {
      const download = await ctx.request('GET', `/v1/imports/${finished.id}/rows`, { key: org.key, ...request });
      expect(download.statusCode, download.body).toBe(200);
      expect(download.headers['content-type']).toMatch(/^text\/csv/);
      expect(download.headers['content-disposition']).toMatch(/attachment/);
      const lines = download.body.trimEnd().split('\n');
      expect(lines).toHaveLength(2);
      expect(lines[0]).toBe('row_number,outcome,customer_id,error_code,error_message,fullName,email,phone');
      expect(lines[1]).toContain(`"'=HYPERLINK(""https://evil.example"")"`);
      expect(lines[1]).toContain("'+61 400 000 000");
      const cells = parseCsvRow(lines[1]!);
      expect(cells.slice(0, 4)).toEqual(['1', 'FAILED', null, 'validation_failed']);
    }

    // Fixed in a spreadsheet and sent back: the download's own columns are ignored, the neutralising quotes removed.
    const download = await ctx.request('GET', `/v1/imports/${finished.id}/rows`, {
      key: org.key,
      query: { outcome: 'FAILED', format: 'csv' },
    });
    const fixed = download.body.replace('not-an-email', 'hyper@example.com');
    const again = await importAndRun(ctx, org, fixed);
    expect(again.counts).toEqual({ created: 1, updated: 0, unchanged: 0, failed: 0 });
    const customer = await ctx.database.pool.query<{ name: string; phone: string }>(
      `SELECT name, phone FROM customers WHERE org_id = $1 AND email = 'hyper@example.com'`,
      [org.id],
    );
    expect(customer.rows[0]).toEqual({ name: '=HYPERLINK("https://evil.example")', phone: '+61 400 000 000' });
  });

  it('when rows are listed as JSON, they come in row order a page at a time, filtered by outcome', async () => {
    const org = await ctx.createOrg();
    const lines = ['fullName,email'];
    for (let i = 1; i <= 7; i += 1) lines.push(i % 2 === 0 ? `Bad ${i},bad` : `Good ${i},good${i}@example.com`);
    const finished = await importAndRun(ctx, org, csv(lines));
    const first = await ctx.request('GET', `/v1/imports/${finished.id}/rows`, { key: org.key, query: { limit: '2', outcome: 'CREATED' } });
    const page = first.json<{ data: Array<{ row_number: number }>; has_more: boolean; next_cursor: string }>();
    expect(page.data.map((row) => row.row_number)).toEqual([1, 3]);
    expect(page.has_more).toBe(true);
    const second = await ctx.request('GET', `/v1/imports/${finished.id}/rows`, {
      key: org.key,
      query: { limit: '2', outcome: 'CREATED', cursor: page.next_cursor },
    });
    expect(second.json<{ data: Array<{ row_number: number }>; next_cursor: null }>()).toMatchObject({
      data: [{ row_number: 5 }, { row_number: 7 }],
      next_cursor: null,
    });
    // A cursor belongs to its filter.
    const mixed = await ctx.request('GET', `/v1/imports/${finished.id}/rows`, {
      key: org.key,
      query: { outcome: 'FAILED', cursor: page.next_cursor },
    });
    expect(mixed.statusCode).toBe(422);
  });

  it("when another organisation's import or no import is named, it answers 404", async () => {
    const [mine, theirs] = await Promise.all([ctx.createOrg(), ctx.createOrg()]);
    const created = await upload(ctx, theirs, csv(['fullName,email', 'A,a@example.com']));
    for (const path of [`/v1/imports/${created.id}`, `/v1/imports/${created.id}/rows`, '/v1/imports/not-a-uuid']) {
      expect((await ctx.request('GET', path, { key: mine.key })).statusCode, path).toBe(404);
    }
    expect((await ctx.request('POST', `/v1/imports/${created.id}/cancel`, { key: mine.key })).statusCode).toBe(404);
  });
});
