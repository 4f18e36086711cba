import type { LightMyRequestResponse } from 'fastify';
import { expect } from 'vitest';
import { testServices, type TestContext, type TestOrg } from '../helpers/harness.js';
import type { Services } from '../../src/services.js';

export type ImportDto = {
  id: string;
  kind: string;
  format: string;
  status: string;
  dry_run: boolean;
  rows_total: number;
  rows_done: number;
  counts: { created: number; updated: number; unchanged: number; failed: number };
  error: { code: string; message: string } | null;
  started_at: string | null;
  finished_at: string | null;
  cancel_requested_at: string | null;
};

export type ImportRowDto = {
  row_number: number;
  outcome: string | null;
  customer_id: string | null;
  error: { code: string; message: string; details?: Record<string, unknown> } | null;
  data: Record<string, unknown>;
};

/** POST /v1/imports with the file as the raw body (text/csv unless said otherwise). */
export function uploadRaw(
  ctx: TestContext,
  org: TestOrg,
  file: string | Buffer,
  options: { kind?: string; dryRun?: boolean; contentType?: string; headers?: Record<string, string> } = {},
): Promise<LightMyRequestResponse> {
  const query = new URLSearchParams({ kind: options.kind ?? 'individuals', ...(options.dryRun ? { dry_run: 'true' } : {}) });
  return ctx.app.inject({
    method: 'POST',
    url: `/v1/imports?${query}`,
    headers: { authorization: `Bearer ${org.key}`, 'content-type': options.contentType ?? 'text/csv', ...(options.headers ?? {}) },
    payload: file,
  });
}

/** Uploads a file that must be accepted; returns the QUEUED import. */
export async function upload(
  ctx: TestContext,
  org: TestOrg,
  file: string | Buffer,
  options: { kind?: string; dryRun?: boolean; contentType?: string } = {},
): Promise<ImportDto> {
  const response = await uploadRaw(ctx, org, file, options);
  expect(response.statusCode, response.body).toBe(202);
  return response.json<ImportDto>();
}

/** The worker's run of an import, called directly (the job's work), with services of `batchSize` rows per batch. */
export function importServices(ctx: TestContext, batchSize?: number): Services {
  return testServices(ctx.database, batchSize === undefined ? {} : { importBatchSize: batchSize });
}

export async function getImport(ctx: TestContext, org: TestOrg, id: string): Promise<ImportDto> {
  const response = await ctx.request('GET', `/v1/imports/${id}`, { key: org.key });
  expect(response.statusCode, response.body).toBe(200);
  return response.json<ImportDto>();
}

/** Every row of an import (all pages), optionally of one outcome. */
export async function allRows(ctx: TestContext, org: TestOrg, id: string, outcome?: string): Promise<ImportRowDto[]> {
  const rows: ImportRowDto[] = [];
  let cursor: string | undefined;
  for (;;) {
    const response = await ctx.request('GET', `/v1/imports/${id}/rows`, {
      key: org.key,
      query: { limit: '100', ...(outcome ? { outcome } : {}), ...(cursor ? { cursor } : {}) },
    });
    expect(response.statusCode, response.body).toBe(200);
    const page = response.json<{ data: ImportRowDto[]; next_cursor: string | null }>();
    rows.push(...page.data);
    if (page.next_cursor === null) return rows;
    cursor = page.next_cursor;
  }
}

/** Uploads and runs an import to its end; returns it as GET shows it then. */
export async function importAndRun(
  ctx: TestContext,
  org: TestOrg,
  file: string,
  options: { kind?: string; dryRun?: boolean; contentType?: string } = {},
): Promise<ImportDto> {
  const created = await upload(ctx, org, file, options);
  await importServices(ctx).imports.run(org.id, created.id);
  return getImport(ctx, org, created.id);
}

export async function count(ctx: TestContext, sql: string, values: unknown[]): Promise<number> {
  const { rows } = await ctx.database.pool.query<{ n: string }>(sql, values);
  return Number(rows[0]!.n);
}

/** CSV text from a header and rows (cells given as they are: the tests quote what needs it). */
export const csv = (lines: string[]) => lines.join('\n') + '\n';

type ErrorBody = NonNullable<ImportRowDto['error']>;

/**
 * Makes two organisations and seeds each with `seed`; imports `bodies` (NDJSON, `kind`) into the first
 * in batches of `batchSize` and sends the same bodies one by one, in file order, to the single route in
 * the second. Checks that the import completed with `expected` outcomes and that each row ended as its
 * request did (the status, and a refusal's error, each error passed through `normalise` with its
 * organisation first). Returns both organisations and when their seeding ended.
 */
export async function importAndSendOneByOne(
  ctx: TestContext,
  seed: (org: TestOrg) => Promise<void>,
  file: { kind: 'individuals' | 'entities'; bodies: Array<Record<string, unknown>>; batchSize: number; expected: string[] },
  normalise: (org: TestOrg, error: ErrorBody) => Promise<unknown> | unknown = (_org, error) => error,
): Promise<{ imported: TestOrg; oneByOne: TestOrg; seeded: Date }> {
  const imported = await ctx.createOrg();
  const oneByOne = await ctx.createOrg();
  await seed(imported);
  await seed(oneByOne);
  const seeded = new Date();
  const created = await upload(ctx, imported, file.bodies.map((body) => JSON.stringify(body)).join('\n') + '\n', {
    kind: file.kind,
    contentType: 'application/x-ndjson',
  });
  await importServices(ctx, file.batchSize).imports.run(imported.id, created.id);
  expect(await getImport(ctx, imported, created.id)).toMatchObject({ status: 'COMPLETED', rows_done: file.bodies.length });
  const rows = await allRows(ctx, imported, created.id);
  expect(rows.map((row) => row.outcome)).toEqual(file.expected);

  const route = file.kind === 'entities' ? '/v1/entities' : '/v1/customers';
  for (const [index, body] of file.bodies.entries()) {
    const response = await ctx.request('POST', route, { key: oneByOne.key, body });
    const row = rows[index]!;
    if (row.outcome === 'FAILED') {
      expect(response.statusCode, `row ${index + 1}: ${response.body}`).toBeGreaterThanOrEqual(400);
      expect(await normalise(imported, row.error!), `row ${index + 1}`).toEqual(
        await normalise(oneByOne, response.json<{ error: ErrorBody }>().error),
      );
    } else {
      expect(response.statusCode, `row ${index + 1}: ${response.body}`).toBe(row.outcome === 'CREATED' ? 201 : 200);
    }
  }
  return { imported, oneByOne, seeded };
}
