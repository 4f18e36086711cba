import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { startOfSecond, withinOneSecond } from '../helpers/one-second.js';

/**
 * Rate limits through leases (access.service.ts, migration 0006): an instance takes a slice of a
 * window (its recent demand for the key, at least 1% of the limit) from api_key_usage and admits
 * requests from it without writing; the day is topped up in the same write (at most 1% of the day);
 * api_key_usage counts the tokens handed out to all instances.
 */

let ctx: TestContext;
let org: TestOrg;

beforeAll(async () => {
  ctx = await createTestContext();
  org = await ctx.createOrg();
});
afterAll(async () => ctx?.close());

type Usage = { burst_window: number; burst_count: number; day_window: number; day_count: number; xmin: string };

async function usageOf(keyId: string): Promise<Usage | undefined> {
  const { rows } = await ctx.database.pool.query<Usage>(
    'SELECT burst_window, burst_count, day_window, day_count, xmin::text AS xmin FROM api_key_usage WHERE api_key_id = $1',
    [keyId],
  );
  return rows[0];
}

const get = (key: string, app: FastifyInstance = ctx.app) => ctx.request('GET', '/v1/designated-services', { key }, app);

function remaining(response: LightMyRequestResponse, window: 'burst' | 'daily'): number {
  const match = new RegExp(`"${window}";r=(\\d+)`).exec(String(response.headers.ratelimit));
  if (!match) throw new Error(`no ${window} window in RateLimit: ${String(response.headers.ratelimit)}`);
  return Number(match[1]);
}

/**
 * Sends `count` requests of `key` at once, on the given instances in turn, at the start of a second,
 * until every check ran within that one second, and returns their statuses. The key's burst window
 * is fresh each second, so an attempt that spilled over spends nothing the next one needs.
 */
async function burstWithinOneSecond(key: string, count: number, apps: FastifyInstance[]): Promise<number[]> {
  return withinOneSecond(
    async () => key,
    async () => {
      const responses = await Promise.all(Array.from({ length: count }, (_, index) => get(key, apps[index % apps.length])));
      return responses.map((response) => response.statusCode);
    },
  );
}

describe('leased windows', () => {
  it('when a key with large limits makes several requests within one second on one instance, api_key_usage is written once for that window (one slice, the day topped up to cover it), while the remaining daily count still goes down by one per request', async () => {
    const { first, afterFirst, rest, afterRest } = await withinOneSecond(
      () => ctx.createKey(org.id, { burstLimit: 10_000, dailyLimit: 1_000_000 }),
      async (key) => {
        const first = await get(key.key);
        const afterFirst = await usageOf(key.id);
        const rest: LightMyRequestResponse[] = [];
        for (let index = 0; index < 4; index += 1) rest.push(await get(key.key));
        return { first, afterFirst, rest, afterRest: await usageOf(key.id) };
      },
    );

    expect([first, ...rest].map((response) => response.statusCode)).toEqual([200, 200, 200, 200, 200]);
    // A new key: no demand known yet, so 1% of the burst limit; the day topped up to cover those
    // burst tokens, not one token per request.
    expect(afterRest).toMatchObject({ burst_count: 100, day_count: 100 });
    // The row was not written again after the first request took the slices.
    expect(afterRest!.xmin).toBe(afterFirst!.xmin);
    expect([first, ...rest].map((response) => remaining(response, 'daily'))).toEqual([999_999, 999_998, 999_997, 999_996, 999_995]);
    expect([first, ...rest].map((response) => remaining(response, 'burst'))).toEqual([9_999, 9_998, 9_997, 9_996, 9_995]);
  });

  it("when a key's slice of the day is spent, the instance takes the next slice and the remaining daily count goes on down by one per request", async () => {
    // dailyLimit 300: slices of 3 tokens.
    const key = await ctx.createKey(org.id, { dailyLimit: 300 });
    const responses: LightMyRequestResponse[] = [];
    for (let index = 0; index < 7; index += 1) responses.push(await get(key.key));
    expect(responses.map((response) => response.statusCode)).toEqual([200, 200, 200, 200, 200, 200, 200]);
    expect(responses.map((response) => remaining(response, 'daily'))).toEqual([299, 298, 297, 296, 295, 294, 293]);
    expect((await usageOf(key.id))!.day_count).toBe(9);
  });

  it(
    'when requests of a key with burstLimit 200 (slices of 2) are spread over two instances within one second, no more than 200 are admitted in all',
    { timeout: 90_000 },
    async () => {
      const second = await ctx.buildInstance();
      const key = await ctx.createKey(org.id, { burstLimit: 200 });
      await get(key.key, ctx.app);
      await get(key.key, second);

      const statuses = await burstWithinOneSecond(key.key, 260, [ctx.app, second]);

      const admitted = statuses.filter((status) => status === 200).length;
      expect(statuses.filter((status) => status !== 200 && status !== 429)).toEqual([]);
      expect(admitted).toBeGreaterThan(0);
      expect(admitted).toBeLessThanOrEqual(200);
    },
  );

  it('when requests of a key with dailyLimit 200 (slices of 2) are spread over two instances, no more than 200 are admitted in the day', async () => {
    const second = await ctx.buildInstance();
    const key = await ctx.createKey(org.id, { dailyLimit: 200 });
    const responses = await Promise.all(Array.from({ length: 260 }, (_, index) => get(key.key, index % 2 ? second : ctx.app)));
    const statuses = responses.map((response) => response.statusCode);
    expect(statuses.filter((status) => status === 200).length).toBeLessThanOrEqual(200);
    expect(statuses.filter((status) => status !== 200 && status !== 429)).toEqual([]);
    expect((await usageOf(key.id))!.day_count).toBeLessThanOrEqual(200);
  });

  it('when an app instance that holds leased tokens closes, it gives the unused ones back: day_count falls to the requests it served plus what other instances hold', async () => {
    const key = await ctx.createKey(org.id, { dailyLimit: 1_000 }); // slices of 10
    // The main instance takes one slice and keeps it.
    expect((await get(key.key, ctx.app)).statusCode).toBe(200);
    const leaving = await ctx.buildInstance();
    const served = 3;
    for (let index = 0; index < served; index += 1) expect((await get(key.key, leaving)).statusCode).toBe(200);
    // Its first request leased a slice of 10; a request that finds its burst second gone leases a new
    // burst slice and tops the day up to match, so on a slow machine the leaving instance may hold more.
    const beforeClose = (await usageOf(key.id))!.day_count;
    expect(beforeClose).toBeGreaterThanOrEqual(20);

    await leaving.close();

    expect((await usageOf(key.id))!.day_count, `${beforeClose} before the instance closed`).toBe(10 + served);
    // The tokens given back are good for the next request: the daily count reflects what was served.
    const next = await get(key.key, ctx.app);
    expect(next.statusCode).toBe(200);
    expect(remaining(next, 'daily')).toBe(1_000 - (1 + served + 1));
  });

  it("when a key's requests in flight at once all find the instance's lease empty, a request within the key's burst limit is not refused", async () => {
    // A product rule (docs/decisions.md: "Burst = requests per wall-clock second"): 200 requests in
    // one second of a key allowed 200 per second must all be served, however they are timed.
    const key = await ctx.createKey(org.id, { burstLimit: 200 });
    await get(key.key);

    const statuses = await burstWithinOneSecond(key.key, 200, [ctx.app]);

    const refused = statuses.filter((status) => status === 429).length;
    expect(refused, `refused within the limit; api_key_usage: ${JSON.stringify(await usageOf(key.id))}`).toBe(0);
  });

  it("when a new key's first requests arrive at once, well within both its limits, none is refused as over the daily limit", async () => {
    // 120 requests against limits of 10,000 per second and 10,000 per day (slices of 100).
    const key = await ctx.createKey(org.id, { burstLimit: 10_000, dailyLimit: 10_000 });

    const responses = await Promise.all(Array.from({ length: 120 }, () => get(key.key)));

    const refused = responses.filter((response) => response.statusCode === 429);
    const first = refused[0];
    const detail = first && { details: first.json().error.details, retryAfter: first.headers['retry-after'], usage: await usageOf(key.id) };
    expect(refused.length, `refused within both limits: ${JSON.stringify(detail)}`).toBe(0);
  });
});

describe('a request refused by one window takes nothing from the other', () => {
  it('when requests are refused by the burst window, the daily count in api_key_usage does not grow', async () => {
    // Limits under 200: slices of one token, so api_key_usage counts every admitted request.
    const { key, statuses } = await withinOneSecond(
      () => ctx.createKey(org.id, { burstLimit: 1, dailyLimit: 100 }),
      async (key) => {
        const statuses: number[] = [];
        for (let index = 0; index < 4; index += 1) statuses.push((await get(key.key)).statusCode);
        return { key, statuses };
      },
    );

    expect(statuses).toEqual([200, 429, 429, 429]);
    expect((await usageOf(key.id))!.day_count).toBe(1);
  });

  it('when requests are refused by the burst window while the instance holds daily tokens, the tokens they reserved go back: the next admitted request sees the daily count of admitted requests only', async () => {
    const { key, statuses } = await withinOneSecond(
      () => ctx.createKey(org.id, { burstLimit: 2, dailyLimit: 1_000 }), // day top-ups of up to 10
      async (key) => {
        const statuses: number[] = [];
        for (let index = 0; index < 4; index += 1) statuses.push((await get(key.key)).statusCode);
        return { key, statuses };
      },
    );
    expect(statuses).toEqual([200, 200, 429, 429]);
    // The second request asked for more burst than was left and topped up the day to match, so the
    // instance holds a day token the refused requests reserved and gave back.
    expect((await usageOf(key.id))!.day_count).toBe(3);

    await startOfSecond();
    const next = await get(key.key);
    expect(next.statusCode).toBe(200);
    expect(remaining(next, 'daily')).toBe(1_000 - 3);
  });

  it('when a request is refused by the daily window, the burst count in api_key_usage does not grow', async () => {
    const { key, second, statuses } = await withinOneSecond(
      () => ctx.createKey(org.id, { burstLimit: 100, dailyLimit: 1 }), // slices of one token
      async (key, second) => {
        const statuses: number[] = [];
        for (let index = 0; index < 3; index += 1) statuses.push((await get(key.key)).statusCode);
        return { key, second, statuses };
      },
    );

    expect(statuses).toEqual([200, 429, 429]);
    expect(await usageOf(key.id)).toMatchObject({ burst_window: second, burst_count: 1, day_count: 1 });
  });
});
