/**
 * The events feed at a million events (issue 30): GET /v1/events and GET /v1/events/{id} at 10,000
 * and at 1,000,000 events of one organisation, p50/p99 and the growth from one to the other, plus
 * the plans of the feed's queries at 1,000,000.
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npm run bench:feed
 *
 * Options (environment): BENCH_LARGE_ROWS (1000000), BENCH_SMALL_ROWS (10000), BENCH_REQUESTS (500
 * per request kind and size), BENCH_RESULTS (bench/results/events-feed.md).
 *
 * As bench/lists.bench.ts: the production build at its default configuration (WEBHOOK_WORKER=off, the
 * feed sealer running as in every instance) serves a scratch database with two organisations, their
 * events seeded in bulk with generate_series, already sealed (positions 1..N, the head at N), spread
 * over the last 20 days (inside the 30-day retention, so the server's purge at start leaves them),
 * then VACUUM ANALYZE. 1,000 customers each; every 50th event is about one "hot" customer (a full
 * page for the customer_id filter at both sizes), the others about a random customer. The baseline is
 * the small organisation in the same run: each request is sent BENCH_REQUESTS times at both sizes in
 * turns (small, large), one at a time on one connection, timed at the client (HTTP, authentication
 * and 100 parsed payloads included).
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type pg from 'pg';
import { BENCH_KEY_LIMITS, build, createScratchDatabase, freeLoopbackPort, projectServerEnv, root, startProcess, svc } from './harness.js';

const LARGE = Number(process.env.BENCH_LARGE_ROWS ?? 1_000_000);
const SMALL = Number(process.env.BENCH_SMALL_ROWS ?? 10_000);
const REQUESTS = Number(process.env.BENCH_REQUESTS ?? 500);
const RESULTS = process.env.BENCH_RESULTS ?? join(root, 'bench', 'results', 'events-feed.md');
const CUSTOMERS = 1_000;
const HOT_EVERY = 50;

type Org = { id: string; key: string; size: number };

async function seed(pool: pg.Pool, orgId: string, total: number): Promise<void> {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    await client.query('SET LOCAL session_replication_role = replica'); // bulk: no per-row triggers
    await client.query(
      `INSERT INTO customers (org_id, kind, external_id, type, name, email, kyc_status, added_via, created_at, updated_at)
       SELECT $1, 'individual', 'feed-' || g, 'INDIVIDUAL', 'Seeded Person ' || g, 'feed' || g || '@bench.test', 'NOT_REQUIRED', 'INTEGRATION',
              now() - interval '60 days', now() - interval '60 days'
         FROM generate_series(1, $2::int) AS g`,
      [orgId, CUSTOMERS],
    );
    // The webhook envelope of a customer.updated as the API writes it (a DTO of about 600 bytes).
    await client.query(
      `WITH people AS (SELECT array_agg(id ORDER BY external_id) AS ids FROM customers WHERE org_id = $1),
       hot AS (SELECT id FROM customers WHERE org_id = $1 AND external_id = 'feed-1'),
       rows AS (
         SELECT g, gen_random_uuid() AS id,
                CASE WHEN g % ${HOT_EVERY} = 0 THEN (SELECT id FROM hot) ELSE (SELECT ids FROM people)[1 + floor(random() * ${CUSTOMERS})::int] END AS customer_id,
                (ARRAY['customer.updated','customer.updated','customer.updated','customer.kyc_completed','aml.review_completed'])[1 + (g % 5)] AS type,
                date_trunc('milliseconds', now() - interval '20 days' + (g::float8 / $2) * interval '20 days') AS created_at
           FROM generate_series(1, $2::int) AS g)
       INSERT INTO outbox_events (id, org_id, type, customer_id, payload, created_at, position)
       SELECT r.id, $1, r.type, r.customer_id,
              json_build_object('id', r.id, 'type', r.type, 'created', to_char(r.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
                'data', json_build_object('customer', json_build_object(
                  'id', r.customer_id, 'external_id', 'feed-x', 'type', 'INDIVIDUAL', 'full_name', 'Seeded Person', 'email', 'seeded@bench.test',
                  'kyc_status', 'VERIFIED', 'kyc_started_at', '2026-01-01T00:00:00.000Z', 'kyc_completed_at', '2026-01-02T00:00:00.000Z',
                  'identity', json_build_object('verified_legal_name', 'Seeded Person', 'verified_country', 'AUS'),
                  'aml', json_build_object('status', 'CLEAR', 'screened_at', '2026-01-01T00:00:00.000Z', 'last_reviewed_at', null,
                    'flags', json_build_object('pep', false, 'sanctions', false, 'adverse_media', false, 'terrorism', false)),
                  'added_via', 'INTEGRATION', 'created_at', '2026-01-01T00:00:00.000Z', 'updated_at', '2026-01-02T00:00:00.000Z')))::text,
              r.created_at, r.g
         FROM rows r`,
      [orgId, total],
    );
    await client.query('INSERT INTO event_feed_heads (org_id, last_position) VALUES ($1, $2)', [orgId, total]);
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

async function send(
  url: string,
  key: string,
): Promise<{
  elapsed: number;
  rows: number;
  body: { data?: unknown[]; next_cursor?: string | null; resume_cursor?: string; has_more?: boolean };
}> {
  const started = performance.now();
  const response = await fetch(url, { headers: { authorization: `Bearer ${key}` } });
  const body = (await response.json()) as {
    data?: unknown[];
    next_cursor?: string | null;
    resume_cursor?: string;
    has_more?: boolean;
    error?: unknown;
  };
  const elapsed = performance.now() - started;
  if (!response.ok) throw new Error(`${url} answered ${response.status}: ${JSON.stringify(body)}`);
  return { elapsed, rows: body.data?.length ?? 1, body };
}

/** The same request at both sizes, in turns (small, large, …), so a drift of the machine weighs on both alike. */
async function timedPair(smallUrl: string, smallKey: string, largeUrl: string, largeKey: string): Promise<{ small: Stat; large: Stat }> {
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

/** The resume_cursor half way through the feed, reached as a consumer would: page by page. */
async function middleCursor(base: string, org: Org): Promise<string> {
  let cursor = '';
  for (let seen = 0; seen < org.size / 2;) {
    const { body } = await send(`${base}/v1/events?limit=100${cursor ? `&cursor=${cursor}` : ''}`, org.key);
    seen += body.data?.length ?? 0;
    cursor = body.resume_cursor!;
    if (!body.has_more) break;
  }
  return cursor;
}

/** The plans of the feed's statements at the large size, as the repository sends them (events.repository.ts). */
async function plans(pool: pg.Pool, org: Org): Promise<string[]> {
  const hot = (await pool.query(`SELECT id FROM customers WHERE org_id = $1 AND external_id = 'feed-1'`, [org.id])).rows[0].id as string;
  const middle = Math.floor(org.size / 2);
  const someId = (await pool.query('SELECT id FROM outbox_events WHERE org_id = $1 AND position = $2', [org.id, middle])).rows[0]
    .id as string;
  const statements: Array<[string, string, unknown[]]> = [
    [
      'first page',
      'SELECT id, position, payload FROM outbox_events WHERE org_id = $1 AND position > $2 ORDER BY position LIMIT $3',
      [org.id, 0, 101],
    ],
    [
      'deep page',
      'SELECT id, position, payload FROM outbox_events WHERE org_id = $1 AND position > $2 ORDER BY position LIMIT $3',
      [org.id, middle, 101],
    ],
    [
      'customer_id page',
      'SELECT id, position, payload FROM outbox_events WHERE org_id = $1 AND position > $2 AND customer_id = $3 ORDER BY position LIMIT $4',
      [org.id, 0, hot, 101],
    ],
    ['by id', 'SELECT id, payload FROM outbox_events WHERE org_id = $1 AND id = $2', [org.id, someId]],
  ];
  const out: string[] = [];
  for (const [label, text, values] of statements) {
    const { rows } = await pool.query(`EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) ${text}`, values);
    out.push(`${label}:`, '```', ...rows.map((row: Record<string, string>) => row['QUERY PLAN']!), '```', '');
  }
  return out;
}

async function main() {
  build();
  const scratch = await createScratchDatabase('svc_feed');
  const { url, pool } = scratch;
  try {
    const orgs: Record<'small' | 'large', Org> = {} as Record<'small' | 'large', Org>;
    for (const [side, size] of [
      ['small', SMALL],
      ['large', LARGE],
    ] as const) {
      const org = svc(url, ['org', 'create', '--name', `feed ${size}`]) as { id: string };
      const { key } = svc(url, [
        'key',
        'create',
        '--org',
        org.id,
        '--scopes',
        'events:read',
        '--label',
        'bench',
        '--burst-limit',
        String(BENCH_KEY_LIMITS.burst),
        '--daily-limit',
        String(BENCH_KEY_LIMITS.daily),
      ]) as { key: string };
      const started = Date.now();
      await seed(pool, org.id, size);
      process.stderr.write(`seeded ${size.toLocaleString('en')} events in ${((Date.now() - started) / 1000).toFixed(1)} s\n`);
      orgs[side] = { id: org.id, key, size };
    }
    await pool.query('VACUUM ANALYZE outbox_events');
    await pool.query('VACUUM ANALYZE customers');

    const port = await freeLoopbackPort();
    const server = await startProcess(
      ['bin/svc.js', 'serve'],
      projectServerEnv(url, port),
      `http://127.0.0.1:${port}/readyz`,
      'feed-project',
    );
    const base = `http://127.0.0.1:${port}`;
    const results: Array<{ request: string; small: Stat; large: Stat }> = [];
    try {
      const { small, large } = orgs;
      const pair = async (request: string, smallPath: string, largePath: string) =>
        results.push({ request, ...(await timedPair(`${base}${smallPath}`, small.key, `${base}${largePath}`, large.key)) });
      await pair('first page', '/v1/events?limit=100', '/v1/events?limit=100');
      await pair(
        'deep page (a cursor half way through the feed)',
        `/v1/events?limit=100&cursor=${await middleCursor(base, small)}`,
        `/v1/events?limit=100&cursor=${await middleCursor(base, large)}`,
      );
      await pair(
        'customer_id (external_id of a customer with every 50th event), first page',
        '/v1/events?limit=100&customer_id=feed-1',
        '/v1/events?limit=100&customer_id=feed-1',
      );
      const middleId = async (org: Org) =>
        (await pool.query('SELECT id FROM outbox_events WHERE org_id = $1 AND position = $2', [org.id, Math.floor(org.size / 2)])).rows[0]
          .id as string;
      await pair('GET /events/{id}', `/v1/events/${await middleId(small)}`, `/v1/events/${await middleId(large)}`);
    } finally {
      server.kill('SIGTERM');
    }
    const explained = await plans(pool, orgs.large);

    const lines = [
      `| Request | rows | p50 ${SMALL.toLocaleString('en')} | p50 ${LARGE.toLocaleString('en')} | p99 ${SMALL.toLocaleString('en')} | p99 ${LARGE.toLocaleString('en')} | p50 growth | p99 growth | within 1.2× (p50) |`,
      '|---|---:|---:|---:|---:|---:|---:|---:|---|',
      ...results.map(
        ({ request, small, large }) =>
          `| ${request} | ${small.rows} / ${large.rows} | ${small.p50.toFixed(1)} ms | ${large.p50.toFixed(1)} ms | ${small.p99.toFixed(1)} ms | ${large.p99.toFixed(1)} ms | ${(large.p50 / small.p50).toFixed(2)}× | ${(large.p99 / small.p99).toFixed(2)}× | ${large.p50 <= 1.2 * small.p50 ? 'met' : '**missed**'} |`,
      ),
    ];
    const report = [
      `# Events feed at ${LARGE.toLocaleString('en')} events (${new Date().toISOString().slice(0, 10)})`,
      '',
      `\`npm run bench:feed\`: the production build at its default configuration; two organisations in one database, ${SMALL.toLocaleString('en')} and ${LARGE.toLocaleString('en')} sealed events; ${REQUESTS} requests of each kind at each size, sent in turns (small, large) one at a time on one connection, timed at the client. "rows" is the page's row count at ${SMALL.toLocaleString('en')} / ${LARGE.toLocaleString('en')}.`,
      '',
      ...lines,
      '',
      `## Plans at ${LARGE.toLocaleString('en')} events`,
      '',
      ...explained,
    ].join('\n');
    process.stdout.write(`${report}\n`);
    writeFileSync(RESULTS, `${report}\n`);
  } finally {
    await scratch.drop();
  }
}

await main();
process.exit(0);
