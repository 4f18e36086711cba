import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import type pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp } from '../../src/app.js';
import { createDatabase } from '../../src/db/client.js';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { startOfSecond, withinOneSecond } from '../helpers/one-second.js';

let ctx: TestContext;
let org: TestOrg;

beforeAll(async () => {
  ctx = await createTestContext();
  org = await ctx.createOrg();
});
afterAll(async () => ctx?.close());

type KeyLimits = Parameters<TestContext['createKey']>[1];

/**
 * Makes a key with the given limits and sends `count` requests with it at once (on the given
 * instances in turn) at the start of a second, until all of them ran within that one second, so
 * they land in one burst window; the responses come back sorted by status (admitted first).
 */
async function burst(
  limits: KeyLimits,
  count: number,
  apps: FastifyInstance[] = [ctx.app],
): Promise<{ key: string; responses: LightMyRequestResponse[] }> {
  return withinOneSecond(
    () => ctx.createKey(org.id, limits),
    async (key) => {
      const responses = await Promise.all(
        Array.from({ length: count }, (_, index) =>
          ctx.request('GET', '/v1/designated-services', { key: key.key }, apps[index % apps.length]),
        ),
      );
      return { key: key.key, responses: responses.sort((a, b) => a.statusCode - b.statusCode) };
    },
  );
}

function secondsUntilUtcMidnight(): number {
  const now = new Date();
  const midnight = Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), now.getUTCDate() + 1);
  return (midnight - now.getTime()) / 1000;
}

describe('burst limit', () => {
  it('when a key exceeds its burst limit within a second, it answers 429 rate_limited with limit and window', async () => {
    const { responses } = await burst({ burstLimit: 3 }, 4);
    expect(responses.slice(0, 3).map((response) => response.statusCode)).toEqual([200, 200, 200]);
    const refused = responses[3]!;
    expect(refused.statusCode).toBe(429);
    expect(refused.json()).toEqual({
      error: { code: 'rate_limited', message: expect.any(String), details: { limit: 3, window_seconds: 1 } },
    });
  });

  it('when a burst is refused, Retry-After is an integer of at least one second', async () => {
    const refused = (await burst({ burstLimit: 1 }, 2)).responses[1]!;
    expect(refused.statusCode).toBe(429);
    expect(refused.headers['retry-after']).toMatch(/^\d+$/);
    expect(Number(refused.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    expect(Number(refused.headers['retry-after'])).toBeLessThanOrEqual(1);
  });

  it('when the next second starts, the burst window is fresh again', async () => {
    const { key, responses } = await burst({ burstLimit: 1 }, 2);
    expect(responses[1]!.statusCode).toBe(429);
    await startOfSecond();
    expect((await ctx.request('GET', '/v1/designated-services', { key })).statusCode).toBe(200);
  });

  it('when requests are split across two app instances, the burst limit holds for their sum', async () => {
    const second = await ctx.buildInstance();
    const { responses } = await burst({ burstLimit: 3 }, 4, [ctx.app, second]);
    expect(responses.map((response) => response.statusCode)).toEqual([200, 200, 200, 429]);
  });

  it('when a key has no override, the configured default burst limit applies', async () => {
    const limited = await ctx.buildInstance({ rateLimit: { burst: 2, daily: 1000 } });
    const { responses } = await burst({}, 3, [limited]);
    expect(responses.map((response) => response.statusCode)).toEqual([200, 200, 429]);
    expect(responses[2]!.json().error.details).toEqual({ limit: 2, window_seconds: 1 });
  });

  it('when a key has an override, it wins over the configured default', async () => {
    const limited = await ctx.buildInstance({ rateLimit: { burst: 1, daily: 1000 } });
    const { responses } = await burst({ burstLimit: 3 }, 3, [limited]);
    expect(responses.map((response) => response.statusCode)).toEqual([200, 200, 200]);
  });

  it('when one key is exhausted, another key of the same organisation is unaffected', async () => {
    const statuses = await withinOneSecond(
      async () => [await ctx.createKey(org.id, { burstLimit: 1 }), await ctx.createKey(org.id, { burstLimit: 1 })] as const,
      async ([exhausted, other]) => {
        const spent = [];
        for (let index = 0; index < 2; index += 1)
          spent.push((await ctx.request('GET', '/v1/designated-services', { key: exhausted.key })).statusCode);
        const fresh = (await ctx.request('GET', '/v1/designated-services', { key: other.key })).statusCode;
        return { spent, fresh };
      },
    );
    expect(statuses).toEqual({ spent: [200, 429], fresh: 200 });
  });
});

describe('daily limit', () => {
  it('when a key exceeds its daily limit, it answers 429 with window_seconds 86400 and Retry-After until UTC midnight', async () => {
    const key = await ctx.createKey(org.id, { dailyLimit: 5 });
    const statuses: number[] = [];
    let last: LightMyRequestResponse | undefined;
    for (let index = 0; index < 6; index += 1) {
      last = await ctx.request('GET', '/v1/designated-services', { key: key.key });
      statuses.push(last.statusCode);
    }
    expect(statuses).toEqual([200, 200, 200, 200, 200, 429]);
    expect(last!.json().error.details).toEqual({ limit: 5, window_seconds: 86_400 });
    expect(last!.headers['retry-after']).toMatch(/^\d+$/);
    expect(Math.abs(Number(last!.headers['retry-after']) - secondsUntilUtcMidnight())).toBeLessThanOrEqual(2);
  });

  it('when requests are split across two app instances, the daily limit holds for their sum', async () => {
    const second = await ctx.buildInstance();
    const key = await ctx.createKey(org.id, { dailyLimit: 5 });
    const statuses: number[] = [];
    for (let index = 0; index < 6; index += 1) {
      statuses.push((await ctx.request('GET', '/v1/designated-services', { key: key.key }, index % 2 ? second : ctx.app)).statusCode);
    }
    expect(statuses).toEqual([200, 200, 200, 200, 200, 429]);
  });

  it('when requests are refused by the burst limit, they do not use up the daily quota', async () => {
    const { key, responses } = await burst({ burstLimit: 1, dailyLimit: 3 }, 4);
    expect(responses.map((response) => response.statusCode)).toEqual([200, 429, 429, 429]);
    await startOfSecond();
    const next = await ctx.request('GET', '/v1/designated-services', { key });
    expect(next.statusCode).toBe(200);
    expect(String(next.headers.ratelimit)).toMatch(/"daily";r=1;/);
  });

  it('when the daily quota is spent, a request that also exceeds the burst is told about the daily window', async () => {
    const { responses } = await burst({ burstLimit: 1, dailyLimit: 1 }, 2);
    expect(responses.map((response) => response.statusCode)).toEqual([200, 429]);
    expect(responses[1]!.json().error.details).toEqual({ limit: 1, window_seconds: 86_400 });
  });

  it('when a key has no override, the configured default daily limit applies', async () => {
    const limited = await ctx.buildInstance({ rateLimit: { burst: 1000, daily: 2 } });
    const key = await ctx.createKey(org.id);
    const statuses: number[] = [];
    for (let index = 0; index < 3; index += 1) {
      statuses.push((await ctx.request('GET', '/v1/designated-services', { key: key.key }, limited)).statusCode);
    }
    expect(statuses).toEqual([200, 200, 429]);
  });
});

describe('RateLimit headers', () => {
  it('when a request is served, it carries RateLimit-Policy and RateLimit in the IETF draft syntax', async () => {
    const key = await ctx.createKey(org.id, { burstLimit: 3, dailyLimit: 50 });
    const response = await ctx.request('GET', '/v1/designated-services', { key: key.key });
    expect(response.statusCode).toBe(200);
    expect(response.headers['ratelimit-policy']).toBe('"burst";q=3;w=1, "daily";q=50;w=86400');
    const match = /^"burst";r=(\d+);t=(\d+), "daily";r=(\d+);t=(\d+)$/.exec(String(response.headers.ratelimit));
    expect(match).not.toBeNull();
    const [, burstRemaining, burstReset, dailyRemaining, dailyReset] = match!.map(Number);
    expect(burstRemaining).toBeLessThanOrEqual(2);
    expect(burstReset).toBe(1);
    expect(dailyRemaining).toBe(49);
    expect(Math.abs(dailyReset! - secondsUntilUtcMidnight())).toBeLessThanOrEqual(2);
  });

  it('when requests are made, the remaining daily count goes down by one each', async () => {
    const key = await ctx.createKey(org.id, { dailyLimit: 50 });
    const remaining: number[] = [];
    for (let index = 0; index < 3; index += 1) {
      const response = await ctx.request('GET', '/v1/designated-services', { key: key.key });
      remaining.push(Number(/"daily";r=(\d+)/.exec(String(response.headers.ratelimit))![1]));
    }
    expect(remaining).toEqual([49, 48, 47]);
  });

  it('when a request is refused with 429, it still carries the RateLimit headers with nothing remaining', async () => {
    const refused = (await burst({ burstLimit: 1 }, 2)).responses[1]!;
    expect(refused.statusCode).toBe(429);
    expect(refused.headers['ratelimit-policy']).toMatch(/^"burst";q=1;w=1, "daily";q=\d+;w=86400$/);
    expect(refused.headers.ratelimit).toMatch(/^"burst";r=0;t=1, /);
  });

  it('when a request fails validation, it still carries the RateLimit headers (every authenticated response does)', async () => {
    const response = await ctx.request('GET', '/v1/customers', { key: org.key, query: { limit: 'many' } });
    expect(response.statusCode).toBe(422);
    expect(response.headers['ratelimit-policy']).toBeDefined();
    expect(response.headers.ratelimit).toBeDefined();
  });
});

describe('cost on the hot path', () => {
  /** An app on its own pool whose every statement sent to PostgreSQL is counted. */
  async function countingInstance(): Promise<{ app: FastifyInstance; statements: () => number; close: () => Promise<void> }> {
    const database = createDatabase(ctx.databaseUrl, { poolSize: 2 });
    let count = 0;
    database.pool.on('connect', (client: pg.PoolClient) => {
      const query = client.query.bind(client) as (...args: unknown[]) => unknown;
      (client as unknown as { query: (...args: unknown[]) => unknown }).query = (...args: unknown[]) => {
        count += 1;
        return query(...args);
      };
    });
    const app = await buildApp({ config: ctx.config, database, logger: false });
    await app.ready();
    return {
      app,
      statements: () => count,
      close: async () => {
        await app.close();
        await database.close();
      },
    };
  }

  it('when an authenticated request is served, authentication, the IP allowlist, both rate-limit windows and last_used_at cost one database round trip together', async () => {
    const counting = await countingInstance();
    try {
      const key = await ctx.createKey(org.id, { allowIps: ['0.0.0.0/0'], burstLimit: 1000, dailyLimit: 1000 });
      // The first use also writes last_used_at; it must ride on the same statement.
      for (const expected of [1, 1]) {
        const before = counting.statements();
        const response = await ctx.request('GET', '/v1/designated-services', { key: key.key, remoteAddress: '198.51.100.1' }, counting.app);
        expect(response.statusCode).toBe(200);
        expect(response.headers.ratelimit).toBeDefined();
        expect(counting.statements() - before).toBe(expected);
      }
    } finally {
      await counting.close();
    }
  });

  it('when a request is refused (unknown key, rate limited), it costs at most that one round trip; a malformed header costs none', async () => {
    const counting = await countingInstance();
    try {
      const cases: Array<[headers: Record<string, string>, status: number, statements: number]> = [
        [{ authorization: 'Bearer not-a-key' }, 401, 0],
        [{ authorization: `Bearer svc_live_${'0'.repeat(40)}` }, 401, 1],
      ];
      for (const [headers, status, statements] of cases) {
        const before = counting.statements();
        const response = await ctx.request('GET', '/v1/designated-services', { headers }, counting.app);
        expect(response.statusCode).toBe(status);
        expect(counting.statements() - before).toBe(statements);
      }
      const limited = await withinOneSecond(
        () => ctx.createKey(org.id, { burstLimit: 1 }),
        async (key) => {
          const before = counting.statements();
          const statuses = [];
          for (let index = 0; index < 2; index += 1) {
            statuses.push((await ctx.request('GET', '/v1/designated-services', { key: key.key }, counting.app)).statusCode);
          }
          return { statuses, statements: counting.statements() - before };
        },
      );
      expect(limited).toEqual({ statuses: [200, 429], statements: 2 });
    } finally {
      await counting.close();
    }
  });
});
