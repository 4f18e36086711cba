import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { inject } from 'vitest';
import { startServerProcess, type ServerProcess } from './processes.js';
import {
  createFaultDatabase,
  describeOutcomes,
  FAULT_TIMEOUTS,
  mixedRequest,
  ok,
  printFigures,
  seedCustomers,
  sleep,
  startLoad,
  type FaultDatabase,
} from './database-faults.js';
import { findPgBouncer, startPgBouncer, type PgBouncer } from './pgbouncer.js';

// Issue 26, item 8 (e): behind PgBouncer in transaction mode, where consecutive statements of one
// client connection may run on different server connections, so named prepared statements cannot
// work (PgBouncer 1.18 of Debian 12 does not track them). DATABASE_PREPARED_STATEMENTS=false sends
// only unnamed statements. The timeouts still reach pg as startup parameters, which this PgBouncer
// ignores (see pgbouncer.ts): behind a pooler they belong on the role.
const pgbouncer = findPgBouncer();
if (!pgbouncer) {
  console.warn(
    'database-faults (e) skipped: pgbouncer is not installed (Debian package "pgbouncer"; .ci/run installs it when apt-get can)',
  );
}
const LOAD_MS = 10_000;

describe.skipIf(!pgbouncer)('behind pgbouncer', () => {
  let fault: FaultDatabase;
  let bouncer: PgBouncer | undefined;
  let server: ServerProcess | undefined;

  beforeAll(async () => {
    fault = await createFaultDatabase('pgbouncer');
    bouncer = await startPgBouncer(pgbouncer!, inject('adminDatabaseUrl'));
    server = await startServerProcess({ DATABASE_URL: bouncer.via(fault.url), DATABASE_PREPARED_STATEMENTS: 'false', ...FAULT_TIMEOUTS });
  });

  afterAll(async () => {
    await server?.stop();
    await bouncer?.stop();
    await fault?.drop();
  });

  it('when it runs behind pgbouncer in transaction mode with DATABASE_PREPARED_STATEMENTS=false, it serves 10 s of concurrent reads and upserts with zero errors', async () => {
    const ids = await seedCustomers(server!, fault.key, 'seed', 30);
    const load = startLoad(server!, fault.key, 8, (worker, n) => mixedRequest(ids, worker, n));
    await sleep(LOAD_MS);
    const outcomes = await load.stop();

    const readiness = await fetch(`${server!.url}/readyz`);
    printFigures('database-faults (e) pgbouncer transaction mode, DATABASE_PREPARED_STATEMENTS=false, 10 s', outcomes, {
      timeToHealthyMs: 0, // no fault injected: healthy throughout
      readyzAfter: readiness.status,
    });

    const failures = outcomes.filter((outcome) => !ok(outcome));
    expect(outcomes.length).toBeGreaterThan(100);
    expect(
      failures.length,
      `errors behind pgbouncer: ${describeOutcomes(failures)}\n${server!.output().slice(-4000)}\n${bouncer!.output().slice(-2000)}`,
    ).toBe(0);
    expect(readiness.status).toBe(200);
  }, 120_000);
});
