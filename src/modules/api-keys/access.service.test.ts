import type pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext } from '../../../test/helpers/harness.js';
import type { Clock } from '../../shared/clock.js';
import { hashApiKey } from './api-key-secret.js';
import { createAccessService, RateLimitedError } from './access.service.js';
import type { AccessCheckRow } from './api-keys.repository.js';

let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

/** The access check's answer as PostgreSQL would give it, for a key with the given windows. */
function answer(row: Partial<AccessCheckRow> & Pick<AccessCheckRow, 'burst_window'>): pg.QueryResult {
  const full: AccessCheckRow = {
    id: '00000000-0000-4000-8000-000000000001',
    org_id: '00000000-0000-4000-8000-000000000002',
    scopes: ['customers:read'],
    features: [],
    burst_limit: 10_000,
    daily_limit: 1_000_000,
    active: true,
    ip_allowed: true,
    now_epoch: row.burst_window + 0.5,
    day_window: Math.floor(row.burst_window / 86_400),
    burst_count: 0,
    day_count: 0,
    burst_wanted: 0,
    day_wanted: 0,
    burst_granted: 0,
    day_granted: 0,
    ...row,
  };
  // Read in array mode, as the service reads it: values in column order, the names in `fields`.
  return { rows: [Object.values(full)], fields: Object.keys(full).map((name) => ({ name })) } as unknown as pg.QueryResult;
}

describe('rate-limit leases, answers arriving out of order', () => {
  it('when a request granted tokens of one second is answered after a neighbour moved the lease to the next second, it is still admitted on its own grant', async () => {
    const access = createAccessService({ database: ctx.database, defaults: { burst: 10_000, daily: 1_000_000 } });
    const second = 1_800_000_000;
    const day = Math.floor(second / 86_400);
    // Both requests find the lease empty: the first asks for a slice, the second for one token.
    const early = access.pendingCheck('hash-of-key', '127.0.0.1');
    const late = access.pendingCheck('hash-of-key', '127.0.0.1');
    // The one-token request is answered first, already in the next second; it uses its token.
    expect(() =>
      late.judge(
        answer({
          burst_window: second + 1,
          burst_wanted: 1,
          burst_granted: 1,
          burst_count: 1,
          day_wanted: 1,
          day_granted: 1,
          day_count: 1,
          day_window: day,
        }),
      ),
    ).not.toThrow();
    // The slice asked in the earlier second comes back afterwards: the database granted it, so the
    // request is admitted, although the lease now holds no token of its second.
    const grant = early.judge(
      answer({
        burst_window: second,
        burst_wanted: 100,
        burst_granted: 100,
        burst_count: 101,
        day_wanted: 10_000,
        day_granted: 10_000,
        day_count: 10_001,
        day_window: day,
      }),
    );
    expect(grant?.auth.apiKeyId).toBe('00000000-0000-4000-8000-000000000001');
  });

  it('when the database grants nothing because the burst is spent but a neighbour brought back tokens of the current second, the request is admitted from them', () => {
    const access = createAccessService({ database: ctx.database, defaults: { burst: 10_000, daily: 1_000_000 } });
    const second = 1_800_000_100;
    const day = Math.floor(second / 86_400);
    const slice = access.pendingCheck('another-hash', '127.0.0.1');
    const single = access.pendingCheck('another-hash', '127.0.0.1');
    slice.judge(
      answer({
        burst_window: second,
        burst_wanted: 100,
        burst_granted: 100,
        burst_count: 10_000,
        day_wanted: 10_000,
        day_granted: 10_000,
        day_count: 10_000,
        day_window: day,
      }),
    );
    expect(() =>
      single.judge(
        answer({
          burst_window: second,
          burst_wanted: 1,
          burst_granted: 0,
          burst_count: 10_000,
          day_wanted: 1,
          day_granted: 0,
          day_count: 10_000,
          day_window: day,
        }),
      ),
    ).not.toThrow();
  });

  it('when the database grants nothing and the instance holds no token either, the request is refused by the spent window', () => {
    const access = createAccessService({ database: ctx.database, defaults: { burst: 10_000, daily: 1_000_000 } });
    const second = 1_800_000_200;
    const check = access.pendingCheck('third-hash', '127.0.0.1');
    let refusal: unknown;
    try {
      check.judge(
        answer({
          burst_window: second,
          burst_wanted: 100,
          burst_granted: 0,
          burst_count: 10_000,
          day_wanted: 10_000,
          day_granted: 0,
          day_count: 5,
        }),
      );
    } catch (error) {
      refusal = error;
    }
    expect(refusal).toBeInstanceOf(RateLimitedError);
    expect((refusal as RateLimitedError).window.name).toBe('burst');
  });
});

describe('state kept per key', () => {
  it('when checks of made-up keys are refused, the instance keeps no lease state for them', async () => {
    const access = createAccessService({ database: ctx.database, defaults: { burst: 10_000, daily: 1_000_000 } });
    for (let index = 0; index < 5; index += 1) {
      await expect(access.authenticate(`made-up-hash-${index}`, '127.0.0.1')).rejects.toMatchObject({ status: 401 });
    }
    expect(access.leasedKeys()).toBe(0);
  });
});

describe('read-only checks while the instance holds tokens of the current windows', () => {
  /** A clock that stands still until moved: the service predicts the database's windows from it. */
  function stoppedClock(): Clock & { move(seconds: number): void } {
    let at = Date.now();
    return { now: () => new Date(at), move: (seconds) => (at += seconds * 1000) };
  }

  const writes = (statement: pg.QueryConfig) => /\b(update|insert|delete)\b|api_key_usage_lease/i.test(statement.text);

  async function usageOf(keyHash: string): Promise<{ burst_window: number; burst_count: number } | undefined> {
    const { rows } = await ctx.database.pool.query<{ burst_window: number; burst_count: number }>(
      'SELECT u.burst_window, u.burst_count FROM api_key_usage u JOIN api_keys k ON k.id = u.api_key_id WHERE k.key_hash = $1',
      [keyHash],
    );
    return rows[0];
  }

  it('when the instance leased tokens of the current second and day, the next check writes nothing; once its clock says the second has passed, the check is the full one again', async () => {
    const org = await ctx.createOrg();
    const keyHash = hashApiKey(org.key);
    const clock = stoppedClock();
    const access = createAccessService({ database: ctx.database, defaults: { burst: 10_000, daily: 1_000_000 }, clock });
    await access.authenticate(keyHash, '127.0.0.1');

    const next = access.pendingCheck(keyHash, '127.0.0.1');
    expect(next.readOnly).toBe(true);
    expect(writes(next.statement)).toBe(false);

    clock.move(1);
    const later = access.pendingCheck(keyHash, '127.0.0.1');
    expect(later.readOnly).toBe(false);
    expect(writes(later.statement)).toBe(true);
  });

  it('when the second moves on between reserving a token and the read-only check, the full check is asked: the request is admitted on a token of the new second', async () => {
    const org = await ctx.createOrg();
    const keyHash = hashApiKey(org.key);
    // The clock stands still, so the service still predicts the second it leased in.
    const access = createAccessService({ database: ctx.database, defaults: { burst: 10_000, daily: 1_000_000 }, clock: stoppedClock() });
    await access.authenticate(keyHash, '127.0.0.1');
    const leased = (await usageOf(keyHash))!;

    await new Promise((resolve) => setTimeout(resolve, 1_100));
    const grant = await access.authenticate(keyHash, '127.0.0.1');

    expect(grant.auth.orgId).toBe(org.id);
    const usage = (await usageOf(keyHash))!;
    expect(usage.burst_window).toBeGreaterThan(leased.burst_window);
    expect(usage.burst_count).toBeGreaterThan(0);
  });
});

describe('lease slices sized by demand', () => {
  function stoppedClock(): Clock & { move(seconds: number): void } {
    let at = Date.now();
    return { now: () => new Date(at), move: (seconds) => (at += seconds * 1000) };
  }
  /** The burst tokens a check asks to lease ($7 of ACCESS_CHECK_SQL; 0: one token). */
  const burstAsk = (check: { statement: pg.QueryConfig }) => check.statement.values![6];

  it('when an instance admitted 20 requests of a key in one second, its first check of the next second leases 20 plus an eighth, and two idle seconds later it asks for the smallest slice again', () => {
    const clock = stoppedClock();
    const access = createAccessService({ database: ctx.database, defaults: { burst: 25, daily: 100_000 }, clock });
    const second = 1_800_000_400;
    // 20 requests spread over the second, each leasing one token (the lease then holds none).
    for (let index = 0; index < 20; index += 1) {
      const check = access.pendingCheck('demand-hash', '127.0.0.1');
      check.judge(
        answer({
          burst_window: second,
          now_epoch: second + 0.02 + index * 0.045,
          burst_limit: 25,
          daily_limit: 100_000,
          burst_wanted: 1,
          burst_granted: 1,
          burst_count: index + 1,
          day_wanted: 1,
          day_granted: 1,
          day_count: index + 1,
        }),
      );
    }
    // The last answer said 0.875 into the second; 0.2 s later it is the next second.
    clock.move(0.2);
    expect(burstAsk(access.pendingCheck('demand-hash', '127.0.0.1'))).toBe(23);

    const idle = createAccessService({ database: ctx.database, defaults: { burst: 25, daily: 100_000 }, clock });
    const first = idle.pendingCheck('idle-hash', '127.0.0.1');
    first.judge(
      answer({
        burst_window: second,
        burst_limit: 25,
        burst_wanted: 1,
        burst_granted: 1,
        burst_count: 1,
        day_wanted: 1,
        day_granted: 1,
        day_count: 1,
      }),
    );
    clock.move(3);
    expect(burstAsk(idle.pendingCheck('idle-hash', '127.0.0.1'))).toBe(1);
  });
});
