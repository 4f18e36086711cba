/**
 * The review sweep's cost (issue 45): one organisation of BENCH_ROWS customers (1,000,000), of which
 * BENCH_DUE_SHARE (1%) hold a SCHEDULED review whose date has passed. One sweep makes them DUE, with
 * an audit row and a customer.review_due event each; then the steady state: a sweep with nothing due,
 * and one with a single review due (a minute of a real book).
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npm run bench:review-sweep
 *
 * It runs on a PostgreSQL cluster of its own with pg_stat_statements preloaded, so every statement the
 * sweep sends is counted (calls, rows, shared blocks read or hit), as the write budget counts a request's.
 * Figures go to BENCH_RESULTS (bench/results/review-sweep.md).
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import pg from 'pg';
import { createDatabase } from '../src/db/client.js';
import { runMigrations } from '../src/db/migrate.js';
import { createServices } from '../src/services.js';
import { startCluster } from '../test/helpers/pg-cluster.js';
import { root } from './harness.js';

const ROWS = Number(process.env.BENCH_ROWS ?? 1_000_000);
const DUE_SHARE = Number(process.env.BENCH_DUE_SHARE ?? 0.01);
const RESULTS = process.env.BENCH_RESULTS ?? join(root, 'bench', 'results', 'review-sweep.md');

type Cost = { label: string; ms: number; due: number; statements: number; rows: number; blocks: number };

async function main() {
  const cluster = await startCluster({
    shared_preload_libraries: 'pg_stat_statements',
    'pg_stat_statements.track': 'all',
    shared_buffers: '256MB',
  });
  try {
    const admin = new pg.Client({ connectionString: cluster.url() });
    await admin.connect();
    await admin.query('CREATE DATABASE app');
    await admin.query('CREATE EXTENSION pg_stat_statements');
    await runMigrations(cluster.url('app'));
    const appDb = (await admin.query<{ oid: number }>(`SELECT oid::int AS oid FROM pg_database WHERE datname = 'app'`)).rows[0]!.oid;

    const database = createDatabase(cluster.url('app'), { poolSize: 4 });
    const services = createServices({
      config: { publicBaseUrl: 'http://localhost', webhookAllowPrivateUrls: true, webhookAllowedPorts: [], retention: {} as never },
      database,
      sealer: { seal: (text: string) => text, open: (text: string) => text } as never,
      jobs: { send: async () => {} },
    });
    const org = await services.organisations.create({ name: 'Sweep Org', features: [], credits: 0, defaultPayer: 'organization' });
    const seeded = performance.now();
    // Seeded on a connection of its own, without the service's statement timeout, in slices of 100,000.
    const seeder = new pg.Client({ connectionString: cluster.url('app') });
    await seeder.connect();
    const due = Math.round(ROWS * DUE_SHARE);
    for (let from = 1; from <= ROWS; from += 100_000) {
      await seeder.query('BEGIN');
      await seeder.query('SET LOCAL session_replication_role = replica'); // bulk: no per-row triggers
      await seeder.query(
        `INSERT INTO customers (org_id, kind, type, name, email, kyc_status, kyc_completed_at, added_via, review_status, next_review_at)
         SELECT $1, 'individual', 'INDIVIDUAL', 'Person ' || g, 'p' || g || '@bench.test', 'VERIFIED', now() - interval '3 years', 'BULK_IMPORT', 'SCHEDULED',
                CASE WHEN g <= $2 THEN now() - interval '1 hour' + g * interval '1 millisecond' ELSE now() + interval '1 day' + g * interval '1 second' END
           FROM generate_series($3::int, least($3::int + 99999, $4::int)) AS g`,
        [org.id, due, from, ROWS],
      );
      await seeder.query('COMMIT');
    }
    await seeder.query('VACUUM ANALYZE customers');
    await seeder.end();
    console.log(`seeded ${ROWS} customers in ${((performance.now() - seeded) / 1000).toFixed(1)} s`);

    const measure = async (label: string): Promise<Cost> => {
      await admin.query('SELECT pg_stat_statements_reset()');
      const started = performance.now();
      const swept = await services.reviewJobs.sweep();
      const ms = performance.now() - started;
      const { rows } = await admin.query<{ statements: string; rows: string; blocks: string }>(
        `SELECT sum(calls)::text AS statements, sum(rows)::text AS rows, sum(shared_blks_hit + shared_blks_read)::text AS blocks
           FROM pg_stat_statements WHERE dbid = $1 AND toplevel`,
        [appDb],
      );
      return {
        label,
        ms,
        due: swept.due,
        statements: Number(rows[0]!.statements),
        rows: Number(rows[0]!.rows),
        blocks: Number(rows[0]!.blocks),
      };
    };
    const costs = [await measure(`${(DUE_SHARE * 100).toFixed(0)}% due at once`), await measure('nothing due')];
    await database.pool.query(
      `UPDATE customers SET next_review_at = now() - interval '1 second' WHERE org_id = $1 AND id = (SELECT id FROM customers WHERE org_id = $1 AND review_status = 'SCHEDULED' LIMIT 1)`,
      [org.id],
    );
    costs.push(await measure('one review due'));

    const lines = [
      `# Review sweep at ${ROWS.toLocaleString('en-AU')} customers`,
      '',
      `One organisation; statements counted by pg_stat_statements (top-level: each BEGIN and COMMIT counts), rows = rows returned or written, blocks = shared blocks read or hit.`,
      '',
      '| sweep | reviews made due | ms | statements | rows | blocks |',
      '|---|---:|---:|---:|---:|---:|',
      ...costs.map(
        (cost) => `| ${cost.label} | ${cost.due} | ${cost.ms.toFixed(0)} | ${cost.statements} | ${cost.rows} | ${cost.blocks} |`,
      ),
      '',
    ];
    writeFileSync(RESULTS, lines.join('\n'));
    console.log(lines.join('\n'));
    await database.close();
    await admin.end();
  } finally {
    await cluster.stop();
  }
}

await main();
