import type { LightMyRequestResponse } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { generateOpenApiDocument } from '../../src/plugins/openapi-document.js';
import { person } from '../customers/customers-fixtures.js';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';

let ctx: TestContext;
let org: TestOrg;
beforeAll(async () => {
  ctx = await createTestContext();
  org = await ctx.createOrg();
});
afterAll(async () => ctx?.close());

const RESOURCES = ['customers', 'entities'] as const;
type Resource = (typeof RESOURCES)[number];
const CALENDAR_FIELDS = ['clientSinceDate', 'preExistingServiceSince', 'preCommencementAssessment.assessedAt'] as const;
type CalendarField = (typeof CALENDAR_FIELDS)[number];

let entitySequence = 0;
/** A create body that is valid in every respect but the date at `field`. */
function createBody(resource: Resource, field: CalendarField, value: string): Record<string, unknown> {
  entitySequence += 1;
  const base =
    resource === 'customers'
      ? person()
      : { type: 'COMPANY', name: `Dated ${entitySequence} ${Math.random().toString(36).slice(2, 8)} Pty Ltd` };
  const existingClient = { ...base, risk: { isNewCustomer: false } };
  switch (field) {
    case 'clientSinceDate':
      return { ...existingClient, clientSinceDate: value };
    case 'preExistingServiceSince':
      return { ...existingClient, preExistingServices: ['PRO-REAL-ESTATE'], preExistingServiceSince: value };
    case 'preCommencementAssessment.assessedAt':
      return {
        ...existingClient,
        designatedServices: ['PRO-REAL-ESTATE'],
        preCommencementAssessment: { significantChange: false, resultingRisk: 'LOW', assessedAt: value },
      };
  }
}

async function recordCount(): Promise<number> {
  const { rows } = await ctx.database.pool.query('SELECT count(*)::int AS n FROM customers WHERE org_id = $1', [org.id]);
  return rows[0].n;
}

function expectRefused(response: LightMyRequestResponse, field: string, message: RegExp): void {
  expect(response.statusCode, response.body).toBe(422);
  const { error } = response.json();
  expect(error.code).toBe('validation_failed');
  expect(Object.keys(error.details.issues)).toEqual([field]);
  expect(error.details.issues[field].join(' ')).toMatch(message);
}

describe('calendar dates in request bodies', () => {
  describe.each(RESOURCES)('POST /%s', (resource) => {
    it.each(CALENDAR_FIELDS)('when %s is in year 0000 or 10000, it answers 422 naming it and writes nothing', async (field) => {
      for (const value of ['0000-01-01', '0000-02-29', '0000-12-31', '10000-01-01']) {
        const before = await recordCount();
        const response = await ctx.request('POST', `/v1/${resource}`, { key: org.key, body: createBody(resource, field, value) });
        expectRefused(response, field, value === '10000-01-01' ? /yyyy-mm-dd/ : /0001-01-01 to 9999-12-31/);
        expect(await recordCount()).toBe(before);
      }
    });

    it.each(CALENDAR_FIELDS)('when %s is 0001-01-01, it is accepted and stored as year 1', async (field) => {
      const response = await ctx.request('POST', `/v1/${resource}`, { key: org.key, body: createBody(resource, field, '0001-01-01') });
      expect(response.statusCode, response.body).toBe(201);
      const { rows } = await ctx.database.pool.query(
        `SELECT client_since_date::text AS "clientSinceDate", pre_existing_service_since::text AS "preExistingServiceSince",
                pre_commencement_assessment->>'assessedAt' AS "preCommencementAssessment.assessedAt"
           FROM customers WHERE id = $1`,
        [response.json().id],
      );
      expect(rows[0][field]).toBe('0001-01-01');
      // The audit row is written from the row as the database returned it: year 1 survived the read too.
      const audit = await ctx.database.pool.query(`SELECT after FROM audit_log WHERE subject_id = $1 AND action LIKE '%.created'`, [
        response.json().id,
      ]);
      const after = audit.rows[0].after as Record<string, any>;
      const audited = field === 'preCommencementAssessment.assessedAt' ? after.preCommencementAssessment?.assessedAt : after[field];
      expect(audited).toBe('0001-01-01');
    });

    it('when preExistingServiceSince is 9999-12-31, it is accepted and stored as written', async () => {
      const response = await ctx.request('POST', `/v1/${resource}`, {
        key: org.key,
        body: createBody(resource, 'preExistingServiceSince', '9999-12-31'),
      });
      expect(response.statusCode, response.body).toBe(201);
      const { rows } = await ctx.database.pool.query(`SELECT pre_existing_service_since::text AS since FROM customers WHERE id = $1`, [
        response.json().id,
      ]);
      expect(rows[0].since).toBe('9999-12-31');
    });
  });
});

describe('updated_since', () => {
  beforeAll(async () => {
    // One record of each kind last changed in year 50: it proves years below 100 reach PostgreSQL
    // as themselves (Date.UTC would read 50 as 1950). The insert bypasses the triggers, which would
    // stamp updated_at with the clock.
    const client = await ctx.database.pool.connect();
    try {
      await client.query('BEGIN');
      await client.query('SET LOCAL session_replication_role = replica');
      await client.query(
        `INSERT INTO customers (org_id, kind, type, name, email, kyc_status, added_via, external_id, created_at, updated_at)
         VALUES ($1, 'individual', 'INDIVIDUAL', 'Ancient Person', 'ancient@example.com', 'NOT_REQUIRED', 'INTEGRATION', 'ancient-individual',
                 timestamptz '0050-06-15T00:00:00Z', timestamptz '0050-06-15T00:00:00Z'),
                ($1, 'entity', 'COMPANY', 'Ancient Pty Ltd', NULL, 'NOT_REQUIRED', 'INTEGRATION', 'ancient-entity',
                 timestamptz '0050-06-15T00:00:00Z', timestamptz '0050-06-15T00:00:00Z')`,
        [org.id],
      );
      await client.query('COMMIT');
    } finally {
      client.release();
    }
    const { rows } = await ctx.database.pool.query(
      `SELECT count(*)::int AS n FROM customers WHERE external_id LIKE 'ancient-%' AND updated_at = timestamptz '0050-06-15T00:00:00Z'`,
    );
    expect(rows[0].n).toBe(2);
  });

  const list = (resource: Resource, updatedSince: string) =>
    ctx.request('GET', `/v1/${resource}`, { key: org.key, query: { updated_since: updatedSince, limit: '100' } });
  const externalIds = (response: LightMyRequestResponse) =>
    response.json().data.map((row: { external_id: string | null }) => row.external_id);

  describe.each(RESOURCES)('GET /%s', (resource) => {
    it('when updated_since lies outside years 0001 to 9999, as written or once converted to UTC, it answers 422 naming it', async () => {
      const outOfRange = [
        '0000-01-01T00:00:00Z',
        '0000-12-31T23:59:59-01:00', // year 1 in UTC, but year 0000 as written
        '0001-01-01T00:00:00+00:01', // year 0 in UTC
        '0001-01-01T00:00:00+23:59',
        '9999-12-31T23:59:59-14:00', // year 10000 in UTC
        '9999-12-31T23:59:59.999-00:01',
      ];
      for (const value of outOfRange) {
        expectRefused(await list(resource, value), 'updated_since', /0001-01-01T00:00:00Z and 9999-12-31T23:59:59\.999Z.*UTC/);
      }
      for (const value of ['10000-01-01T00:00:00Z', '+010000-01-01T00:00:00Z', '-000001-01-01T00:00:00Z', '2026-02-30T00:00:00Z']) {
        expectRefused(await list(resource, value), 'updated_since', /ISO 8601/);
      }
    });

    it('when updated_since is at the bounds or in years below 100, it answers 200 and compares as that instant', async () => {
      const ancient = `ancient-${resource === 'customers' ? 'individual' : 'entity'}`;
      for (const value of ['0001-01-01T00:00:00Z', '0001-01-01T00:00:00-14:00', '0050-06-14T23:59:59.999Z']) {
        const response = await list(resource, value);
        expect(response.statusCode, response.body).toBe(200);
        expect(externalIds(response)).toContain(ancient);
      }
      const later = await list(resource, '0050-06-15T00:00:00Z');
      expect(later.statusCode, later.body).toBe(200);
      expect(externalIds(later)).not.toContain(ancient);
      for (const value of ['9999-12-31T23:59:59.999Z', '9999-12-31T23:59:59.9999Z', '9999-12-31T23:59:59+14:00']) {
        const response = await list(resource, value);
        expect(response.statusCode, response.body).toBe(200);
        expect(response.json().data).toEqual([]);
      }
    });
  });
});

describe('review_due_before', () => {
  describe.each(RESOURCES)('GET /%s', (resource) => {
    it('when review_due_before lies outside years 0001 to 9999 or is not ISO 8601, it answers 422 naming it; at the bounds, 200', async () => {
      const list = (value: string) => ctx.request('GET', `/v1/${resource}`, { key: org.key, query: { review_due_before: value } });
      for (const value of ['0000-01-01T00:00:00Z', '0001-01-01T00:00:00+00:01', '9999-12-31T23:59:59-14:00']) {
        expectRefused(await list(value), 'review_due_before', /0001-01-01T00:00:00Z and 9999-12-31T23:59:59\.999Z.*UTC/);
      }
      expectRefused(await list('2026-02-30T00:00:00Z'), 'review_due_before', /ISO 8601/);
      for (const value of ['0001-01-01T00:00:00Z', '9999-12-31T23:59:59.999Z']) expect((await list(value)).statusCode).toBe(200);
    });
  });
});

/** The feeds' time filters (the events feed, the audit trail): the same bounds as updated_since. */
const FEEDS = ['events', 'audit-events'] as const;
const FEED_FILTERS = ['created_after', 'created_before'] as const;

describe('created_after and created_before', () => {
  const feed = (path: (typeof FEEDS)[number], filter: string, value: string) =>
    ctx.request('GET', `/v1/${path}`, { key: org.key, query: { [filter]: value } });

  describe.each(FEEDS)('GET /%s', (path) => {
    it.each(FEED_FILTERS)('when %s lies outside years 0001 to 9999 or is not ISO 8601, it answers 422 naming it', async (filter) => {
      for (const value of ['0000-01-01T00:00:00Z', '0001-01-01T00:00:00+00:01', '9999-12-31T23:59:59-14:00']) {
        expectRefused(await feed(path, filter, value), filter, /0001-01-01T00:00:00Z and 9999-12-31T23:59:59\.999Z.*UTC/);
      }
      for (const value of ['10000-01-01T00:00:00Z', '2026-02-30T00:00:00Z', 'yesterday']) {
        expectRefused(await feed(path, filter, value), filter, /ISO 8601/);
      }
    });

    it.each(FEED_FILTERS)('when %s is at the bounds, it answers 200', async (filter) => {
      for (const value of ['0001-01-01T00:00:00Z', '9999-12-31T23:59:59.999Z']) {
        const response = await feed(path, filter, value);
        expect(response.statusCode, response.body).toBe(200);
      }
    });
  });
});

describe('dueAt of a document request', () => {
  const request = async (dueAt: string) => {
    const entity = await ctx.request('POST', '/v1/entities', {
      key: org.key,
      body: {
        type: 'COMPANY',
        name: `Due ${Math.random().toString(36).slice(2, 8)} Pty Ltd`,
        contact: { fullName: 'Dana Due', email: 'dana.due@example.com' },
      },
    });
    expect(entity.statusCode, entity.body).toBe(201);
    return ctx.request('POST', `/v1/entities/${entity.json().id}/document-requests`, { key: org.key, body: { types: ['OTHER'], dueAt } });
  };

  it('when dueAt lies outside years 0001 to 9999 or is not ISO 8601, it answers 422 naming it', async () => {
    for (const value of ['0000-01-01T00:00:00Z', '9999-12-31T23:59:59-14:00']) {
      expectRefused(await request(value), 'dueAt', /0001-01-01T00:00:00Z and 9999-12-31T23:59:59\.999Z.*UTC/);
    }
    for (const value of ['10000-01-01T00:00:00Z', '2026-02-30T00:00:00Z']) {
      expectRefused(await request(value), 'dueAt', /ISO 8601/);
    }
  });

  it('when dueAt is at the bounds of the date range, it answers 422 on the request rule (past, or too far ahead), never a 500', async () => {
    expectRefused(await request('0001-01-01T00:00:00Z'), 'dueAt', /future/);
    expectRefused(await request('9999-12-31T23:59:59.999Z'), 'dueAt', /at most 365 days/);
  });
});

describe('coverage', () => {
  it('when the OpenAPI document has a date or date-time request field, this file proves its bounds', async () => {
    const document = (await generateOpenApiDocument()) as {
      paths: Record<string, Record<string, any>>;
      components?: { schemas?: Record<string, any> };
    };
    const found: string[] = [];
    const visit = (node: any, path: string, seen: Set<unknown>): void => {
      if (!node || typeof node !== 'object' || seen.has(node)) return;
      seen.add(node);
      if (typeof node.$ref === 'string') visit(document.components?.schemas?.[node.$ref.split('/').pop()!], path, seen);
      if (node.format === 'date' || node.format === 'date-time') found.push(path);
      for (const [key, child] of Object.entries(node)) {
        if (key === 'properties')
          for (const [name, property] of Object.entries(child as object)) visit(property, path ? `${path}.${name}` : name, seen);
        else if (key !== '$ref') visit(child, path, seen);
      }
    };
    for (const [route, operations] of Object.entries(document.paths)) {
      for (const [method, operation] of Object.entries(operations)) {
        for (const parameter of operation.parameters ?? []) {
          if (parameter.schema?.format === 'date' || parameter.schema?.format === 'date-time')
            found.push(`${method.toUpperCase()} ${route} ?${parameter.name}`);
        }
        const before = found.length;
        visit(operation.requestBody?.content?.['application/json']?.schema, '', new Set());
        for (let index = before; index < found.length; index += 1) found[index] = `${method.toUpperCase()} ${route} ${found[index]}`;
      }
    }
    const proven = [
      ...RESOURCES.flatMap((resource) => CALENDAR_FIELDS.map((field) => `POST /${resource} ${field}`)),
      ...RESOURCES.map((resource) => `GET /${resource} ?updated_since`),
      ...RESOURCES.map((resource) => `GET /${resource} ?review_due_before`),
      ...FEEDS.flatMap((path) => FEED_FILTERS.map((filter) => `GET /${path} ?${filter}`)),
      'POST /entities/{id}/document-requests dueAt',
    ];
    expect(found.sort()).toEqual(proven.sort());
  });
});
