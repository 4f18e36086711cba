import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Services } from '../../services.js';
import {
  createTestContext,
  TEST_LINK_ENCRYPTION_KEY,
  testServices,
  type TestContext,
  type TestOrg,
} from '../../../test/helpers/harness.js';
import { runSvcInProcess } from '../../../test/helpers/cli-in-process.js';

type Json = Record<string, any>;

let ctx: TestContext;
let services: Services;
beforeAll(async () => {
  ctx = await createTestContext();
  services = testServices(ctx.database);
});
afterAll(async () => ctx?.close());

const operator = { type: 'operator' as const, id: 'cli:test' };

async function svc(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const { code, stdout, stderr } = await runSvcInProcess(args, {
    DATABASE_URL: ctx.databaseUrl,
    LOG_LEVEL: 'silent',
    LINK_ENCRYPTION_KEY: TEST_LINK_ENCRYPTION_KEY,
  });
  return { code: code ?? 1, stdout, stderr };
}

/** Runs a command that must succeed and returns its one JSON document. */
async function svcJson(...args: string[]): Promise<any> {
  const result = await svc(...args);
  expect(result.code, `svc ${args.join(' ')}: ${result.stderr}`).toBe(0);
  return JSON.parse(result.stdout);
}

let sequence = 0;
async function create(org: TestOrg, path: '/v1/customers' | '/v1/entities', body: Json): Promise<string> {
  const response = await ctx.request('POST', path, { key: org.key, body });
  expect(response.statusCode, response.body).toBe(201);
  return response.json<{ id: string }>().id;
}
const person = (org: TestOrg, externalId?: string) => {
  sequence += 1;
  return create(org, '/v1/customers', { fullName: `Person ${sequence}`, email: `person.${sequence}@example.com`, externalId });
};
const entity = (org: TestOrg) => {
  sequence += 1;
  return create(org, '/v1/entities', {
    type: 'COMPANY',
    name: `Entity ${sequence} Pty Ltd`,
    contact: { fullName: `Contact ${sequence}`, email: `contact.${sequence}@example.com` },
  });
};

/** Verified through the back office (kyc submit and verdict): the review is SCHEDULED. */
async function verified(org: TestOrg, id: string, kind: 'individual' | 'entity'): Promise<string> {
  if (kind === 'individual') {
    expect((await ctx.request('POST', `/v1/customers/${id}/kyc`, { key: org.key })).statusCode).toBe(200);
    await services.backOffice.submit(org.id, id, operator);
  } else {
    expect((await ctx.request('POST', `/v1/entities/${id}/kyb`, { key: org.key, body: { method: 'manual' } })).statusCode).toBe(200);
  }
  await services.backOffice.verdict(org.id, id, { result: 'VERIFIED' }, operator);
  return id;
}

async function reviewDueEvents(orgId: string, customerId: string) {
  const { rows } = await ctx.database.pool.query<{ payload: string }>(
    `SELECT payload FROM outbox_events WHERE org_id = $1 AND customer_id = $2 AND type = 'customer.review_due'`,
    [orgId, customerId],
  );
  return rows.map((row) => JSON.parse(row.payload) as { data: { customer: Json } });
}

describe('svc review simulate-due', () => {
  it('when the record is verified, its review becomes DUE now for SCHEDULED_DATE, customer.review_due carries the DTO, and the change is audited', async () => {
    const org = await ctx.createOrg();
    const id = await verified(org, await person(org, 'crm-simulate-1'), 'individual');
    const started = Date.now();
    const dto = await svcJson('review', 'simulate-due', '--org', org.id, '--customer', 'crm-simulate-1');
    expect(dto).toMatchObject({ id, review: { status: 'DUE', reasons: ['SCHEDULED_DATE'], last_completed_at: null } });
    const dueAt = new Date(dto.review.next_review_at).getTime();
    expect(dueAt).toBeGreaterThanOrEqual(started - 1000);
    expect(dueAt).toBeLessThanOrEqual(Date.now());

    const fetched = await ctx.request('GET', `/v1/customers/${id}`, { key: org.key });
    expect(fetched.json().review).toEqual(dto.review);
    const events = await reviewDueEvents(org.id, id);
    expect(events).toHaveLength(1);
    expect(events[0]!.data.customer.review).toEqual(dto.review);
    // As the sweep does on a review's date: the one event, no customer.updated beside it.
    const { rows: updates } = await ctx.database.pool.query(
      `SELECT 1 FROM outbox_events WHERE org_id = $1 AND customer_id = $2 AND type = 'customer.updated' AND created_at >= $3`,
      [org.id, id, new Date(started)],
    );
    expect(updates).toEqual([]);
    const { rows: audits } = await ctx.database.pool.query(
      `SELECT actor_type, actor_id, subject_type FROM audit_log WHERE org_id = $1 AND subject_id = $2 AND action = 'customer.review_due_simulated'`,
      [org.id, id],
    );
    expect(audits).toEqual([{ actor_type: 'operator', actor_id: expect.stringMatching(/^cli:/), subject_type: 'customer' }]);
  });

  it('when --customer names an entity, it works the same and prints the entity DTO', async () => {
    const org = await ctx.createOrg();
    const id = await verified(org, await entity(org), 'entity');
    const dto = await svcJson('review', 'simulate-due', '--org', org.id, '--customer', id);
    expect(dto).toMatchObject({ id, review: { status: 'DUE', reasons: ['SCHEDULED_DATE'] } });
    expect(dto.kyb_status ?? dto.kyc_status).toBe('VERIFIED');
    expect(await reviewDueEvents(org.id, id)).toHaveLength(1);
  });

  it('when the record was never verified (NOT_SCHEDULED), it exits 1 saying so and changes nothing', async () => {
    const org = await ctx.createOrg();
    const id = await person(org);
    const result = await svc('review', 'simulate-due', '--org', org.id, '--customer', id);
    expect(result.code).toBe(1);
    expect(result.stdout).toBe('');
    expect(result.stderr).toMatch(/no review to make due/);
    expect((await ctx.request('GET', `/v1/customers/${id}`, { key: org.key })).json().review.status).toBe('NOT_SCHEDULED');
    expect(await reviewDueEvents(org.id, id)).toEqual([]);
  });

  it('when the review is already due, it prints the record unchanged, writes nothing and sends no second customer.review_due', async () => {
    const org = await ctx.createOrg();
    const id = await verified(org, await person(org), 'individual');
    const first = await svcJson('review', 'simulate-due', '--org', org.id, '--customer', id);
    const again = await svcJson('review', 'simulate-due', '--org', org.id, '--customer', id);
    expect(again).toEqual(first);
    expect(await reviewDueEvents(org.id, id)).toHaveLength(1);
    const { rows } = await ctx.database.pool.query(
      `SELECT 1 FROM audit_log WHERE org_id = $1 AND subject_id = $2 AND action = 'customer.review_due_simulated'`,
      [org.id, id],
    );
    expect(rows).toHaveLength(1);
  });

  it('when the organisation or the record is unknown, it exits 1 naming what was not found', async () => {
    const org = await ctx.createOrg();
    const unknownOrg = await svc('review', 'simulate-due', '--org', randomUUID(), '--customer', 'crm-x');
    expect(unknownOrg.code).toBe(1);
    expect(unknownOrg.stderr).toMatch(/Organisation not found/);
    const notAnOrg = await svc('review', 'simulate-due', '--org', 'not-a-uuid', '--customer', 'crm-x');
    expect(notAnOrg.stderr).toMatch(/Organisation not found/);
    const unknownRecord = await svc('review', 'simulate-due', '--org', org.id, '--customer', 'crm-nobody');
    expect(unknownRecord.code).toBe(1);
    expect(unknownRecord.stderr).toMatch(/Customer or entity not found/);
  });
});

describe('svc review due', () => {
  it('when reviews are DUE or OVERDUE, it prints those records as DTOs, individuals and entities together, the longest due first', async () => {
    const org = await ctx.createOrg();
    const [a, b, c, scheduled] = [
      await verified(org, await person(org), 'individual'),
      await verified(org, await person(org), 'individual'),
      await verified(org, await entity(org), 'entity'),
      await verified(org, await person(org), 'individual'),
    ];
    await person(org); // never verified: NOT_SCHEDULED
    for (const id of [a, b, c]) await services.reviews.simulateDue(org.id, id, operator);
    // b has been due longest (and is OVERDUE by now), then the entity c, then a.
    await ctx.database.pool.query(
      `UPDATE customers SET review_status = 'OVERDUE', next_review_at = now() - interval '40 days' WHERE org_id = $1 AND id = $2`,
      [org.id, b],
    );
    await ctx.database.pool.query(`UPDATE customers SET next_review_at = now() - interval '3 days' WHERE org_id = $1 AND id = $2`, [
      org.id,
      c,
    ]);

    const printed = await svcJson('review', 'due', '--org', org.id);
    expect(printed.map((dto: Json) => dto.id)).toEqual([b, c, a]);
    expect(printed.map((dto: Json) => dto.review.status)).toEqual(['OVERDUE', 'DUE', 'DUE']);
    expect(printed[1]).toEqual((await ctx.request('GET', `/v1/entities/${c}`, { key: org.key })).json());
    expect(printed[2]).toEqual((await ctx.request('GET', `/v1/customers/${a}`, { key: org.key })).json());
    expect(printed.map((dto: Json) => dto.id)).not.toContain(scheduled);

    expect((await svcJson('review', 'due', '--org', org.id, '--limit', '2')).map((dto: Json) => dto.id)).toEqual([b, c]);
  });

  it('when a review is recorded, the record leaves the list', async () => {
    const org = await ctx.createOrg();
    const id = await verified(org, await person(org), 'individual');
    await services.reviews.simulateDue(org.id, id, operator);
    expect((await svcJson('review', 'due', '--org', org.id)).map((dto: Json) => dto.id)).toEqual([id]);
    const response = await ctx.request('POST', `/v1/customers/${id}/reviews`, {
      key: org.key,
      body: { outcome: 'NO_CHANGE', reviewer: 'Sam Officer' },
    });
    expect(response.statusCode, response.body).toBe(201);
    expect(await svcJson('review', 'due', '--org', org.id)).toEqual([]);
  });

  it("when nothing is due, it prints []; another organisation's due reviews are never shown", async () => {
    const [org, other] = [await ctx.createOrg(), await ctx.createOrg()];
    const theirs = await verified(other, await person(other), 'individual');
    await services.reviews.simulateDue(other.id, theirs, operator);
    expect(await svcJson('review', 'due', '--org', org.id)).toEqual([]);
  });

  it('when the organisation is unknown or --limit is out of range, it exits 1 saying why', async () => {
    const unknown = await svc('review', 'due', '--org', randomUUID());
    expect(unknown.code).toBe(1);
    expect(unknown.stderr).toMatch(/Organisation not found/);
    const org = await ctx.createOrg();
    const tooMany = await svc('review', 'due', '--org', org.id, '--limit', '1001');
    expect(tooMany.code).toBe(1);
    expect(tooMany.stderr).toMatch(/limit: Must be a whole number from 1 to 1000/);
  });
});
