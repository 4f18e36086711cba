import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { createTestContext, type TestContext } from '../helpers/harness.js';
import { runSvc, type SvcResult } from '../helpers/svc-process.js';
import { runSvcInProcess } from '../helpers/cli-in-process.js';

// The commands run in this process (runSvcInProcess); `bin/svc.js` itself is spawned at the end.
vi.setConfig({ testTimeout: 120_000 });

let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

const UNKNOWN_ID = '00000000-0000-4000-8000-000000000000';
const ORGANISATION_FIELDS = ['id', 'name', 'features', 'credits', 'default_payer', 'is_sandbox', 'created_at', 'updated_at'].sort();
const KEY_FIELDS = [
  'id',
  'org_id',
  'label',
  'prefix',
  'scopes',
  'allowed_ips',
  'burst_limit',
  'daily_limit',
  'expires_at',
  'revoked_at',
  'last_used_at',
  'created_at',
].sort();

function svc(...args: string[]): Promise<SvcResult> {
  return runSvcInProcess(args, { DATABASE_URL: ctx.databaseUrl });
}

/** A successful operator command: exit 0 and the whole of stdout is one JSON document. */
async function svcJson<T = Record<string, unknown>>(...args: string[]): Promise<T> {
  const result = await svc(...args);
  expect(result.stderr === '' || !/error/i.test(result.stderr), result.stderr).toBe(true);
  expect(result.code).toBe(0);
  return JSON.parse(result.stdout) as T;
}

function expectFailure(result: SvcResult, message: RegExp): void {
  expect(result.code).not.toBe(0);
  expect(result.code).not.toBeNull();
  expect(result.stdout).toBe('');
  expect(result.stderr).toMatch(message);
}

/** Runs the commands side by side and checks each one failed as expected. */
async function expectFailures(cases: Array<[args: string[], message: RegExp]>): Promise<void> {
  const results = await Promise.all(cases.map(([args]) => svc(...args)));
  results.forEach((result, index) => {
    const [args, message] = cases[index]!;
    expect(result.code, `svc ${args.join(' ')}`).not.toBe(0);
    expect(result.code).not.toBeNull();
    expect(result.stdout, `svc ${args.join(' ')}`).toBe('');
    expect(result.stderr, `svc ${args.join(' ')}`).toMatch(message);
  });
}

describe('svc org', () => {
  it('when an organisation is created, it prints exactly the organisation as one JSON document', async () => {
    const org = await svcJson(
      'org',
      'create',
      '--name',
      'Acme Conveyancing',
      '--features',
      'groups',
      '--credits',
      '25',
      '--default-payer',
      'customer',
    );
    expect(Object.keys(org).sort()).toEqual(ORGANISATION_FIELDS);
    expect(org).toMatchObject({
      name: 'Acme Conveyancing',
      features: ['groups'],
      credits: 25,
      default_payer: 'customer',
      is_sandbox: false,
    });
  });

  it('when defaults are used, the organisation has no features, no credits and the organisation pays', async () => {
    const org = await svcJson('org', 'create', '--name', 'Plain');
    expect(org).toMatchObject({ features: [], credits: 0, default_payer: 'organization' });
  });

  it('when an organisation is shown, it prints the stored organisation', async () => {
    const created = await svcJson<{ id: string }>('org', 'create', '--name', 'Shown Ltd', '--credits', '3');
    const shown = await svcJson('org', 'show', created.id);
    expect(shown).toEqual(created);
  });

  it('when credits are added, the balance moves and a ledger row records the adjustment', async () => {
    const created = await svcJson<{ id: string }>('org', 'create', '--name', 'Topped Up', '--credits', '5');
    const updated = await svcJson('org', 'update', created.id, '--add-credits', '10', '--features', 'groups,kyb_extra_methods');
    expect(updated).toMatchObject({ id: created.id, credits: 15, features: ['groups', 'kyb_extra_methods'] });
    const ledger = await ctx.database.pool.query(
      'SELECT delta, balance_after, reason FROM credit_ledger WHERE org_id = $1 ORDER BY created_at, id',
      [created.id],
    );
    expect(ledger.rows).toEqual([
      { delta: 5, balance_after: 5, reason: 'initial_credits' },
      { delta: 10, balance_after: 15, reason: 'operator_adjustment' },
    ]);
  });

  it('when removing credits would make the balance negative, it fails and changes nothing', async () => {
    const created = await svcJson<{ id: string }>('org', 'create', '--name', 'Small', '--credits', '2');
    expectFailure(await svc('org', 'update', created.id, '--add-credits', '-3'), /below zero/);
    expect(await svcJson('org', 'show', created.id)).toMatchObject({ credits: 2 });
  });

  it('when the organisation id is unknown, show and update exit non-zero with a message and print nothing', async () => {
    await expectFailures([
      [['org', 'show', UNKNOWN_ID], /Organisation not found/],
      [['org', 'show', 'not-a-uuid'], /Organisation not found/],
      [['org', 'update', UNKNOWN_ID, '--add-credits', '1'], /Organisation not found/],
    ]);
  });

  it('when a feature or payer is unknown, it exits non-zero naming the bad value', async () => {
    await expectFailures([
      [['org', 'create', '--name', 'X', '--features', 'groups,teleport'], /teleport/],
      [['org', 'create', '--name', 'X', '--default-payer', 'nobody'], /organization, customer/],
      [['org', 'create', '--name', 'X', '--credits', 'lots'], /--credits must be a whole number/],
      [['org', 'create'], /--name/],
    ]);
    const created = await ctx.database.pool.query(`SELECT id FROM organisations WHERE name = 'X'`);
    expect(created.rows).toEqual([]);
  });
});

describe('svc key', () => {
  it('when a key is created with every option, it prints the key once with its settings', async () => {
    const org = await svcJson<{ id: string }>('org', 'create', '--name', 'Keyed');
    const created = await svcJson<Record<string, unknown>>(
      'key',
      'create',
      '--org',
      org.id,
      '--scopes',
      'customers:read,customers:write',
      '--label',
      'ci',
      '--allow-ip',
      '10.0.0.0/8,192.0.2.7,2001:db8::/32',
      '--burst-limit',
      '5',
      '--daily-limit',
      '500',
      '--expires-at',
      '2031-01-02T03:04:05Z',
    );
    expect(Object.keys(created).sort()).toEqual([...KEY_FIELDS, 'key'].sort());
    expect(created).toMatchObject({
      org_id: org.id,
      label: 'ci',
      scopes: ['customers:read', 'customers:write'],
      allowed_ips: ['10.0.0.0/8', '192.0.2.7/32', '2001:db8::/32'],
      burst_limit: 5,
      daily_limit: 500,
      expires_at: '2031-01-02T03:04:05.000Z',
      revoked_at: null,
    });
    expect(created.key).toMatch(/^svc_live_[0-9A-Za-z]{32,}$/);
    expect(String(created.key).startsWith(String(created.prefix))).toBe(true);
  });

  it('when keys are listed, they are shown without their secret', async () => {
    const org = await svcJson<{ id: string }>('org', 'create', '--name', 'Listed');
    const first = await svcJson<{ id: string; key: string }>('key', 'create', '--org', org.id, '--scopes', 'customers:read');
    const second = await svcJson<{ id: string; key: string }>('key', 'create', '--org', org.id, '--scopes', 'aml:read');
    const result = await svc('key', 'list', '--org', org.id);
    expect(result.code).toBe(0);
    const listed = JSON.parse(result.stdout) as Array<Record<string, unknown>>;
    expect(listed.map((key) => key.id)).toEqual([first.id, second.id]);
    for (const key of listed) expect(Object.keys(key).sort()).toEqual(KEY_FIELDS);
    expect(result.stdout).not.toContain(first.key);
    expect(result.stdout).not.toContain(second.key);
  });

  it('when a key is revoked, it prints the key with revoked_at set, and revoking again keeps the first time', async () => {
    const org = await svcJson<{ id: string }>('org', 'create', '--name', 'Revoking');
    const created = await svcJson<{ id: string }>('key', 'create', '--org', org.id, '--scopes', 'customers:read');
    const revoked = await svcJson<{ id: string; revoked_at: string | null }>('key', 'revoke', created.id);
    expect(revoked.id).toBe(created.id);
    expect(Date.parse(revoked.revoked_at ?? '')).not.toBeNaN();
    const again = await svcJson<{ revoked_at: string }>('key', 'revoke', created.id);
    expect(again.revoked_at).toBe(revoked.revoked_at);
    const [listed] = await svcJson<Array<{ revoked_at: string }>>('key', 'list', '--org', org.id);
    expect(listed?.revoked_at).toBe(revoked.revoked_at);
  });

  it('when a key request is invalid, it exits non-zero with a message and prints nothing', async () => {
    const org = await svcJson<{ id: string }>('org', 'create', '--name', 'Refused');
    const failures: Array<[string[], RegExp]> = [
      [['key', 'create', '--org', UNKNOWN_ID, '--scopes', 'customers:read'], /Organisation not found/],
      [['key', 'create', '--org', org.id, '--scopes', 'customers:read,everything'], /Unknown scope.*everything/],
      [['key', 'create', '--org', org.id, '--scopes', 'customers:read', '--allow-ip', '10.0.0.300'], /10\.0\.0\.300/],
      [['key', 'create', '--org', org.id, '--scopes', 'customers:read', '--expires-at', 'soon'], /--expires-at.*ISO 8601/],
      [
        ['key', 'create', '--org', org.id, '--scopes', 'customers:read', '--expires-at', '2020-01-01T00:00:00Z'],
        /--expires-at.*must be in the future/,
      ],
      // Year 10000 once in UTC: past PostgreSQL's input range, refused before any SQL.
      [
        ['key', 'create', '--org', org.id, '--scopes', 'customers:read', '--expires-at', '9999-12-31T23:59:59-14:00'],
        /--expires-at.*9999-12-31T23:59:59\.999Z/,
      ],
      [['key', 'create', '--org', org.id, '--scopes', 'customers:read', '--burst-limit', '0'], /burstLimit/],
      [['key', 'list', '--org', UNKNOWN_ID], /Organisation not found/],
      [['key', 'revoke', UNKNOWN_ID], /API key not found/],
    ];
    await expectFailures(failures);
    const keys = await ctx.database.pool.query('SELECT id FROM api_keys WHERE org_id = $1', [org.id]);
    expect(keys.rows).toEqual([]);
  });
});

describe('operator changes are audited', () => {
  it('when an operator creates and updates an organisation and creates and revokes a key, each change has an audit row naming the operator, without the key', async () => {
    const org = await svcJson<{ id: string }>('org', 'create', '--name', 'Audited', '--credits', '1');
    await svcJson('org', 'update', org.id, '--add-credits', '4');
    const key = await svcJson<{ id: string; key: string }>('key', 'create', '--org', org.id, '--scopes', 'customers:read');
    await svcJson('key', 'revoke', key.id);
    await svcJson('key', 'revoke', key.id); // already revoked: no second row

    const { rows } = await ctx.database.pool.query(
      'SELECT actor_type, actor_id, action, subject_id, before, after FROM audit_log WHERE org_id = $1 ORDER BY created_at, id',
      [org.id],
    );
    expect(rows.map((row) => [row.action, row.subject_id])).toEqual([
      ['organisation.created', org.id],
      ['organisation.updated', org.id],
      ['api_key.created', key.id],
      ['api_key.revoked', key.id],
    ]);
    for (const row of rows) {
      expect(row.actor_type).toBe('operator');
      expect(row.actor_id).toMatch(/^cli:/);
    }
    expect(rows[1].before).toMatchObject({ credits: 1 });
    expect(rows[1].after).toMatchObject({ credits: 5 });
    expect(rows[3].before).toMatchObject({ revoked_at: null });
    expect(rows[3].after.revoked_at).toEqual(expect.any(String));
    expect(JSON.stringify(rows)).not.toContain(key.key);
  });
});

describe('svc --help', () => {
  const NO_DATABASE = { DATABASE_URL: 'postgres://nobody@127.0.0.1:1/none' };

  function subcommands(help: string): string[] {
    // Only the "Commands:" block, which ends at the first blank line (help text may follow it).
    const section = (help.split(/\nCommands:\n/)[1] ?? '').split(/\n\s*\n/)[0] ?? '';
    return section
      .split('\n')
      .map((line) => /^ {2}(\S+)/.exec(line)?.[1])
      .filter((name): name is string => name !== undefined && name !== 'help' && /^[a-z][a-z-]*$/.test(name));
  }

  it('when --help is given to any command, it prints usage and exits 0 without touching a database', async () => {
    // Walk the command tree from the help output itself, so commands added by other modules are covered too.
    const helps = new Map<string, SvcResult>();
    const visit = async (paths: string[][]): Promise<void> => {
      const results = await Promise.all(paths.map((path) => runSvcInProcess([...path, '--help'], NO_DATABASE)));
      const next: string[][] = [];
      results.forEach((result, index) => {
        const path = paths[index]!;
        helps.set(path.join(' '), result);
        for (const name of subcommands(result.stdout)) next.push([...path, name]);
      });
      if (next.length > 0) await visit(next);
    };
    await visit([[]]);

    for (const expected of ['serve', 'worker', 'migrate', 'org create', 'org show', 'org update', 'key create', 'key list', 'key revoke']) {
      expect([...helps.keys()]).toContain(expected);
    }
    for (const [path, result] of helps) {
      expect(result.code, `svc ${path} --help`).toBe(0);
      expect(result.stdout, `svc ${path} --help`).toMatch(new RegExp(`^Usage: svc ${path}`.trimEnd()));
    }
  });
});

describe('bin/svc.js', () => {
  it('when no build is given (a fresh clone: `npm install && npm start`), it runs the TypeScript sources through tsx', async () => {
    expect(process.env.SVC_BUILD_DIR, 'the global setup compiles a build for the other tests').toBeTruthy();
    const fromSources = await runSvc(['migrate'], { DATABASE_URL: ctx.databaseUrl, SVC_BUILD_DIR: undefined });
    expect(fromSources.code, fromSources.stderr).toBe(0);
    expect(JSON.parse(fromSources.stdout)).toEqual({ applied: 0 });
  });

  it('when run as a process, a failed command exits 1 with the reason on stderr, and usage errors and --help exit as commander says', async () => {
    const [missing, unknown, help] = await Promise.all([
      runSvc(['org', 'show', UNKNOWN_ID], { DATABASE_URL: ctx.databaseUrl }),
      runSvc(['no-such-command'], {}),
      runSvc(['org', '--help'], {}),
    ]);
    expect(missing).toMatchObject({ code: 1, stdout: '' });
    expect(missing.stderr).toMatch(/^error: Organisation not found\.$/m);
    expect(unknown).toMatchObject({ code: 1, stdout: '' });
    expect(unknown.stderr).toMatch(/^error: unknown command 'no-such-command'$/m);
    expect(help).toMatchObject({ code: 0, stderr: '' });
    expect(help.stdout).toMatch(/^Usage: svc org /);
  });

  it('when `svc serve` is refused by the database server itself (an unknown database), its log line and its error line name the server message, and it exits 1', async () => {
    const missing = new URL(ctx.databaseUrl);
    missing.pathname = `/h43_missing_${Date.now()}`;
    const name = missing.pathname.slice(1);
    const result = await runSvc(['serve'], { DATABASE_URL: missing.toString(), PORT: '0', LOG_LEVEL: 'info' });
    expect(result).toMatchObject({ code: 1, stdout: '' });
    const logged = result.stderr
      .split('\n')
      .filter((line) => line.startsWith('{'))
      .map((line) => JSON.parse(line) as { msg: string; err?: { sqlState?: string; message?: string } });
    expect(logged.find((line) => line.msg === 'failed to start')?.err).toMatchObject({
      sqlState: '3D000',
      message: `database "${name}" does not exist`,
    });
    expect(result.stderr).toMatch(
      new RegExp(`^error: the database refused the command \\(\\w+ 3D000\\): database "${name}" does not exist$`, 'm'),
    );
  });
});
