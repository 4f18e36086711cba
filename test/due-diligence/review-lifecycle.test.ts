import { eq } from 'drizzle-orm';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { customers } from '../../src/db/schema.js';
import { startBackgroundJobs } from '../../src/jobs.js';
import { addMonths } from '../../src/modules/customers/review-model.js';
import type { Services } from '../../src/services.js';
import { createTestContext, testServices, type TestContext, type TestOrg } from '../helpers/harness.js';
import { auditOf, createCustomer, createEntity, customerRow, eventsOf } from '../verification/verification-fixtures.js';

let ctx: TestContext;
let backOffice: Services['backOffice'];
beforeAll(async () => {
  ctx = await createTestContext();
  backOffice = testServices(ctx.database).backOffice;
});
afterAll(async () => ctx?.close());

const operator = { type: 'operator' as const, id: 'cli:test' };
const DAY_MS = 86_400_000;

/** A clock the test moves; the review jobs read it. */
function movableClock(start = new Date()) {
  let now = start;
  return { now: () => now, set: (next: Date) => (now = next) };
}

type Json = Record<string, unknown> & { review: { status: string; next_review_at: string | null; reasons: string[] } };

async function verifiedPerson(org: TestOrg, options: { country?: string } = {}) {
  const person = await createCustomer(ctx, org);
  const started = await ctx.request('POST', `/v1/customers/${person.id}/kyc`, { key: org.key });
  expect(started.statusCode, started.body).toBe(200);
  await backOffice.submit(org.id, person.id, operator);
  const dto = (await backOffice.verdict(org.id, person.id, { result: 'VERIFIED', country: options.country ?? 'AUS' }, operator)) as Json;
  return { id: person.id, dto };
}

async function verifiedEntity(org: TestOrg) {
  const entity = await createEntity(ctx, org);
  const started = await ctx.request('POST', `/v1/entities/${entity.id}/kyb`, { key: org.key, body: { method: 'manual' } });
  expect(started.statusCode, started.body).toBe(200);
  const dto = (await backOffice.verdict(org.id, entity.id, { result: 'VERIFIED' }, operator)) as Json;
  return { id: entity.id, dto };
}

const getCustomer = async (org: TestOrg, id: string) => (await ctx.request('GET', `/v1/customers/${id}`, { key: org.key })).json<Json>();
const getEntity = async (org: TestOrg, id: string) => (await ctx.request('GET', `/v1/entities/${id}`, { key: org.key })).json<Json>();
const patchRisk = (org: TestOrg, id: string, risk: Record<string, boolean>) =>
  ctx.request('PATCH', `/v1/customers/${id}`, { key: org.key, body: { risk } });
const reviewDueEvents = (orgId: string) => eventsOf(ctx, orgId, 'customer.review_due');

describe('a review is scheduled when verification reaches VERIFIED', () => {
  it('when a person is verified, the review is SCHEDULED at kyc_completed_at plus the rating interval, with no reasons', async () => {
    const org = await ctx.createOrg();
    const before = await createCustomer(ctx, org);
    expect((await getCustomer(org, before.id)).review).toEqual({
      status: 'NOT_SCHEDULED',
      next_review_at: null,
      last_completed_at: null,
      reasons: [],
    });
    const { id, dto } = await verifiedPerson(org);
    const completedAt = new Date(dto.kyc_completed_at as string);
    expect(dto.review).toEqual({
      status: 'SCHEDULED',
      next_review_at: addMonths(completedAt, 36).toISOString(),
      last_completed_at: null,
      reasons: [],
    });
    expect((await getCustomer(org, id)).review).toEqual(dto.review);
    expect(await reviewDueEvents(org.id)).toHaveLength(0);
  });

  it("when the organisation's policy sets another LOW interval, a verification schedules at that interval", async () => {
    const org = await ctx.createOrg();
    const put = await ctx.request('PUT', '/v1/due-diligence-policy', {
      key: org.key,
      body: { reviewIntervalMonths: { LOW: 6, MEDIUM: 6, HIGH: 3 } },
    });
    expect(put.statusCode, put.body).toBe(200);
    const { dto } = await verifiedPerson(org);
    expect(dto.review.next_review_at).toBe(addMonths(new Date(dto.kyc_completed_at as string), 6).toISOString());
  });
});

describe('triggers bring a scheduled review forward', () => {
  it('when the risk rating rises, the review becomes DUE now with RISK_INCREASED and customer.review_due fires once', async () => {
    const org = await ctx.createOrg();
    const { id } = await verifiedPerson(org);
    const rose = await patchRisk(org, id, { handlesCashOrCrypto: true, operatesCashBusiness: true });
    expect(rose.statusCode, rose.body).toBe(200);
    const review = rose.json<Json>().review;
    expect(review.status).toBe('DUE');
    expect(review.reasons).toEqual(['RISK_INCREASED']);
    expect(Math.abs(new Date(review.next_review_at!).getTime() - Date.now())).toBeLessThan(60_000);
    const events = await reviewDueEvents(org.id);
    expect(events).toHaveLength(1);
    expect((events[0]!.document.data.customer as Json).review.status).toBe('DUE');

    // A second rise while due records nothing new and fires nothing more.
    const again = await patchRisk(org, id, { unusualTransactions: true });
    expect(again.json<Json>().review).toEqual(review);
    expect(await reviewDueEvents(org.id)).toHaveLength(1);
  });

  it('when the risk rating falls, the date moves by the policy and the review never becomes due', async () => {
    const org = await ctx.createOrg();
    const { id } = await verifiedPerson(org);
    // A record rated HIGH and scheduled at HIGH's interval (set directly: a rise through the API would make it due).
    const verified = await customerRow(ctx, id);
    await ctx.database.db
      .update(customers)
      .set({
        riskRating: 'HIGH',
        riskAnswers: { handlesCashOrCrypto: true, operatesCashBusiness: true, unusualTransactions: true },
        nextReviewAt: addMonths(verified.kycCompletedAt!, 12),
      })
      .where(eq(customers.id, id));
    const high = await customerRow(ctx, id);
    const fell = await patchRisk(org, id, { unusualTransactions: false, operatesCashBusiness: false });
    expect(fell.statusCode, fell.body).toBe(200);
    const review = fell.json<Json>().review;
    expect(review.status).toBe('SCHEDULED');
    expect(review.reasons).toEqual([]);
    expect(review.next_review_at).toBe(addMonths(high.kycCompletedAt!, 36).toISOString());
    expect(await reviewDueEvents(org.id)).toHaveLength(0);
  });

  it('when the AML status becomes NEEDS_REVIEW, the review becomes DUE with AML_REVIEW', async () => {
    const org = await ctx.createOrg();
    const { id } = await verifiedPerson(org);
    await backOffice.setAml(org.id, id, { status: 'NEEDS_REVIEW', adverseMedia: true }, operator);
    const dto = await getCustomer(org, id);
    expect(dto.review).toMatchObject({ status: 'DUE', reasons: ['AML_REVIEW'] });
    expect(await reviewDueEvents(org.id)).toHaveLength(1);
    expect(await auditOf(ctx, org.id, id, 'aml.screened')).toHaveLength(1);
  });

  it('when a designated service added raises the rating, the review becomes DUE with SERVICES_CHANGED', async () => {
    const org = await ctx.createOrg();
    const { id } = await verifiedPerson(org);
    const put = await ctx.request('PUT', `/v1/customers/${id}/designated-services`, {
      key: org.key,
      body: { service_codes: ['FIN-CRYPTO'] },
    });
    expect(put.statusCode, put.body).toBe(200);
    expect(put.json<Json>().review).toMatchObject({ status: 'DUE', reasons: ['SERVICES_CHANGED'] });
  });

  it('when a designated service is added that leaves the rating where it was, the review stays scheduled', async () => {
    const org = await ctx.createOrg();
    const { id, dto } = await verifiedPerson(org);
    const put = await ctx.request('PUT', `/v1/customers/${id}/designated-services`, {
      key: org.key,
      body: { service_codes: ['FIN-ADVISORY'] },
    });
    expect(put.json<Json>().review).toEqual(dto.review);
  });

  it("when an entity's beneficial owners change, its review becomes DUE with OWNERS_CHANGED", async () => {
    const org = await ctx.createOrg();
    const { id } = await verifiedEntity(org);
    const owner = {
      fullName: 'Olive Owner',
      email: 'olive@example.test',
      holderType: 'INDIVIDUAL',
      roleTypes: ['SHAREHOLDER'],
      percentageHeld: 40,
      kycRequired: false,
    };
    const added = await ctx.request('POST', `/v1/entities/${id}/ubos`, { key: org.key, body: { owners: [owner] } });
    expect(added.statusCode, added.body).toBe(200);
    expect((await getEntity(org, id)).review).toMatchObject({ status: 'DUE', reasons: ['OWNERS_CHANGED'] });
    expect(await reviewDueEvents(org.id)).toHaveLength(1);
  });
});

describe('enhanced due diligence is derived and explained', () => {
  it('when nothing calls for it, edd.required is false with no reasons', async () => {
    const org = await ctx.createOrg();
    const { dto } = await verifiedPerson(org);
    expect(dto.edd).toEqual({ required: false, reasons: [] });
  });

  it('when the person is a PEP with a decisive answer and a verified country on the list, the reasons come in their fixed order', async () => {
    const org = await ctx.createOrg();
    const { id } = await verifiedPerson(org, { country: 'PRK' });
    await backOffice.setAml(org.id, id, { status: 'NEEDS_REVIEW', pep: true }, operator);
    await patchRisk(org, id, { unexplainedWealth: true });
    expect((await getCustomer(org, id)).edd).toEqual({
      required: true,
      reasons: ['HIGH_RISK', 'PEP', 'UNEXPLAINED_WEALTH', 'HIGH_RISK_JURISDICTION'],
    });
  });

  it("when an entity is formed in a country on the organisation's list, it needs EDD from creation", async () => {
    const org = await ctx.createOrg();
    const created = await ctx.request('POST', '/v1/entities', {
      key: org.key,
      body: {
        type: 'COMPANY',
        name: 'Pyongyang Trading Co',
        origin: 'INTERNATIONAL',
        countryOfFormation: 'PRK',
        registrationNumber: 'P-1',
      },
    });
    expect(created.statusCode, created.body).toBe(201);
    expect(created.json<Json>().edd).toEqual({ required: true, reasons: ['HIGH_RISK_JURISDICTION'] });
  });
});

describe('the review sweep', () => {
  it('when a scheduled date passes, one sweep makes the review DUE (SCHEDULED_DATE) and fires once; later, OVERDUE without another event', async () => {
    const org = await ctx.createOrg();
    const { id, dto } = await verifiedPerson(org);
    const clock = movableClock();
    const jobs = testServices(ctx.database, { clock }).reviewJobs;
    await jobs.sweep();
    expect((await getCustomer(org, id)).review.status).toBe('SCHEDULED');

    const dueAt = new Date(dto.review.next_review_at!);
    clock.set(new Date(dueAt.getTime() + 1000));
    await jobs.sweep();
    await jobs.sweep();
    expect((await getCustomer(org, id)).review).toMatchObject({ status: 'DUE', reasons: ['SCHEDULED_DATE'] });
    const events = await reviewDueEvents(org.id);
    expect(events).toHaveLength(1);
    expect((events[0]!.document.data.customer as Json).review).toMatchObject({ status: 'DUE', reasons: ['SCHEDULED_DATE'] });

    clock.set(new Date(dueAt.getTime() + 29 * DAY_MS));
    await jobs.sweep();
    expect((await getCustomer(org, id)).review.status).toBe('DUE');
    clock.set(new Date(dueAt.getTime() + 30 * DAY_MS + 1000));
    await jobs.sweep();
    expect((await getCustomer(org, id)).review).toMatchObject({ status: 'OVERDUE', reasons: ['SCHEDULED_DATE'] });
    expect(await reviewDueEvents(org.id)).toHaveLength(1);
    expect(await auditOf(ctx, org.id, id, 'customer.review_due')).toHaveLength(1);
    expect(await auditOf(ctx, org.id, id, 'customer.review_overdue')).toHaveLength(1);
  });

  it('when 1,000 reviews fall due at once and 3 instances sweep together, each fires exactly one customer.review_due', async () => {
    const org = await ctx.createOrg();
    await ctx.database.pool.query(
      `INSERT INTO customers (org_id, kind, type, name, kyc_status, kyc_completed_at, added_via, review_status, next_review_at)
       SELECT $1, 'individual', 'INDIVIDUAL', 'Person ' || n, 'VERIFIED', now() - interval '3 years', 'INTEGRATION', 'SCHEDULED', now() - interval '1 hour'
         FROM generate_series(1, 1000) AS n`,
      [org.id],
    );
    const instances = [0, 1, 2].map(() => testServices(ctx.database, { clock: { now: () => new Date() } }).reviewJobs);
    const swept = await Promise.all(instances.map((jobs) => jobs.sweep()));
    expect(swept.reduce((sum, result) => sum + result.due, 0)).toBe(1000);
    const events = await reviewDueEvents(org.id);
    expect(events).toHaveLength(1000);
    expect(new Set(events.map((event) => event.customerId)).size).toBe(1000);
    const { rows } = await ctx.database.pool.query(`SELECT review_status, count(*)::int AS n FROM customers WHERE org_id = $1 GROUP BY 1`, [
      org.id,
    ]);
    expect(rows).toEqual([{ review_status: 'DUE', n: 1000 }]);
  });

  it('when the service was down across a due date, starting it fires the review_due once without waiting for the next tick', async () => {
    const org = await ctx.createOrg();
    const { id } = await verifiedPerson(org);
    await ctx.database.db
      .update(customers)
      .set({ nextReviewAt: new Date(Date.now() - 2 * DAY_MS) })
      .where(eq(customers.id, id));
    const jobs = await startBackgroundJobs({
      config: ctx.config,
      database: ctx.database,
      logger: pino({ level: 'silent' }),
      webhookWorker: false,
    });
    try {
      await expect.poll(async () => (await reviewDueEvents(org.id)).length, { timeout: 20_000, interval: 100 }).toBe(1);
    } finally {
      await jobs.stop();
    }
    const restarted = await startBackgroundJobs({
      config: ctx.config,
      database: ctx.database,
      logger: pino({ level: 'silent' }),
      webhookWorker: false,
    });
    try {
      await expect
        .poll(
          async () =>
            (await ctx.database.pool.query(`SELECT 1 FROM pgboss.job WHERE name = 'review-sweep' AND state = 'completed'`)).rowCount,
          { timeout: 20_000, interval: 100 },
        )
        .toBeGreaterThanOrEqual(2);
    } finally {
      await restarted.stop();
    }
    expect(await reviewDueEvents(org.id)).toHaveLength(1);
    expect((await getCustomer(org, id)).review.status).toBe('DUE');
  });
});

describe('a policy change re-dates reviews in the background', () => {
  it('when the intervals change, the PUT says what will move, and the job moves every date in batches with its progress visible', async () => {
    const org = await ctx.createOrg();
    const verified = [await verifiedPerson(org), await verifiedPerson(org), await verifiedPerson(org)];
    await createCustomer(ctx, org);
    const put = await ctx.request('PUT', '/v1/due-diligence-policy', {
      key: org.key,
      body: { reviewIntervalMonths: { LOW: 12, MEDIUM: 12, HIGH: 6 } },
    });
    expect(put.statusCode, put.body).toBe(200);
    expect(put.json().redating).toEqual({
      status: 'QUEUED',
      scheduled_reviews: 3,
      records_total: 4,
      records_checked: 0,
      reviews_moved: 0,
      finished_at: null,
    });
    // Nothing moved inside the request.
    expect((await getCustomer(org, verified[0]!.id)).review.next_review_at).toBe(verified[0]!.dto.review.next_review_at);

    const jobs = testServices(ctx.database, { reviewBatchSize: 2 }).reviewJobs;
    const { rows } = await ctx.database.pool.query<{ generation: number }>(
      `SELECT generation FROM due_diligence_policies WHERE org_id = $1`,
      [org.id],
    );
    const result = await jobs.redate(org.id, rows[0]!.generation);
    expect(result).toEqual({ checked: 4, moved: 3 });
    for (const person of verified) {
      const review = (await getCustomer(org, person.id)).review;
      expect(review.next_review_at).toBe(addMonths(new Date(person.dto.kyc_completed_at as string), 12).toISOString());
    }
    const after = (await ctx.request('GET', '/v1/due-diligence-policy', { key: org.key })).json();
    expect(after.redating).toMatchObject({ status: 'DONE', records_total: 4, records_checked: 4, reviews_moved: 3 });
    expect(await reviewDueEvents(org.id)).toHaveLength(0);
  });

  it('when a newer PUT replaced the generation, the older re-dating stops without moving anything', async () => {
    const org = await ctx.createOrg();
    const person = await verifiedPerson(org);
    await ctx.request('PUT', '/v1/due-diligence-policy', {
      key: org.key,
      body: { reviewIntervalMonths: { LOW: 12, MEDIUM: 12, HIGH: 6 } },
    });
    await ctx.request('PUT', '/v1/due-diligence-policy', {
      key: org.key,
      body: { reviewIntervalMonths: { LOW: 24, MEDIUM: 12, HIGH: 6 } },
    });
    const updatedEvents = (await eventsOf(ctx, org.id, 'customer.updated')).length;
    const jobs = testServices(ctx.database).reviewJobs;
    const { rows } = await ctx.database.pool.query<{ generation: number }>(
      `SELECT generation FROM due_diligence_policies WHERE org_id = $1`,
      [org.id],
    );
    expect(await jobs.redate(org.id, rows[0]!.generation - 1)).toBeUndefined();
    expect((await getCustomer(org, person.id)).review.next_review_at).toBe(person.dto.review.next_review_at);
    expect(await jobs.redate(org.id, rows[0]!.generation)).toEqual({ checked: 1, moved: 1 });
    // Re-dating tells webhooks nothing record by record: the policy's own audit row says why dates moved.
    expect(await eventsOf(ctx, org.id, 'customer.updated')).toHaveLength(updatedEvents);
    expect(await auditOf(ctx, org.id, person.id, 'customer.review_redated')).toHaveLength(1);
  });
});
