/**
 * Lists at a million records (issue 29): every list request the API serves, at 10,000 and at
 * 1,000,000 customers of one organisation, with its p50/p99 and the growth from one to the other.
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npm run bench:lists
 *
 * Options (environment): BENCH_LARGE_ROWS (1000000), BENCH_SMALL_ROWS (10000), BENCH_REQUESTS (500
 * per request kind and size), BENCH_RESULTS (bench/results/lists.md).
 *
 * The project's production build at its default configuration serves a scratch database holding four
 * organisations, seeded in bulk (then VACUUM ANALYZE, as autovacuum would): a small and a large one
 * for each of two shapes of data.
 *  - `lifetime`: created evenly over two years; 70% changed within 10 s of their creation, 30% once more
 *    at a random time between creation and now; KYC and AML statuses spread as in a real book (0.1%
 *    of records NEEDS_REVIEW).
 *  - `bulk`: the shape the issue measured: created one per millisecond 30 days ago, never changed
 *    since, except 50 records changed now.
 * Both carry review columns as a book would (issue 45, item 7; reviewColumns): 1% of records DUE or
 * OVERDUE, 70% SCHEDULED over the next three years, the rest NOT_SCHEDULED, 5% needing EDD.
 * Each request is sent BENCH_REQUESTS times, one at a time on one connection, and timed at the
 * client (so the figures include HTTP, authentication and the DTOs of 100 rows).
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type pg from 'pg';
import { build, createScratchDatabase, freeLoopbackPort, projectServerEnv, root, startProcess, svc, BENCH_KEY_LIMITS } from './harness.js';

const LARGE = Number(process.env.BENCH_LARGE_ROWS ?? 1_000_000);
const SMALL = Number(process.env.BENCH_SMALL_ROWS ?? 10_000);
const REQUESTS = Number(process.env.BENCH_REQUESTS ?? 500);
const RESULTS = process.env.BENCH_RESULTS ?? join(root, 'bench', 'results', 'lists.md');
type Shape = 'lifetime' | 'bulk';

/**
 * The review columns of record `g`, from hashes of its number rather than random(), so the other
 * columns keep the values they had before these existed: 0.6% DUE (dated in the last 30 days), 0.4%
 * OVERDUE (dated 30 to 330 days ago), 70% SCHEDULED (dated within three years from now), the rest
 * NOT_SCHEDULED without a date; 5% need enhanced due diligence.
 */
const reviewColumns = `
  CASE WHEN rs < 0.006 THEN 'DUE' WHEN rs < 0.01 THEN 'OVERDUE' WHEN rs < 0.71 THEN 'SCHEDULED' ELSE 'NOT_SCHEDULED' END,
  date_trunc('milliseconds', CASE WHEN rs < 0.006 THEN now() - rd * interval '30 days'
                                  WHEN rs < 0.01 THEN now() - interval '30 days' - rd * interval '300 days'
                                  WHEN rs < 0.71 THEN now() + interval '1 minute' + rd * interval '1095 days' END),
  re < 0.05`;
/** Three uniform numbers in [0, 1) per record `g`, for reviewColumns. */
const reviewDraws = `(hashtext('status' || g)::bigint + 2147483648) / 4294967296.0 AS rs,
                     (hashtext('date' || g)::bigint + 2147483648) / 4294967296.0 AS rd,
                     (hashtext('edd' || g)::bigint + 2147483648) / 4294967296.0 AS re`;

async function seedShape(pool: pg.Pool, orgId: string, total: number, shape: Shape) {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    await client.query('SET LOCAL session_replication_role = replica'); // bulk: no per-row triggers
    if (shape === 'lifetime') {
      await client.query('SELECT setseed(0.29)');
      await client.query(
        `INSERT INTO customers (org_id, kind, external_id, type, name, email, kyc_status, aml_status, added_via, created_at, updated_at,
                                review_status, next_review_at, edd_required)
         SELECT $1, 'individual', 'seed-' || g, 'INDIVIDUAL', 'Seeded Person ' || g, 'seed' || g || '@bench.test',
           (ARRAY['VERIFIED','NOT_REQUIRED','PENDING','IN_PROGRESS','NOT_STARTED','FAILED','AWAITING_RESUBMISSION'])[
              CASE WHEN r1 < 0.45 THEN 1 WHEN r1 < 0.75 THEN 2 WHEN r1 < 0.85 THEN 3 WHEN r1 < 0.90 THEN 4 WHEN r1 < 0.95 THEN 5 WHEN r1 < 0.99 THEN 6 ELSE 7 END],
           (ARRAY['CLEAR','NOT_SCREENED','IN_PROGRESS','NEEDS_REVIEW','RESOLVED'])[
              CASE WHEN r2 < 0.60 THEN 1 WHEN r2 < 0.95 THEN 2 WHEN r2 < 0.989 THEN 3 WHEN r2 < 0.990 THEN 4 ELSE 5 END],
           'BULK_IMPORT', c,
           CASE WHEN r3 < 0.7 THEN c + r4 * interval '10 seconds' ELSE c + r4 * (now() - c) END,
           ${reviewColumns}
         FROM (SELECT g, date_trunc('milliseconds', now() - interval '730 days' + (g::float8 / $2) * interval '730 days') AS c,
                      random() r1, random() r2, random() r3, random() r4, ${reviewDraws}
                 FROM generate_series(1, $2::int) g) s`,
        [orgId, total],
      );
    } else {
      await client.query(
        `INSERT INTO customers (org_id, kind, external_id, type, name, email, kyc_status, added_via, created_at, updated_at,
                                review_status, next_review_at, edd_required)
         SELECT $1, 'individual', 'seed-' || g, 'INDIVIDUAL', 'Seeded Person ' || g, 'seed' || g || '@bench.test', 'NOT_REQUIRED', 'BULK_IMPORT',
                now() - interval '30 days' + g * interval '1 millisecond', now() - interval '30 days' + g * interval '1 millisecond',
                ${reviewColumns}
           FROM (SELECT g, ${reviewDraws} FROM generate_series(1, $2::int) AS g) s`,
        [orgId, total],
      );
      await client.query(
        `UPDATE customers SET updated_at = now() WHERE org_id = $1 AND id IN (SELECT id FROM customers WHERE org_id = $1 ORDER BY random() LIMIT 50)`,
        [orgId],
      );
    }
    // The counters the triggers would have kept (migration 0019's backfill, for this organisation).
    await client.query(
      `INSERT INTO customer_counts (org_id, kind, type, kyc_status, aml_status, review_status, edd_required, slot, records)
       SELECT org_id, kind, type, kyc_status, aml_status, review_status, edd_required, 0, count(*)
         FROM customers WHERE org_id = $1 GROUP BY 1, 2, 3, 4, 5, 6, 7`,
      [orgId],
    );
    await client.query('COMMIT');
  } catch (error) {
    await client.query('ROLLBACK');
    throw error;
  } finally {
    client.release();
  }
}

type Stat = { p50: number; p99: number; rows: number };
const percentile = (sorted: number[], p: number) => sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!;

/**
 * The same request kind at both sizes, sent in turns (small, large, small, …) one at a time on one
 * connection, so a drift of the machine weighs on both alike.
 */
async function timedPair(smallUrl: string, smallKey: string, largeUrl: string, largeKey: string): Promise<{ small: Stat; large: Stat }> {
  const send = async (url: string, key: string) => {
    const started = performance.now();
    const response = await fetch(url, { headers: { authorization: `Bearer ${key}` } });
    const body = (await response.json()) as { data?: unknown[]; error?: unknown };
    const elapsed = performance.now() - started;
    if (!response.ok) throw new Error(`${url} answered ${response.status}: ${JSON.stringify(body)}`);
    return { elapsed, rows: body.data?.length ?? 1 };
  };
  for (let index = 0; index < 5; index++) {
    await send(smallUrl, smallKey);
    await send(largeUrl, largeKey);
  }
  const times = { small: [] as number[], large: [] as number[] };
  const rows = { small: 0, large: 0 };
  for (let index = 0; index < REQUESTS; index++) {
    const small = await send(smallUrl, smallKey);
    const large = await send(largeUrl, largeKey);
    times.small.push(small.elapsed);
    times.large.push(large.elapsed);
    rows.small = small.rows;
    rows.large = large.rows;
  }
  const stat = (side: 'small' | 'large'): Stat => {
    const sorted = times[side].sort((a, b) => a - b);
    return { p50: percentile(sorted, 50), p99: percentile(sorted, 99), rows: rows[side] };
  };
  return { small: stat('small'), large: stat('large') };
}

/** The cursor of a deep page: up to 50 pages in, or the last one there is. */
async function deepCursor(base: string, query: string, key: string): Promise<string | undefined> {
  let cursor: string | undefined;
  for (let page = 0; page < 50; page++) {
    const response = await fetch(`${base}/v1/customers?${query}${cursor ? `&cursor=${cursor}` : ''}`, {
      headers: { authorization: `Bearer ${key}` },
    });
    const body = (await response.json()) as { next_cursor: string | null };
    if (!body.next_cursor) break;
    cursor = body.next_cursor;
  }
  return cursor;
}

async function main() {
  build();
  const scratch = await createScratchDatabase('svc_lists');
  const { url, pool } = scratch;
  const orgs: Record<string, { id: string; key: string; size: number; shape: Shape }> = {};
  try {
    for (const shape of ['lifetime', 'bulk'] as const) {
      for (const size of [SMALL, LARGE]) {
        const org = svc(url, ['org', 'create', '--name', `${shape} ${size}`]) as { id: string };
        const { key } = svc(url, [
          'key',
          'create',
          '--org',
          org.id,
          '--scopes',
          'customers:read',
          '--label',
          'bench',
          '--burst-limit',
          String(BENCH_KEY_LIMITS.burst),
          '--daily-limit',
          String(BENCH_KEY_LIMITS.daily),
        ]) as { key: string };
        const started = Date.now();
        await seedShape(pool, org.id, size, shape);
        process.stderr.write(`seeded ${size.toLocaleString('en')} ${shape} records in ${((Date.now() - started) / 1000).toFixed(1)} s\n`);
        orgs[`${shape}:${size}`] = { id: org.id, key, size, shape };
      }
    }
    await pool.query('VACUUM ANALYZE customers');
    await pool.query('VACUUM ANALYZE customer_counts');

    const port = await freeLoopbackPort();
    const server = await startProcess(
      ['bin/svc.js', 'serve'],
      projectServerEnv(url, port),
      `http://127.0.0.1:${port}/readyz`,
      'lists-project',
    );
    const base = `http://127.0.0.1:${port}`;
    const lines: string[] = [];
    try {
      for (const shape of ['lifetime', 'bulk'] as const) {
        const results: Array<{ request: string; small: Stat; large: Stat }> = [];
        const quantile = async (orgId: string, fraction: number) =>
          (
            (
              await pool.query(
                `SELECT percentile_disc($2::float8) WITHIN GROUP (ORDER BY updated_at) AS at FROM customers WHERE org_id = $1`,
                [orgId, 1 - fraction],
              )
            ).rows[0].at as Date
          ).toISOString();
        /** The review date before which `fraction` of the organisation's records fall. */
        const reviewQuantile = async (orgId: string, fraction: number) =>
          (
            (
              await pool.query(
                `SELECT next_review_at AS at FROM customers WHERE org_id = $1 AND next_review_at IS NOT NULL
                  ORDER BY next_review_at OFFSET (SELECT floor(count(*) * $2::float8) FROM customers WHERE org_id = $1) LIMIT 1`,
                [orgId, fraction],
              )
            ).rows[0].at as Date
          ).toISOString();
        // [label, query, also measured with include=total_count]
        const requests = async (org: { id: string }) => {
          const day = new Date(Date.now() - 86_400_000).toISOString();
          const list: Array<[string, string, boolean]> = [
            ['walk, no filter', 'limit=100', true],
            ['walk, updated_since long ago', `limit=100&updated_since=2000-01-01T00:00:00Z`, true],
            ['updated_since matching 5%', `limit=100&updated_since=${await quantile(org.id, 0.05)}`, true],
            ['updated_since matching 50%', `limit=100&updated_since=${await quantile(org.id, 0.5)}`, false],
            ['updated_since one day ago (a daily poll)', `limit=100&updated_since=${day}`, false],
            ['aml_status=NEEDS_REVIEW', 'limit=100&aml_status=NEEDS_REVIEW', true],
            ['status=FAILED', 'limit=100&status=FAILED', true],
            ['status=FAILED&aml_status=NEEDS_REVIEW', 'limit=100&status=FAILED&aml_status=NEEDS_REVIEW', false],
            ['review_status=DUE,OVERDUE', 'limit=100&review_status=DUE,OVERDUE', true],
            ['review_status=SCHEDULED', 'limit=100&review_status=SCHEDULED', true],
            ['review_due_before matching 1%', `limit=100&review_due_before=${await reviewQuantile(org.id, 0.01)}`, true],
            ['edd_required=true', 'limit=100&edd_required=true', true],
          ];
          return list;
        };
        const smallOrg = orgs[`${shape}:${SMALL}`]!;
        const largeOrg = orgs[`${shape}:${LARGE}`]!;
        const smallRequests = await requests(smallOrg);
        const largeRequests = await requests(largeOrg);
        const pair = (request: string, smallPath: string, largePath: string) =>
          timedPair(`${base}${smallPath}`, smallOrg.key, `${base}${largePath}`, largeOrg.key).then((measured) =>
            results.push({ request, ...measured }),
          );
        for (let index = 0; index < smallRequests.length; index++) {
          const [label, smallQuery, counted] = smallRequests[index]!;
          const largeQuery = largeRequests[index]![1];
          await pair(`${label}, first page`, `/v1/customers?${smallQuery}`, `/v1/customers?${largeQuery}`);
          const first = results[results.length - 1]!;
          if (first.small.rows < first.large.rows && first.small.rows > 0) {
            // A page of as many rows at both sizes: the DTOs of 100 rows cost more than those of 7.
            const limit = first.small.rows;
            await pair(
              `${label}, first page, limit=${limit} at both sizes`,
              `/v1/customers?${smallQuery.replace('limit=100', `limit=${limit}`)}`,
              `/v1/customers?${largeQuery.replace('limit=100', `limit=${limit}`)}`,
            );
          }
          const smallCursor = await deepCursor(base, smallQuery, smallOrg.key);
          const largeCursor = await deepCursor(base, largeQuery, largeOrg.key);
          if (smallCursor && largeCursor)
            await pair(
              `${label}, deep page`,
              `/v1/customers?${smallQuery}&cursor=${smallCursor}`,
              `/v1/customers?${largeQuery}&cursor=${largeCursor}`,
            );
          if (counted) {
            await pair(
              `${label}, include=total_count`,
              `/v1/customers?${smallQuery}&include=total_count`,
              `/v1/customers?${largeQuery}&include=total_count`,
            );
          }
        }
        const someId = async (orgId: string) =>
          (await pool.query(`SELECT id FROM customers WHERE org_id = $1 ORDER BY created_at LIMIT 1 OFFSET 5000`, [orgId])).rows[0]
            .id as string;
        await pair('GET /customers/{id}', `/v1/customers/${await someId(smallOrg.id)}`, `/v1/customers/${await someId(largeOrg.id)}`);

        lines.push(
          `### Shape \`${shape}\``,
          '',
          `| Request (100 rows a page) | rows | p50 ${SMALL.toLocaleString('en')} | p50 ${LARGE.toLocaleString('en')} | p99 ${SMALL.toLocaleString('en')} | p99 ${LARGE.toLocaleString('en')} | p50 growth | p99 growth | p99 ≤ 1.5× and ≤ 25 ms |`,
          '|---|---:|---:|---:|---:|---:|---:|---:|---|',
        );
        for (const { request, small, large } of results) {
          const met = large.p99 <= Math.max(1.5 * small.p99, 0) && large.p99 <= 25;
          lines.push(
            `| ${request} | ${small.rows} / ${large.rows} | ${small.p50.toFixed(1)} ms | ${large.p50.toFixed(1)} ms | ${small.p99.toFixed(1)} ms | ${large.p99.toFixed(1)} ms | ${(large.p50 / small.p50).toFixed(2)}× | ${(large.p99 / small.p99).toFixed(2)}× | ${met ? 'met' : '**missed**'} |`,
          );
        }
        lines.push('');
      }
    } finally {
      server.kill('SIGTERM');
    }
    const report = [
      `# Lists at ${LARGE.toLocaleString('en')} records (${new Date().toISOString().slice(0, 10)})`,
      '',
      `The production build at its default configuration; ${REQUESTS} requests of each kind at each size, sent in turns (small, large) one at a time on one connection, timed at the client. "rows" is the page's row count at ${SMALL.toLocaleString('en')} / ${LARGE.toLocaleString('en')}.`,
      '',
      ...lines,
    ].join('\n');
    process.stdout.write(`${report}\n`);
    writeFileSync(RESULTS, `${report}\n`);
  } finally {
    await scratch.drop();
  }
}

await main();
process.exit(0);
