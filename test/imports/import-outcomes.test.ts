import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createEventsFeedSealer, type EventsFeedSealer } from '../../src/modules/events/events-feed.sealer.js';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { allRows, count, csv, getImport, importAndRun, importServices, upload } from './import-helpers.js';

let ctx: TestContext;
let sealer: EventsFeedSealer;
beforeAll(async () => {
  ctx = await createTestContext();
  sealer = createEventsFeedSealer({ database: ctx.database, pollIntervalMs: 60_000 });
});
afterAll(async () => {
  await sealer?.stop();
  await ctx?.close();
});

const post = (org: TestOrg, path: string, body: unknown) => ctx.request('POST', path, { key: org.key, body });

describe('each row ends with the outcome its single request would have', () => {
  it('when rows are new, match by externalId with a change, match with none, or are refused, they end CREATED, UPDATED, UNCHANGED and FAILED', async () => {
    const org = await ctx.createOrg();
    const existing = await post(org, '/v1/customers', { externalId: 'crm-1', fullName: 'Ada Existing', email: 'ada@example.com' });
    expect(existing.statusCode, existing.body).toBe(201);
    const same = await post(org, '/v1/customers', {
      externalId: 'crm-2',
      fullName: 'Bo Same',
      email: 'bo@example.com',
      phone: '0400 111 222',
    });
    expect(same.statusCode, same.body).toBe(201);

    const finished = await importAndRun(
      ctx,
      org,
      csv([
        'externalId,fullName,email,phone,risk.isNewCustomer,designatedServices',
        'crm-new,Cy New,cy@example.com,,true,PRO-REAL-ESTATE;PRO-CLIENT-MONEY',
        'crm-1,Ada Existing,ada@example.com,0400 999 888,,',
        'crm-2,Bo Same,bo@example.com,0400 111 222,,',
        'crm-bad,Di Bad,not-an-email,,,',
      ]),
    );
    expect(finished).toMatchObject({
      status: 'COMPLETED',
      rows_total: 4,
      rows_done: 4,
      counts: { created: 1, updated: 1, unchanged: 1, failed: 1 },
      error: null,
    });
    expect(finished.started_at).toEqual(expect.any(String));
    expect(finished.finished_at).toEqual(expect.any(String));

    const rows = await allRows(ctx, org, finished.id);
    expect(rows.map((row) => [row.row_number, row.outcome])).toEqual([
      [1, 'CREATED'],
      [2, 'UPDATED'],
      [3, 'UNCHANGED'],
      [4, 'FAILED'],
    ]);
    expect(rows[1]!.customer_id).toBe(existing.json<{ id: string }>().id);
    expect(rows[2]!.customer_id).toBe(same.json<{ id: string }>().id);
    expect(rows[3]!.customer_id).toBeNull();

    // The new record is as POST /v1/customers would have made it (in another organisation here), added via BULK_IMPORT.
    const other = await ctx.createOrg();
    const direct = await post(other, '/v1/customers', {
      externalId: 'crm-new',
      fullName: 'Cy New',
      email: 'cy@example.com',
      risk: { isNewCustomer: true },
      designatedServices: ['PRO-REAL-ESTATE', 'PRO-CLIENT-MONEY'],
    });
    expect(direct.statusCode, direct.body).toBe(201);
    const columns = async (id: string) =>
      (
        await ctx.database.pool.query(
          `SELECT external_id, name, email, kyc_status, designated_services, is_designated_service, risk_rating, client_classification,
                  risk_answers, review_status, edd_required, added_via FROM customers WHERE id = $1`,
          [id],
        )
      ).rows[0];
    expect(await columns(rows[0]!.customer_id!)).toEqual({
      ...(await columns(direct.json<{ id: string }>().id)),
      added_via: 'BULK_IMPORT',
    });
    const created = await ctx.request('GET', `/v1/customers/${rows[0]!.customer_id}`, { key: org.key });
    expect(created.json()).toMatchObject({ external_id: 'crm-new', added_via: 'BULK_IMPORT' });

    // The refused row carries the very envelope the single route answers for the same body.
    const single = await post(org, '/v1/customers', { externalId: 'crm-bad', fullName: 'Di Bad', email: 'not-an-email' });
    expect(single.statusCode).toBe(422);
    expect(rows[3]!.error).toEqual(single.json<{ error: unknown }>().error);
  });

  it('when a row conflicts (its email and name belong to a record under another externalId), it fails 409 as the single route does', async () => {
    const org = await ctx.createOrg();
    await post(org, '/v1/customers', { externalId: 'crm-a', fullName: 'Eve Taken', email: 'eve@example.com' });
    const finished = await importAndRun(
      ctx,
      org,
      csv(['externalId,fullName,email', 'crm-b,Eve Taken,eve@example.com', 'crm-c,Fay Fine,fay@example.com']),
    );
    expect(finished.counts).toEqual({ created: 1, updated: 0, unchanged: 0, failed: 1 });
    const [conflicted] = await allRows(ctx, org, finished.id, 'FAILED');
    const single = await post(org, '/v1/customers', { externalId: 'crm-b', fullName: 'Eve Taken', email: 'eve@example.com' });
    expect(single.statusCode).toBe(409);
    expect(conflicted!.error).toEqual(single.json<{ error: unknown }>().error);
    expect(conflicted!.error!.code).toBe('conflict');
  });

  it('when cells break the body schema (a boolean, a date, an unknown service, a nested rule), the row fails with the route’s issues by field path', async () => {
    const org = await ctx.createOrg();
    const finished = await importAndRun(
      ctx,
      org,
      csv([
        'fullName,email,risk.isNewCustomer,clientSinceDate,designatedServices',
        'Gus Maybe,gus@example.com,maybe,,',
        'Hal Date,hal@example.com,false,2020-02-30,',
        'Ivy Code,ivy@example.com,,,NOT-A-CODE',
        'Jo Since,jo@example.com,true,2020-01-01,',
      ]),
    );
    expect(finished.counts.failed).toBe(4);
    const rows = await allRows(ctx, org, finished.id);
    const bodies = [
      { fullName: 'Gus Maybe', email: 'gus@example.com', risk: { isNewCustomer: 'maybe' } },
      { fullName: 'Hal Date', email: 'hal@example.com', risk: { isNewCustomer: false }, clientSinceDate: '2020-02-30' },
      { fullName: 'Ivy Code', email: 'ivy@example.com', designatedServices: ['NOT-A-CODE'] },
      { fullName: 'Jo Since', email: 'jo@example.com', risk: { isNewCustomer: true }, clientSinceDate: '2020-01-01' },
    ];
    for (const [index, body] of bodies.entries()) {
      const single = await post(org, '/v1/customers', body);
      expect(single.statusCode, single.body).toBe(422);
      expect(rows[index]!.error, `row ${index + 1}`).toEqual(single.json<{ error: unknown }>().error);
    }
  });

  it('when a record is created or changed by a row, its audit row names the uploading key and the upload’s request', async () => {
    const org = await ctx.createOrg();
    await post(org, '/v1/customers', { externalId: 'crm-k', fullName: 'Kim Before', email: 'kim@example.com' });
    const finished = await importAndRun(
      ctx,
      org,
      csv(['externalId,fullName,email', 'crm-k,Kim After,kim@example.com', 'crm-l,Lou New,lou@example.com']),
    );
    const { rows } = await ctx.database.pool.query<{ action: string; actor_type: string; actor_id: string; request_id: string | null }>(
      `SELECT action, actor_type, actor_id, request_id FROM audit_log
        WHERE org_id = $1 AND subject_type = 'customer' AND created_at >= $2 ORDER BY id`,
      [org.id, finished.started_at],
    );
    expect(rows.map((row) => row.action)).toEqual(['customer.upserted', 'customer.created']);
    for (const row of rows) expect(row).toMatchObject({ actor_type: 'api_key', actor_id: org.keyId, request_id: expect.any(String) });
  });

  it('when the kind is entities, rows are POST /v1/entities bodies, dotted contact fields included', async () => {
    const org = await ctx.createOrg();
    const finished = await importAndRun(
      ctx,
      org,
      csv([
        'type,name,externalId,abn,contact.fullName,contact.email,designatedServices',
        'COMPANY,Acme Pty Ltd,crm-e1,51 824 753 556,Sam Director,sam@acme.example,PRO-FORMATION',
        'TRUST,,crm-e2,,,,',
      ]),
      { kind: 'entities' },
    );
    expect(finished.counts).toEqual({ created: 1, updated: 0, unchanged: 0, failed: 1 });
    const rows = await allRows(ctx, org, finished.id);
    const entity = await ctx.request('GET', `/v1/entities/${rows[0]!.customer_id}`, { key: org.key });
    expect(entity.json()).toMatchObject({
      name: 'Acme Pty Ltd',
      abn: '51824753556',
      added_via: 'BULK_IMPORT',
      contact: { full_name: 'Sam Director', email: 'sam@acme.example' },
    });
    const single = await post(org, '/v1/entities', { type: 'TRUST', externalId: 'crm-e2' });
    expect(rows[1]!.error).toEqual(single.json<{ error: unknown }>().error);
  });

  it('when a file is NDJSON, each line is a request body and fails exactly as that body would', async () => {
    const org = await ctx.createOrg();
    const lines = [
      {
        externalId: 'crm-n1',
        fullName: 'Nia Json',
        email: 'nia@example.com',
        risk: { isNewCustomer: false },
        clientSinceDate: '2015-05-05',
      },
      { fullName: 'Oz Json', email: 'oz@example.com', risk: { isNewCustomer: 'no' } },
    ];
    const finished = await importAndRun(ctx, org, lines.map((line) => JSON.stringify(line)).join('\n'), {
      contentType: 'application/x-ndjson',
    });
    expect(finished).toMatchObject({ format: 'ndjson', counts: { created: 1, failed: 1 } });
    const rows = await allRows(ctx, org, finished.id);
    expect(rows[0]!.data).toEqual(lines[0]);
    const single = await post(org, '/v1/customers', lines[1]);
    expect(rows[1]!.error).toEqual(single.json<{ error: unknown }>().error);
  });

  it('when the template of a kind is imported as it is, its example row creates a record', async () => {
    for (const kind of ['individuals', 'entities']) {
      const org = await ctx.createOrg();
      const template = await ctx.request('GET', `/v1/imports/templates/${kind}.csv`, { key: org.key });
      expect(template.statusCode).toBe(200);
      expect(template.headers['content-type']).toMatch(/^text\/csv/);
      const finished = await importAndRun(ctx, org, template.body, { kind });
      expect(finished.counts, kind).toEqual({ created: 1, updated: 0, unchanged: 0, failed: 0 });
    }
  });
});

describe('a dry run', () => {
  it('when dry_run is true, it reports the outcomes each row would have and writes no record, audit row or record event', async () => {
    const org = await ctx.createOrg();
    await post(org, '/v1/customers', { externalId: 'crm-d1', fullName: 'Dee Before', email: 'dee@example.com' });
    await post(org, '/v1/customers', { externalId: 'crm-d2', fullName: 'Dan Same', email: 'dan@example.com' });
    const records = () => count(ctx, 'SELECT count(*) AS n FROM customers WHERE org_id = $1', [org.id]);
    const recordAudit = () =>
      count(ctx, `SELECT count(*) AS n FROM audit_log WHERE org_id = $1 AND subject_type IN ('customer', 'entity')`, [org.id]);
    const recordEvents = () =>
      count(ctx, `SELECT count(*) AS n FROM outbox_events WHERE org_id = $1 AND type <> 'import.completed'`, [org.id]);
    const before = { records: await records(), audit: await recordAudit(), events: await recordEvents() };
    const snapshot = await ctx.request('GET', '/v1/customers/crm-d1', { key: org.key });

    const finished = await importAndRun(
      ctx,
      org,
      csv([
        'externalId,fullName,email',
        'crm-d1,Dee After,dee@example.com',
        'crm-d2,Dan Same,dan@example.com',
        'crm-d3,Dot New,dot@example.com',
        'crm-d4,Bad,nope',
      ]),
      { dryRun: true },
    );
    expect(finished).toMatchObject({ status: 'COMPLETED', dry_run: true, counts: { created: 1, updated: 1, unchanged: 1, failed: 1 } });
    expect({ records: await records(), audit: await recordAudit(), events: await recordEvents() }).toEqual(before);
    expect((await ctx.request('GET', '/v1/customers/crm-d1', { key: org.key })).json()).toEqual(snapshot.json());
    const rows = await allRows(ctx, org, finished.id);
    expect(rows.map((row) => row.outcome)).toEqual(['UPDATED', 'UNCHANGED', 'CREATED', 'FAILED']);
    // A record that would be created does not exist: no id.
    expect(rows[2]!.customer_id).toBeNull();
  });
});

describe('import.completed', () => {
  it('when an import completes, one import.completed event with its counts is in GET /v1/events', async () => {
    const org = await ctx.createOrg();
    const finished = await importAndRun(ctx, org, csv(['fullName,email', 'Pat One,pat@example.com', 'Bad,bad']));
    await sealer.sealOnce();
    const response = await ctx.request('GET', '/v1/events', { key: org.key, query: { type: 'import.completed' } });
    expect(response.statusCode, response.body).toBe(200);
    const events = response.json<{ data: Array<{ type: string; data: { import: { id: string; status: string; counts: unknown } } }> }>()
      .data;
    expect(events).toHaveLength(1);
    expect(events[0]!.data.import).toMatchObject({
      id: finished.id,
      status: 'COMPLETED',
      counts: { created: 1, failed: 1, updated: 0, unchanged: 0 },
    });
  });

  it('when the worker runs an import that already ended, it changes nothing and fires nothing more', async () => {
    const org = await ctx.createOrg();
    const finished = await importAndRun(ctx, org, csv(['fullName,email', 'Quin Once,quin@example.com']));
    const again = await importServices(ctx).imports.run(org.id, finished.id);
    expect(again?.status).toBe('COMPLETED');
    expect(await count(ctx, `SELECT count(*) AS n FROM outbox_events WHERE org_id = $1 AND type = 'import.completed'`, [org.id])).toBe(1);
    expect(await getImport(ctx, org, finished.id)).toEqual(finished);
  });

  it('when a record the integration imported is changed again later, customer.updated fires as for any record of the integration', async () => {
    const org = await ctx.createOrg();
    await importAndRun(ctx, org, csv(['externalId,fullName,email', 'crm-u1,Uma First,uma@example.com']));
    const patched = await ctx.request('PATCH', '/v1/customers/crm-u1', { key: org.key, body: { phone: '0400 000 001' } });
    expect(patched.statusCode, patched.body).toBe(200);
    expect(await count(ctx, `SELECT count(*) AS n FROM outbox_events WHERE org_id = $1 AND type = 'customer.updated'`, [org.id])).toBe(1);
  });
});

describe('an upload', () => {
  it('when a file is accepted, it answers 202 with the QUEUED import and its rows wait with no outcome', async () => {
    const org = await ctx.createOrg();
    const created = await upload(ctx, org, csv(['fullName,email', 'Ray Wait,ray@example.com']));
    expect(created).toMatchObject({ status: 'QUEUED', kind: 'individuals', format: 'csv', dry_run: false, rows_total: 1, rows_done: 0 });
    expect(await allRows(ctx, org, created.id, 'PENDING')).toHaveLength(1);
  });
});

describe('webhook endpoints that opt out of import rows', () => {
  it('when an endpoint has skip_import_rows, the events an import’s rows cause are not delivered to it; the feed and other endpoints still get them', async () => {
    const org = await ctx.createOrg();
    const create = async (body: Record<string, unknown>) => {
      const response = await ctx.request('POST', '/v1/webhook-endpoints', {
        key: org.key,
        body: { url: 'https://93.184.215.14/hooks/imports', ...body },
      });
      expect(response.statusCode, response.body).toBe(201);
      return response.json<{ id: string; skip_import_rows: boolean }>();
    };
    const all = await create({});
    const quiet = await create({ skipImportRows: true });
    expect([all.skip_import_rows, quiet.skip_import_rows]).toEqual([false, true]);
    await post(org, '/v1/customers', { externalId: 'crm-w1', fullName: 'Wes Before', email: 'wes@example.com' });

    await importAndRun(ctx, org, csv(['externalId,fullName,email', 'crm-w1,Wes After,wes@example.com']));
    const deliveries = async (endpointId: string) =>
      (
        await ctx.database.pool.query<{ type: string }>(
          `SELECT e.type FROM webhook_deliveries d JOIN outbox_events e ON e.org_id = d.org_id AND e.id = d.event_id
            WHERE d.org_id = $1 AND d.endpoint_id = $2 ORDER BY e.type`,
          [org.id, endpointId],
        )
      ).rows.map((row) => row.type);
    expect(await deliveries(all.id)).toEqual(['customer.updated', 'import.completed']);
    expect(await deliveries(quiet.id)).toEqual(['import.completed']);
    expect(await count(ctx, `SELECT count(*) AS n FROM outbox_events WHERE org_id = $1 AND type = 'customer.updated'`, [org.id])).toBe(1);

    // A change through the API still reaches it; the setting can be turned off.
    await ctx.request('PATCH', '/v1/customers/crm-w1', { key: org.key, body: { phone: '0400 000 002' } });
    expect(await deliveries(quiet.id)).toEqual(['customer.updated', 'import.completed']);
    const patched = await ctx.request('PATCH', `/v1/webhook-endpoints/${quiet.id}`, { key: org.key, body: { skipImportRows: false } });
    expect(patched.json()).toMatchObject({ skip_import_rows: false });
  });
});
