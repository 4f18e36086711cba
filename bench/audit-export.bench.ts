/**
 * `svc audit export` at 10,000 and at 1,000,000 sealed audit rows of one organisation (issue 31,
 * "Scale"): the export's peak RSS at both sizes (constant memory: about the same), its rows/s, the
 * file's size, and `svc audit verify --file` of both files (offline, no database), with its peak RSS.
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npm run bench:audit-export
 *
 * Options (environment): BENCH_LARGE_ROWS (1000000), BENCH_SMALL_ROWS (10000), BENCH_FORMAT (ndjson),
 * BENCH_RESULTS (bench/results/audit-export.md).
 *
 * The production build runs each command as an operator would (`node bin/svc.js …`, NODE_ENV=
 * production) under `/usr/bin/time -v`, whose "Maximum resident set size" is the peak RSS. The rows
 * are seeded already sealed, in pages of 10,000: the harness reserves a block of audit ids, builds each
 * row (a customer.updated with a customer snapshot of about 250 bytes before and after), chains it
 * with the project's own chainHash (audit-chain.ts, as the sealer would), and inserts the page with
 * its sequences and hashes through unnest; then the chain head, and VACUUM ANALYZE. The export then
 * verifies offline only if every hash is real.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type pg from 'pg';
import { chainHash, GENESIS_HASH } from '../src/modules/audit/audit-chain.js';
import { build, cleanEnv, createBenchOrganisation, createScratchDatabase, root } from './harness.js';

const LARGE = Number(process.env.BENCH_LARGE_ROWS ?? 1_000_000);
const SMALL = Number(process.env.BENCH_SMALL_ROWS ?? 10_000);
const FORMAT = process.env.BENCH_FORMAT ?? 'ndjson';
const RESULTS = process.env.BENCH_RESULTS ?? join(root, 'bench', 'results', 'audit-export.md');
const PAGE = 10_000;

/** Seeds `total` sealed rows (sequences 1..total) for `orgId` with real hashes; returns the head hash. */
async function seed(pool: pg.Pool, orgId: string, total: number): Promise<string> {
  const { rows } = await pool.query<{ first: string }>(
    `SELECT setval('audit_log_id_seq', nextval('audit_log_id_seq') + $1::bigint) - $1::bigint + 1 AS first`,
    [total],
  );
  const firstId = BigInt(rows[0]!.first);
  // Spread over the last 30 days, at whole milliseconds (the column's precision as the chain reads it).
  const start = Date.now() - 30 * 86_400_000;
  const step = Math.max(1, Math.floor((30 * 86_400_000) / total));
  const subjects = Array.from({ length: 1_000 }, (_, index) => `00000000-0000-4000-8000-${String(index).padStart(12, '0')}`);
  let previousHash = GENESIS_HASH;
  for (let from = 1; from <= total; from += PAGE) {
    const columns = {
      id: [] as string[],
      sequence: [] as number[],
      createdAt: [] as string[],
      subjectId: [] as string[],
      before: [] as string[],
      after: [] as string[],
      requestId: [] as string[],
      hash: [] as string[],
    };
    for (let sequence = from; sequence < Math.min(total + 1, from + PAGE); sequence += 1) {
      const id = String(firstId + BigInt(sequence - 1));
      const createdAt = new Date(start + sequence * step);
      const subjectId = subjects[sequence % subjects.length]!;
      const customer = {
        id: subjectId,
        external_id: `crm-${sequence % subjects.length}`,
        full_name: `Seeded Person ${sequence % subjects.length}`,
        email: `person${sequence}@bench.test`,
        phone: '+61400000000',
        kyc_status: 'VERIFIED',
        aml_status: 'CLEAR',
        updated_at: createdAt.toISOString(),
      };
      const before = customer;
      const after = { ...customer, email: `person${sequence + 1}@bench.test` };
      const requestId = `req-${sequence}`;
      const hash = chainHash(previousHash, {
        orgId,
        id,
        sequence,
        createdAt,
        actorType: 'operator',
        actorId: 'cli:bench',
        action: 'customer.updated',
        subjectType: 'customer',
        subjectId,
        before,
        after,
        requestId,
        idempotencyKey: null,
      });
      previousHash = hash;
      columns.id.push(id);
      columns.sequence.push(sequence);
      columns.createdAt.push(createdAt.toISOString());
      columns.subjectId.push(subjectId);
      columns.before.push(JSON.stringify(before));
      columns.after.push(JSON.stringify(after));
      columns.requestId.push(requestId);
      columns.hash.push(hash);
    }
    await pool.query(
      `INSERT INTO audit_log (id, org_id, actor_type, actor_id, action, subject_type, subject_id, before, after, request_id, created_at, sequence, hash)
       SELECT v.id, $1, 'operator', 'cli:bench', 'customer.updated', 'customer', v.subject_id, v.before, v.after, v.request_id, v.created_at, v.sequence, v.hash
         FROM unnest($2::bigint[], $3::bigint[], $4::timestamptz[], $5::uuid[], $6::jsonb[], $7::jsonb[], $8::text[], $9::text[])
              AS v(id, sequence, created_at, subject_id, before, after, request_id, hash)`,
      [
        orgId,
        columns.id,
        columns.sequence,
        columns.createdAt,
        columns.subjectId,
        columns.before,
        columns.after,
        columns.requestId,
        columns.hash,
      ],
    );
    if ((from - 1) % 100_000 === 0) process.stdout.write(`  seeded ${from - 1 + columns.id.length} of ${total}\n`);
  }
  await pool.query(
    `INSERT INTO audit_chain_heads (org_id, last_sequence, last_hash) VALUES ($1, $2, $3)
     ON CONFLICT (org_id) DO UPDATE SET last_sequence = EXCLUDED.last_sequence, last_hash = EXCLUDED.last_hash`,
    [orgId, total, previousHash],
  );
  return previousHash;
}

type Timed = { stdout: string; seconds: number; maxRssMb: number };

/** `node bin/svc.js …args` under /usr/bin/time -v: its stdout, wall time and peak RSS. */
function timedSvc(databaseUrl: string | undefined, args: string[]): Timed {
  const report = join(tmpdir(), `svc-time-${process.pid}-${Date.now()}.txt`);
  const env = { ...cleanEnv(), NODE_ENV: 'production', ...(databaseUrl ? { DATABASE_URL: databaseUrl } : {}) };
  const started = process.hrtime.bigint();
  let stdout: string;
  try {
    stdout = execFileSync('/usr/bin/time', ['-v', '-o', report, process.execPath, 'bin/svc.js', ...args], {
      cwd: root,
      env,
      encoding: 'utf8',
      maxBuffer: 64 * 1024 * 1024,
    });
  } catch (error) {
    const failed = error as { stderr?: string; stdout?: string; message: string };
    throw new Error(`svc ${args.join(' ')} failed: ${failed.stderr || failed.message}\n${failed.stdout ?? ''}`, { cause: error });
  }
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  const text = execFileSync('cat', [report], { encoding: 'utf8' });
  rmSync(report, { force: true });
  const kb = Number(/Maximum resident set size \(kbytes\): (\d+)/.exec(text)?.[1]);
  return { stdout, seconds, maxRssMb: kb / 1024 };
}

const round = (value: number, digits = 1) => Number(value.toFixed(digits));

async function main(): Promise<void> {
  build();
  const scratch = await createScratchDatabase('bench_audit_export');
  const folder = mkdtempSync(join(tmpdir(), 'bench-audit-export-'));
  try {
    const small = createBenchOrganisation(scratch.url, 'Small');
    const sizes = [
      { name: 'small', orgId: small.id, rows: SMALL },
      { name: 'large', orgId: scratch.org.id, rows: LARGE },
    ];
    for (const size of sizes) {
      const started = Date.now();
      process.stdout.write(`seeding ${size.rows} sealed rows (${size.name})\n`);
      await seed(scratch.pool, size.orgId, size.rows);
      process.stdout.write(`  ${round((Date.now() - started) / 1000)} s\n`);
    }
    await scratch.pool.query('VACUUM ANALYZE audit_log');

    const results = [];
    for (const size of sizes) {
      const file = join(folder, `${size.name}.${FORMAT}`);
      const exported = timedSvc(scratch.url, ['audit', 'export', '--org', size.orgId, '--format', FORMAT, '--out', file]);
      const manifest = JSON.parse(exported.stdout) as { rows: number; head_hash: string };
      if (manifest.rows !== size.rows) throw new Error(`exported ${manifest.rows} rows, seeded ${size.rows}`);
      const bytes = statSync(file).size;
      // Offline: no DATABASE_URL at all.
      const verified = timedSvc(undefined, ['audit', 'verify', '--file', file]);
      const verdict = JSON.parse(verified.stdout) as { ok: boolean; rows: number; head_hash: string };
      if (!verdict.ok || verdict.rows !== size.rows || verdict.head_hash !== manifest.head_hash)
        throw new Error(`verify --file: ${verified.stdout}`);
      results.push({ ...size, exported, verified, bytes });
      process.stdout.write(
        `${size.name}: export ${round(exported.seconds)} s, ${Math.round(size.rows / exported.seconds)} rows/s, peak RSS ${round(exported.maxRssMb)} MB, ${round(bytes / 1e6)} MB; ` +
          `verify --file ${round(verified.seconds)} s, peak RSS ${round(verified.maxRssMb)} MB\n`,
      );
      rmSync(file, { force: true });
    }

    const [smallRun, largeRun] = results;
    const lines = [
      '# svc audit export at 10,000 and 1,000,000 rows',
      '',
      `Run ${new Date().toISOString()} with \`npm run bench:audit-export\` (bench/audit-export.bench.ts), Node ${process.versions.node}, format ${FORMAT}, on this machine (2 vCPU).`,
      'Each command ran as an operator runs it (`node bin/svc.js`, production build) under `/usr/bin/time -v`; the peak RSS is its "Maximum resident set size".',
      '',
      '| Rows | Export time | Export rows/s | Export peak RSS | File size | `verify --file` time | `verify --file` rows/s | `verify --file` peak RSS |',
      '|---:|---:|---:|---:|---:|---:|---:|---:|',
      ...results.map(
        (run) =>
          `| ${run.rows.toLocaleString('en-US')} | ${round(run.exported.seconds)} s | ${Math.round(run.rows / run.exported.seconds).toLocaleString('en-US')} | ${round(run.exported.maxRssMb)} MB | ${round(run.bytes / 1e6)} MB | ${round(run.verified.seconds)} s | ${Math.round(run.rows / run.verified.seconds).toLocaleString('en-US')} | ${round(run.verified.maxRssMb)} MB |`,
      ),
      '',
      `Peak RSS of the export at ${largeRun!.rows.toLocaleString('en-US')} rows against ${smallRun!.rows.toLocaleString('en-US')}: ${round(largeRun!.exported.maxRssMb - smallRun!.exported.maxRssMb)} MB more ` +
        `(${round(largeRun!.exported.maxRssMb / smallRun!.exported.maxRssMb, 2)}×) for ${round(largeRun!.rows / smallRun!.rows, 0)}× the rows; \`verify --file\`: ${round(largeRun!.verified.maxRssMb - smallRun!.verified.maxRssMb)} MB more.`,
      'The export reads keyset pages of 5,000 rows in one REPEATABLE READ READ ONLY transaction and writes each page before reading the next (awaiting drain);',
      "`verify --file` reads the file line by line and keeps only the previous row (the manifest is read first from the file's last 64 KB).",
      "Both times include the process start (about 0.5 s here); the export's also the count and range queries.",
      '',
    ];
    writeFileSync(RESULTS, `${lines.join('\n')}`);
    process.stdout.write(`\nwritten to ${RESULTS}\n`);
  } finally {
    rmSync(folder, { recursive: true, force: true });
    await scratch.drop();
  }
}

await main();
