import { expect, it } from 'vitest';
import {
  connectAdmin,
  describeOutcomes,
  FAULT_TIMEOUTS,
  getSpec,
  mixedRequest,
  ok,
  printFigures,
  requestBound,
  seedCustomers,
  servedFaultDatabase,
  sleep,
  startLoad,
  timeToHealthy,
  upsertSpec,
  type RequestSpec,
} from './database-faults.js';

// Issue 26, item 8 (d): one row locked for 20 s by another session (a stuck migration script, an
// operator's open transaction). Writes of that row give up after lock_timeout; nothing else waits.
const LOCK_TIMEOUT_MS = 2_000;
const env = {
  ...FAULT_TIMEOUTS,
  DATABASE_LOCK_TIMEOUT_MS: String(LOCK_TIMEOUT_MS),
  DATABASE_STATEMENT_TIMEOUT_MS: '5000',
  DATABASE_QUERY_TIMEOUT_MS: '6000',
};
const bound = requestBound(env);
const HOLD_MS = 20_000;
const LOCKED_EXTERNAL_ID = 'locked-0';
const LOCKED_NAME = 'Seedlocked Number0'; // as seedCustomers names it

const served = servedFaultDatabase('row-lock', env);

it('when one row stays locked for 20 s, only writes of that row fail (409 record_locked once lock_timeout is reached), its reads and everything else are served', async () => {
  const { fault, server } = served;
  const others = await seedCustomers(server, fault.key, 'other', 30);
  const [lockedId] = await seedCustomers(server, fault.key, 'locked', 1);

  const holder = await connectAdmin(fault.name);
  await holder.query('BEGIN');
  const { rowCount } = await holder.query('SELECT id FROM customers WHERE id = $1 FOR UPDATE', [lockedId]);
  expect(rowCount).toBe(1);
  const lockedAt = Date.now();

  // Five clients on other records, one reading the locked row, two writing it (upsert by external id, PATCH by id).
  const next = (worker: number, n: number): RequestSpec => {
    if (worker < 5) return { ...mixedRequest(others, worker, n), target: 'other' };
    if (worker === 5) return getSpec(lockedId!, 'locked');
    if (worker === 6) return upsertSpec(LOCKED_EXTERNAL_ID, LOCKED_NAME, n + 1, 'locked');
    return {
      op: 'patch',
      target: 'locked',
      method: 'PATCH',
      path: `/v1/customers/${lockedId}`,
      body: { phone: `+61 411 ${String(n).padStart(6, '0')}` },
    };
  };
  const load = startLoad(server, fault.key, 8, next);
  await sleep(lockedAt + HOLD_MS - Date.now());

  const draining = load.stop();
  await holder.query('ROLLBACK');
  const releasedAt = Date.now();
  await holder.end();
  const healthyMs = await timeToHealthy(
    server,
    fault.key,
    { getId: lockedId!, upsert: upsertSpec(LOCKED_EXTERNAL_ID, LOCKED_NAME, 0) },
    releasedAt,
  );
  const outcomes = await draining;

  const otherOutcomes = outcomes.filter((outcome) => outcome.target === 'other');
  const lockedReads = outcomes.filter((outcome) => outcome.target === 'locked' && outcome.op === 'get');
  const lockedWrites = outcomes.filter((outcome) => outcome.target === 'locked' && outcome.op !== 'get');
  // Writes that ended while the lock was held; those still waiting at the ROLLBACK may succeed.
  const writesUnderLock = lockedWrites.filter((outcome) => outcome.endedAt < releasedAt);
  const longest = (list: typeof outcomes) => Math.max(0, ...list.map((outcome) => outcome.ms));
  printFigures('database-faults (d) one row locked for 20 s', outcomes, {
    timeToHealthyMs: healthyMs,
    lockTimeoutMs: LOCK_TIMEOUT_MS,
    boundMs: bound,
    otherRequests: otherOutcomes.length,
    otherLongestMs: longest(otherOutcomes),
    lockedReads: lockedReads.length,
    lockedReadLongestMs: longest(lockedReads),
    lockedWrites: lockedWrites.length,
    lockedWriteShortestMs: Math.min(...writesUnderLock.map((outcome) => outcome.ms)),
    lockedWriteLongestMs: longest(writesUnderLock),
  });

  const otherFailures = otherOutcomes.filter((outcome) => !ok(outcome));
  expect(
    otherFailures.length,
    `requests for other records failed: ${describeOutcomes(otherFailures)}\n${server.output().slice(-4000)}`,
  ).toBe(0);
  const failedReads = lockedReads.filter((outcome) => outcome.status !== 200);
  expect(failedReads.length, `reads of the locked row failed: ${describeOutcomes(failedReads)}`).toBe(0);
  expect(lockedReads.length).toBeGreaterThan(0);

  const slow = outcomes.filter((outcome) => outcome.ms > bound).sort((a, b) => b.ms - a.ms);
  expect(slow.length, `requests longer than ${bound} ms: ${describeOutcomes(slow)}`).toBe(0);
  expect(writesUnderLock.length).toBeGreaterThan(0);
  const notLocked = writesUnderLock.filter(
    (outcome) => outcome.status !== 409 || outcome.code !== 'record_locked' || outcome.retryAfter !== '1',
  );
  expect(
    notLocked.length,
    `writes of the locked row that did not answer 409 record_locked with Retry-After: 1: ${describeOutcomes(notLocked)}\n${server.output().slice(-4000)}`,
  ).toBe(0);
  // lock_timeout bounds each lock wait, not the statement: with two writers of the row, the second
  // first queues for the tuple lock the first one holds while it waits for the holder's transaction,
  // then waits for that transaction itself. So a write gives up after one or two lock timeouts, and
  // statement_timeout (5 s) stays above both.
  const offTime = writesUnderLock.filter((outcome) => outcome.ms < LOCK_TIMEOUT_MS * 0.9 || outcome.ms > 2 * LOCK_TIMEOUT_MS + 1000);
  expect(
    offTime.length,
    `writes of the locked row not answered after one or two lock timeouts (${LOCK_TIMEOUT_MS} ms each): ${describeOutcomes(offTime)}`,
  ).toBe(0);
  const afterRelease = lockedWrites.filter((outcome) => outcome.endedAt >= releasedAt && !ok(outcome) && outcome.code !== 'record_locked');
  expect(afterRelease.length, describeOutcomes(afterRelease)).toBe(0);

  expect(healthyMs, 'the locked row was not writable within 15 s of the ROLLBACK').not.toBeNull();
  expect(healthyMs!).toBeLessThanOrEqual(1000);
}, 120_000);
