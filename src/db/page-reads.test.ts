import { sql } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../../test/helpers/database.js';
import { freePort } from '../../test/helpers/pg-cluster.js';
import { createDatabase, type Database, type Executor } from './client.js';
import { createPageReads, type PageReason, type PageTarget } from './page-reads.js';

/*
 * The routing rules of src/db/page-reads.ts that need no standby: where a page reads when the
 * "replica" is not a standby at all, or cannot be reached. The rules on a real streaming standby
 * (replay paused, standby stopped) are in test/reliability/replica-reads.test.ts.
 */

let testDatabase: TestDatabase;
let primary: Database;
let notStandby: Database;
let unreachable: Database;

beforeAll(async () => {
  testDatabase = await createTestDatabase();
  primary = createDatabase(testDatabase.url, { poolSize: 2 });
  notStandby = createDatabase(testDatabase.url, { poolSize: 2 });
  const refused = new URL(testDatabase.url);
  refused.hostname = '127.0.0.1';
  refused.port = String(await freePort());
  unreachable = createDatabase(refused.toString(), { poolSize: 2, connectTimeoutMs: 1_000 });
});

afterAll(async () => {
  await Promise.all([primary?.close(), notStandby?.close(), unreachable?.close()]);
  await testDatabase?.drop();
});

function recorder() {
  const seen: Array<`${PageTarget}:${PageReason}`> = [];
  return { seen, observe: (target: PageTarget, reason: PageReason) => void seen.push(`${target}:${reason}`) };
}

/** A page that says which server port answered it. */
const whichServer = async (executor: Executor) =>
  (await executor.execute<{ port: number }>(sql`SELECT inet_server_port() AS port`)).rows[0]!.port;

describe('page reads', () => {
  it('when no replica is configured, every page reads the primary', async () => {
    const { seen, observe } = recorder();
    const reads = createPageReads({ primary, observe });
    expect(await reads.read(async () => 'page')).toBe('page');
    expect(seen).toEqual(['primary:no_replica']);
  });

  it('when the replica has no replay position (it is not a standby), pages read the primary', async () => {
    const { seen, observe } = recorder();
    const reads = createPageReads({ primary, replica: notStandby, observe });
    let executorOf: Executor | undefined;
    await reads.read(async (executor) => {
      executorOf = executor;
      return whichServer(executor);
    });
    expect(executorOf).toBe(primary.db);
    expect(seen).toEqual(['primary:lagging']);
  });

  it('when the replay check is off (tests only), pages read the replica whatever its position', async () => {
    const { seen, observe } = recorder();
    const reads = createPageReads({ primary, replica: notStandby, exact: false, observe });
    let executorOf: Executor | undefined;
    await reads.read(async (executor) => {
      executorOf = executor;
      return whichServer(executor);
    });
    expect(executorOf).not.toBe(primary.db);
    expect(seen).toEqual(['replica:replayed']);
  });

  it('when the replica refuses connections, the page reads the primary and the replica is left alone until its retry time', async () => {
    const { seen, observe } = recorder();
    let clock = 1_000_000;
    const reads = createPageReads({ primary, replica: unreachable, retryAfterMs: 5_000, now: () => clock, observe });
    expect(await reads.read(whichServer)).toBe(Number(new URL(testDatabase.url).port || 5432));
    expect(await reads.read(whichServer)).toBeGreaterThan(0);
    clock += 5_001;
    await reads.read(whichServer);
    expect(seen).toEqual(['primary:replica_error', 'primary:replica_down', 'primary:replica_error']);
  });

  it('when a page fails on the replica for another reason, it is read again on the primary and the replica is not left alone', async () => {
    const { seen, observe } = recorder();
    const reads = createPageReads({ primary, replica: notStandby, exact: false, observe });
    let attempts = 0;
    const result = await reads.read(async (executor) => {
      attempts += 1;
      if (executor !== primary.db) await executor.execute(sql`SELECT 1 / 0`);
      return 'from the primary';
    });
    expect(result).toBe('from the primary');
    expect(attempts).toBe(2);
    await reads.read(async () => 'next');
    expect(seen).toEqual(['primary:replica_error', 'replica:replayed']);
  });
});
