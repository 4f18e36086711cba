import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { createDatabase, type Database } from '../../src/db/client.js';
import { createEventsFeedSealer, type EventsFeedSealer } from '../../src/modules/events/events-feed.sealer.js';
import { createOutboxRepository, type FeedEventType } from '../../src/shared/outbox.js';
import { createEntity } from '../entities/entity-test-helpers.js';
import { createTestContext, type TestContext, type TestOrg, testServices } from '../helpers/harness.js';

type Event = { id: string; type: string; created: string; data: Record<string, unknown> };
type Page = { object: 'list'; data: Event[]; has_more: boolean; next_cursor: string | null; resume_cursor: string; limit: number };

let ctx: TestContext;
let sealer: EventsFeedSealer;
beforeAll(async () => {
  ctx = await createTestContext();
  // Sealed on demand (sealOnce), so each test decides what is sealed when.
  sealer = createEventsFeedSealer({ database: ctx.database, pollIntervalMs: 60_000 });
});
afterAll(async () => {
  await sealer?.stop();
  await ctx?.close();
});

/** Writes one event in a transaction of its own, as a change would. */
async function recordEvent(
  orgId: string,
  options: { type?: FeedEventType; customerId?: string | null; database?: Database } = {},
): Promise<string> {
  const database = options.database ?? ctx.database;
  const outbox = createOutboxRepository();
  const id = await database.transaction((tx) =>
    outbox.record(
      { orgId, type: options.type ?? 'webhook.test', customerId: options.customerId ?? null, customer: null, data: { note: 'test' } },
      tx,
    ),
  );
  // Events stamped in the same millisecond have no order between them (the sealer orders by
  // created_at, kept to the millisecond, then by id): wait until the clock has moved past this one,
  // so the order a test writes in is the order the feed shows.
  const written = Date.now();
  while (Date.now() < written + 2) await new Promise((resolve) => setImmediate(resolve));
  return id;
}

async function list(org: TestOrg, query: Record<string, string> = {}) {
  return ctx.request('GET', '/v1/events', { key: org.key, query });
}

async function page(org: TestOrg, query: Record<string, string> = {}): Promise<Page> {
  const response = await list(org, query);
  expect(response.statusCode, response.body).toBe(200);
  return response.json<Page>();
}

/** Every event from `cursor` on (the start when undefined), following next_cursor until null; returns them and the last resume_cursor. */
async function walk(org: TestOrg, cursor?: string, query: Record<string, string> = {}): Promise<{ events: Event[]; cursor: string }> {
  const events: Event[] = [];
  let next: string | null | undefined = cursor;
  for (;;) {
    const body = await page(org, { ...query, limit: '100', ...(next ? { cursor: next } : {}) });
    events.push(...body.data);
    next = body.next_cursor;
    if (next === null) return { events, cursor: body.resume_cursor };
  }
}

async function positionsOf(orgId: string): Promise<Array<{ id: string; position: number | null }>> {
  const { rows } = await ctx.database.pool.query<{ id: string; position: string | null }>(
    'SELECT id, position FROM outbox_events WHERE org_id = $1 ORDER BY position NULLS LAST, created_at',
    [orgId],
  );
  return rows.map((row) => ({ id: row.id, position: row.position === null ? null : Number(row.position) }));
}

describe('GET /v1/events scopes and isolation', () => {
  it('when the key lacks events:read, both routes answer 403 forbidden_scope naming it; with it, 200', async () => {
    const org = await ctx.createOrg();
    const id = await recordEvent(org.id);
    await sealer.sealOnce();
    const narrow = await ctx.createKey(org.id, { scopes: ['customers:read', 'customers:write'] });
    for (const url of ['/v1/events', `/v1/events/${id}`]) {
      const refused = await ctx.request('GET', url, { key: narrow.key });
      expect(refused.statusCode, refused.body).toBe(403);
      expect(refused.json().error.code).toBe('forbidden_scope');
      expect(refused.json().error.details.required_scope).toBe('events:read');
    }
    const reader = await ctx.createKey(org.id, { scopes: ['events:read'] });
    expect((await ctx.request('GET', '/v1/events', { key: reader.key })).statusCode).toBe(200);
    expect((await ctx.request('GET', `/v1/events/${id}`, { key: reader.key })).statusCode).toBe(200);
  });

  it("when another organisation's event id or customer is asked for, the answer is 404, and its events never appear in the list", async () => {
    const mine = await ctx.createOrg();
    const theirs = await ctx.createOrg();
    const own = await recordEvent(mine.id);
    const foreign = await recordEvent(theirs.id);
    const theirEntity = await createEntity(ctx, theirs, { externalId: 'their-entity' });
    await sealer.sealOnce();

    const byId = await ctx.request('GET', `/v1/events/${foreign}`, { key: mine.key });
    expect(byId.statusCode).toBe(404);
    expect(byId.json().error.code).toBe('not_found');
    expect((await walk(mine)).events.map((event) => event.id)).toEqual([own]);
    for (const ref of [theirEntity.id as string, 'their-entity']) {
      const filtered = await list(mine, { customer_id: ref });
      expect(filtered.statusCode, filtered.body).toBe(404);
      expect(filtered.json().error.code).toBe('not_found');
    }
  });

  it('when the id is unknown or not a UUID, GET /v1/events/{id} answers 404 not_found', async () => {
    const org = await ctx.createOrg();
    for (const id of ['7b3c9d4e-1f2a-4b5c-8d6e-9f0a1b2c3d4e', 'not-a-uuid']) {
      const response = await ctx.request('GET', `/v1/events/${id}`, { key: org.key });
      expect(response.statusCode).toBe(404);
      expect(response.json().error.code).toBe('not_found');
    }
  });
});

describe('GET /v1/events content and paging', () => {
  it('when a customer of the integration changes through the API, its customer.updated is in the feed exactly as the webhook envelope, and GET by id returns the same', async () => {
    const org = await ctx.createOrg();
    const created = await ctx.request('POST', '/v1/customers', {
      key: org.key,
      body: { externalId: 'feed-1', fullName: 'Ana Silva', email: 'ana@example.com' },
    });
    expect(created.statusCode, created.body).toBe(201);
    const patched = await ctx.request('PATCH', '/v1/customers/feed-1', { key: org.key, body: { fullName: 'Ana M. Silva' } });
    expect(patched.statusCode, patched.body).toBe(200);
    await sealer.sealOnce();

    const { events } = await walk(org);
    expect(events).toHaveLength(1);
    const [event] = events;
    const { rows } = await ctx.database.pool.query<{ payload: string }>('SELECT payload FROM outbox_events WHERE org_id = $1 AND id = $2', [
      org.id,
      event!.id,
    ]);
    expect(event).toEqual(JSON.parse(rows[0]!.payload));
    expect(Object.keys(event!).sort()).toEqual(['created', 'data', 'id', 'type']);
    expect(event!.type).toBe('customer.updated');
    expect((event!.data.customer as { full_name: string }).full_name).toBe('Ana M. Silva');
    const one = await ctx.request('GET', `/v1/events/${event!.id}`, { key: org.key });
    expect(one.statusCode).toBe(200);
    expect(one.json()).toEqual(event);
  });

  it('when limit is given it is applied and echoed; has_more is true only while another page exists, and next_cursor, which fetches it, is null on the last page', async () => {
    const org = await ctx.createOrg();
    const empty = await page(org);
    expect(empty).toMatchObject({ object: 'list', data: [], has_more: false, next_cursor: null, limit: 50 });
    expect(typeof empty.resume_cursor).toBe('string');

    const ids: string[] = [];
    for (let index = 0; index < 5; index += 1) ids.push(await recordEvent(org.id));
    await sealer.sealOnce();

    // The start-of-feed resume_cursor of the empty page resumes at the first event.
    const first = await page(org, { limit: '2', cursor: empty.resume_cursor });
    expect(first.limit).toBe(2);
    expect(first.data.map((event) => event.id)).toEqual(ids.slice(0, 2));
    expect(first.has_more).toBe(true);
    // While another page exists, next_cursor fetches it, and is where a poll would resume.
    expect(first.next_cursor).toBe(first.resume_cursor);
    const second = await page(org, { limit: '3', cursor: first.next_cursor! });
    expect(second.data.map((event) => event.id)).toEqual(ids.slice(2, 5));
    expect(second).toMatchObject({ has_more: false, next_cursor: null });
  });

  it('when the last page is read, next_cursor is null and resume_cursor is not; polling with resume_cursor later returns only the newer events', async () => {
    const org = await ctx.createOrg();
    const older = [await recordEvent(org.id), await recordEvent(org.id), await recordEvent(org.id)];
    await sealer.sealOnce();
    const last = await page(org, { limit: '3' });
    expect(last.data.map((event) => event.id)).toEqual(older);
    expect(last).toMatchObject({ has_more: false, next_cursor: null });
    expect(last.resume_cursor).toEqual(expect.any(String));

    // Nothing new yet: an empty page hands back the same resume_cursor, still with next_cursor null.
    const atEnd = await page(org, { cursor: last.resume_cursor });
    expect(atEnd).toMatchObject({ data: [], has_more: false, next_cursor: null, resume_cursor: last.resume_cursor });
    const newer = [await recordEvent(org.id), await recordEvent(org.id)];
    await sealer.sealOnce();
    const poll = await page(org, { cursor: atEnd.resume_cursor });
    expect(poll.data.map((event) => event.id)).toEqual(newer);
    expect(poll).toMatchObject({ has_more: false, next_cursor: null });
    expect(poll.resume_cursor).not.toBe(last.resume_cursor);
  });

  it('when filtering by type, customer_id (UUID or external_id, individual or entity) and created_after/created_before, only matching events come back and the cursor passes the filters through', async () => {
    const org = await ctx.createOrg();
    const person = await ctx.request('POST', '/v1/customers', {
      key: org.key,
      body: { externalId: 'p-1', fullName: 'Li Wei', email: 'li@example.com' },
    });
    const personId = person.json().id as string;
    const entity = await createEntity(ctx, org, { externalId: 'e-1' });
    const aboutPerson = [
      await recordEvent(org.id, { type: 'customer.updated', customerId: personId }),
      await recordEvent(org.id, { type: 'customer.kyc_completed', customerId: personId }),
      await recordEvent(org.id, { type: 'customer.updated', customerId: personId }),
    ];
    const aboutEntity = await recordEvent(org.id, { type: 'customer.updated', customerId: entity.id as string });
    const test = await recordEvent(org.id, { type: 'webhook.test' });
    await sealer.sealOnce();

    expect((await walk(org, undefined, { type: 'webhook.test' })).events.map((event) => event.id)).toEqual([test]);
    expect((await walk(org, undefined, { type: 'customer.kyc_completed, webhook.test' })).events.map((event) => event.id)).toEqual([
      aboutPerson[1],
      test,
    ]);
    expect((await walk(org, undefined, { customer_id: 'p-1' })).events.map((event) => event.id)).toEqual(aboutPerson);
    expect((await walk(org, undefined, { customer_id: personId, type: 'customer.updated' })).events.map((event) => event.id)).toEqual([
      aboutPerson[0],
      aboutPerson[2],
    ]);
    expect((await walk(org, undefined, { customer_id: entity.id as string })).events.map((event) => event.id)).toEqual([aboutEntity]);
    expect((await walk(org, undefined, { customer_id: 'e-1' })).events.map((event) => event.id)).toEqual([aboutEntity]);

    // Paging one by one through a filter keeps to it.
    const first = await page(org, { customer_id: 'p-1', limit: '1' });
    const rest = await walk(org, first.resume_cursor, { customer_id: 'p-1' });
    expect([...first.data, ...rest.events].map((event) => event.id)).toEqual(aboutPerson);
    // A UUID and an external_id of one record are one walk.
    expect((await page(org, { customer_id: personId, cursor: first.resume_cursor })).data.map((event) => event.id)).toEqual(
      aboutPerson.slice(1),
    );

    const { rows } = await ctx.database.pool.query<{ id: string; created_at: Date }>(
      'SELECT id, created_at FROM outbox_events WHERE org_id = $1 ORDER BY position',
      [org.id],
    );
    const middle = rows[2]!;
    const after = (await walk(org, undefined, { created_after: middle.created_at.toISOString() })).events.map((event) => event.id);
    expect(after).toEqual(rows.filter((row) => row.created_at > middle.created_at).map((row) => row.id));
    const before = (await walk(org, undefined, { created_before: middle.created_at.toISOString() })).events.map((event) => event.id);
    expect(before).toEqual(rows.filter((row) => row.created_at < middle.created_at).map((row) => row.id));
    expect(after.length + before.length).toBeLessThan(rows.length + 1);
  });

  it('when the type is unknown, or a date is not ISO 8601, the answer is 422 naming the field (and, for type, the valid types)', async () => {
    const org = await ctx.createOrg();
    const badType = await list(org, { type: 'customer.updated,customer.deleted' });
    expect(badType.statusCode).toBe(422);
    const message = (badType.json().error.details.issues.type as string[]).join(' ');
    expect(message).toContain('"customer.deleted"');
    expect(message).toContain(
      'customer.kyc_completed, aml.review_completed, customer.updated, endpoint.disabled, document_request.updated, customer.review_due, customer.review_completed, import.completed, webhook.test',
    );
    for (const field of ['created_after', 'created_before']) {
      const response = await list(org, { [field]: 'yesterday' });
      expect(response.statusCode).toBe(422);
      expect(response.json().error.details.issues[field]).toBeDefined();
    }
  });

  it('when the customer_id names no record of the organisation, the answer is 404 not_found', async () => {
    const org = await ctx.createOrg();
    for (const ref of ['nobody', '7b3c9d4e-1f2a-4b5c-8d6e-9f0a1b2c3d4e']) {
      const response = await list(org, { customer_id: ref });
      expect(response.statusCode).toBe(404);
      expect(response.json().error.code).toBe('not_found');
    }
  });

  it('when the cursor is tampered with, comes from another list, or is used with other filters, the answer is 422 on cursor', async () => {
    const org = await ctx.createOrg();
    await recordEvent(org.id);
    await recordEvent(org.id);
    await sealer.sealOnce();
    const { resume_cursor: cursor } = await page(org, { limit: '1' });
    const [payload, mac] = cursor.split('.');
    const forged = Buffer.from(JSON.stringify({ ...JSON.parse(Buffer.from(payload!, 'base64url').toString()), p: 0 })).toString(
      'base64url',
    );
    const customers = await ctx.request('POST', '/v1/customers', {
      key: org.key,
      body: { fullName: 'Cursor One', email: 'c1@example.com' },
    });
    expect(customers.statusCode).toBe(201);
    await ctx.request('POST', '/v1/customers', { key: org.key, body: { fullName: 'Cursor Two', email: 'c2@example.com' } });
    const customersCursor = (await ctx.request('GET', '/v1/customers', { key: org.key, query: { limit: '1' } })).json()
      .next_cursor as string;
    expect(customersCursor).toBeTruthy();

    for (const [query, why] of [
      [{ cursor: `${forged}.${mac}` }, 'forged position'],
      [{ cursor: `${payload}.${mac!.slice(0, -2)}AA` }, 'bad mac'],
      [{ cursor: 'garbage' }, 'garbage'],
      [{ cursor: customersCursor }, 'a customers cursor'],
      [{ cursor, type: 'webhook.test' }, 'other filters'],
    ] as const) {
      const response = await list(org, query);
      expect(response.statusCode, why).toBe(422);
      expect(response.json().error.details.issues.cursor, why).toBeDefined();
    }
    // The events cursor is not a customers cursor either.
    expect((await ctx.request('GET', '/v1/customers', { key: org.key, query: { cursor } })).statusCode).toBe(422);
  });

  it('when an event is committed but not sealed yet, GET by id returns it while the list does not show it', async () => {
    const org = await ctx.createOrg();
    const id = await recordEvent(org.id);
    expect((await ctx.request('GET', `/v1/events/${id}`, { key: org.key })).statusCode).toBe(200);
    expect((await page(org)).data).toEqual([]);
    await sealer.sealOnce();
    expect((await page(org)).data.map((event) => event.id)).toEqual([id]);
  });
});

describe('feed order is commit order', () => {
  it('when T1 writes A and stays open while T2 writes B and commits, the consumer gets B first and then A with its cursor once T1 commits', async () => {
    const org = await ctx.createOrg();
    const outbox = createOutboxRepository();
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let written!: () => void;
    const aWritten = new Promise<void>((resolve) => (written = resolve));
    const t1 = ctx.database.transaction(async (tx) => {
      const id = await outbox.record({ orgId: org.id, type: 'webhook.test', customerId: null, customer: null, data: { which: 'A' } }, tx);
      written();
      await held;
      return id;
    });
    await aWritten;
    const b = await recordEvent(org.id);
    await sealer.sealOnce();

    const first = await page(org);
    expect(first.data.map((event) => event.id)).toEqual([b]);
    expect(first.has_more).toBe(false);

    release();
    const a = await t1;
    // Committed, not sealed yet: nothing new, and the cursor stays where it was.
    expect(await page(org, { cursor: first.resume_cursor })).toMatchObject({ data: [], resume_cursor: first.resume_cursor });
    await sealer.sealOnce();
    const second = await page(org, { cursor: first.resume_cursor });
    expect(second.data.map((event) => event.id)).toEqual([a]);
    // A was written first (an earlier created) yet comes later, where its commit put it.
    expect(Date.parse(second.data[0]!.created)).toBeLessThanOrEqual(Date.parse(first.data[0]!.created));
  });
});

describe('sealing', () => {
  it('when two sealers on two database handles race over many concurrent commits, positions are 1..N with no duplicate and no gap', async () => {
    const org = await ctx.createOrg();
    const other = createDatabase(ctx.databaseUrl, { poolSize: 5 });
    const warnings: unknown[] = [];
    const logger = { warn: (...args: unknown[]) => void warnings.push(args), error: (...args: unknown[]) => void warnings.push(args) };
    const sealers = [
      createEventsFeedSealer({ database: ctx.database, batchSize: 7, logger }),
      createEventsFeedSealer({ database: other, batchSize: 7, logger }),
    ];
    try {
      let writing = true;
      const racing = sealers.map(async (one) => {
        while (writing) await one.sealOnce();
      });
      const writers = Array.from({ length: 6 }, (_, writer) =>
        (async () => {
          for (let index = 0; index < 60; index += 1) await recordEvent(org.id, { database: writer % 2 === 0 ? ctx.database : other });
        })(),
      );
      await Promise.all(writers);
      writing = false;
      await Promise.all(racing);
      await Promise.all(sealers.map((one) => one.sealOnce()));
    } finally {
      await Promise.all(sealers.map((one) => one.stop()));
      await other.close();
    }
    const positions = (await positionsOf(org.id)).map((row) => row.position);
    expect(positions).toEqual(Array.from({ length: 360 }, (_, index) => index + 1));
    const head = await ctx.database.pool.query<{ last_position: string }>('SELECT last_position FROM event_feed_heads WHERE org_id = $1', [
      org.id,
    ]);
    expect(Number(head.rows[0]!.last_position)).toBe(360);
    // Neither ever tried a position the other had taken (the unique index would have refused it).
    expect(warnings).toEqual([]);
  });

  it("when another sealer holds the organisation's head, a pass skips the organisation instead of waiting for it", async () => {
    const org = await ctx.createOrg();
    await recordEvent(org.id);
    await sealer.sealOnce();
    const id = await recordEvent(org.id);
    const warnings: unknown[] = [];
    const logger = { warn: (...args: unknown[]) => void warnings.push(args), error: (...args: unknown[]) => void warnings.push(args) };
    const watched = createEventsFeedSealer({ database: ctx.database, pollIntervalMs: 60_000, logger });
    const holder = await ctx.database.pool.connect();
    try {
      await holder.query('BEGIN');
      await holder.query('SELECT 1 FROM event_feed_heads WHERE org_id = $1 FOR UPDATE', [org.id]);
      // The head stays locked until after the pass, so a pass that waited for it would end at the pool's
      // lock_timeout with 55P03, which the sealer logs as a failed organisation: no warning, no wait.
      await watched.sealOnce();
      expect(warnings).toEqual([]);
      expect((await positionsOf(org.id)).find((row) => row.id === id)?.position).toBeNull();
    } finally {
      await holder.query('ROLLBACK');
      holder.release();
      await watched.stop();
    }
    await sealer.sealOnce();
    expect((await positionsOf(org.id)).find((row) => row.id === id)?.position).toBe(2);
  });

  it('when every event of the organisation has been purged, the next event still gets a later position (the head row remembers)', async () => {
    const org = await ctx.createOrg();
    await recordEvent(org.id);
    await recordEvent(org.id);
    await sealer.sealOnce();
    await ctx.database.pool.query(`UPDATE outbox_events SET created_at = now() - interval '31 days' WHERE org_id = $1`, [org.id]);
    await testServices(ctx.database, { config: ctx.config }).retention().purgeOrganisation(org.id);
    expect(await positionsOf(org.id)).toEqual([]);

    const next = await recordEvent(org.id);
    await sealer.sealOnce();
    expect(await positionsOf(org.id)).toEqual([{ id: next, position: 3 }]);
  });

  it('when the sealer runs in the background, a commit wakes it and the event appears without waiting for the poll', async () => {
    const org = await ctx.createOrg();
    const background = createEventsFeedSealer({ database: ctx.database, pollIntervalMs: 60_000 });
    await background.start();
    try {
      // The first pass (at start) is over once a pass of our own has run after it: only the wake can seal what follows.
      await background.sealOnce();
      const id = await recordEvent(org.id);
      // Well before the 60 s poll would run a pass.
      await vi.waitFor(async () => expect((await page(org)).data.map((event) => event.id)).toEqual([id]), {
        timeout: 20_000,
        interval: 20,
      });
    } finally {
      await background.stop();
    }
  });
});

describe('retention', () => {
  it('when an event is older than EVENT_RETENTION_DAYS, the purge removes it from the list and from GET, and a cursor past it continues with the later events', async () => {
    const org = await ctx.createOrg();
    const old = await recordEvent(org.id);
    const kept = [await recordEvent(org.id), await recordEvent(org.id)];
    await sealer.sealOnce();
    const consumer = await page(org, { limit: '1' });
    expect(consumer.data.map((event) => event.id)).toEqual([old]);

    await ctx.database.pool.query(
      `UPDATE outbox_events SET created_at = now() - make_interval(days => $3::int + 1) WHERE org_id = $1 AND id = $2`,
      [org.id, old, ctx.config.retention.eventDays],
    );
    const purged = await testServices(ctx.database, { config: ctx.config }).retention().purgeOrganisation(org.id);
    expect(purged.outbox_events).toBe(1);

    expect((await ctx.request('GET', `/v1/events/${old}`, { key: org.key })).statusCode).toBe(404);
    expect((await walk(org)).events.map((event) => event.id)).toEqual(kept);
    expect((await walk(org, consumer.resume_cursor)).events.map((event) => event.id)).toEqual(kept);
  });
});
