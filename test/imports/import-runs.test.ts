import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { startBackgroundJobs } from '../../src/jobs.js';
import { QUEUES, startJobRunner } from '../../src/shared/job-runner.js';
import { ImportInterrupted } from '../../src/modules/imports/import-worker.js';
import { createImportsRepository } from '../../src/modules/imports/imports.repository.js';
import { createImportsService } from '../../src/modules/imports/imports.service.js';
import { cursorKeyLoader } from '../../src/modules/service-secrets/cursor-key.js';
import { createAuditWriter } from '../../src/shared/audit-writer.js';
import { createOutboxRepository } from '../../src/shared/outbox.js';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { allRows, count, csv, getImport, importServices, upload, type ImportDto } from './import-helpers.js';

let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

/** A file of `n` new individuals, `fail` of them (every fail-th) refused for their email. */
function people(n: number, prefix: string, options: { failEvery?: number } = {}): string {
  const lines = ['externalId,fullName,email'];
  for (let i = 1; i <= n; i += 1) {
    const bad = options.failEvery !== undefined && i % options.failEvery === 0;
    lines.push(`${prefix}-${i},Person ${prefix} ${i},${bad ? 'not-an-email' : `${prefix}.${i}@example.com`}`);
  }
  return csv(lines);
}

const records = (org: TestOrg) => count(ctx, 'SELECT count(*) AS n FROM customers WHERE org_id = $1', [org.id]);
const createdAudit = (org: TestOrg) =>
  count(ctx, `SELECT count(*) AS n FROM audit_log WHERE org_id = $1 AND action = 'customer.created'`, [org.id]);

describe('batches, resume and cancel', () => {
  it('when a run stops between batches (shutdown), the next run continues at the first row without an outcome and applies each row once', async () => {
    const org = await ctx.createOrg();
    const created = await upload(ctx, org, people(9, 'k', { failEvery: 4 }));
    const { imports } = importServices(ctx, 2);
    // Stopped between batches as a shutdown stops it; a kill -9 loses at most the batch in flight (next test).
    const stop = new AbortController();
    let batches = 0;
    await expect(
      imports.run(org.id, created.id, {
        signal: stop.signal,
        onBatch: () => {
          batches += 1;
          if (batches === 2) stop.abort();
        },
      }),
    ).rejects.toThrow(ImportInterrupted);
    const midway = await getImport(ctx, org, created.id);
    expect(midway).toMatchObject({ status: 'RUNNING', rows_done: 4 });
    expect(await records(org)).toBe(3);

    await imports.run(org.id, created.id);
    const finished = await getImport(ctx, org, created.id);
    expect(finished).toMatchObject({ status: 'COMPLETED', rows_done: 9, counts: { created: 7, updated: 0, unchanged: 0, failed: 2 } });
    expect(await records(org)).toBe(7);
    expect(await createdAudit(org)).toBe(7);
    expect((await allRows(ctx, org, created.id)).map((row) => row.outcome)).toEqual([
      'CREATED',
      'CREATED',
      'CREATED',
      'FAILED',
      'CREATED',
      'CREATED',
      'CREATED',
      'FAILED',
      'CREATED',
    ]);
  });

  it('when the database connection is lost mid-batch, that batch rolls back whole and the retried run applies its rows exactly once', async () => {
    const org = await ctx.createOrg();
    const created = await upload(ctx, org, people(5, 'm'));
    const services = importServices(ctx);
    let calls = 0;
    const crashing = createImportsService({
      database: ctx.database,
      cursorKey: cursorKeyLoader(ctx.database),
      jobs: { send: () => Promise.reject(new Error('no jobs here')) },
      audit: createAuditWriter(),
      outbox: createOutboxRepository(),
      imports: createImportsRepository(),
      entities: services.entities,
      customers: {
        registerStatusOf: services.customers.registerStatusOf,
        async upsertMany(...args) {
          calls += 1;
          const results = await services.customers.upsertMany(...args);
          // The second batch's connection dies after it has written its rows (3 and 4).
          if (calls === 2) throw Object.assign(new Error('terminating connection due to administrator command'), { code: '57P01' });
          return results;
        },
      },
      importBatchSize: 2,
    });
    await expect(crashing.run(org.id, created.id)).rejects.toThrow(/administrator command/);
    expect(await getImport(ctx, org, created.id)).toMatchObject({ status: 'RUNNING', rows_done: 2 });
    expect(await records(org)).toBe(2);

    await crashing.run(org.id, created.id);
    expect(await getImport(ctx, org, created.id)).toMatchObject({ status: 'COMPLETED', rows_done: 5, counts: { created: 5 } });
    expect(await records(org)).toBe(5);
    expect(await createdAudit(org)).toBe(5);
  });

  it('when a cancel is requested while it runs, it stops before the next batch: CANCELLED, the rows applied so far stay', async () => {
    const org = await ctx.createOrg();
    const created = await upload(ctx, org, people(6, 'c'));
    const { imports } = importServices(ctx, 2);
    let cancelled: ImportDto | undefined;
    const ended = await imports.run(org.id, created.id, {
      onBatch: async () => {
        if (cancelled) return;
        const response = await ctx.request('POST', `/v1/imports/${created.id}/cancel`, { key: org.key });
        expect(response.statusCode, response.body).toBe(200);
        cancelled = response.json<ImportDto>();
      },
    });
    expect(cancelled).toMatchObject({ status: 'RUNNING', cancel_requested_at: expect.any(String) });
    expect(ended?.status).toBe('CANCELLED');
    const finished = await getImport(ctx, org, created.id);
    expect(finished).toMatchObject({ status: 'CANCELLED', rows_done: 2, counts: { created: 2 }, finished_at: expect.any(String) });
    expect(await records(org)).toBe(2);
    expect(await allRows(ctx, org, created.id, 'PENDING')).toHaveLength(4);
    // Finished: a second cancel is a 409, and no import.completed fired.
    const again = await ctx.request('POST', `/v1/imports/${created.id}/cancel`, { key: org.key });
    expect(again.statusCode).toBe(409);
    expect(await count(ctx, `SELECT count(*) AS n FROM outbox_events WHERE org_id = $1 AND type = 'import.completed'`, [org.id])).toBe(0);
  });

  it('when a QUEUED import is cancelled, it is CANCELLED at once and its worker applies nothing', async () => {
    const org = await ctx.createOrg();
    const created = await upload(ctx, org, people(3, 'q'));
    const response = await ctx.request('POST', `/v1/imports/${created.id}/cancel`, { key: org.key });
    expect(response.json()).toMatchObject({ status: 'CANCELLED', rows_done: 0, finished_at: expect.any(String) });
    const ended = await importServices(ctx).imports.run(org.id, created.id);
    expect(ended?.status).toBe('CANCELLED');
    expect(await records(org)).toBe(0);
  });
});

/** The job runner and workers of `svc serve`, on the test database. */
const backgroundJobs = () =>
  startBackgroundJobs({ config: ctx.config, database: ctx.database, logger: pino({ level: 'silent' }), webhookWorker: false });

/** A logger whose lines (their messages) are kept in `lines`. */
function recordingLogger() {
  const lines: string[] = [];
  const logger = pino({ level: 'info' }, { write: (line: string) => void lines.push((JSON.parse(line) as { msg: string }).msg) });
  return { logger, lines };
}

describe('imports run in the background', () => {
  it('when an instance runs with IMPORT_WORKER=off, it never works an import: one with imports on completes it', async () => {
    const org = await ctx.createOrg();
    const apiOnly = recordingLogger();
    const runner = await startJobRunner(ctx.database, { logger: apiOnly.logger });
    const work = vi.spyOn(runner, 'work');
    const api = await startBackgroundJobs({
      config: ctx.config,
      database: ctx.database,
      logger: apiOnly.logger,
      webhookWorker: false,
      importWorker: false,
      runner,
    });
    const worker = recordingLogger();
    let workerJobs: Awaited<ReturnType<typeof startBackgroundJobs>> | undefined;
    try {
      // It works the other queues, but registers no worker for imports' rows.
      const worked = work.mock.calls.map(([queue]) => queue);
      expect(worked).toContain(QUEUES.reviewSweep.name);
      expect(worked).not.toContain(QUEUES.importRun.name);

      const created = await upload(ctx, org, people(5, 'w'));
      workerJobs = await startBackgroundJobs({ config: ctx.config, database: ctx.database, logger: worker.logger, webhookWorker: false });
      await expect.poll(async () => (await getImport(ctx, org, created.id)).status, { timeout: 30_000, interval: 100 }).toBe('COMPLETED');
      expect(await records(org)).toBe(5);
      expect(worker.lines).toContain('import completed');
      expect(apiOnly.lines).not.toContain('import completed');
    } finally {
      await Promise.all([api.stop(), workerJobs?.stop()]);
    }
  });

  it('when two organisations upload, the job runner completes both imports', async () => {
    const [big, small] = await Promise.all([ctx.createOrg(), ctx.createOrg()]);
    const bigImport = await upload(ctx, big, people(300, 'b', { failEvery: 20 }));
    const smallImport = await upload(ctx, small, people(3, 's'));
    const jobs = await backgroundJobs();
    try {
      await expect
        .poll(async () => (await getImport(ctx, small, smallImport.id)).status, { timeout: 30_000, interval: 100 })
        .toBe('COMPLETED');
      await expect.poll(async () => (await getImport(ctx, big, bigImport.id)).status, { timeout: 60_000, interval: 200 }).toBe('COMPLETED');
    } finally {
      await jobs.stop();
    }
    expect(await getImport(ctx, big, bigImport.id)).toMatchObject({ rows_done: 300, counts: { created: 285, failed: 15 } });
    expect(await getImport(ctx, small, smallImport.id)).toMatchObject({ rows_done: 3, counts: { created: 3 } });
    expect(await records(big)).toBe(285);
    expect(await records(small)).toBe(3);
  });

  it("when one organisation's large import is running, a second organisation's small import and its API requests proceed", async () => {
    const [large, small] = await Promise.all([ctx.createOrg(), ctx.createOrg()]);
    // Twenty of the worker's batches (500 rows each): it runs for many seconds, and the test stops it midway.
    const largeImport = await upload(ctx, large, people(10_000, 'big'));
    const jobs = await backgroundJobs();
    try {
      await expect
        .poll(async () => (await getImport(ctx, large, largeImport.id)).status, { timeout: 20_000, interval: 20 })
        .toBe('RUNNING');

      const smallImport = await upload(ctx, small, people(10, 'few'));
      // The small organisation's own requests while the large import runs.
      const posted = await ctx.request('POST', '/v1/customers', {
        key: small.key,
        body: { externalId: 'few-api', fullName: 'Few Api', email: 'few.api@example.com' },
      });
      expect(posted.statusCode, posted.body).toBe(201);
      const read = await ctx.request('GET', `/v1/customers/${posted.json<{ id: string }>().id}`, { key: small.key });
      expect(read.statusCode, read.body).toBe(200);
      const listed = await ctx.request('GET', '/v1/customers', { key: small.key });
      expect(listed.statusCode, listed.body).toBe(200);
      const importsListed = await ctx.request('GET', '/v1/imports', { key: small.key });
      expect(importsListed.statusCode, importsListed.body).toBe(200);

      await expect
        .poll(async () => (await getImport(ctx, small, smallImport.id)).status, { timeout: 20_000, interval: 50 })
        .toBe('COMPLETED');
      // Read after the small one completed: the large one had not finished.
      const largeThen = await getImport(ctx, large, largeImport.id);
      expect(largeThen).toMatchObject({ status: 'RUNNING', finished_at: null });
      expect(largeThen.rows_done).toBeLessThan(largeThen.rows_total);
      const smallDone = await getImport(ctx, small, smallImport.id);
      expect(smallDone).toMatchObject({ rows_done: 10, counts: { created: 10, updated: 0, unchanged: 0, failed: 0 } });
      expect(await records(small)).toBe(11);
    } finally {
      // Stops the large import between batches; it stays RUNNING, to resume on its job's retry.
      await jobs.stop();
    }
  });
});

describe('GET /v1/imports', () => {
  it('when an organisation has imports, they are listed newest first a page at a time, and only its own', async () => {
    const [org, other] = await Promise.all([ctx.createOrg(), ctx.createOrg()]);
    const ids: string[] = [];
    for (let i = 0; i < 3; i += 1) ids.push((await upload(ctx, org, people(1, `l${i}`))).id);
    await upload(ctx, other, people(1, 'x'));
    const first = await ctx.request('GET', '/v1/imports', { key: org.key, query: { limit: '2' } });
    const page = first.json<{ object: string; data: ImportDto[]; has_more: boolean; next_cursor: string | null; limit: number }>();
    expect(page).toMatchObject({ object: 'list', has_more: true, limit: 2 });
    const second = await ctx.request('GET', '/v1/imports', { key: org.key, query: { limit: '2', cursor: page.next_cursor! } });
    const rest = second.json<{ data: ImportDto[]; has_more: boolean; next_cursor: string | null }>();
    expect(rest).toMatchObject({ has_more: false, next_cursor: null });
    expect([...page.data, ...rest.data].map((item) => item.id)).toEqual([...ids].reverse());
  });

  it('when a key has imports:read only, it reads imports but cannot upload or cancel', async () => {
    const org = await ctx.createOrg();
    const created = await upload(ctx, org, people(1, 'r'));
    const reader = await ctx.createKey(org.id, { scopes: ['imports:read'] });
    expect((await ctx.request('GET', `/v1/imports/${created.id}`, { key: reader.key })).statusCode).toBe(200);
    expect((await ctx.request('GET', '/v1/imports', { key: reader.key })).statusCode).toBe(200);
    expect((await ctx.request('POST', `/v1/imports/${created.id}/cancel`, { key: reader.key })).statusCode).toBe(403);
    const customersOnly = await ctx.createKey(org.id, { scopes: ['customers:read', 'customers:write'] });
    expect((await ctx.request('GET', `/v1/imports/${created.id}`, { key: customersOnly.key })).statusCode).toBe(403);
  });
});

describe('retention', () => {
  it('when an import finished longer ago than IMPORT_RETENTION_DAYS, the purge deletes it and its rows and keeps the records it created', async () => {
    const org = await ctx.createOrg();
    const old = await upload(ctx, org, people(3, 'o'));
    const young = await upload(ctx, org, people(2, 'y'));
    const { imports } = importServices(ctx);
    await imports.run(org.id, old.id);
    await imports.run(org.id, young.id);
    await ctx.database.pool.query(`UPDATE imports SET finished_at = now() - interval '31 days' WHERE org_id = $1 AND id = $2`, [
      org.id,
      old.id,
    ]);
    const purged = await importServices(ctx).retention({ batchSize: 2 }).purgeOrganisation(org.id);
    expect(purged).toMatchObject({ imports: 1, import_rows: 3 });
    expect((await ctx.request('GET', `/v1/imports/${old.id}`, { key: org.key })).statusCode).toBe(404);
    expect((await ctx.request('GET', `/v1/imports/${young.id}`, { key: org.key })).statusCode).toBe(200);
    expect(await records(org)).toBe(5);
  });
});
