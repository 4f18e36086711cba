import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { and, eq } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { auditLog, groupTemplates } from '../../db/schema.js';
import { createTestContext, type TestContext, type TestOrg } from '../../../test/helpers/harness.js';
import { runSvcInProcess } from '../../../test/helpers/cli-in-process.js';

let ctx: TestContext;
let org: TestOrg;
const folder = mkdtempSync(join(tmpdir(), 'svc-templates-'));

beforeAll(async () => {
  ctx = await createTestContext();
  org = await ctx.createOrg({ features: ['groups'] });
});
afterAll(async () => ctx?.close());

function writeFile(name: string, content: unknown): string {
  const path = join(folder, name);
  writeFileSync(path, typeof content === 'string' ? content : JSON.stringify(content));
  return path;
}

async function svc(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const { code, stdout, stderr } = await runSvcInProcess(args, { DATABASE_URL: ctx.databaseUrl, LOG_LEVEL: 'warn' });
  return { code: code ?? 1, stdout, stderr };
}

const validFile = {
  code: 'estate-admin',
  name: 'Deceased estate administration',
  description: 'Probate and distribution',
  industry: 'LEGAL',
  roles: [
    { roleLabel: 'Executor', partyType: 'INDIVIDUAL', checkTrigger: 'ON_ADD' },
    { roleLabel: 'Beneficiary', required: false, checkTrigger: 'BEFORE_SETTLEMENT' },
  ],
};

describe('svc template create', () => {
  it('when the file is valid, it prints the CUSTOM template as one JSON document and the API lists it', async () => {
    const result = await svc(['template', 'create', '--org', org.id, '--file', writeFile('valid.json', validFile)]);
    expect(result.code).toBe(0);
    const printed = JSON.parse(result.stdout);
    expect(printed).toEqual({
      id: expect.any(String),
      code: 'estate-admin',
      name: 'Deceased estate administration',
      description: 'Probate and distribution',
      industry: 'LEGAL',
      source: 'CUSTOM',
      is_verified: false,
      roles: [
        { role_label: 'Executor', party_type: 'INDIVIDUAL', required: true, check_trigger: 'ON_ADD' },
        { role_label: 'Beneficiary', party_type: 'EITHER', required: false, check_trigger: 'BEFORE_SETTLEMENT' },
      ],
    });

    const listed = await ctx.request('GET', '/v1/group-templates', { key: org.key });
    expect(listed.json().data.at(-1)).toEqual(printed);
    const audits = await ctx.database.db
      .select()
      .from(auditLog)
      .where(and(eq(auditLog.orgId, org.id), eq(auditLog.subjectId, printed.id)));
    expect(audits).toMatchObject([{ action: 'group_template.created', actorType: 'operator' }]);

    const group = await ctx.request('POST', '/v1/groups', { key: org.key, body: { name: 'Estate of J. Smith', templateId: printed.id } });
    expect(group.statusCode).toBe(201);
    expect(group.json()).toMatchObject({ industry: 'LEGAL', parties: [{ role_label: 'Executor' }, { role_label: 'Beneficiary' }] });
  });

  it('when the file breaks the rules, it exits non-zero naming every bad field and stores nothing', async () => {
    const file = writeFile('invalid.json', {
      code: 'PB-MINE',
      industry: 'LEGAL',
      roles: [{ roleLabel: 'Client', partyType: 'ROBOT', checkTrigger: 'SOMETIMES' }],
      colour: 'blue',
    });
    const result = await svc(['template', 'create', '--org', org.id, '--file', file]);
    expect(result.code).not.toBe(0);
    expect(result.stdout).toBe('');
    for (const field of [
      'code: the "PB-" prefix is reserved',
      'name: is required',
      'roles[0].partyType:',
      'roles[0].checkTrigger:',
      'colour: Unknown property.',
    ]) {
      expect(result.stderr).toContain(field);
    }
    expect(await ctx.database.db.$count(groupTemplates, eq(groupTemplates.source, 'CUSTOM'))).toBe(1);
  });

  it('when roles is empty, repeats a label, or the JSON is malformed, it says so', async () => {
    const empty = await svc([
      'template',
      'create',
      '--org',
      org.id,
      '--file',
      writeFile('empty.json', { ...validFile, code: 'x', roles: [] }),
    ]);
    expect(empty.code).not.toBe(0);
    expect(empty.stderr).toMatch(/roles: must have at least one role/);

    const repeated = { ...validFile, code: 'x', roles: [{ roleLabel: 'Client' }, { roleLabel: 'client' }] };
    const duplicate = await svc(['template', 'create', '--org', org.id, '--file', writeFile('dup.json', repeated)]);
    expect(duplicate.code).not.toBe(0);
    expect(duplicate.stderr).toMatch(/roles\[1\]\.roleLabel: duplicates the label of roles\[0\]/);

    const malformed = await svc(['template', 'create', '--org', org.id, '--file', writeFile('broken.json', '{"code": "x",')]);
    expect(malformed.code).not.toBe(0);
    expect(malformed.stderr).toMatch(/file: .*not valid JSON/);
    // Three CLI processes in a row, each compiling the sources through tsx: 30 s each on a loaded machine.
  }, 90_000);

  it('when the code is taken in the organisation, it exits non-zero naming code', async () => {
    const result = await svc(['template', 'create', '--org', org.id, '--file', writeFile('clash.json', { ...validFile, name: 'Other' })]);
    expect(result.code).not.toBe(0);
    expect(result.stderr).toMatch(/code: A template with code "estate-admin" already exists/);
  });

  it('when the organisation does not exist, it exits non-zero', async () => {
    const result = await svc([
      'template',
      'create',
      '--org',
      '00000000-0000-4000-8000-000000000000',
      '--file',
      writeFile('valid2.json', validFile),
    ]);
    expect(result.code).not.toBe(0);
    expect(result.stderr).toMatch(/Organisation not found/);
  });
});
