import { afterAll, beforeAll, expect, it } from 'vitest';
import { createDatabase, type Database } from '../../src/db/client.js';
import { createTestDatabase } from '../helpers/database.js';
import { ALL_SCOPES, testServices } from '../helpers/harness.js';
import { call, pool, startServerProcess, type ServerProcess } from './processes.js';
import type { operations } from '../../clients/typescript/schema.js';

let database: Database;
let drop: () => Promise<void>;
let url: string;

beforeAll(async () => {
  const testDatabase = await createTestDatabase();
  drop = testDatabase.drop;
  url = testDatabase.url;
  database = createDatabase(url);
});

afterAll(async () => {
  await database?.close();
  await drop?.();
});

/** GET /v1/imports/{id}'s answer, as the committed typed client has it. */
type ImportDto = operations['getImport']['responses'][200]['content']['application/json'];

/**
 * The file: ROWS rows, every hundredth of each kind spread evenly through it, so that every batch of
 * the worker (500 rows) holds some of each and the crash falls between rows of every kind.
 */
const ROWS = 6_000;
const UPDATE_AT = 7;
const UNCHANGED_AT = 37;
const INVALID_AT = 67;
const PER_KIND = ROWS / 100;
/** Records created through POST /v1/customers before the upload: the file updates the first PER_KIND and repeats the next PER_KIND as they are. */
const EXISTING = 2 * PER_KIND;

const existing = (index: number) => ({
  externalId: `ex-${index}`,
  fullName: `Existing Person ${index}`,
  email: `existing.${index}@example.com`,
});

function importFile(): { text: string; newIds: string[]; expected: ImportDto['counts'] } {
  const lines = ['externalId,fullName,email,phone'];
  const newIds: string[] = [];
  let updates = 0;
  let unchanged = 0;
  let invalid = 0;
  for (let row = 1; row <= ROWS; row += 1) {
    const slot = row % 100;
    if (slot === UPDATE_AT) {
      const record = existing(updates++);
      lines.push(`${record.externalId},${record.fullName},${record.email},+61 400 000 ${String(updates).padStart(3, '0')}`);
    } else if (slot === UNCHANGED_AT) {
      const record = existing(PER_KIND + unchanged++);
      lines.push(`${record.externalId},${record.fullName},${record.email},`);
    } else if (slot === INVALID_AT) {
      // Refused as their single requests would be: a bad email, or a new record without a full name.
      invalid += 1;
      lines.push(invalid % 2 === 0 ? `bad-${row},Bad Person ${row},not-an-email,` : `bad-${row},,bad.${row}@example.com,`);
    } else {
      newIds.push(`new-${row}`);
      lines.push(`new-${row},New Person ${row},new.${row}@example.com,`);
    }
  }
  return { text: lines.join('\n') + '\n', newIds, expected: { created: newIds.length, updated: updates, unchanged, failed: invalid } };
}

async function getImport(server: ServerProcess, key: string, id: string): Promise<ImportDto> {
  const response = await call(server, 'GET', `/v1/imports/${id}`, { key });
  expect(response.status, response.body).toBe(200);
  return JSON.parse(response.body) as ImportDto;
}

const count = async (sql: string, values: unknown[]): Promise<number> => {
  const { rows } = await database.pool.query<{ n: string }>(sql, values);
  return Number(rows[0]!.n);
};

it(
  'when the server is killed with SIGKILL mid-import and restarted, the import resumes and applies every row exactly once',
  { timeout: 420_000 },
  async () => {
    const org = await testServices(database).organisations.create({ name: 'Import crash', credits: 0 });
    const { key } = await testServices(database).apiKeys.create({ orgId: org.id, scopes: ALL_SCOPES });
    const file = importFile();
    expect(file.expected).toEqual({ created: ROWS - 3 * PER_KIND, updated: PER_KIND, unchanged: PER_KIND, failed: PER_KIND });

    let server: ServerProcess | undefined = await startServerProcess({ DATABASE_URL: url });
    let restarted: ServerProcess | undefined;
    try {
      await pool(EXISTING, 10, async (index) => {
        const response = await call(server!, 'POST', '/v1/customers', { key, body: existing(index) });
        expect(response.status, response.body).toBe(201);
      });

      const started = Date.now();
      const uploaded = await fetch(`${server.url}/v1/imports?kind=individuals`, {
        method: 'POST',
        headers: { authorization: `Bearer ${key}`, 'content-type': 'text/csv' },
        body: file.text,
      });
      const uploadBody = await uploaded.text();
      expect(uploaded.status, uploadBody).toBe(202);
      const { id } = JSON.parse(uploadBody) as ImportDto;

      // Killed once a batch has committed and before the last has: the next batch is in flight. Polled fast rather than
      // slowing the worker down to be caught.
      let seen: ImportDto;
      for (;;) {
        seen = await getImport(server, key, id);
        if (seen.rows_done > 0 && seen.rows_done < seen.rows_total) break;
        if (seen.rows_done === seen.rows_total && seen.rows_total > 0) {
          throw new Error(`the import finished (${seen.status}) before it was caught mid-way: make the file bigger (ROWS)`);
        }
        if (Date.now() - started > 120_000) throw new Error(`the import did not start within 120 s: ${JSON.stringify(seen)}`);
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      await server.crash();
      const crashedAfter = Date.now() - started;
      server = undefined;

      // As the crash left it: RUNNING, rows still PENDING, and the applied batches whole (outcomes, counts and records agree).
      const { rows: atCrash } = await database.pool.query<{
        status: string;
        rows_done: number;
        rows_total: number;
        created_count: number;
      }>(`SELECT status, rows_done, rows_total, created_count FROM imports WHERE org_id = $1 AND id = $2`, [org.id, id]);
      expect(atCrash[0]).toMatchObject({ status: 'RUNNING', rows_total: ROWS });
      const pendingAtCrash = await count(`SELECT count(*) AS n FROM import_rows WHERE org_id = $1 AND import_id = $2 AND outcome IS NULL`, [
        org.id,
        id,
      ]);
      expect(pendingAtCrash, 'rows without an outcome at the crash').toBeGreaterThan(0);
      expect(atCrash[0]!.rows_done, 'rows_done at the crash: the rows with an outcome').toBe(ROWS - pendingAtCrash);
      expect(await count(`SELECT count(*) AS n FROM customers WHERE org_id = $1`, [org.id]), 'records at the crash').toBe(
        EXISTING + atCrash[0]!.created_count,
      );

      restarted = await startServerProcess({ DATABASE_URL: url });
      const restartedAt = Date.now();
      // The dead instance's job is retried once its heartbeat lapses (QUEUES.importRun): tens of seconds, then the rest of the rows.
      let finished: ImportDto;
      let resumedAfter: number | undefined;
      const deadline = Date.now() + 300_000;
      for (;;) {
        finished = await getImport(restarted, key, id);
        if (resumedAfter === undefined && finished.rows_done > atCrash[0]!.rows_done) resumedAfter = Date.now() - restartedAt;
        if (finished.status !== 'RUNNING' && finished.status !== 'QUEUED') break;
        if (Date.now() > deadline) throw new Error(`the import did not finish within 300 s of the restart: ${JSON.stringify(finished)}`);
        await new Promise((resolve) => setTimeout(resolve, 250));
      }
      const completedAfterRestart = Date.now() - restartedAt;

      expect(finished).toMatchObject({ status: 'COMPLETED', rows_total: ROWS, rows_done: ROWS, counts: file.expected });
      // Each row applied once: the records, their audit rows and events, and the rows' outcomes.
      expect(await count(`SELECT count(*) AS n FROM customers WHERE org_id = $1`, [org.id]), 'records').toBe(
        EXISTING + file.expected.created,
      );
      const { rows: imported } = await database.pool.query<{ external_id: string; n: string }>(
        `SELECT external_id, count(*) AS n FROM customers WHERE org_id = $1 AND external_id = ANY($2::text[]) GROUP BY external_id`,
        [org.id, file.newIds],
      );
      expect(imported, 'the new external ids stored').toHaveLength(file.newIds.length);
      expect(imported.filter((row) => Number(row.n) !== 1)).toEqual([]);
      expect(
        await count(`SELECT count(*) AS n FROM customers WHERE org_id = $1 AND added_via = 'BULK_IMPORT'`, [org.id]),
        'records added by the import',
      ).toBe(file.expected.created);
      expect(
        await count(`SELECT count(*) AS n FROM customers WHERE org_id = $1 AND external_id LIKE 'bad-%'`, [org.id]),
        'records of refused rows',
      ).toBe(0);
      // One creation audit row per record: none repeated, none of a record that does not exist.
      const { rows: creations } = await database.pool.query<{ rows: string; subjects: string; orphans: string }>(
        `SELECT count(*) AS rows, count(DISTINCT subject_id) AS subjects,
                count(*) FILTER (WHERE NOT EXISTS (SELECT 1 FROM customers c WHERE c.org_id = a.org_id AND c.id = a.subject_id)) AS orphans
           FROM audit_log a WHERE org_id = $1 AND action = 'customer.created'`,
        [org.id],
      );
      expect(
        { rows: Number(creations[0]!.rows), subjects: Number(creations[0]!.subjects), orphans: Number(creations[0]!.orphans) },
        'customer.created audit rows',
      ).toEqual({ rows: EXISTING + file.expected.created, subjects: EXISTING + file.expected.created, orphans: 0 });
      expect(
        await count(`SELECT count(*) AS n FROM audit_log WHERE org_id = $1 AND action = 'customer.upserted'`, [org.id]),
        'customer.upserted audit rows',
      ).toBe(file.expected.updated);
      expect(
        await count(`SELECT count(*) AS n FROM outbox_events WHERE org_id = $1 AND type = 'customer.updated'`, [org.id]),
        'customer.updated events',
      ).toBe(file.expected.updated);
      expect(
        await count(`SELECT count(*) AS n FROM customers WHERE org_id = $1 AND phone IS NOT NULL`, [org.id]),
        'records the file gave a phone',
      ).toBe(file.expected.updated);
      const { rows: outcomes } = await database.pool.query<{ outcome: string | null; n: string }>(
        `SELECT outcome, count(*) AS n FROM import_rows WHERE org_id = $1 AND import_id = $2 GROUP BY outcome ORDER BY outcome`,
        [org.id, id],
      );
      expect(Object.fromEntries(outcomes.map((row) => [row.outcome ?? 'PENDING', Number(row.n)])), 'the rows by outcome').toEqual({
        CREATED: file.expected.created,
        UPDATED: file.expected.updated,
        UNCHANGED: file.expected.unchanged,
        FAILED: file.expected.failed,
      });
      expect(await count(`SELECT count(*) AS n FROM outbox_events WHERE org_id = $1 AND type = 'import.completed'`, [org.id])).toBe(1);
      expect(await count(`SELECT count(*) AS n FROM audit_log WHERE org_id = $1 AND action = 'import.completed'`, [org.id])).toBe(1);
      process.stderr.write(
        `import crash: ${ROWS} rows; killed ${crashedAfter} ms after the upload started at ${atCrash[0]!.rows_done} rows done ` +
          `(${pendingAtCrash} pending); ` +
          `after the restart, the next batch committed within ${resumedAfter} ms and COMPLETED within ${completedAfterRestart} ms\n`,
      );
    } finally {
      await server?.crash();
      await restarted?.stop();
    }
  },
);
