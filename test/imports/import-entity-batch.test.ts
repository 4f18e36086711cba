import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createPageReads } from '../../src/db/page-reads.js';
import { createCustomerChangeRecorder } from '../../src/modules/customers/customer-changes.js';
import { createCustomersRepository } from '../../src/modules/customers/customers.repository.js';
import { createReviewColumns } from '../../src/modules/customers/review-columns.js';
import { createDueDiligenceRepository } from '../../src/modules/due-diligence/due-diligence.repository.js';
import { createEntitiesRepository } from '../../src/modules/entities/entities.repository.js';
import { createEntitiesService } from '../../src/modules/entities/entities.service.js';
import type { UpsertEntityBody } from '../../src/modules/entities/entities.schemas.js';
import { cursorKeyLoader } from '../../src/modules/service-secrets/cursor-key.js';
import { AppError } from '../../src/shared/app-error.js';
import { createAuditWriter } from '../../src/shared/audit-writer.js';
import { systemClock } from '../../src/shared/clock.js';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { allRows, importAndSendOneByOne, importServices, upload } from './import-helpers.js';

let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

const post = (org: TestOrg, path: string, body: unknown) => ctx.request('POST', path, { key: org.key, body });

/** The records an organisation starts with, the same in both: an individual and seven entities. */
const PAT = { fullName: 'Pat Person', email: 'pat@example.com' };
const SEEDED: Array<[path: string, body: Record<string, unknown>]> = [
  ['/v1/customers', { externalId: 'crm-p', ...PAT }],
  ['/v1/entities', { externalId: 'ent-a', type: 'COMPANY', name: 'Alpha Pty Ltd', abn: '51824753556' }],
  ['/v1/entities', { type: 'TRUST', name: 'Beta Trust' }],
  ['/v1/entities', { externalId: 'ent-c', type: 'COMPANY', name: 'Gamma Pty Ltd' }],
  ['/v1/entities', { externalId: 'ent-d', type: 'COMPANY', name: 'Delta Pty Ltd', acn: '051775556', address: '1 Delta St' }],
  ['/v1/entities', { externalId: 'ent-e', type: 'TRUST', name: 'Epsilon Trust', contact: PAT }],
  ['/v1/entities', { externalId: 'ent-f', type: 'COMPANY', name: 'Foxtrot Pty Ltd', contact: PAT }],
  ['/v1/entities', { externalId: 'ent-g', type: 'COMPANY', name: 'Golf Pty Ltd' }],
];

async function seed(org: TestOrg): Promise<void> {
  for (const [path, body] of SEEDED) {
    const response = await post(org, path, body);
    expect(response.statusCode, response.body).toBe(201);
  }
}

/**
 * Entity rows that depend on each other and on what is stored within one batch: new entities with and
 * without contact persons (new, shared, stored), keys an earlier row holds, matches, refusals.
 */
const BODIES: Array<Record<string, unknown>> = [
  { externalId: 'new-1', type: 'COMPANY', name: 'New One Pty Ltd' },
  {
    externalId: 'new-2',
    type: 'COMPANY',
    name: 'New Two Pty Ltd',
    contact: { fullName: 'Cleo Contact', email: 'cleo@example.com', kycRequired: false },
  },
  { externalId: 'new-3', type: 'TRUST', name: 'New Three Trust', contact: { fullName: 'CLEO CONTACT', email: 'Cleo@Example.com' } },
  { externalId: 'new-1', type: 'COMPANY', name: 'New One Pty Ltd', address: '1 New St' },
  { externalId: 'ent-a', name: 'Alpha Pty Ltd', address: '2 Alpha St' },
  { externalId: 'new-5', type: 'COMPANY', name: 'alpha pty ltd' },
  { externalId: 'crm-p', type: 'COMPANY', name: 'Person Co' },
  { type: 'COMPANY', name: 'Bad Co', origin: 'INTERNATIONAL', abn: '53004085616' },
  { externalId: 'new-6', type: 'COMPANY', name: 'Six Pty Ltd', contact: { customerId: 'crm-p' } },
  { externalId: 'new-7', type: 'TRUST', name: 'Beta Trust' },
  { externalId: 'ent-a', contact: { fullName: 'Dee Director', email: 'dee@example.com', kycRequired: false } },
  { externalId: 'new-9', type: 'COMPANY', name: 'Nine Pty Ltd', contact: { fullName: 'Dee Director', email: 'dee@example.com' } },
  { externalId: 'new-10', type: 'COMPANY', name: 'Ten Pty Ltd', abn: '53004085616' },
  { externalId: 'new-11', type: 'COMPANY', name: 'Eleven Pty Ltd', abn: '53004085616' },
  { name: 'Missing Type Pty Ltd' },
  { externalId: 'new-12', type: 'COMPANY', name: 'Twelve Pty Ltd', contact: { fullName: 'Pat Person', email: 'PAT@example.com' } },
  { externalId: 'new-13', type: 'COMPANY', name: 'Thirteen Pty Ltd', clientSinceDate: '2020-01-01' },
  { externalId: 'new-14', type: 'COMPANY', name: 'Fourteen Ltd', origin: 'INTERNATIONAL', countryOfFormation: 'IRN' },
  { externalId: 'new-15', type: 'SMSF', name: 'Fifteen Super Fund', acn: '004085616', designatedServices: ['PRO-FORMATION'] },
  { externalId: 'new-16', type: 'COMPANY', name: 'Sixteen Pty Ltd', acn: '004085616' },
  { externalId: 'ent-c', abn: '33051775556' },
  { externalId: 'new-17', type: 'COMPANY', name: 'Seventeen Pty Ltd', abn: '33051775556' },
  { acn: '051775556', address: '4 Delta St' },
  { externalId: 'ent-d', type: 'COMPANY', name: 'Delta Pty Ltd', address: '1 Delta St' },
  { externalId: 'ent-e', type: 'TRUST', name: 'Epsilon Trust', contact: { fullName: 'pat person', email: 'pat@example.com' } },
  { externalId: 'ent-e', contact: { fullName: 'Pat Person', email: 'pat@example.com', kycRequired: false } },
  { externalId: 'ent-f', address: '6 Foxtrot St', designatedServices: ['PRO-FORMATION'] },
  { externalId: 'ent-g', name: 'Golf Holdings Pty Ltd', contact: { fullName: 'pat person', email: 'Pat@Example.com', kycRequired: false } },
  { externalId: 'new-18', type: 'COMPANY', name: 'Golf Pty Ltd' },
  { externalId: 'new-19', type: 'COMPANY', name: 'GOLF HOLDINGS PTY LTD' },
];

const EXPECTED = [
  'CREATED',
  'CREATED', // with a new contact person, whose KYC is not intended
  'CREATED', // the same person (case aside): found, not created again
  'UPDATED', // row 1's record
  'UPDATED',
  'FAILED', // the legal name and type are ent-a's, under another externalId
  'FAILED', // the externalId is an individual's
  'FAILED', // an ABN on an INTERNATIONAL entity
  'CREATED', // its contact named by externalId
  'UPDATED', // adopts the entity without an externalId
  'UPDATED', // ent-a's new contact person is created here, its KYC not intended
  'CREATED', // finds that person as row 11 left it
  'CREATED',
  'FAILED', // row 13's record holds the ABN under another externalId
  'FAILED', // a new entity needs a type
  'CREATED', // its contact is the stored individual
  'FAILED', // clientSinceDate needs an existing client
  'CREATED', // formed in a high-risk jurisdiction
  'CREATED',
  'FAILED', // row 19's record holds the ACN under another externalId
  'UPDATED', // ent-c takes an ABN no record held before the file
  'FAILED', // which row 21 gave ent-c, under another externalId
  'UPDATED', // ent-d, matched by its ACN
  'UPDATED', // ent-d's address as it was before row 23
  'UNCHANGED', // ent-e as stored, its contact the same person
  'UPDATED', // ent-e's contact no longer needs KYC
  'UPDATED', // ent-f's address and services; its contact person stays
  'UPDATED', // ent-g renamed, its contact the stored individual
  'CREATED', // the name ent-g gave up
  'FAILED', // the name ent-g took, under another externalId
];

/** What an organisation's records hold, entities with their contact's name and email, ids left out. */
async function records(org: TestOrg) {
  const { rows } = await ctx.database.pool.query(
    `SELECT e.kind, e.external_id, e.type, e.name, e.email, e.abn, e.acn, e.address, e.origin, e.country_of_formation,
            e.designated_services, e.kyc_status, e.is_contact_only, e.risk_rating, e.review_status, e.edd_required,
            e.added_via, e.contact_kyc_required, contact.name AS contact_name, contact.email AS contact_email
       FROM customers e LEFT JOIN customers contact ON contact.org_id = e.org_id AND contact.id = e.contact_customer_id
      WHERE e.org_id = $1 ORDER BY e.kind, e.external_id NULLS LAST, e.name, e.email`,
    [org.id],
  );
  return rows;
}

async function auditActions(org: TestOrg) {
  const { rows } = await ctx.database.pool.query<{ subject_type: string; action: string; n: string }>(
    `SELECT subject_type, action, count(*) AS n FROM audit_log
      WHERE org_id = $1 AND subject_type IN ('customer', 'entity') GROUP BY 1, 2 ORDER BY 1, 2`,
    [org.id],
  );
  return rows;
}

/** The audit rows of the records created or changed after `since`, without ids, times or how they were added. */
async function auditSince(org: TestOrg, since: Date) {
  const { rows } = await ctx.database.pool.query(
    `SELECT action,
            before - '{id,createdAt,updatedAt,addedVia,contactCustomerId}'::text[] AS before,
            after - '{id,createdAt,updatedAt,addedVia,contactCustomerId}'::text[] AS after
       FROM audit_log WHERE org_id = $1 AND created_at > $2 AND subject_type IN ('customer', 'entity')`,
    [org.id, since],
  );
  return rows.map((row) => JSON.stringify(row)).sort();
}

/** The events of the records written after `since` (the import's own left out): types and records, ids, times and added_via left out. */
async function eventsSince(org: TestOrg, since: Date) {
  const { rows } = await ctx.database.pool.query<{ type: string; data: Record<string, unknown> }>(
    `SELECT type, payload::jsonb->'data' AS data FROM outbox_events WHERE org_id = $1 AND created_at > $2 AND type <> 'import.completed'`,
    [org.id, since],
  );
  const strip = (value: unknown): unknown => {
    if (Array.isArray(value)) return value.map(strip);
    if (value === null || typeof value !== 'object') return value;
    return Object.fromEntries(
      Object.entries(value)
        .filter(([key]) => !['id', 'customer_id', 'created_at', 'updated_at', 'added_via'].includes(key))
        .map(([key, inner]) => [key, strip(inner)]),
    );
  };
  return rows.map((row) => JSON.stringify({ type: row.type, data: strip(row.data) })).sort();
}

/** An error envelope with the record it names (details.match, an id) named by its externalId, the same in both organisations. */
async function withMatchByExternalId(org: TestOrg, error: { details?: Record<string, unknown> }) {
  const match = error.details?.match;
  if (typeof match !== 'string') return error;
  const { rows } = await ctx.database.pool.query<{ external_id: string }>(
    'SELECT external_id FROM customers WHERE org_id = $1 AND id = $2',
    [org.id, match],
  );
  return { ...error, details: { ...error.details, match: rows[0]?.external_id } };
}

describe('entity rows of one batch', () => {
  it.each([
    ['one batch', 500],
    ['batches of three rows', 3],
  ])(
    'when a file of entities creates, matches and shares keys and contact persons (in %s), each row ends as its request would have, sent one after another in file order',
    async (_name, batchSize) => {
      const { imported, oneByOne, seeded } = await importAndSendOneByOne(
        ctx,
        seed,
        { kind: 'entities', bodies: BODIES, batchSize, expected: EXPECTED },
        withMatchByExternalId,
      );
      const stored = await records(imported);
      const expected = (await records(oneByOne)).map((record) =>
        record.added_via === 'INTEGRATION' &&
        !['ent-a', 'ent-c', 'ent-d', 'ent-e', 'ent-f', 'ent-g', 'crm-p'].includes(record.external_id) &&
        record.name !== 'Beta Trust'
          ? { ...record, added_via: 'BULK_IMPORT' }
          : record,
      );
      expect(stored).toEqual(expected);
      expect(await auditActions(imported)).toEqual(await auditActions(oneByOne));
      expect(await auditSince(imported, seeded)).toEqual(await auditSince(oneByOne, seeded));
      expect(await eventsSince(imported, seeded)).toEqual(await eventsSince(oneByOne, seeded));
    },
  );

  it('when the file is a dry run, every row gets the outcome it would have and nothing is written', async () => {
    const org = await ctx.createOrg();
    await seed(org);
    const before = { records: await records(org), audit: await auditActions(org) };
    const created = await upload(ctx, org, BODIES.map((body) => JSON.stringify(body)).join('\n') + '\n', {
      kind: 'entities',
      contentType: 'application/x-ndjson',
      dryRun: true,
    });
    await importServices(ctx, 500).imports.run(org.id, created.id);
    const rows = await allRows(ctx, org, created.id);
    // Judged against the records as stored: a row never sees what an earlier row of a dry run would have written.
    expect(rows.map((row) => row.outcome)).toEqual([
      'CREATED',
      'CREATED',
      'CREATED',
      'CREATED', // row 1's record was never written
      'UPDATED',
      'FAILED',
      'FAILED',
      'FAILED',
      'CREATED',
      'UPDATED',
      'UPDATED',
      'CREATED',
      'CREATED',
      'CREATED', // nor row 13's
      'FAILED',
      'CREATED',
      'FAILED',
      'CREATED',
      'CREATED',
      'CREATED', // nor row 19's
      'UPDATED',
      'CREATED', // ent-c never took the ABN
      'UPDATED',
      'UNCHANGED', // ent-d's address never moved
      'UNCHANGED',
      'UPDATED',
      'UPDATED',
      'UPDATED',
      'FAILED', // ent-g still holds the name
      'CREATED', // nor took the new one
    ]);
    expect(rows.filter((row) => row.outcome === 'CREATED').every((row) => row.customer_id === null)).toBe(true);
    expect(await records(org)).toEqual(before.records);
    expect(await auditActions(org)).toEqual(before.audit);
  });

  it("when a request takes the ABN a batch's change gives its entity after the batch read the keys, that row fails as its request would and the batch's other changes are written", async () => {
    const org = await ctx.createOrg();
    await seed(org);
    const entitiesRepository = createEntitiesRepository();
    const dueDiligence = createDueDiligenceRepository();
    const service = createEntitiesService({
      database: ctx.database,
      pageReads: createPageReads({ primary: ctx.database }),
      clock: systemClock,
      cursorKey: cursorKeyLoader(ctx.database),
      customers: createCustomersRepository(ctx.database.db),
      changes: createCustomerChangeRecorder(),
      audit: createAuditWriter(),
      reviewColumns: createReviewColumns({ policies: dueDiligence, clock: systemClock }),
      entities: {
        ...entitiesRepository,
        // Another request creates an entity with that ABN, and commits, right after the batch read who holds the keys.
        async holdersOfKeys(...args: Parameters<typeof entitiesRepository.holdersOfKeys>) {
          const held = await entitiesRepository.holdersOfKeys(...args);
          const other = { externalId: 'other', type: 'COMPANY', name: 'Other Pty Ltd', abn: '33051775556' };
          const taken = await post(org, '/v1/entities', other);
          expect(taken.statusCode, taken.body).toBe(201);
          return held;
        },
      },
    });
    const bodies: UpsertEntityBody[] = [
      { externalId: 'ent-c', abn: '33051775556' },
      { externalId: 'ent-f', address: '7 Foxtrot St' },
    ];
    const results = await ctx.database.transaction((tx) =>
      service.upsertMany(
        { orgId: org.id, actor: { type: 'system', id: null }, transaction: (work) => tx.transaction(work) },
        bodies.map((body) => ({ body })),
        { addedVia: 'BULK_IMPORT', dryRun: false },
        tx,
      ),
    );

    const refused = results[0] as { error: AppError };
    expect(refused.error).toBeInstanceOf(AppError);
    expect(refused.error).toMatchObject({ status: 409, message: 'Another entity already has this ABN, ACN or legal name and type.' });
    expect(results[1]).toMatchObject({ created: false, changed: true });
    const stored = await records(org);
    expect(stored.find((record) => record.external_id === 'ent-c')).toMatchObject({ abn: null });
    expect(stored.find((record) => record.external_id === 'ent-f')).toMatchObject({ address: '7 Foxtrot St' });
    expect(stored.find((record) => record.external_id === 'other')).toMatchObject({ abn: '33051775556' });
    const { rows } = await ctx.database.pool.query<{ external_id: string }>(
      `SELECT c.external_id FROM audit_log a JOIN customers c ON c.org_id = a.org_id AND c.id = a.subject_id
        WHERE a.org_id = $1 AND a.action = 'entity.upserted'`,
      [org.id],
    );
    expect(rows.map((row) => row.external_id)).toEqual(['ent-f']);
  });
});
