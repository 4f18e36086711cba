import { eq } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { customers as customersTable } from '../../src/db/schema.js';
import { isAppError } from '../../src/shared/app-error.js';
import { createTestContext, type TestContext, type TestOrg, TEST_LINK_ENCRYPTION_KEY, testServices } from '../helpers/harness.js';
import { auditOf, createCustomer, createEntity, customerRow, eventsOf, setStatus, verificationsOf } from './verification-fixtures.js';
import { runSvcInProcess } from '../helpers/cli-in-process.js';
import type { Services } from '../../src/services.js';

let ctx: TestContext;
let backOffice: Services['backOffice'];
beforeAll(async () => {
  ctx = await createTestContext();
  backOffice = testServices(ctx.database).backOffice;
});
afterAll(async () => ctx?.close());

const operator = { type: 'operator' as const, id: 'cli:test' };

/** Runs the operator CLI against this file's database; stdout must be exactly one JSON document. */
async function svc(...args: string[]): Promise<unknown> {
  const result = await runSvcInProcess(args, {
    DATABASE_URL: ctx.databaseUrl,
    LOG_LEVEL: 'silent',
    LINK_ENCRYPTION_KEY: TEST_LINK_ENCRYPTION_KEY,
  });
  if (result.code !== 0) throw new Error(`svc ${args.join(' ')} exited ${result.code}: ${result.stderr}`);
  return JSON.parse(result.stdout);
}

async function svcFails(...args: string[]): Promise<{ code: number; stderr: string; stdout: string }> {
  const result = await runSvcInProcess(args, {
    DATABASE_URL: ctx.databaseUrl,
    LOG_LEVEL: 'silent',
    LINK_ENCRYPTION_KEY: TEST_LINK_ENCRYPTION_KEY,
  });
  if (result.code === 0) throw new Error('expected the command to fail');
  return { code: result.code ?? 1, stderr: result.stderr, stdout: result.stdout };
}

async function conflictOf(work: Promise<unknown>) {
  const error = await work.then(
    () => undefined,
    (failure: unknown) => failure,
  );
  expect(isAppError(error), String(error)).toBe(true);
  return error as { code: string; status: number };
}

/**
 * The DTO minus updated_at. updated_at is re-stamped at commit when the transaction ran longer than
 * 50 ms (migration 0001), after the event payload was written, so on a loaded machine the two can
 * differ by those milliseconds; every other field must match exactly.
 */
function sameState(dto: Record<string, unknown>) {
  const { updated_at: updatedAt, ...rest } = dto;
  expect(typeof updatedAt).toBe('string');
  return rest;
}

async function getCustomer(org: TestOrg, id: string) {
  const response = await ctx.request('GET', `/v1/customers/${id}`, { key: org.key });
  expect(response.statusCode).toBe(200);
  return response.json<Record<string, unknown>>();
}

async function getEntity(org: TestOrg, id: string) {
  const response = await ctx.request('GET', `/v1/entities/${id}`, { key: org.key });
  expect(response.statusCode).toBe(200);
  return response.json<Record<string, unknown>>();
}

/** An individual whose KYC was started (PENDING). */
async function startedPerson(org: TestOrg) {
  const person = await createCustomer(ctx, org);
  const response = await ctx.request('POST', `/v1/customers/${person.id}/kyc`, { key: org.key });
  expect(response.statusCode, response.body).toBe(200);
  return person;
}

describe('kyc submit', () => {
  it('when a PENDING check is submitted, it goes IN_PROGRESS with an audit row', async () => {
    const org = await ctx.createOrg();
    const person = await startedPerson(org);
    const dto = (await backOffice.submit(org.id, person.id, operator)) as { kyc_status: string };
    expect(dto.kyc_status).toBe('IN_PROGRESS');
    expect((await customerRow(ctx, person.id)).kycStatus).toBe('IN_PROGRESS');
    expect((await verificationsOf(ctx, org.id, person.id))[0]!.status).toBe('IN_PROGRESS');
    const audit = await auditOf(ctx, org.id, person.id, 'verification.submitted');
    expect(audit).toHaveLength(1);
    expect(audit[0]).toMatchObject({ actorType: 'operator', actorId: 'cli:test' });
  });

  it('when nothing was started, a submit answers conflict', async () => {
    const org = await ctx.createOrg();
    const person = await createCustomer(ctx, org);
    const error = await conflictOf(backOffice.submit(org.id, person.id, operator));
    expect(error.code).toBe('conflict');
  });

  it('when the record is unknown, a submit answers not found', async () => {
    const org = await ctx.createOrg();
    const error = await conflictOf(backOffice.submit(org.id, 'no-such-external-id', operator));
    expect(error.code).toBe('not_found');
  });

  it("when another organisation's record is named, a submit answers not found", async () => {
    const org = await ctx.createOrg();
    const stranger = await ctx.createOrg();
    const person = await startedPerson(org);
    const error = await conflictOf(backOffice.submit(stranger.id, person.id, operator));
    expect(error.code).toBe('not_found');
    expect((await customerRow(ctx, person.id)).kycStatus).toBe('PENDING');
  });
});

describe('kyc verdict', () => {
  it('when VERIFIED, it sets kyc_completed_at and the identity, audits, and fires customer.kyc_completed with the GET DTO', async () => {
    const org = await ctx.createOrg();
    const person = await startedPerson(org);
    await backOffice.submit(org.id, person.id, operator);
    const dto = (await backOffice.verdict(
      org.id,
      person.id,
      { result: 'VERIFIED', legalName: 'Jane Q Citizen', country: 'nzl' },
      operator,
    )) as Record<string, unknown>;
    expect(dto.kyc_status).toBe('VERIFIED');
    expect(dto.kyc_completed_at).not.toBeNull();
    expect(dto.identity).toEqual({ verified_legal_name: 'Jane Q Citizen', verified_country: 'NZL' });

    const fetched = await getCustomer(org, person.id);
    expect(sameState(fetched)).toEqual(sameState(dto));
    const events = await eventsOf(ctx, org.id, 'customer.kyc_completed');
    expect(events).toHaveLength(1);
    expect(events[0]!.customerId).toBe(person.id);
    expect(sameState(events[0]!.document.data.customer)).toEqual(sameState(fetched));
    expect((await verificationsOf(ctx, org.id, person.id))[0]).toMatchObject({ status: 'VERIFIED' });
    expect(await auditOf(ctx, org.id, person.id, 'verification.verified')).toHaveLength(1);
  });

  it('when VERIFIED without a legal name or country, the identity defaults to the full name and AUS', async () => {
    const org = await ctx.createOrg();
    const person = await startedPerson(org);
    await backOffice.submit(org.id, person.id, operator);
    const dto = (await backOffice.verdict(org.id, person.id, { result: 'VERIFIED' }, operator)) as { identity: unknown; full_name: string };
    expect(dto.identity).toEqual({ verified_legal_name: dto.full_name, verified_country: 'AUS' });
  });

  it('when VERIFIED with a bad country, it answers 422 and changes nothing', async () => {
    const org = await ctx.createOrg();
    const person = await startedPerson(org);
    await backOffice.submit(org.id, person.id, operator);
    const error = await conflictOf(backOffice.verdict(org.id, person.id, { result: 'VERIFIED', country: 'Narnia' }, operator));
    expect(error.code).toBe('validation_failed');
    expect((await customerRow(ctx, person.id)).kycStatus).toBe('IN_PROGRESS');
    expect(await eventsOf(ctx, org.id, 'customer.kyc_completed')).toEqual([]);
  });

  it('when FAILED, it sets kyc_completed_at without identity and fires customer.kyc_completed', async () => {
    const org = await ctx.createOrg();
    const person = await startedPerson(org);
    await backOffice.submit(org.id, person.id, operator);
    const dto = (await backOffice.verdict(org.id, person.id, { result: 'FAILED' }, operator)) as Record<string, unknown>;
    expect(dto.kyc_status).toBe('FAILED');
    expect(dto.kyc_completed_at).not.toBeNull();
    expect(dto.identity).toBeNull();
    const events = await eventsOf(ctx, org.id, 'customer.kyc_completed');
    expect(events).toHaveLength(1);
    expect(sameState(events[0]!.document.data.customer)).toEqual(sameState(await getCustomer(org, person.id)));
    expect(await auditOf(ctx, org.id, person.id, 'verification.failed')).toHaveLength(1);
  });

  it('when RESUBMIT, it goes AWAITING_RESUBMISSION without an event, and a later submit goes IN_PROGRESS', async () => {
    const org = await ctx.createOrg();
    const person = await startedPerson(org);
    await backOffice.submit(org.id, person.id, operator);
    const dto = (await backOffice.verdict(org.id, person.id, { result: 'RESUBMIT' }, operator)) as Record<string, unknown>;
    expect(dto.kyc_status).toBe('AWAITING_RESUBMISSION');
    expect(dto.kyc_completed_at).toBeNull();
    expect(await eventsOf(ctx, org.id, 'customer.kyc_completed')).toEqual([]);
    expect(await auditOf(ctx, org.id, person.id, 'verification.resubmission_requested')).toHaveLength(1);

    const resubmitted = (await backOffice.submit(org.id, person.id, operator)) as { kyc_status: string };
    expect(resubmitted.kyc_status).toBe('IN_PROGRESS');
  });

  for (const status of ['NOT_STARTED', 'PENDING', 'AWAITING_RESUBMISSION', 'VERIFIED', 'FAILED'] as const) {
    it(`when the status is ${status}, a verdict answers conflict and fires nothing`, async () => {
      const org = await ctx.createOrg();
      const person = await createCustomer(ctx, org);
      await setStatus(ctx, person.id, status);
      const error = await conflictOf(backOffice.verdict(org.id, person.id, { result: 'VERIFIED' }, operator));
      expect(error.code).toBe('conflict');
      expect((await customerRow(ctx, person.id)).kycStatus).toBe(status);
      expect(await eventsOf(ctx, org.id, 'customer.kyc_completed')).toEqual([]);
    });
  }

  it('when an entity gets a verdict, the event carries the entity DTO with kyb_status and no identity is set', async () => {
    const org = await ctx.createOrg();
    const entity = await createEntity(ctx, org);
    expect((await ctx.request('POST', `/v1/entities/${entity.id}/kyb`, { key: org.key, body: { method: 'manual' } })).statusCode).toBe(200);
    const dto = (await backOffice.verdict(org.id, entity.id, { result: 'VERIFIED' }, operator)) as Record<string, unknown>;
    expect(dto.kyb_status).toBe('VERIFIED');
    expect(dto.kyb_completed_at).not.toBeNull();
    const fetched = await getEntity(org, entity.id);
    expect(sameState(fetched)).toEqual(sameState(dto));
    const events = await eventsOf(ctx, org.id, 'customer.kyc_completed');
    expect(events).toHaveLength(1);
    expect(sameState(events[0]!.document.data.customer)).toEqual(sameState(fetched));
    expect((await customerRow(ctx, entity.id)).verifiedLegalName).toBeNull();
  });

  it('when the record is named by external_id, the verdict finds it', async () => {
    const org = await ctx.createOrg();
    const created = await ctx.request('POST', '/v1/customers', {
      key: org.key,
      body: { fullName: 'Ext Person', email: 'ext@example.test', externalId: 'crm-42' },
    });
    const id = created.json<{ id: string }>().id;
    await setStatus(ctx, id, 'IN_PROGRESS');
    const dto = (await backOffice.verdict(org.id, 'crm-42', { result: 'FAILED' }, operator)) as { id: string; kyc_status: string };
    expect(dto).toMatchObject({ id, kyc_status: 'FAILED' });
  });
});

describe('aml set and aml resolve', () => {
  it('when a screening finds matches, aml set records NEEDS_REVIEW, the flags and screened_at, with an audit row', async () => {
    const org = await ctx.createOrg();
    const person = await createCustomer(ctx, org);
    const block = await backOffice.setAml(org.id, person.id, { status: 'NEEDS_REVIEW', pep: true, sanctions: true }, operator);
    expect(block.status).toBe('NEEDS_REVIEW');
    expect(block.screened_at).not.toBeNull();
    expect(block.last_reviewed_at).toBeNull();
    expect(block.flags).toEqual({ pep: true, sanctions: true, adverse_media: false, terrorism: false });
    const aml = await ctx.request('GET', `/v1/customers/${person.id}/aml`, { key: org.key });
    expect(aml.json()).toEqual(block);
    expect(await auditOf(ctx, org.id, person.id, 'aml.screened')).toHaveLength(1);
  });

  it('when aml set asks for RESOLVED, it answers 422 and changes nothing', async () => {
    const org = await ctx.createOrg();
    const person = await createCustomer(ctx, org);
    const error = await conflictOf(backOffice.setAml(org.id, person.id, { status: 'RESOLVED' }, operator));
    expect(error.code).toBe('validation_failed');
    expect((await customerRow(ctx, person.id)).amlStatus).toBe('NOT_SCREENED');
  });

  it('when a NEEDS_REVIEW screening is resolved, it goes RESOLVED with last_reviewed_at, audits, and fires aml.review_completed', async () => {
    const org = await ctx.createOrg();
    const person = await createCustomer(ctx, org);
    await backOffice.setAml(org.id, person.id, { status: 'NEEDS_REVIEW', adverseMedia: true }, operator);
    const block = await backOffice.resolveAml(org.id, person.id, operator);
    expect(block.status).toBe('RESOLVED');
    expect(block.last_reviewed_at).not.toBeNull();
    expect(block.flags.adverse_media).toBe(true);
    const events = await eventsOf(ctx, org.id, 'aml.review_completed');
    expect(events).toHaveLength(1);
    expect(sameState(events[0]!.document.data.customer)).toEqual(sameState(await getCustomer(org, person.id)));
    expect(await auditOf(ctx, org.id, person.id, 'aml.review_completed')).toHaveLength(1);
  });

  it('when the screening is CLEAR, resolve answers conflict and fires nothing', async () => {
    const org = await ctx.createOrg();
    const person = await createCustomer(ctx, org);
    await backOffice.setAml(org.id, person.id, { status: 'CLEAR' }, operator);
    const error = await conflictOf(backOffice.resolveAml(org.id, person.id, operator));
    expect(error.code).toBe('conflict');
    expect((await customerRow(ctx, person.id)).amlStatus).toBe('CLEAR');
    expect(await eventsOf(ctx, org.id, 'aml.review_completed')).toEqual([]);
  });

  it('when an entity is screened, aml set works on it too', async () => {
    const org = await ctx.createOrg();
    const entity = await createEntity(ctx, org);
    const block = await backOffice.setAml(org.id, entity.id, { status: 'NEEDS_REVIEW', terrorism: true }, operator);
    expect(block.flags.terrorism).toBe(true);
    const fetched = await ctx.request('GET', `/v1/entities/${entity.id}/aml`, { key: org.key });
    expect(fetched.json()).toEqual(block);
  });
});

describe('customer.updated from the back office', () => {
  it('when the back office changes an integration-added record, submit, verdict, aml set and aml resolve each write one customer.updated event with the DTO', async () => {
    const org = await ctx.createOrg();
    const person = await startedPerson(org);
    const updatedEvents = async () => (await eventsOf(ctx, org.id, 'customer.updated')).filter((event) => event.customerId === person.id);
    const afterStart = (await updatedEvents()).length;

    await backOffice.submit(org.id, person.id, operator);
    await backOffice.verdict(org.id, person.id, { result: 'VERIFIED' }, operator);
    await backOffice.setAml(org.id, person.id, { status: 'NEEDS_REVIEW', pep: true }, operator);
    await backOffice.resolveAml(org.id, person.id, operator);

    const events = (await updatedEvents()).slice(afterStart);
    expect(events).toHaveLength(4);
    const customers = events.map((event) => event.document.data.customer as { kyc_status: string; aml: { status: string } });
    expect(customers.map((customer) => customer.kyc_status)).toEqual(['IN_PROGRESS', 'VERIFIED', 'VERIFIED', 'VERIFIED']);
    expect(customers.map((customer) => customer.aml.status)).toEqual(['NOT_SCREENED', 'NOT_SCREENED', 'NEEDS_REVIEW', 'RESOLVED']);
    expect(sameState(events[3]!.document.data.customer)).toEqual(sameState(await getCustomer(org, person.id)));
  });

  it('when the record was not added by the integration, the back office writes no customer.updated event', async () => {
    const org = await ctx.createOrg();
    const person = await startedPerson(org);
    await ctx.database.db.update(customersTable).set({ addedVia: 'ADMIN_MANUAL' }).where(eq(customersTable.id, person.id));
    const before = (await eventsOf(ctx, org.id, 'customer.updated')).length;
    await backOffice.submit(org.id, person.id, operator);
    await backOffice.verdict(org.id, person.id, { result: 'FAILED' }, operator);
    await backOffice.setAml(org.id, person.id, { status: 'CLEAR' }, operator);
    expect(await eventsOf(ctx, org.id, 'customer.updated')).toHaveLength(before);
    expect(await eventsOf(ctx, org.id, 'customer.kyc_completed')).toHaveLength(1);
  });
});

// Each command is a fresh Node process compiling TypeScript through tsx: seconds each on a busy machine.
describe('operator CLI', { timeout: 120_000 }, () => {
  it('when kyc submit, kyc verdict and emails run, each prints one JSON document and the verdict fires the event', async () => {
    const org = await ctx.createOrg();
    const person = await startedPerson(org);
    const submitted = (await svc('kyc', 'submit', '--org', org.id, '--customer', person.id)) as { kyc_status: string };
    expect(submitted.kyc_status).toBe('IN_PROGRESS');
    const verified = (await svc(
      'kyc',
      'verdict',
      '--org',
      org.id,
      '--customer',
      person.id,
      '--result',
      'VERIFIED',
      '--country',
      'GBR',
    )) as Record<string, unknown>;
    expect(verified).toMatchObject({ kyc_status: 'VERIFIED', identity: { verified_country: 'GBR' } });
    expect(await eventsOf(ctx, org.id, 'customer.kyc_completed')).toHaveLength(1);
    const audit = await auditOf(ctx, org.id, person.id, 'verification.verified');
    expect(audit[0]!.actorType).toBe('operator');

    const listed = (await svc('emails', '--org', org.id)) as Array<{ recipient: string; link: string; subject: string }>;
    expect(listed).toHaveLength(1);
    expect(listed[0]!.recipient).toBe(person.email);
    expect(listed[0]!.link).toMatch(/\/verify\//);
    const toPerson = (await svc('emails', '--org', org.id, '--to', person.email.toUpperCase())) as unknown[];
    expect(toPerson).toHaveLength(1);
    expect(await svc('emails', '--org', org.id, '--to', 'nobody@example.test')).toEqual([]);
  });

  it('when aml set and aml resolve run, each prints the AML block', async () => {
    const org = await ctx.createOrg();
    const person = await createCustomer(ctx, org);
    const screened = (await svc(
      'aml',
      'set',
      '--org',
      org.id,
      '--customer',
      person.id,
      '--status',
      'NEEDS_REVIEW',
      '--pep',
      '--sanctions',
    )) as {
      status: string;
      flags: Record<string, boolean>;
    };
    expect(screened).toMatchObject({
      status: 'NEEDS_REVIEW',
      flags: { pep: true, sanctions: true, adverse_media: false, terrorism: false },
    });
    const resolved = (await svc('aml', 'resolve', '--org', org.id, '--customer', person.id)) as {
      status: string;
      last_reviewed_at: string | null;
    };
    expect(resolved.status).toBe('RESOLVED');
    expect(resolved.last_reviewed_at).not.toBeNull();
    expect(await eventsOf(ctx, org.id, 'aml.review_completed')).toHaveLength(1);
  });

  it('when a verdict is refused, the command exits non-zero with the message on stderr and nothing on stdout', async () => {
    const org = await ctx.createOrg();
    const person = await createCustomer(ctx, org);
    const failure = await svcFails('kyc', 'verdict', '--org', org.id, '--customer', person.id, '--result', 'VERIFIED');
    expect(failure.code).not.toBe(0);
    expect(failure.stderr).toMatch(/verdict needs a check in progress/);
    expect(failure.stdout).toBe('');
  });

  it('when aml set is given RESOLVED, the command refuses it', async () => {
    const org = await ctx.createOrg();
    const person = await createCustomer(ctx, org);
    const failure = await svcFails('aml', 'set', '--org', org.id, '--customer', person.id, '--status', 'RESOLVED');
    expect(failure.code).not.toBe(0);
    expect(failure.stderr).toMatch(/must be one of/);
    expect((await customerRow(ctx, person.id)).amlStatus).toBe('NOT_SCREENED');
  });
});
