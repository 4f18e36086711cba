import { and, asc, eq, ne } from 'drizzle-orm';
import { expect } from 'vitest';
import { auditLog, creditLedger, customers, emails, organisations, outboxEvents, verifications } from '../../src/db/schema.js';
import type { TestContext, TestOrg } from '../helpers/harness.js';
import { testLinkSealer } from '../helpers/harness.js';
import { createEmailsRepository } from '../../src/modules/emails/emails.repository.js';

export type EntityType = 'COMPANY' | 'TRUST' | 'PARTNERSHIP' | 'SMSF' | 'OTHER';

type Json = Record<string, unknown>;

let sequence = 0;
const unique = () => `${Date.now().toString(36)}${(sequence++).toString(36)}`;

/** Creates an entity through the API; with a contact (the default) whose email is returned. */
export async function createEntity(ctx: TestContext, org: TestOrg, options: { type?: EntityType; contact?: boolean } = {}) {
  const suffix = unique();
  const contactEmail = `contact-${suffix}@example.test`;
  const response = await ctx.request('POST', '/v1/entities', {
    key: org.key,
    body: {
      type: options.type ?? 'COMPANY',
      name: `Entity ${suffix} Pty Ltd`,
      ...(options.contact === false ? {} : { contact: { fullName: `Contact ${suffix}`, email: contactEmail } }),
    },
  });
  expect(response.statusCode, response.body).toBe(201);
  const entity = response.json<Json & { id: string }>();
  return { id: entity.id, contactEmail, dto: entity };
}

/** Creates an individual customer through the API, optionally with a representative. */
export async function createCustomer(ctx: TestContext, org: TestOrg, options: { representative?: boolean } = {}) {
  const suffix = unique();
  const email = `person-${suffix}@example.test`;
  const representativeEmail = `attorney-${suffix}@example.test`;
  const response = await ctx.request('POST', '/v1/customers', {
    key: org.key,
    body: {
      fullName: `Person ${suffix}`,
      email,
      ...(options.representative ? { representative: { fullName: `Attorney ${suffix}`, email: representativeEmail } } : {}),
    },
  });
  expect(response.statusCode, response.body).toBe(201);
  const customer = response.json<Json & { id: string; full_name: string }>();
  return { id: customer.id, email, representativeEmail, dto: customer };
}

export async function setStatus(ctx: TestContext, customerId: string, kycStatus: string) {
  await ctx.database.db.update(customers).set({ kycStatus }).where(eq(customers.id, customerId));
}

export async function customerRow(ctx: TestContext, customerId: string) {
  const [row] = await ctx.database.db.select().from(customers).where(eq(customers.id, customerId));
  return row!;
}

export async function balanceOf(ctx: TestContext, orgId: string): Promise<number> {
  const [row] = await ctx.database.db.select({ credits: organisations.credits }).from(organisations).where(eq(organisations.id, orgId));
  return row!.credits;
}

export async function verificationsOf(ctx: TestContext, orgId: string, customerId?: string) {
  return ctx.database.db
    .select()
    .from(verifications)
    .where(and(eq(verifications.orgId, orgId), customerId ? eq(verifications.customerId, customerId) : undefined));
}

/** Ledger rows written by verification charges (the organisation's opening grant is left out). */
export async function ledgerOf(ctx: TestContext, orgId: string) {
  return ctx.database.db
    .select()
    .from(creditLedger)
    .where(and(eq(creditLedger.orgId, orgId), ne(creditLedger.reason, 'initial_credits')))
    .orderBy(asc(creditLedger.createdAt), asc(creditLedger.id));
}

/** The organisation's emails with their body and link opened (they are sealed at rest). */
export async function emailsOf(ctx: TestContext, orgId: string) {
  const repository = createEmailsRepository(testLinkSealer());
  return (await ctx.database.db.select().from(emails).where(eq(emails.orgId, orgId))).map((row) => repository.openRow(row));
}

export async function eventsOf(ctx: TestContext, orgId: string, type?: string) {
  const rows = await ctx.database.db
    .select()
    .from(outboxEvents)
    .where(and(eq(outboxEvents.orgId, orgId), type ? eq(outboxEvents.type, type) : undefined))
    // In the order written: the feed sealer rewrites rows after commit, so the heap's order is no order.
    .orderBy(asc(outboxEvents.createdAt), asc(outboxEvents.id));
  return rows.map((row) => ({ ...row, document: JSON.parse(row.payload) as { id: string; type: string; data: { customer: Json } } }));
}

export async function auditOf(ctx: TestContext, orgId: string, subjectId: string, action?: string) {
  return ctx.database.db
    .select()
    .from(auditLog)
    .where(and(eq(auditLog.orgId, orgId), eq(auditLog.subjectId, subjectId), action ? eq(auditLog.action, action) : undefined));
}

/**
 * The "nothing armed, charged or emailed" check after a refused start: no verification row, no
 * ledger row, the balance as before, no email, and the record's status as before.
 */
export async function expectNothingArmed(ctx: TestContext, org: TestOrg, subjectId: string, before: { credits: number; status: string }) {
  expect(await verificationsOf(ctx, org.id)).toEqual([]);
  expect(await ledgerOf(ctx, org.id)).toEqual([]);
  expect(await emailsOf(ctx, org.id)).toEqual([]);
  expect(await balanceOf(ctx, org.id)).toBe(before.credits);
  expect((await customerRow(ctx, subjectId)).kycStatus).toBe(before.status);
}

export function errorOf(response: { json(): unknown }) {
  return (response.json() as { error: { code: string; message: string; details?: Json & { issues?: Record<string, string[]> } } }).error;
}
