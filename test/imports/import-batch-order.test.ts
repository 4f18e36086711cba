import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { allRows, importAndSendOneByOne, importServices, upload } from './import-helpers.js';

let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

const post = (org: TestOrg, path: string, body: unknown) => ctx.request('POST', path, { key: org.key, body });

/** The records an organisation starts with, the same in both: three under an externalId, one without, one entity. */
async function seed(org: TestOrg): Promise<void> {
  for (const body of [
    { externalId: 'crm-1', fullName: 'Ada Lovelace', email: 'ada@example.com' },
    { externalId: 'crm-2', fullName: 'Bo Diddley', email: 'bo@example.com', phone: '0400 111 222' },
    { fullName: 'Cy Twombly', email: 'cy@example.com' },
    { externalId: 'crm-3', fullName: 'Di Prima', email: 'di@example.com' },
    { fullName: 'Gus Grey', email: 'gus.b@example.com' },
    { externalId: 'crm-4', fullName: 'Gus Grey', email: 'gus.a@example.com' },
  ]) {
    expect((await post(org, '/v1/customers', body)).statusCode).toBe(201);
  }
  expect((await post(org, '/v1/entities', { type: 'TRUST', name: 'Ent Trust', externalId: 'crm-ent' })).statusCode).toBe(201);
}

/** Rows that depend on each other within one batch: duplicates, a record's key moved by an earlier row, adoption, refusals. */
const BODIES: Array<Record<string, unknown>> = [
  { externalId: 'new-1', fullName: 'Nel One', email: 'one@example.com' },
  { externalId: 'new-1', fullName: 'Nel One', email: 'one@example.com', phone: '0400 000 001' },
  { externalId: 'new-1', fullName: 'Nel One', email: 'one@example.com', phone: '0400 000 001' },
  { externalId: 'new-2', fullName: 'NEL ONE', email: 'One@Example.com' },
  { externalId: 'crm-1', email: 'ada.two@example.com' },
  { externalId: 'new-3', fullName: 'Ada Lovelace', email: 'ada.two@example.com' },
  { fullName: 'Ada Lovelace', email: 'ada@example.com' },
  { externalId: 'new-4', fullName: 'Cy Twombly', email: 'cy@example.com' },
  { externalId: 'crm-ent', fullName: 'Xi Entity', email: 'xi@example.com' },
  { fullName: 'Bad Email', email: 'not-an-email' },
  { externalId: 'crm-2', fullName: 'Bo Diddley', email: 'bo@example.com', phone: '0400 111 222' },
  { externalId: 'crm-2', phone: '0400 000 002' },
  { externalId: 'new-5', fullName: 'Eve Early', email: 'eve@example.com', clientSinceDate: '2020-01-01' },
  { externalId: 'new-6', fullName: 'Fay Fine', email: 'fay@example.com' },
  { externalId: 'crm-1', fullName: 'Ada Lovelace', email: 'ada@example.com' },
  { externalId: 'new-6', fullName: 'Fay Fine', email: 'fay@example.com', designatedServices: ['PRO-REAL-ESTATE'] },
  { externalId: 'new-7', fullName: 'Di Prima', email: 'di.new@example.com' },
  { externalId: 'crm-3', email: 'di.new@example.com' },
  { externalId: 'crm-4', email: 'gus.b@example.com' },
  { externalId: 'crm-2', phone: '0400 000 003' },
];

const EXPECTED = [
  'CREATED',
  'UPDATED',
  'UNCHANGED',
  'FAILED', // the name and email belong to new-1
  'UPDATED', // crm-1 moves to a new email
  'FAILED', // that email and name are now crm-1's
  'CREATED', // crm-1 left this name and email: a new record
  'UPDATED', // adopts the record without an externalId
  'FAILED', // the externalId is an entity's
  'FAILED',
  'UNCHANGED',
  'UPDATED',
  'FAILED', // clientSinceDate needs an existing client
  'CREATED',
  'FAILED', // row 7's record holds that name and email now
  'UPDATED',
  'CREATED',
  'FAILED', // the name and email crm-3 would end with are row 17's
  'FAILED', // the name and email crm-4 would end with are another record's, which no row names
  'UPDATED',
];

/** What an organisation's individuals hold, keyed by externalId or name, ids left out. */
async function individuals(org: TestOrg) {
  const { rows } = await ctx.database.pool.query(
    `SELECT external_id, name, email, phone, designated_services, kyc_status, risk_rating, review_status, edd_required
       FROM customers WHERE org_id = $1 AND kind = 'individual' ORDER BY external_id NULLS LAST, name, email`,
    [org.id],
  );
  return rows;
}

async function auditActions(org: TestOrg) {
  const { rows } = await ctx.database.pool.query<{ action: string; n: string }>(
    `SELECT action, count(*) AS n FROM audit_log WHERE org_id = $1 AND subject_type = 'customer' GROUP BY action ORDER BY action`,
    [org.id],
  );
  return rows;
}

/** The audit rows of the records created after `since`, without their ids and times. */
async function createdAudit(org: TestOrg, since: Date) {
  const { rows } = await ctx.database.pool.query<{ before: unknown; after: Record<string, unknown> }>(
    `SELECT before, after - '{id,createdAt,updatedAt}'::text[] AS after FROM audit_log
      WHERE org_id = $1 AND action = 'customer.created' AND created_at > $2
      ORDER BY after->>'email'`,
    [org.id, since],
  );
  return rows;
}

/** The records the customer.updated events carry, ids, times and added_via left out, in a stable order. */
async function updatedEvents(org: TestOrg) {
  const { rows } = await ctx.database.pool.query<{ customer: Record<string, unknown> }>(
    `SELECT payload::jsonb->'data'->'customer' AS customer FROM outbox_events WHERE org_id = $1 AND type = 'customer.updated'`,
    [org.id],
  );
  return rows
    .map(({ customer }) =>
      JSON.stringify({ ...customer, id: undefined, created_at: undefined, updated_at: undefined, added_via: undefined }),
    )
    .sort();
}

/** The records whose newest customer.updated event does not carry the updated_at they hold. */
async function staleEvents(org: TestOrg) {
  const { rows } = await ctx.database.pool.query<{ id: string }>(
    `SELECT c.id FROM customers c
       JOIN outbox_events e ON e.org_id = c.org_id AND e.customer_id = c.id AND e.type = 'customer.updated'
      WHERE c.org_id = $1
      GROUP BY c.id, c.updated_at
     HAVING max(e.payload::jsonb->'data'->'customer'->>'updated_at') <> to_char(c.updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')`,
    [org.id],
  );
  return rows;
}

/** The audit rows of the updates after `since`, without their ids and times. */
async function upsertedAudit(org: TestOrg, since: Date) {
  const { rows } = await ctx.database.pool.query<{ before: unknown; after: unknown }>(
    `SELECT before - '{id,createdAt,updatedAt,addedVia}'::text[] AS before, after - '{id,createdAt,updatedAt,addedVia}'::text[] AS after
       FROM audit_log WHERE org_id = $1 AND action = 'customer.upserted' AND created_at > $2`,
    [org.id, since],
  );
  return rows.map((row) => JSON.stringify(row)).sort();
}

describe('rows of one batch that depend on each other', () => {
  it.each([
    ['one batch', 500],
    ['batches of three rows', 3],
  ])(
    'when a file’s rows share keys (in %s), each row ends as its request would have, sent one after another in file order',
    async (_name, batchSize) => {
      const { imported, oneByOne, seeded } = await importAndSendOneByOne(ctx, seed, {
        kind: 'individuals',
        bodies: BODIES,
        batchSize,
        expected: EXPECTED,
      });
      expect(await individuals(imported)).toEqual(await individuals(oneByOne));
      expect(await auditActions(imported)).toEqual(await auditActions(oneByOne));
      // Each creation's audit row holds the record as the single route's does (ids and times aside).
      const creations = await createdAudit(imported, seeded);
      expect(creations).toHaveLength(EXPECTED.filter((outcome) => outcome === 'CREATED').length);
      expect(creations).toEqual(
        (await createdAudit(oneByOne, seeded)).map((row) => ({ ...row, after: { ...row.after, addedVia: 'BULK_IMPORT' } })),
      );
      // Each update's audit row and customer.updated event hold what the single route's do, and each
      // record's newest event carries the updated_at the record holds.
      const updates = await upsertedAudit(imported, seeded);
      expect(updates).toHaveLength(EXPECTED.filter((outcome) => outcome === 'UPDATED').length);
      expect(updates).toEqual(await upsertedAudit(oneByOne, seeded));
      const events = await updatedEvents(imported);
      expect(events).toHaveLength(EXPECTED.filter((outcome) => outcome === 'UPDATED').length);
      expect(events).toEqual(await updatedEvents(oneByOne));
      expect(await staleEvents(imported)).toEqual([]);
      expect(await staleEvents(oneByOne)).toEqual([]);
    },
  );

  it('when the same file is a dry run, every row is judged against the records as stored and nothing is written', async () => {
    const org = await ctx.createOrg();
    await seed(org);
    const before = { records: await individuals(org), audit: await auditActions(org) };
    const created = await upload(ctx, org, BODIES.map((body) => JSON.stringify(body)).join('\n') + '\n', {
      contentType: 'application/x-ndjson',
      dryRun: true,
    });
    await importServices(ctx).imports.run(org.id, created.id);
    const rows = await allRows(ctx, org, created.id);
    // Nothing written, so a repeated row is new again and a moved email never moved.
    expect(rows.map((row) => row.outcome)).toEqual([
      'CREATED',
      'CREATED',
      'CREATED',
      'CREATED',
      'UPDATED',
      'CREATED',
      'UNCHANGED', // crm-1 still holds this name and email
      'UPDATED',
      'FAILED',
      'FAILED',
      'UNCHANGED',
      'UPDATED',
      'FAILED',
      'CREATED',
      'UNCHANGED',
      'CREATED',
      'CREATED',
      'UPDATED',
      'FAILED',
      'UPDATED',
    ]);
    expect(rows.filter((row) => row.outcome === 'CREATED').every((row) => row.customer_id === null)).toBe(true);
    expect({ records: await individuals(org), audit: await auditActions(org) }).toEqual(before);
  });
});
