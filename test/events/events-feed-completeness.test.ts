import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createEventsFeedSealer, type EventsFeedSealer } from '../../src/modules/events/events-feed.sealer.js';
import { createOutboxRepository } from '../../src/shared/outbox.js';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';

/**
 * The "Done when": a consumer walking the feed with its last cursor, at any rate, misses no
 * event under concurrent writers, including events whose transactions commit late.
 */
// npm test writes for 5 s; the reliability suite runs this file again for 20 s (vitest.reliability.config.ts).
const WRITE_SECONDS = Number(process.env.FEED_COMPLETENESS_SECONDS ?? 5);
const HTTP_WRITERS = 3;
const LATE_WRITERS = 3;
const CUSTOMERS_PER_WRITER = 5;

let ctx: TestContext;
let sealer: EventsFeedSealer;
beforeAll(async () => {
  ctx = await createTestContext();
  // As in production: running in the background, woken after commits, polling every second.
  sealer = createEventsFeedSealer({ database: ctx.database });
  await sealer.start();
});
afterAll(async () => {
  await sealer?.stop();
  await ctx?.close();
});

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

type Page = { data: Array<{ id: string }>; has_more: boolean; next_cursor: string | null; resume_cursor: string };

/** A consumer polling with its last resume_cursor: `pauseMs` between polls (0: as fast as it can). */
function startConsumer(org: TestOrg, pauseMs: number, limit: number) {
  const seen: string[] = [];
  let cursor: string | undefined;
  let stopAtEnd = false;
  let polls = 0;
  const done = (async () => {
    for (;;) {
      const response = await ctx.request('GET', '/v1/events', {
        key: org.key,
        query: { limit: String(limit), ...(cursor ? { cursor } : {}) },
      });
      expect(response.statusCode, response.body).toBe(200);
      const page = response.json<Page>();
      polls += 1;
      seen.push(...page.data.map((event) => event.id));
      cursor = page.resume_cursor;
      if (page.has_more) continue;
      if (stopAtEnd) return;
      await sleep(pauseMs);
    }
  })();
  return {
    seen,
    polls: () => polls,
    /** Walks on to the end of the feed as it is now, then stops. */
    async finish() {
      stopAtEnd = true;
      await done;
    },
  };
}

describe('events feed completeness under concurrent writers', () => {
  it(
    `when 6 writers (3 through the HTTP API, 3 committing late) write for ${WRITE_SECONDS} s, a fast and a slow consumer each see every event exactly once, in position order`,
    async () => {
      const org = await ctx.createOrg();
      // Integration customers, so every PATCH that changes one fires customer.updated.
      const customers: string[][] = [];
      for (let writer = 0; writer < HTTP_WRITERS; writer += 1) {
        const ids: string[] = [];
        for (let index = 0; index < CUSTOMERS_PER_WRITER; index += 1) {
          const response = await ctx.request('POST', '/v1/customers', {
            key: org.key,
            body: {
              externalId: `w${writer}-c${index}`,
              fullName: `Writer ${writer} Customer ${index}`,
              email: `w${writer}.c${index}@example.com`,
            },
          });
          expect(response.statusCode, response.body).toBe(201);
          ids.push(response.json().id as string);
        }
        customers.push(ids);
      }

      const fast = startConsumer(org, 0, 100);
      const slow = startConsumer(org, 700, 20);
      const outbox = createOutboxRepository();
      const stopAt = Date.now() + WRITE_SECONDS * 1000;
      let httpWrites = 0;
      let lateCommits = 0;

      const httpWriters = customers.map(async (ids, writer) => {
        for (let version = 0; Date.now() < stopAt; version += 1) {
          const id = ids[version % ids.length]!;
          const response = await ctx.request('PATCH', `/v1/customers/${id}`, {
            key: org.key,
            body: { fullName: `Writer ${writer} Customer v${version}` },
          });
          expect(response.statusCode, response.body).toBe(200);
          httpWrites += 1;
        }
      });
      const lateWriters = Array.from({ length: LATE_WRITERS }, async () => {
        while (Date.now() < stopAt) {
          const holdMs = Math.floor(Math.random() * 301);
          await ctx.database.transaction(async (tx) => {
            await outbox.record({ orgId: org.id, type: 'webhook.test', customerId: null, customer: null, data: { holdMs } }, tx);
            await sleep(holdMs);
          });
          if (holdMs > 0) lateCommits += 1;
        }
      });
      await Promise.all([...httpWriters, ...lateWriters]);

      // Every event committed; wait until the sealer has placed them all.
      const unsealed = async () =>
        Number(
          (
            await ctx.database.pool.query<{ count: string }>('SELECT count(*) FROM outbox_events WHERE org_id = $1 AND position IS NULL', [
              org.id,
            ])
          ).rows[0]!.count,
        );
      const deadline = Date.now() + 10_000;
      while ((await unsealed()) > 0 && Date.now() < deadline) await sleep(50);
      expect(await unsealed()).toBe(0);
      await Promise.all([fast.finish(), slow.finish()]);

      const { rows } = await ctx.database.pool.query<{ id: string; position: string; created_at: Date }>(
        'SELECT id, position, created_at FROM outbox_events WHERE org_id = $1 ORDER BY position',
        [org.id],
      );
      const expected = rows.map((row) => row.id);
      // Events that a later-written event overtook: sealed behind it because their transaction committed after it.
      let overtaken = 0;
      let latestCreated = 0;
      for (const row of rows) {
        const created = row.created_at.getTime();
        if (created < latestCreated) overtaken += 1;
        latestCreated = Math.max(latestCreated, created);
      }

      console.info(
        `feed completeness: ${expected.length} events (${httpWrites} through the API, ${lateCommits} committed late), ${overtaken} overtaken by later-written events; ` +
          `fast consumer ${fast.polls()} polls, slow ${slow.polls()}; missed 0 and duplicates 0 are asserted below`,
      );
      expect(httpWrites).toBeGreaterThan(0);
      expect(lateCommits).toBeGreaterThan(0);
      expect(overtaken, 'some events must have committed late, or the test proves nothing').toBeGreaterThan(0);
      expect(expected.length).toBe(httpWrites + (await countLateEvents(org.id)));
      for (const consumer of [fast, slow]) {
        const missed = expected.filter((id) => !consumer.seen.includes(id));
        const duplicates = consumer.seen.length - new Set(consumer.seen).size;
        expect({ missed: missed.length, duplicates }).toEqual({ missed: 0, duplicates: 0 });
        // Seen in position order: the feed never showed an event before one with a lower position.
        expect(consumer.seen).toEqual(expected);
      }
      expect(fast.polls()).toBeGreaterThan(slow.polls());
    },
    (WRITE_SECONDS + 60) * 1000,
  );
});

async function countLateEvents(orgId: string): Promise<number> {
  const { rows } = await ctx.database.pool.query<{ count: string }>(
    "SELECT count(*) FROM outbox_events WHERE org_id = $1 AND type = 'webhook.test'",
    [orgId],
  );
  return Number(rows[0]!.count);
}
