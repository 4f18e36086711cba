/**
 * A book of entities imported three times, as a firm's migration goes: first the book (new entities,
 * many with a new contact person), then the same book with a change to every entity, then that file
 * again (nothing to change). Each file goes through `svc import --kind entities` of the production
 * build, which runs the same job as POST /v1/imports; a file of as many new individuals, imported in
 * the same run, is the reference the entity figures are read against (this machine's speed varies
 * from hour to hour by more than the difference between two commits).
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npm run bench:entity-imports
 *
 * Options (environment): BENCH_IMPORT_ROWS (20000), BENCH_RESULTS (bench/results/entity-imports.md).
 *
 * The book, from a fixed rule so every run imports the same bytes: companies, trusts, partnerships
 * and super funds; 30% with an ABN; 45% with a contact person of their own and 5% sharing one with
 * the row before; 40% existing clients with their pre-commencement fields, the rest with designated
 * services; 5% refused as their single request would be (no type, an ABN on an INTERNATIONAL entity,
 * an INTERNATIONAL entity without its country). The counts of every import are checked: the run
 * exits 1 when they differ from what the file must give.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { build, createScratchDatabase, root, svc } from './harness.js';

const ROWS = Number(process.env.BENCH_IMPORT_ROWS ?? 20_000);
const RESULTS = process.env.BENCH_RESULTS ?? join(root, 'bench', 'results', 'entity-imports.md');

const COLUMNS = [
  'externalId',
  'type',
  'name',
  'origin',
  'abn',
  'address',
  'countryOfFormation',
  'contact.fullName',
  'contact.email',
  'clientSinceDate',
  'risk.isNewCustomer',
  'preCommencementAssessment.significantChange',
  'preCommencementAssessment.resultingRisk',
  'designatedServices',
] as const;
type Cells = Partial<Record<(typeof COLUMNS)[number], string>>;
type Counts = { created: number; updated: number; unchanged: number; failed: number };

const TYPES = ['COMPANY', 'TRUST', 'PARTNERSHIP', 'SMSF'];
const SERVICES = ['PRO-REAL-ESTATE', 'PRO-CLIENT-MONEY', 'PRO-FORMATION', 'FIN-LOANS'];

/** Row `index` of the book (1-based); `street` is the entity's address, the one cell the second file changes. */
function entityRow(index: number, street: string): { cells: Cells; refused: boolean } {
  const cells: Cells = {
    externalId: `ent-${index}`,
    type: TYPES[index % TYPES.length],
    name: `Entity ${index} Holdings`,
    address: `${index} ${street}, Sydney NSW 2000`,
  };
  if (index % 10 < 3) cells.abn = String(10_000_000_000 + index);
  if (index % 20 < 9) Object.assign(cells, { 'contact.fullName': `Contact ${index}`, 'contact.email': `contact${index}@example.com` });
  else if (index % 20 === 9)
    Object.assign(cells, { 'contact.fullName': `Contact ${index - 1}`, 'contact.email': `contact${index - 1}@example.com` });
  if (index % 5 < 2) {
    Object.assign(cells, {
      clientSinceDate: `${2005 + (index % 18)}-0${1 + (index % 9)}-15`,
      'risk.isNewCustomer': 'false',
      'preCommencementAssessment.significantChange': 'false',
      'preCommencementAssessment.resultingRisk': 'LOW',
      designatedServices: SERVICES[index % SERVICES.length],
    });
  } else {
    Object.assign(cells, { 'risk.isNewCustomer': 'true', designatedServices: `${SERVICES[index % SERVICES.length]};FIN-LOANS` });
  }
  if (index % 20 !== 7) return { cells, refused: false };
  switch (Math.floor(index / 20) % 3) {
    case 0:
      return { cells: { ...cells, type: undefined }, refused: true };
    case 1:
      return {
        cells: { ...cells, origin: 'INTERNATIONAL', countryOfFormation: 'NZL', abn: String(20_000_000_000 + index) },
        refused: true,
      };
    default:
      return { cells: { ...cells, origin: 'INTERNATIONAL', abn: undefined }, refused: true };
  }
}

const quote = (text: string) => (/[",\n\r]/.test(text) ? `"${text.replaceAll('"', '""')}"` : text);

function writeBook(path: string, street: string): number {
  const lines = [COLUMNS.join(',')];
  let refused = 0;
  for (let index = 1; index <= ROWS; index += 1) {
    const row = entityRow(index, street);
    if (row.refused) refused += 1;
    lines.push(COLUMNS.map((column) => quote(row.cells[column] ?? '')).join(','));
  }
  writeFileSync(path, lines.join('\n') + '\n');
  return refused;
}

function writeIndividuals(path: string): void {
  const lines = ['externalId,fullName,email,risk.isNewCustomer,designatedServices'];
  for (let index = 1; index <= ROWS; index += 1) {
    lines.push(`crm-${index},Client ${index},client${index}@example.com,true,${SERVICES[index % SERVICES.length]}`);
  }
  writeFileSync(path, lines.join('\n') + '\n');
}

type Finished = { status: string; counts: Counts; rows_total: number; started_at: string; finished_at: string };

function importFile(url: string, orgId: string, kind: 'individuals' | 'entities', file: string, expected: Counts) {
  const finished = svc(url, ['import', '--org', orgId, '--kind', kind, '--file', file]) as Finished;
  const workerSeconds = (Date.parse(finished.finished_at) - Date.parse(finished.started_at)) / 1000;
  const exact = finished.status === 'COMPLETED' && JSON.stringify(finished.counts) === JSON.stringify(expected);
  return { finished, workerSeconds, exact };
}

async function main(): Promise<void> {
  build();
  const files = mkdtempSync(join(tmpdir(), 'svc-entity-imports-'));
  const scratch = await createScratchDatabase('bench_entity_imports');
  try {
    const book = join(files, 'book.csv');
    const changed = join(files, 'changed.csv');
    const individuals = join(files, 'individuals.csv');
    const refused = writeBook(book, 'George St');
    writeBook(changed, 'Pitt St');
    writeIndividuals(individuals);
    const valid = ROWS - refused;
    const none = { created: 0, updated: 0, unchanged: 0, failed: 0 };
    const runs = [
      {
        label: `${ROWS.toLocaleString('en')} new individuals (the reference)`,
        kind: 'individuals' as const,
        file: individuals,
        expected: { ...none, created: ROWS },
      },
      {
        label: 'the book: new entities and contact persons',
        kind: 'entities' as const,
        file: book,
        expected: { ...none, created: valid, failed: refused },
      },
      {
        label: 'the book with every address changed',
        kind: 'entities' as const,
        file: changed,
        expected: { ...none, updated: valid, failed: refused },
      },
      { label: 'the same file again', kind: 'entities' as const, file: changed, expected: { ...none, unchanged: valid, failed: refused } },
    ];
    const measured = runs.map((run) => ({ ...run, ...importFile(scratch.url, scratch.org.id, run.kind, run.file, run.expected) }));
    const reference = measured[0]!;
    const rate = (seconds: number) => Math.round(ROWS / seconds);
    const report = [
      '# Importing a book of entities (issue 46)',
      '',
      `\`npm run bench:entity-imports\` (BENCH_IMPORT_ROWS=${ROWS}), ${new Date().toISOString().slice(0, 10)}. The production build's \`svc import\` (the job POST /v1/imports runs, worked in the CLI's process), on PostgreSQL at DATABASE_URL, this machine; one organisation, the four files one after another. ${refused.toLocaleString('en')} rows of each entity file are refused (FAILED), as their single request would be.`,
      '',
      '| file | counts | worker (started → finished) | rows/s relative to the individuals |',
      '|---|---|---:|---:|',
      ...measured.map(
        (run) =>
          `| ${run.label} | ${JSON.stringify(run.finished.counts)}${run.exact ? '' : ` **expected ${JSON.stringify(run.expected)}**`} | ${run.workerSeconds.toFixed(1)} s: ${rate(run.workerSeconds).toLocaleString('en')} rows/s | ${(reference.workerSeconds / run.workerSeconds).toFixed(2)}× |`,
      ),
      '',
    ].join('\n');
    console.log(report);
    writeFileSync(RESULTS, report);
    if (measured.some((run) => !run.exact)) process.exitCode = 1;
  } finally {
    await scratch.drop();
    rmSync(files, { recursive: true, force: true });
  }
}

await main();
