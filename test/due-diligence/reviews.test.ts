import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addMonths } from '../../src/modules/customers/review-model.js';
import { createEventsFeedSealer, type EventsFeedSealer } from '../../src/modules/events/events-feed.sealer.js';
import type { Services } from '../../src/services.js';
import { createTestContext, type TestContext, type TestOrg, testServices } from '../helpers/harness.js';
import { createCustomer, createEntity } from '../verification/verification-fixtures.js';

type Json = Record<string, any>;
type Review = {
  object: 'review';
  id: string;
  customer_id: string;
  outcome: string;
  notes: string | null;
  reviewer: string;
  reasons: string[];
  status_before: string;
  next_review_at: string | null;
  created_at: string;
};
type Page = { object: 'list'; data: Review[]; has_more: boolean; next_cursor: string | null; limit: number };

let ctx: TestContext;
let services: Services;
let sealer: EventsFeedSealer;
beforeAll(async () => {
  ctx = await createTestContext();
  services = testServices(ctx.database);
  // The events feed serves sealed events only: sealed on demand.
  sealer = createEventsFeedSealer({ database: ctx.database, pollIntervalMs: 60_000 });
});
afterAll(async () => {
  await sealer?.stop();
  await ctx?.close();
});

const operator = { type: 'operator' as const, id: 'cli:test' };
const REVIEW = { outcome: 'NO_CHANGE', reviewer: 'Sam Officer', notes: 'Identity and services confirmed.\nNo change in risk.' };

/** An individual verified through the back office (the CLI's kyc submit and verdict): its review is SCHEDULED. */
async function verifiedPerson(org: TestOrg, body: Json = {}) {
  const person = Object.keys(body).length
    ? await ctx.request('POST', '/v1/customers', { key: org.key, body }).then((response) => {
        expect(response.statusCode, response.body).toBe(201);
        return { id: response.json<{ id: string }>().id };
      })
    : await createCustomer(ctx, org);
  const started = await ctx.request('POST', `/v1/customers/${person.id}/kyc`, { key: org.key });
  expect(started.statusCode, started.body).toBe(200);
  await services.backOffice.submit(org.id, person.id, operator);
  const dto = (await services.backOffice.verdict(org.id, person.id, { result: 'VERIFIED' }, operator)) as Json;
  expect(dto.review.status).toBe('SCHEDULED');
  return person.id;
}

/** An entity whose KYB (manual lane) reached VERIFIED: its review is SCHEDULED. */
async function verifiedEntity(org: TestOrg) {
  const entity = await createEntity(ctx, org);
  const started = await ctx.request('POST', `/v1/entities/${entity.id}/kyb`, { key: org.key, body: { method: 'manual' } });
  expect(started.statusCode, started.body).toBe(200);
  const dto = (await services.backOffice.verdict(org.id, entity.id, { result: 'VERIFIED' }, operator)) as Json;
  expect(dto.review.status).toBe('SCHEDULED');
  return entity.id;
}

/** The record's review made due now, as `svc review simulate-due` does. */
const makeDue = (org: TestOrg, id: string) => services.reviews.simulateDue(org.id, id, operator);

const record = (org: TestOrg, path: string, body: unknown = REVIEW, headers: Record<string, string> = {}) =>
  ctx.request('POST', `${path}/reviews`, { key: org.key, body, headers });

async function recorded(org: TestOrg, path: string, body: unknown = REVIEW): Promise<Review> {
  const response = await record(org, path, body);
  expect(response.statusCode, response.body).toBe(201);
  // Reviews recorded in the same millisecond have no order between them: let the clock move on.
  const written = Date.now();
  while (Date.now() < written + 2) await new Promise((resolve) => setImmediate(resolve));
  return response.json<Review>();
}

async function get(org: TestOrg, path: string): Promise<Json> {
  const response = await ctx.request('GET', path, { key: org.key });
  expect(response.statusCode, response.body).toBe(200);
  return response.json<Json>();
}

async function rows(table: 'customer_reviews' | 'audit_log' | 'outbox_events', orgId: string, where = 'true', values: unknown[] = []) {
  const { rows: found } = await ctx.database.pool.query(`SELECT * FROM ${table} WHERE org_id = $1 AND ${where}`, [orgId, ...values]);
  return found;
}

/** Every event of `type` in the organisation's feed, read through GET /v1/events. */
async function feed(org: TestOrg, type: string): Promise<Array<{ id: string; type: string; data: { customer: Json } }>> {
  await sealer.sealOnce();
  const response = await ctx.request('GET', '/v1/events', { key: org.key, query: { type, limit: '100' } });
  expect(response.statusCode, response.body).toBe(200);
  return response.json<{ data: Array<{ id: string; type: string; data: { customer: Json } }> }>().data;
}

/** Every review of the record, following next_cursor with `limit`; the pages' sizes and has_more flags too. */
async function walk(org: TestOrg, path: string, limit: number) {
  const reviews: Review[] = [];
  const pages: Array<{ size: number; has_more: boolean }> = [];
  let cursor: string | null = null;
  do {
    const response = await ctx.request('GET', `${path}/reviews`, {
      key: org.key,
      query: { limit: String(limit), ...(cursor ? { cursor } : {}) },
    });
    expect(response.statusCode, response.body).toBe(200);
    const page = response.json<Page>();
    expect(page.limit).toBe(limit);
    reviews.push(...page.data);
    pages.push({ size: page.data.length, has_more: page.has_more });
    expect(page.next_cursor === null).toBe(!page.has_more);
    cursor = page.next_cursor;
  } while (cursor);
  return { reviews, pages };
}

const withoutUpdatedAt = ({ updated_at: _updatedAt, ...rest }: Json) => rest;

describe('POST /v1/customers/{id}/reviews', () => {
  it('when a review is recorded on a DUE record, its reasons clear, last_completed_at is the review, it is SCHEDULED again and the next review falls the policy interval later', async () => {
    const org = await ctx.createOrg();
    const put = await ctx.request('PUT', '/v1/due-diligence-policy', {
      key: org.key,
      body: { reviewIntervalMonths: { LOW: 18, MEDIUM: 9, HIGH: 3 } },
    });
    expect(put.statusCode, put.body).toBe(200);
    const id = await verifiedPerson(org);
    const due = (await makeDue(org, id)) as Json;
    expect(due.review).toMatchObject({ status: 'DUE', reasons: ['SCHEDULED_DATE'] });
    const { rows: ratings } = await ctx.database.pool.query<{ risk_rating: 'LOW' | 'MEDIUM' | 'HIGH' }>(
      'SELECT risk_rating FROM customers WHERE id = $1',
      [id],
    );
    const interval = { LOW: 18, MEDIUM: 9, HIGH: 3 }[ratings[0]!.risk_rating];

    const review = await recorded(org, `/v1/customers/${id}`);
    expect(review).toEqual({
      object: 'review',
      id: expect.any(String),
      customer_id: id,
      outcome: 'NO_CHANGE',
      notes: REVIEW.notes,
      reviewer: 'Sam Officer',
      reasons: ['SCHEDULED_DATE'],
      status_before: 'DUE',
      next_review_at: addMonths(new Date(review.created_at), interval).toISOString(),
      created_at: expect.any(String),
    });
    const customer = await get(org, `/v1/customers/${id}`);
    expect(customer.review).toEqual({
      status: 'SCHEDULED',
      next_review_at: review.next_review_at,
      last_completed_at: review.created_at,
      reasons: [],
    });
    const [stored] = await rows('customer_reviews', org.id);
    expect(stored).toMatchObject({ customer_id: id, reasons: ['SCHEDULED_DATE'], status_before: 'DUE', outcome: 'NO_CHANGE' });
  });

  it('when a review is recorded ahead of its date, it is accepted with no reasons and status_before SCHEDULED, and the next date moves from now', async () => {
    const org = await ctx.createOrg();
    const id = await verifiedPerson(org);
    const before = await get(org, `/v1/customers/${id}`);
    const review = await recorded(org, `/v1/customers/${id}`, { outcome: 'UPDATED', reviewer: 'Ann Auditor' });
    expect(review).toMatchObject({ reasons: [], status_before: 'SCHEDULED', notes: null, outcome: 'UPDATED' });
    expect(review.next_review_at).toBe(addMonths(new Date(review.created_at), 36).toISOString());
    expect(new Date(review.next_review_at!).getTime()).toBeGreaterThan(new Date(before.review.next_review_at).getTime());
    expect((await get(org, `/v1/customers/${id}`)).review).toMatchObject({ status: 'SCHEDULED', last_completed_at: review.created_at });
  });

  it('when a review is recorded, customer.review_completed carries the record as it is after it, in GET /v1/events', async () => {
    const org = await ctx.createOrg();
    const id = await verifiedPerson(org);
    await makeDue(org, id);
    const review = await recorded(org, `/v1/customers/${id}`);
    const events = await feed(org, 'customer.review_completed');
    expect(events).toHaveLength(1);
    const customer = await get(org, `/v1/customers/${id}`);
    expect(withoutUpdatedAt(events[0]!.data.customer)).toEqual(withoutUpdatedAt(customer));
    expect(events[0]!.data.customer.review).toEqual({
      status: 'SCHEDULED',
      next_review_at: review.next_review_at,
      last_completed_at: review.created_at,
      reasons: [],
    });
  });

  it('when the request is repeated with its Idempotency-Key, the same review is replayed and one row, audit row and event are written', async () => {
    const org = await ctx.createOrg();
    const id = await verifiedPerson(org);
    await makeDue(org, id);
    const headers = { 'idempotency-key': randomUUID() };
    const first = await record(org, `/v1/customers/${id}`, REVIEW, headers);
    const again = await record(org, `/v1/customers/${id}`, REVIEW, headers);
    expect(first.statusCode, first.body).toBe(201);
    expect(again.statusCode).toBe(201);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.json()).toEqual(first.json());
    expect(await rows('customer_reviews', org.id)).toHaveLength(1);
    expect(await rows('audit_log', org.id, "action = 'customer.review_recorded'")).toHaveLength(1);
    expect(await rows('outbox_events', org.id, "type = 'customer.review_completed'")).toHaveLength(1);
  });

  it('when a review is recorded, one audit row names the key, the Idempotency-Key and the review columns before and after', async () => {
    const org = await ctx.createOrg();
    const id = await verifiedPerson(org);
    await makeDue(org, id);
    const key = randomUUID();
    const response = await record(org, `/v1/customers/${id}`, REVIEW, { 'idempotency-key': key });
    expect(response.statusCode, response.body).toBe(201);
    const audits = await rows('audit_log', org.id, "action = 'customer.review_recorded'");
    expect(audits).toHaveLength(1);
    expect(audits[0]).toMatchObject({
      subject_type: 'customer',
      subject_id: id,
      actor_type: 'api_key',
      actor_id: org.keyId,
      idempotency_key: key,
    });
    expect(audits[0].before).toMatchObject({ reviewStatus: 'DUE', reviewReasons: ['SCHEDULED_DATE'], reviewCompletedAt: null });
    const review = response.json<Review>();
    expect(audits[0].after).toMatchObject({
      reviewStatus: 'SCHEDULED',
      reviewReasons: [],
      reviewCompletedAt: review.created_at,
      nextReviewAt: review.next_review_at,
    });
  });

  it('when the record was never verified (review NOT_SCHEDULED), it answers 409 and writes nothing', async () => {
    const org = await ctx.createOrg();
    const person = await createCustomer(ctx, org);
    const response = await record(org, `/v1/customers/${person.id}`);
    expect(response.statusCode, response.body).toBe(409);
    expect(response.json().error).toMatchObject({ code: 'conflict', details: { review_status: 'NOT_SCHEDULED' } });
    expect(await rows('customer_reviews', org.id)).toEqual([]);
    expect(await rows('audit_log', org.id, "action = 'customer.review_recorded'")).toEqual([]);
    expect((await get(org, `/v1/customers/${person.id}`)).review).toMatchObject({ status: 'NOT_SCHEDULED', last_completed_at: null });
  });

  it('when the record is unknown, in another organisation, or an entity, it answers 404', async () => {
    const [org, other] = [await ctx.createOrg(), await ctx.createOrg()];
    const entityId = await verifiedEntity(org);
    const theirs = await verifiedPerson(other);
    for (const ref of [randomUUID(), 'crm-nobody', entityId, theirs]) {
      const response = await record(org, `/v1/customers/${ref}`);
      expect(response.statusCode, `${ref}: ${response.body}`).toBe(404);
      expect(response.json().error.code).toBe('not_found');
    }
    expect(await rows('customer_reviews', org.id)).toEqual([]);
    expect(await rows('customer_reviews', other.id)).toEqual([]);
  });

  it.each([
    ['no outcome', { reviewer: 'Sam Officer' }, 'outcome'],
    ['an unknown outcome', { outcome: 'DONE', reviewer: 'Sam Officer' }, 'outcome'],
    ['no reviewer', { outcome: 'NO_CHANGE' }, 'reviewer'],
    ['an empty reviewer', { outcome: 'NO_CHANGE', reviewer: '   ' }, 'reviewer'],
    ['a reviewer of 201 characters', { outcome: 'NO_CHANGE', reviewer: 'x'.repeat(201) }, 'reviewer'],
    ['notes of 5001 characters', { outcome: 'NO_CHANGE', reviewer: 'Sam Officer', notes: 'n'.repeat(5001) }, 'notes'],
    ['notes that are not text', { outcome: 'NO_CHANGE', reviewer: 'Sam Officer', notes: 42 }, 'notes'],
    ['an unknown field', { outcome: 'NO_CHANGE', reviewer: 'Sam Officer', reviewedAt: '2026-01-01' }, ''],
  ])('when the body has %s, it answers 422 validation_failed naming the field and writes nothing', async (_case, body, field) => {
    const org = await ctx.createOrg();
    const id = await verifiedPerson(org);
    const response = await record(org, `/v1/customers/${id}`, body);
    expect(response.statusCode, response.body).toBe(422);
    const error = response.json().error;
    expect(error.code).toBe('validation_failed');
    if (field) expect(Object.keys(error.details.issues)).toContain(field);
    expect(await rows('customer_reviews', org.id)).toEqual([]);
  });

  it('when the limits are met exactly (reviewer 200, notes 5000 characters), the review is recorded as sent', async () => {
    const org = await ctx.createOrg();
    const id = await verifiedPerson(org);
    const body = { outcome: 'ESCALATED', reviewer: 'r'.repeat(200), notes: 'n'.repeat(5000) };
    const review = await recorded(org, `/v1/customers/${id}`, body);
    expect(review).toMatchObject(body);
  });

  it("when {id} is the caller's external_id, it records on that record", async () => {
    const org = await ctx.createOrg();
    const id = await verifiedPerson(org, { externalId: 'crm-review-1', fullName: 'Ext Ernal', email: 'ext@example.com' });
    const review = await recorded(org, '/v1/customers/crm-review-1');
    expect(review.customer_id).toBe(id);
    expect((await walk(org, '/v1/customers/crm-review-1', 10)).reviews.map((item) => item.id)).toEqual([review.id]);
  });

  it('when the key lacks verification:write, recording is 403 while the history stays readable with customers:read', async () => {
    const org = await ctx.createOrg();
    const id = await verifiedPerson(org);
    const reader = await ctx.createKey(org.id, { scopes: ['customers:read'] });
    const refused = await ctx.request('POST', `/v1/customers/${id}/reviews`, { key: reader.key, body: REVIEW });
    expect(refused.statusCode).toBe(403);
    const listed = await ctx.request('GET', `/v1/customers/${id}/reviews`, { key: reader.key });
    expect(listed.statusCode, listed.body).toBe(200);
  });
});

describe('GET /v1/customers/{id}/reviews', () => {
  it('when reviews were recorded, the history lists them newest first, exact across pages of every size', async () => {
    const org = await ctx.createOrg();
    const id = await verifiedPerson(org);
    await makeDue(org, id);
    const written: Review[] = [];
    for (const outcome of ['NO_CHANGE', 'UPDATED', 'ESCALATED', 'NO_CHANGE', 'EXITED']) {
      written.push(await recorded(org, `/v1/customers/${id}`, { outcome, reviewer: 'Sam Officer' }));
    }
    const newestFirst = [...written].reverse();
    for (const limit of [1, 2, 3, 5, 100]) {
      const { reviews, pages } = await walk(org, `/v1/customers/${id}`, limit);
      expect(reviews, `limit ${limit}`).toEqual(newestFirst);
      expect(pages.map((page) => page.size)).toEqual(
        Array.from({ length: Math.ceil(5 / limit) }, (_, index) => Math.min(limit, 5 - index * limit)),
      );
      expect(pages.at(-1)!.has_more).toBe(false);
    }
    // Only the first, made on a due review, carries its reasons.
    expect(newestFirst.map((review) => review.status_before)).toEqual(['SCHEDULED', 'SCHEDULED', 'SCHEDULED', 'SCHEDULED', 'DUE']);
  });

  it('when no review was recorded, the history is an empty list', async () => {
    const org = await ctx.createOrg();
    const person = await createCustomer(ctx, org);
    expect(await get(org, `/v1/customers/${person.id}/reviews`)).toEqual({
      object: 'list',
      data: [],
      has_more: false,
      next_cursor: null,
      limit: 50,
    });
  });

  it("when a cursor of another record's history is passed, it answers 422 on cursor", async () => {
    const org = await ctx.createOrg();
    const [first, second] = [await verifiedPerson(org), await verifiedPerson(org)];
    for (let i = 0; i < 2; i += 1) await recorded(org, `/v1/customers/${first}`);
    const page = await ctx.request('GET', `/v1/customers/${first}/reviews`, { key: org.key, query: { limit: '1' } });
    const cursor = page.json<Page>().next_cursor!;
    const response = await ctx.request('GET', `/v1/customers/${second}/reviews`, { key: org.key, query: { cursor } });
    expect(response.statusCode, response.body).toBe(422);
    expect(Object.keys(response.json().error.details.issues)).toEqual(['cursor']);
    const forged = await ctx.request('GET', `/v1/customers/${first}/reviews`, { key: org.key, query: { cursor: 'not.a-cursor' } });
    expect(forged.statusCode).toBe(422);
  });

  it('when the record is unknown or an entity, the history is 404', async () => {
    const org = await ctx.createOrg();
    const entityId = await verifiedEntity(org);
    for (const ref of [randomUUID(), entityId]) {
      const response = await ctx.request('GET', `/v1/customers/${ref}/reviews`, { key: org.key });
      expect(response.statusCode, response.body).toBe(404);
    }
  });
});

describe('/v1/entities/{id}/reviews', () => {
  it('when a review is recorded on an entity, it is scheduled again, listed in its history, audited, and the event carries the entity DTO', async () => {
    const org = await ctx.createOrg();
    const id = await verifiedEntity(org);
    await makeDue(org, id);
    const review = await recorded(org, `/v1/entities/${id}`, { outcome: 'UPDATED', reviewer: 'Ena Entity', notes: 'Owners confirmed.' });
    expect(review).toMatchObject({ customer_id: id, reasons: ['SCHEDULED_DATE'], status_before: 'DUE', outcome: 'UPDATED' });
    const entity = await get(org, `/v1/entities/${id}`);
    expect(entity.review).toEqual({
      status: 'SCHEDULED',
      next_review_at: review.next_review_at,
      last_completed_at: review.created_at,
      reasons: [],
    });
    expect((await walk(org, `/v1/entities/${id}`, 10)).reviews).toEqual([review]);
    const audits = await rows('audit_log', org.id, "action = 'entity.review_recorded'");
    expect(audits).toMatchObject([{ subject_type: 'entity', subject_id: id }]);
    const events = await feed(org, 'customer.review_completed');
    expect(events).toHaveLength(1);
    expect(withoutUpdatedAt(events[0]!.data.customer)).toEqual(withoutUpdatedAt(entity));
  });

  it('when {id} is an individual, the entity routes answer 404', async () => {
    const org = await ctx.createOrg();
    const id = await verifiedPerson(org);
    expect((await record(org, `/v1/entities/${id}`)).statusCode).toBe(404);
    expect((await ctx.request('GET', `/v1/entities/${id}/reviews`, { key: org.key })).statusCode).toBe(404);
    expect(await rows('customer_reviews', org.id)).toEqual([]);
  });

  it('when the entity was never verified, recording is 409', async () => {
    const org = await ctx.createOrg();
    const entity = await createEntity(ctx, org);
    const response = await record(org, `/v1/entities/${entity.id}`);
    expect(response.statusCode, response.body).toBe(409);
  });
});
