import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';
import { randomUUID } from 'node:crypto';
import { PassThrough } from 'node:stream';
import type { Command } from 'commander';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { createProgram } from '../../src/cli/program.js';
import { createCliRunner } from '../../src/cli/runner.js';
import { createAuditChainSealer, type AuditChainSealer } from '../../src/modules/audit/audit-chain.sealer.js';
import { ROUTE_SCOPES } from '../../src/plugins/route-scopes.js';
import { multipart, pdfBytes } from '../documents/document-helpers.js';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { runSvcInProcess } from '../helpers/cli-in-process.js';

/**
 * Issue 31, coverage: every mutation, through the API or the operator CLI, appears in the trail, read
 * back through GET /v1/audit-events, with who did it (and for the API, the request's Idempotency-Key);
 * and it commits in the transaction of the change.
 */

// Each spawned `svc` loads the build compiled once for the run.
vi.setConfig({ testTimeout: 120_000 });

type AuditEvent = {
  id: string;
  sequence: number;
  actor: { type: string; id: string | null; key_label: string | null };
  action: string;
  subject: { type: string; id: string | null };
  changes: Record<string, { old: unknown; new: unknown }>;
  request_id: string | null;
  idempotency_key: string | null;
};
type Expected = { action: string; subject: { type: string; id: string | null } };

let ctx: TestContext;
let sealer: AuditChainSealer;
/** Every plaintext secret the scenarios were handed (API keys, webhook secrets): none may reach the trail. */
const secretsSeen: string[] = [];

beforeAll(async () => {
  ctx = await createTestContext();
  sealer = createAuditChainSealer({ database: ctx.database, pollIntervalMs: 60_000 });
});
afterAll(async () => {
  await sealer?.stop();
  await ctx?.close();
});

/** Every sealed event of the organisation, in chain order, read as an auditor would: through the API. */
async function trail(key: string, query: Record<string, string> = {}): Promise<AuditEvent[]> {
  await sealer.sealOnce();
  const events: AuditEvent[] = [];
  let cursor: string | undefined;
  for (;;) {
    const response = await ctx.request('GET', '/v1/audit-events', {
      key,
      query: { ...query, limit: '100', ...(cursor ? { cursor } : {}) },
    });
    expect(response.statusCode, response.body).toBe(200);
    const body = response.json<{ data: AuditEvent[]; has_more: boolean; next_cursor: string | null }>();
    events.push(...body.data);
    if (body.next_cursor === null) return events;
    cursor = body.next_cursor;
  }
}

const WEBHOOK_URL = 'https://93.184.215.14/hooks/coverage';

async function call(org: TestOrg, method: string, url: string, status: number, body?: unknown, idempotencyKey?: string): Promise<any> {
  const response = await ctx.request(method, url, {
    key: org.key,
    body,
    headers: idempotencyKey ? { 'idempotency-key': idempotencyKey } : {},
  });
  expect(response.statusCode, `${method} ${url}: ${response.body}`).toBe(status);
  const json = response.body ? response.json() : undefined;
  // A link's token is a secret the audit trail must never hold.
  for (const link of [json?.verification_link, json?.upload_url]) if (typeof link === 'string') secretsSeen.push(link.split('/').pop()!);
  return json;
}

const suffix = () => Math.random().toString(36).slice(2, 8);
const createCustomer = (org: TestOrg) =>
  call(org, 'POST', '/v1/customers', 201, { fullName: `Person ${suffix()}`, email: `p.${suffix()}@example.com` });
const createEntity = (org: TestOrg) =>
  call(org, 'POST', '/v1/entities', 201, {
    type: 'COMPANY',
    name: `Entity ${suffix()} Pty Ltd`,
    contact: { fullName: `Contact ${suffix()}`, email: `c.${suffix()}@example.com` },
  });
const owners = () => ({
  owners: [{ fullName: `Olive Owner ${suffix()}`, email: `owner.${suffix()}@example.com`, roleTypes: ['SHAREHOLDER'], percentageHeld: 60 }],
});
const createEndpoint = async (org: TestOrg) => {
  const endpoint = await call(org, 'POST', '/v1/webhook-endpoints', 201, { url: WEBHOOK_URL });
  secretsSeen.push(endpoint.secret);
  return endpoint;
};

/** POST /v1/imports with a small CSV as the raw body (the worker is not run here). */
async function uploadImport(org: TestOrg, idempotencyKey?: string): Promise<{ id: string }> {
  const response = await ctx.request('POST', '/v1/imports?kind=individuals', {
    key: org.key,
    body: `externalId,fullName,email\ncrm-${suffix()},Ivy Imported,ivy.${suffix()}@example.com\n`,
    headers: { 'content-type': 'text/csv', ...(idempotencyKey ? { 'idempotency-key': idempotencyKey } : {}) },
  });
  expect(response.statusCode, response.body).toBe(202);
  return response.json();
}

/** One mutating request: `run` makes its fixtures, sends the request with the Idempotency-Key, and names the rows it must leave. */
type ApiScenario = { route: string; name?: string; run(org: TestOrg, idempotencyKey: string): Promise<Expected[]> };

const API_SCENARIOS: ApiScenario[] = [
  {
    route: 'POST /v1/customers',
    run: async (org, key) => {
      const created = await call(org, 'POST', '/v1/customers', 201, { fullName: 'Ada Created', email: 'ada@example.com' }, key);
      return [{ action: 'customer.created', subject: { type: 'customer', id: created.id } }];
    },
  },
  {
    route: 'POST /v1/customers',
    name: 'POST /v1/customers (upsert of a known external_id)',
    run: async (org, key) => {
      const externalId = `crm-${suffix()}`;
      await call(org, 'POST', '/v1/customers', 201, { externalId, fullName: 'Ada Upserted', email: 'ada.u@example.com' });
      const updated = await call(
        org,
        'POST',
        '/v1/customers',
        200,
        { externalId, fullName: 'Ada Upserted', email: 'ada.u@example.com', phone: '+61 400 111 222' },
        key,
      );
      return [{ action: 'customer.upserted', subject: { type: 'customer', id: updated.id } }];
    },
  },
  {
    route: 'PATCH /v1/customers/:id',
    run: async (org, key) => {
      const customer = await createCustomer(org);
      await call(org, 'PATCH', `/v1/customers/${customer.id}`, 200, { phone: '+61 400 333 444' }, key);
      return [{ action: 'customer.patched', subject: { type: 'customer', id: customer.id } }];
    },
  },
  {
    route: 'PUT /v1/customers/:id/designated-services',
    run: async (org, key) => {
      const customer = await createCustomer(org);
      await call(org, 'PUT', `/v1/customers/${customer.id}/designated-services`, 200, { service_codes: ['PRO-FORMATION'] }, key);
      return [{ action: 'customer.designated_services_replaced', subject: { type: 'customer', id: customer.id } }];
    },
  },
  {
    route: 'POST /v1/customers/:id/kyc',
    run: async (org, key) => {
      const customer = await createCustomer(org);
      await call(org, 'POST', `/v1/customers/${customer.id}/kyc`, 200, undefined, key);
      return [
        { action: 'customer.kyc_started', subject: { type: 'customer', id: customer.id } },
        { action: 'organisation.credits_charged', subject: { type: 'organisation', id: org.id } },
      ];
    },
  },
  {
    route: 'POST /v1/entities',
    run: async (org, key) => {
      const entity = await call(org, 'POST', '/v1/entities', 201, { type: 'COMPANY', name: `Entity ${suffix()} Pty Ltd` }, key);
      return [{ action: 'entity.created', subject: { type: 'entity', id: entity.id } }];
    },
  },
  {
    route: 'PATCH /v1/entities/:id',
    run: async (org, key) => {
      const entity = await createEntity(org);
      await call(org, 'PATCH', `/v1/entities/${entity.id}`, 200, { address: '1 Example St, Sydney NSW 2000' }, key);
      return [{ action: 'entity.patched', subject: { type: 'entity', id: entity.id } }];
    },
  },
  {
    route: 'POST /v1/entities/:id/ubos',
    run: async (org, key) => {
      const entity = await createEntity(org);
      const saved = await call(org, 'POST', `/v1/entities/${entity.id}/ubos`, 200, owners(), key);
      // The owner is a person of the organisation: a new one is created, in the same request.
      return [
        { action: 'customer.created', subject: { type: 'customer', id: saved.ubos[0].linked_customer.id } },
        { action: 'entity.beneficial_owner_saved', subject: { type: 'beneficial_owner', id: saved.ubos[0].id } },
      ];
    },
  },
  {
    route: 'POST /v1/entities/:id/ubos/:uboId/send-link',
    run: async (org, key) => {
      const entity = await createEntity(org);
      const saved = await call(org, 'POST', `/v1/entities/${entity.id}/ubos`, 200, owners());
      await call(org, 'POST', `/v1/entities/${entity.id}/ubos/${saved.ubos[0].id}/send-link`, 200, undefined, key);
      return [
        { action: 'beneficial_owner.kyc_started', subject: { type: 'customer', id: saved.ubos[0].linked_customer.id } },
        { action: 'organisation.credits_charged', subject: { type: 'organisation', id: org.id } },
      ];
    },
  },
  {
    route: 'POST /v1/entities/:id/kyb',
    run: async (org, key) => {
      const entity = await createEntity(org);
      await call(org, 'POST', `/v1/entities/${entity.id}/kyb`, 200, undefined, key);
      return [
        { action: 'entity.kyb_started', subject: { type: 'entity', id: entity.id } },
        { action: 'organisation.credits_charged', subject: { type: 'organisation', id: org.id } },
      ];
    },
  },
  {
    route: 'POST /v1/entities/:id/documents',
    run: async (org, key) => {
      const entity = await createEntity(org);
      const { payload, contentType } = multipart([
        { name: 'file', data: pdfBytes(), filename: 'deed.pdf' },
        { name: 'type', value: 'TRUST_DEED' },
      ]);
      const response = await ctx.app.inject({
        method: 'POST',
        url: `/v1/entities/${entity.id}/documents`,
        headers: { authorization: `Bearer ${org.key}`, 'content-type': contentType, 'idempotency-key': key },
        payload,
      });
      expect(response.statusCode, response.body).toBe(201);
      return [
        { action: 'entity.document_uploaded', subject: { type: 'entity', id: entity.id } },
        { action: 'organisation.credits_charged', subject: { type: 'organisation', id: org.id } },
      ];
    },
  },
  {
    route: 'POST /v1/entities/:id/document-requests',
    run: async (org, key) => {
      const entity = await createEntity(org);
      await call(org, 'POST', `/v1/entities/${entity.id}/document-requests`, 201, { types: ['CERTIFICATE_OF_REGISTRATION'] }, key);
      return [
        { action: 'entity.documents_requested', subject: { type: 'entity', id: entity.id } },
        { action: 'organisation.credits_charged', subject: { type: 'organisation', id: org.id } },
      ];
    },
  },
  {
    route: 'POST /v1/groups',
    run: async (org, key) => {
      const customer = await createCustomer(org);
      const group = await call(
        org,
        'POST',
        '/v1/groups',
        201,
        { name: `Matter ${suffix()}`, parties: [{ roleLabel: 'Buyer', partyType: 'INDIVIDUAL', customerId: customer.id }] },
        key,
      );
      return [{ action: 'group.created', subject: { type: 'group', id: group.id } }];
    },
  },
  {
    route: 'POST /v1/webhook-endpoints',
    run: async (org, key) => {
      const endpoint = await call(org, 'POST', '/v1/webhook-endpoints', 201, { url: WEBHOOK_URL }, key);
      secretsSeen.push(endpoint.secret);
      return [{ action: 'webhook_endpoint.created', subject: { type: 'webhook_endpoint', id: endpoint.id } }];
    },
  },
  {
    route: 'PATCH /v1/webhook-endpoints/:id',
    run: async (org, key) => {
      const endpoint = await createEndpoint(org);
      await call(org, 'PATCH', `/v1/webhook-endpoints/${endpoint.id}`, 200, { description: 'Renamed' }, key);
      return [{ action: 'webhook_endpoint.updated', subject: { type: 'webhook_endpoint', id: endpoint.id } }];
    },
  },
  {
    route: 'DELETE /v1/webhook-endpoints/:id',
    run: async (org, key) => {
      const endpoint = await createEndpoint(org);
      await call(org, 'DELETE', `/v1/webhook-endpoints/${endpoint.id}`, 200, undefined, key);
      return [{ action: 'webhook_endpoint.deleted', subject: { type: 'webhook_endpoint', id: endpoint.id } }];
    },
  },
  {
    route: 'POST /v1/webhook-endpoints/:id/rotate-secret',
    run: async (org, key) => {
      const endpoint = await createEndpoint(org);
      const rotated = await call(org, 'POST', `/v1/webhook-endpoints/${endpoint.id}/rotate-secret`, 200, {}, key);
      secretsSeen.push(rotated.secret);
      return [{ action: 'webhook_endpoint.secret_rotated', subject: { type: 'webhook_endpoint', id: endpoint.id } }];
    },
  },
  {
    route: 'POST /v1/webhook-endpoints/:id/test',
    run: async (org, key) => {
      const endpoint = await createEndpoint(org);
      await call(org, 'POST', `/v1/webhook-endpoints/${endpoint.id}/test`, 201, undefined, key);
      return [{ action: 'webhook_endpoint.test_sent', subject: { type: 'webhook_endpoint', id: endpoint.id } }];
    },
  },
  {
    route: 'POST /v1/webhook-deliveries/:id/retry',
    run: async (org, key) => {
      const endpoint = await createEndpoint(org);
      const test = await call(org, 'POST', `/v1/webhook-endpoints/${endpoint.id}/test`, 201);
      const retried = await call(org, 'POST', `/v1/webhook-deliveries/${test.delivery.id}/retry`, 202, undefined, key);
      return [{ action: 'webhook_delivery.resent', subject: { type: 'webhook_delivery', id: retried.id } }];
    },
  },
  {
    route: 'PUT /v1/due-diligence-policy',
    run: async (org, key) => {
      await call(org, 'PUT', '/v1/due-diligence-policy', 200, { reviewIntervalMonths: { HIGH: 6 } }, key);
      return [{ action: 'due_diligence_policy.updated', subject: { type: 'due_diligence_policy', id: null } }];
    },
  },
  {
    route: 'POST /v1/customers/:id/reviews',
    run: async (org, key) => {
      const customer = await verifiedCustomer(org);
      await call(org, 'POST', `/v1/customers/${customer.id}/reviews`, 201, { outcome: 'NO_CHANGE', reviewer: 'Sam Officer' }, key);
      return [{ action: 'customer.review_recorded', subject: { type: 'customer', id: customer.id } }];
    },
  },
  {
    route: 'POST /v1/entities/:id/reviews',
    run: async (org, key) => {
      const entity = await createEntity(org);
      await call(org, 'POST', `/v1/entities/${entity.id}/kyb`, 200, { method: 'manual' });
      await svc('kyc', 'verdict', '--org', org.id, '--customer', entity.id, '--result', 'VERIFIED');
      await call(
        org,
        'POST',
        `/v1/entities/${entity.id}/reviews`,
        201,
        { outcome: 'UPDATED', reviewer: 'Sam Officer', notes: 'Owners confirmed.' },
        key,
      );
      return [{ action: 'entity.review_recorded', subject: { type: 'entity', id: entity.id } }];
    },
  },
  {
    route: 'POST /v1/imports',
    run: async (org, key) => {
      const created = await uploadImport(org, key);
      return [{ action: 'import.created', subject: { type: 'import', id: created.id } }];
    },
  },
  {
    route: 'POST /v1/imports/:id/cancel',
    run: async (org, key) => {
      const created = await uploadImport(org);
      await call(org, 'POST', `/v1/imports/${created.id}/cancel`, 200, undefined, key);
      return [{ action: 'import.cancel_requested', subject: { type: 'import', id: created.id } }];
    },
  },
];

describe('coverage of the API', () => {
  it('when a /v1 route writes (any method but GET), a scenario here performs it', () => {
    const mutating = Object.keys(ROUTE_SCOPES).filter((route) => !route.startsWith('GET '));
    const covered = new Set(API_SCENARIOS.map((scenario) => scenario.route));
    expect(mutating.filter((route) => !covered.has(route))).toEqual([]);
  });

  it.each(API_SCENARIOS.map((scenario) => [scenario.name ?? scenario.route, scenario] as const))(
    'when %s succeeds, GET /v1/audit-events shows its rows with the acting key and the Idempotency-Key',
    async (_name, scenario) => {
      const org = await ctx.createOrg();
      secretsSeen.push(org.key);
      const idempotencyKey = `coverage-${randomUUID()}`;
      const expected = await scenario.run(org, idempotencyKey);
      const events = (await trail(org.key)).filter((event) => event.idempotency_key === idempotencyKey);
      expect(events.map((event) => ({ action: event.action, subject: event.subject })).sort(byAction)).toEqual(
        [...expected].sort(byAction),
      );
      for (const event of events) {
        expect(event.actor).toEqual({ type: 'api_key', id: org.keyId, key_label: null });
        expect(event.request_id).toEqual(expect.any(String));
      }
    },
  );

  it('when a KYC start charges credits, its row says the balance before and after, the reason and the verification', async () => {
    const org = await ctx.createOrg({ credits: 100 });
    const customer = await createCustomer(org);
    await call(org, 'POST', `/v1/customers/${customer.id}/kyc`, 200, undefined, 'coverage-charge');
    const [charge] = await trail(org.key, { action: 'organisation.credits_charged' });
    const { rows } = await ctx.database.pool.query(
      'SELECT delta, balance_after, reason, verification_id FROM credit_ledger WHERE org_id = $1 AND delta < 0',
      [org.id],
    );
    expect(rows).toHaveLength(1);
    expect(charge!.changes).toEqual({
      credits: { old: rows[0].balance_after - rows[0].delta, new: rows[0].balance_after },
      reason: { old: null, new: rows[0].reason },
      verification_id: { old: null, new: rows[0].verification_id },
      customer_id: { old: null, new: customer.id },
    });
  });
});

const byAction = (a: Expected, b: Expected) => a.action.localeCompare(b.action);

describe('in the transaction of the change', () => {
  /** A test-only constraint trigger: it raises at COMMIT, after every statement of the request ran. */
  async function failAtCommit(table: string, column: string, value: string) {
    const name = `coverage_fail_${suffix()}`;
    await ctx.database.pool.query(
      `CREATE FUNCTION ${name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'coverage: refused at commit'; END $$`,
    );
    await ctx.database.pool.query(
      `CREATE CONSTRAINT TRIGGER ${name} AFTER INSERT OR UPDATE ON ${table} DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.${column} = '${value}') EXECUTE FUNCTION ${name}()`,
    );
    return async () => {
      await ctx.database.pool.query(`DROP TRIGGER ${name} ON ${table}`);
      await ctx.database.pool.query(`DROP FUNCTION ${name}()`);
    };
  }

  it('when the audit row cannot commit, the change it records is not made either (and the same key may retry)', async () => {
    const org = await ctx.createOrg();
    const customer = await createCustomer(org);
    const drop = await failAtCommit('audit_log', 'subject_id', customer.id);
    const key = `coverage-${randomUUID()}`;
    try {
      const refused = await ctx.request('PATCH', `/v1/customers/${customer.id}`, {
        key: org.key,
        body: { phone: '+61 400 555 666' },
        headers: { 'idempotency-key': key },
      });
      expect(refused.statusCode, refused.body).toBe(500);
    } finally {
      await drop();
    }
    expect((await call(org, 'GET', `/v1/customers/${customer.id}`, 200)).phone ?? null).toBeNull();
    expect((await trail(org.key)).filter((event) => event.idempotency_key === key)).toEqual([]);
    // Nothing of the request committed, its idempotency record neither: the retry runs it.
    await call(org, 'PATCH', `/v1/customers/${customer.id}`, 200, { phone: '+61 400 555 666' }, key);
    expect((await trail(org.key)).filter((event) => event.idempotency_key === key).map((event) => event.action)).toEqual([
      'customer.patched',
    ]);
  });

  it('when the change cannot commit, after its audit row was written, no audit row remains', async () => {
    const org = await ctx.createOrg();
    const customer = await createCustomer(org);
    const drop = await failAtCommit('customers', 'id', customer.id);
    const key = `coverage-${randomUUID()}`;
    try {
      const refused = await ctx.request('POST', `/v1/customers/${customer.id}/kyc`, { key: org.key, headers: { 'idempotency-key': key } });
      expect(refused.statusCode, refused.body).toBe(500);
    } finally {
      await drop();
    }
    expect((await trail(org.key)).filter((event) => event.idempotency_key === key)).toEqual([]);
    const { rows } = await ctx.database.pool.query('SELECT count(*)::int AS n FROM audit_log WHERE org_id = $1 AND idempotency_key = $2', [
      org.id,
      key,
    ]);
    expect(rows[0].n).toBe(0);
    const ledger = await ctx.database.pool.query('SELECT count(*)::int AS n FROM credit_ledger WHERE org_id = $1 AND delta < 0', [org.id]);
    expect(ledger.rows[0].n).toBe(0);
  });
});

// ---------------------------------------------------------------------------------------------
// The operator CLI

const OPERATOR = { type: 'operator', id: `cli:${userInfo().username}`, key_label: null };

/** The commands that change nothing (reads, exports, checks): every other command needs a scenario. */
const READ_ONLY_COMMANDS = new Set([
  'org list',
  'org show',
  'key list',
  'webhook list',
  'webhook deliveries',
  'emails',
  'review due',
  'audit head',
  'audit verify',
  'audit export',
  'openapi',
]);

/** The operator commands as `svc` registers them (serve, worker and migrate aside). */
function leafCommands(): string[] {
  const program = createProgram(createCliRunner({ stdout: new PassThrough(), stderr: new PassThrough(), env: {} }));
  const leaves = (command: Command, path: string[]): string[] =>
    command.commands.length === 0 ? [path.join(' ')] : command.commands.flatMap((child) => leaves(child, [...path, child.name()]));
  return program.commands
    .filter((command) => !['serve', 'worker', 'migrate'].includes(command.name()))
    .flatMap((command) => leaves(command, [command.name()]));
}

async function svc(...args: string[]): Promise<any> {
  const result = await runSvcInProcess(args, { DATABASE_URL: ctx.databaseUrl });
  expect(result.code, `svc ${args.join(' ')}: ${result.stderr}`).toBe(0);
  return JSON.parse(result.stdout);
}

/** A file of the template to create (template create reads one). */
function templateFile(): string {
  const path = join(mkdtempSync(join(tmpdir(), 'coverage-')), 'template.json');
  writeFileSync(
    path,
    JSON.stringify({ code: `estate-${suffix()}`, name: 'Estate administration', industry: 'LEGAL', roles: [{ roleLabel: 'Executor' }] }),
  );
  return path;
}

/** A customer whose KYC is started (IN_PROGRESS after submit): the back-office commands act on it. */
async function startedCustomer(org: TestOrg) {
  const customer = await createCustomer(org);
  await call(org, 'POST', `/v1/customers/${customer.id}/kyc`, 200);
  return customer;
}

/** A customer whose KYC reached VERIFIED (its review is SCHEDULED). */
async function verifiedCustomer(org: TestOrg) {
  const customer = await startedCustomer(org);
  await svc('kyc', 'submit', '--org', org.id, '--customer', customer.id);
  await svc('kyc', 'verdict', '--org', org.id, '--customer', customer.id, '--result', 'VERIFIED');
  return customer;
}

/** One operator command: `run` makes its fixtures, runs `svc`, and names the organisation and the rows it must leave. */
type CliScenario = { command: string; name?: string; run(org: TestOrg): Promise<{ orgId?: string; expected: Expected[] }> };

const CLI_SCENARIOS: CliScenario[] = [
  {
    command: 'org create',
    run: async () => {
      const created = await svc('org', 'create', '--name', 'Coverage Org', '--credits', '5', '--features', 'kyb_extra_methods');
      return { orgId: created.id, expected: [{ action: 'organisation.created', subject: { type: 'organisation', id: created.id } }] };
    },
  },
  {
    command: 'org update',
    run: async (org) => {
      await svc('org', 'update', org.id, '--name', 'Renamed', '--features', '');
      return { expected: [{ action: 'organisation.updated', subject: { type: 'organisation', id: org.id } }] };
    },
  },
  {
    command: 'org update',
    name: 'org update --add-credits',
    run: async (org) => {
      await svc('org', 'update', org.id, '--add-credits', '25');
      return { expected: [{ action: 'organisation.updated', subject: { type: 'organisation', id: org.id } }] };
    },
  },
  {
    command: 'key create',
    run: async (org) => {
      const key = await svc('key', 'create', '--org', org.id, '--scopes', 'customers:read', '--label', 'coverage');
      secretsSeen.push(key.key);
      return { expected: [{ action: 'api_key.created', subject: { type: 'api_key', id: key.id } }] };
    },
  },
  {
    command: 'key revoke',
    run: async (org) => {
      const key = await ctx.createKey(org.id);
      secretsSeen.push(key.key);
      await svc('key', 'revoke', key.id);
      return { expected: [{ action: 'api_key.revoked', subject: { type: 'api_key', id: key.id } }] };
    },
  },
  {
    command: 'webhook add',
    run: async (org) => {
      const endpoint = await svc('webhook', 'add', '--org', org.id, '--url', WEBHOOK_URL);
      secretsSeen.push(endpoint.secret);
      return { expected: [{ action: 'webhook_endpoint.created', subject: { type: 'webhook_endpoint', id: endpoint.id } }] };
    },
  },
  {
    command: 'webhook update',
    run: async (org) => {
      const endpoint = await createEndpoint(org);
      await svc('webhook', 'update', endpoint.id, '--org', org.id, '--description', 'Renamed');
      return { expected: [{ action: 'webhook_endpoint.updated', subject: { type: 'webhook_endpoint', id: endpoint.id } }] };
    },
  },
  {
    command: 'webhook disable',
    run: async (org) => {
      const endpoint = await createEndpoint(org);
      await svc('webhook', 'disable', endpoint.id, '--org', org.id, '--reason', 'maintenance');
      return { expected: [{ action: 'webhook_endpoint.disabled', subject: { type: 'webhook_endpoint', id: endpoint.id } }] };
    },
  },
  {
    command: 'webhook delete',
    run: async (org) => {
      const endpoint = await createEndpoint(org);
      await svc('webhook', 'delete', endpoint.id, '--org', org.id);
      return { expected: [{ action: 'webhook_endpoint.deleted', subject: { type: 'webhook_endpoint', id: endpoint.id } }] };
    },
  },
  {
    command: 'webhook rotate-secret',
    run: async (org) => {
      const endpoint = await createEndpoint(org);
      const rotated = await svc('webhook', 'rotate-secret', endpoint.id, '--org', org.id);
      secretsSeen.push(rotated.secret);
      return { expected: [{ action: 'webhook_endpoint.secret_rotated', subject: { type: 'webhook_endpoint', id: endpoint.id } }] };
    },
  },
  {
    command: 'webhook test',
    run: async (org) => {
      await createEndpoint(org);
      await svc('webhook', 'test', '--org', org.id);
      return { expected: [{ action: 'webhook.test_sent', subject: { type: 'organisation', id: org.id } }] };
    },
  },
  {
    command: 'webhook test',
    name: 'webhook test --endpoint',
    run: async (org) => {
      const endpoint = await createEndpoint(org);
      await svc('webhook', 'test', '--org', org.id, '--endpoint', endpoint.id);
      return { expected: [{ action: 'webhook_endpoint.test_sent', subject: { type: 'webhook_endpoint', id: endpoint.id } }] };
    },
  },
  {
    command: 'webhook resend',
    run: async (org) => {
      const endpoint = await createEndpoint(org);
      const test = await call(org, 'POST', `/v1/webhook-endpoints/${endpoint.id}/test`, 201);
      const resent = await svc('webhook', 'resend', test.delivery.id, '--org', org.id);
      return { expected: [{ action: 'webhook_delivery.resent', subject: { type: 'webhook_delivery', id: resent.id } }] };
    },
  },
  {
    command: 'template create',
    run: async (org) => {
      const template = await svc('template', 'create', '--org', org.id, '--file', templateFile());
      return { expected: [{ action: 'group_template.created', subject: { type: 'group_template', id: template.id } }] };
    },
  },
  {
    command: 'kyc submit',
    run: async (org) => {
      const customer = await startedCustomer(org);
      await svc('kyc', 'submit', '--org', org.id, '--customer', customer.id);
      return { expected: [{ action: 'verification.submitted', subject: { type: 'customer', id: customer.id } }] };
    },
  },
  {
    command: 'kyc verdict',
    run: async (org) => {
      const customer = await startedCustomer(org);
      await svc('kyc', 'submit', '--org', org.id, '--customer', customer.id);
      await svc('kyc', 'verdict', '--org', org.id, '--customer', customer.id, '--result', 'VERIFIED');
      return { expected: [{ action: 'verification.verified', subject: { type: 'customer', id: customer.id } }] };
    },
  },
  {
    command: 'aml set',
    run: async (org) => {
      const customer = await createCustomer(org);
      await svc('aml', 'set', '--org', org.id, '--customer', customer.id, '--status', 'NEEDS_REVIEW', '--pep');
      return { expected: [{ action: 'aml.screened', subject: { type: 'customer', id: customer.id } }] };
    },
  },
  {
    command: 'aml resolve',
    run: async (org) => {
      const customer = await createCustomer(org);
      await svc('aml', 'set', '--org', org.id, '--customer', customer.id, '--status', 'NEEDS_REVIEW', '--pep');
      await svc('aml', 'resolve', '--org', org.id, '--customer', customer.id);
      return { expected: [{ action: 'aml.review_completed', subject: { type: 'customer', id: customer.id } }] };
    },
  },
  {
    command: 'review simulate-due',
    run: async (org) => {
      const customer = await verifiedCustomer(org);
      await svc('review', 'simulate-due', '--org', org.id, '--customer', customer.id);
      return { expected: [{ action: 'customer.review_due_simulated', subject: { type: 'customer', id: customer.id } }] };
    },
  },
  {
    command: 'import',
    run: async (org) => {
      const externalId = `crm-${suffix()}`;
      const file = join(mkdtempSync(join(tmpdir(), 'coverage-')), 'clients.csv');
      writeFileSync(file, `externalId,fullName,email\n${externalId},Ivy Imported,ivy.${suffix()}@example.com\n`);
      const finished = await svc('import', '--org', org.id, '--kind', 'individuals', '--file', file);
      const customer = await call(org, 'GET', `/v1/customers/${externalId}`, 200);
      return {
        expected: [
          { action: 'import.created', subject: { type: 'import', id: finished.id } },
          { action: 'customer.created', subject: { type: 'customer', id: customer.id } },
        ],
      };
    },
  },
  {
    command: 'audit purge',
    run: async () => {
      // An organisation whose chain starts with rows from 8 years ago (written straight into the
      // database, as an old deployment left them), sealed before anything of today: the purge then
      // has a prefix past retention to delete, and records it behind a checkpoint.
      const [created] = (await ctx.database.pool.query<{ id: string }>(`INSERT INTO organisations (name) VALUES ('Old Org') RETURNING id`))
        .rows;
      const orgId = created!.id;
      await ctx.database.pool.query(
        `INSERT INTO audit_log (org_id, actor_type, actor_id, action, subject_type, subject_id, before, after, created_at)
         SELECT $1, 'operator', 'cli:old', 'test.changed', 'test', gen_random_uuid(), NULL, jsonb_build_object('n', g),
                now() - interval '8 years' + g * interval '1 second'
           FROM generate_series(1, 3) AS g`,
        [orgId],
      );
      await sealer.sealOnce();
      const before = new Date(Date.now() - 7.5 * 365 * 86_400_000).toISOString();
      const purged = await svc('audit', 'purge', '--org', orgId, '--before', before);
      expect(purged).toMatchObject({ org_id: orgId, purged: 3, checkpoint: { sequence: 3 } });
      return { orgId, expected: [{ action: 'audit_log.purged', subject: { type: 'organisation', id: orgId } }] };
    },
  },
];

describe('coverage of the operator CLI', () => {
  it('when svc has a command that is not a read, a scenario here runs it', () => {
    const commands = leafCommands();
    expect(commands.length).toBeGreaterThan(10);
    const covered = new Set(CLI_SCENARIOS.map((scenario) => scenario.command));
    expect(commands.filter((command) => !READ_ONLY_COMMANDS.has(command) && !covered.has(command))).toEqual([]);
    // A read-only entry for a command that no longer exists would hide nothing, but says the list is stale.
    expect([...READ_ONLY_COMMANDS].filter((command) => command !== 'audit export' && !commands.includes(command))).toEqual([]);
  });

  it.each(CLI_SCENARIOS.map((scenario) => [scenario.name ?? scenario.command, scenario] as const))(
    'when svc %s succeeds, GET /v1/audit-events?actor=operator shows its row with the operator as actor',
    async (_name, scenario) => {
      const org = await ctx.createOrg();
      secretsSeen.push(org.key);
      const { orgId, expected } = await scenario.run(org);
      // An organisation the command created is read with a key of its own.
      const key = orgId && orgId !== org.id ? (await ctx.createKey(orgId)).key : org.key;
      const events = await trail(key, { actor: 'operator' });
      for (const row of expected) {
        const found = events.filter((event) => event.action === row.action && event.subject.id === row.subject.id);
        expect(found, `${row.action} on ${row.subject.id} in ${JSON.stringify(events.map((event) => event.action))}`).toHaveLength(1);
        expect(found[0]!.subject).toEqual(row.subject);
        expect(found[0]!.actor).toEqual(OPERATOR);
        expect(found[0]!.idempotency_key).toBeNull();
      }
    },
  );
});

describe('secrets', () => {
  it('when every mutation above has run, no audit row holds a key plaintext or hash, a webhook secret or a link token', async () => {
    const { rows } = await ctx.database.pool.query<{ content: string }>(
      "SELECT coalesce(before::text, '') || coalesce(after::text, '') AS content FROM audit_log",
    );
    const { rows: stored } = await ctx.database.pool.query<{ secret: string }>(
      `SELECT key_hash AS secret FROM api_keys
       UNION ALL SELECT secret FROM webhook_endpoints
       UNION ALL SELECT previous_secret FROM webhook_endpoints WHERE previous_secret IS NOT NULL`,
    );
    const secrets = [...secretsSeen, ...stored.map((row) => row.secret)];
    expect(secrets.length).toBeGreaterThan(40);
    expect(rows.length).toBeGreaterThan(40);
    const leaks = rows.flatMap((row) =>
      secrets.filter((secret) => row.content.includes(secret)).map((secret) => `${secret.slice(0, 6)}… in ${row.content.slice(0, 120)}`),
    );
    expect(leaks).toEqual([]);
  });
});
