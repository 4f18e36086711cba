import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  formatViolations,
  LOG_FILE_SUFFIX,
  scanLogDirectory,
  scanLogLines,
  SENT_FILE_SUFFIX,
  sentValuesToLookFor,
} from './helpers/log-scan.js';

const SENT = ['Jane Quinn Citizen', 'jane.citizen@example.com', '+61 400 123 456', 'Ada', 'trust'];

/** A log line as the service writes it. */
const line = (fields: Record<string, unknown>) =>
  JSON.stringify({ level: 30, time: 1795629849210, pid: 4242, hostname: 'vm', reqId: 'req-1', ...fields });
const scan = (...lines: string[]) =>
  scanLogLines(
    lines.map((text) => ({ line: text, source: 'a.test.ts-1' })),
    SENT,
  );
const rulesOf = (...lines: string[]) => scan(...lines).flatMap((violation) => violation.broken.map(({ rule }) => rule));

describe('the log scan', () => {
  it('when a line holds a name, email or phone a test sent, it fails the line, whatever the case', () => {
    expect(rulesOf(line({ msg: 'created Jane Quinn Citizen' }))).toEqual(['sent personal data']);
    expect(rulesOf(line({ msg: 'x', customer: { contact: 'JANE QUINN CITIZEN' } }))).toEqual(['sent personal data']);
    expect(rulesOf(line({ msg: 'call +61 400 123 456' }))).toEqual(['sent personal data']);
  });

  it('when a line holds an email address, sent or not, it fails the line', () => {
    expect(rulesOf(line({ msg: 'email to jane.citizen@example.com' }))).toEqual(['sent personal data']);
    expect(rulesOf(line({ msg: 'email to someone.else@example.org' }))).toEqual(['email address']);
  });

  it("when a line holds SQL text, placeholders or a driver's failed-query message, it fails the line", () => {
    expect(rulesOf(line({ err: { query: 'insert into "customers" ("email") values ($1)' } }))).toEqual(['SQL text']);
    expect(rulesOf(line({ err: { query: 'select "id", "email" from "customers" where "org_id" = $1' } }))).toEqual(['SQL text']);
    expect(rulesOf(line({ msg: 'update customers set email = 1' }))).toEqual(['SQL text']);
    expect(rulesOf(line({ msg: 'DELETE FROM emails' }))).toEqual(['SQL text']);
    expect(rulesOf(line({ msg: 'select id, email from customers' }))).toEqual(['SQL text']);
    expect(rulesOf(line({ msg: 'select count(*) from customers' }))).toEqual(['SQL text']);
    expect(rulesOf(line({ msg: 'select email from customers where id = 1' }))).toEqual(['SQL text']);
    expect(rulesOf(line({ msg: 'Failed query: select 1\nparams: 1' }))).toEqual(['SQL text']);
    expect(rulesOf(line({ msg: 'values ($1, $2)' }))).toEqual(['SQL text']);
  });

  it('when a line holds an API key, it fails the line, wherever the key sits', () => {
    expect(rulesOf(line({ msg: 'key svc_live_sBJEkpYxohWi47R71ULZndhUlHpQK6EgOZgLmysQ' }))).toEqual(['API key']);
    expect(rulesOf(line({ url: '/v1/customers?access_token=svc_live_' }))).toEqual(['API key']);
  });

  it('when lines are what the service writes (request lines, error fields, frames, words like select or update), they pass', () => {
    expect(
      rulesOf(
        line({
          apiKeyId: 'f0c3debb-0452-4309-99e1-1e5b53d2b35c',
          method: 'PATCH',
          route: '/v1/customers/:id',
          status: 422,
          durationMs: 3.5,
          msg: 'request',
        }),
        line({
          route: '/v1/customers',
          status: 500,
          err: { type: 'DatabaseError', sqlState: '23505', table: 'customers', constraint: 'customers_org_email_key' },
          msg: 'unhandled error',
        }),
        line({
          err: {
            type: 'TypeError',
            stack:
              '    at Object.select (file:///app/node_modules/drizzle-orm/pg-core/db.js:12:3)\n    at update (file:///app/src/x.ts:1:1)',
          },
          msg: 'failed',
        }),
        line({ msg: 'select a template from the catalogue; update the record where needed; cost $ 5' }),
        line({ msg: 'Server listening at http://127.0.0.1:43123' }),
        line({ msg: 'trust ada admin' }),
        line({ err: { stack: '    at file:///work/main/node_modules/@fastify/swagger/index.js:1:1' }, msg: 'pino@9.14.0' }),
      ),
    ).toEqual([]);
  });

  it('when a sent value is shorter than five characters or one lower-case word, it is not looked for (it occurs in ordinary lines)', () => {
    expect(sentValuesToLookFor(['Ada', 'trust', 'admin', ' Jane Citizen ', 'Zoë "Z" O\'Neil'])).toEqual([
      'jane citizen',
      'zoë "z" o\'neil',
      'zoë \\"z\\" o\'neil',
    ]);
  });

  it('when a sent value is part of a longer word or number, it is not counted; as a whole word it is', () => {
    const scanOf = (text: string) => scanLogLines([{ line: text, source: 's' }], ['Citizen', '0412345678']);
    expect(scanOf(line({ msg: 'Citizenship checked', time: 179604123456780 }))).toEqual([]);
    expect(scanOf(line({ msg: 'Citizen checked' })).map((violation) => violation.broken)).toEqual([
      [{ rule: 'sent personal data', match: 'citizen' }],
    ]);
    expect(scanOf(line({ msg: 'phone 0412345678.' })).map((violation) => violation.broken)).toEqual([
      [{ rule: 'sent personal data', match: '0412345678' }],
    ]);
  });

  it('when lines fail, the message lists each rule broken, with the line shortened and where it came from', () => {
    const message = formatViolations(
      scan(line({ msg: 'Failed query', long: 'x'.repeat(1000) }), line({ msg: 'svc_live_abc for Jane Quinn Citizen' })),
      10,
    );
    expect(message).toMatch(/^Log scan: 2 of 10 log lines break the rules \(1 × SQL text, 1 × sent personal data, 1 × API key\)\./);
    expect(message).toContain('[SQL text: "Failed query"] written during a.test.ts-1');
    expect(message).toContain('[sent personal data: "jane quinn citizen"; API key: "svc_live_"] written during a.test.ts-1');
    expect(message).toContain('…');
    expect(message.length).toBeLessThan(1500);
  });

  it("when the run's directory holds log files and sent values of several test files, each value is looked for in every file", () => {
    const directory = mkdtempSync(join(tmpdir(), 'svc-log-scan-unit-'));
    try {
      writeFileSync(join(directory, `a.test.ts-1${SENT_FILE_SUFFIX}`), `${JSON.stringify('Jane Quinn Citizen')}\n`);
      writeFileSync(join(directory, `a.test.ts-1${LOG_FILE_SUFFIX}`), `${line({ msg: 'request' })}\n`);
      writeFileSync(
        join(directory, `b.test.ts-2${LOG_FILE_SUFFIX}`),
        `${line({ msg: 'request' })}\n${line({ msg: 'hello Jane Quinn Citizen' })}\n`,
      );
      const result = scanLogDirectory(directory);
      expect(result.scannedLines).toBe(3);
      expect(result.violations).toEqual([
        expect.objectContaining({ source: 'b.test.ts-2', broken: [{ rule: 'sent personal data', match: 'jane quinn citizen' }] }),
      ]);
    } finally {
      rmSync(directory, { recursive: true, force: true });
    }
  });
});
