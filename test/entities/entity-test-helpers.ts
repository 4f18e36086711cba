import { expect } from 'vitest';
import type { TestContext, TestOrg } from '../helpers/harness.js';

let sequence = 0;
/** A name no other test in the file uses, so matching never crosses tests by accident. */
export function uniqueName(prefix = 'Entity'): string {
  sequence += 1;
  return `${prefix} ${sequence} ${Math.random().toString(36).slice(2, 8)} Pty Ltd`;
}

/** A random digit string of the given length (ABN 11, ACN 9). */
export function randomDigits(length: number): string {
  let digits = '';
  while (digits.length < length) digits += Math.floor(Math.random() * 10).toString();
  return digits;
}

export async function postEntity(ctx: TestContext, org: TestOrg, body: Record<string, unknown>) {
  return ctx.request('POST', '/v1/entities', { key: org.key, body });
}

/** Creates an entity and returns its DTO (asserting 201). */
export async function createEntity(ctx: TestContext, org: TestOrg, body: Record<string, unknown> = {}) {
  const response = await postEntity(ctx, org, { type: 'COMPANY', name: uniqueName(), ...body });
  expect(response.statusCode, response.body).toBe(201);
  return response.json();
}

export async function createIndividual(ctx: TestContext, org: TestOrg, body: Record<string, unknown> = {}) {
  const suffix = Math.random().toString(36).slice(2, 8);
  const response = await ctx.request('POST', '/v1/customers', {
    key: org.key,
    body: { fullName: `Person ${suffix}`, email: `person.${suffix}@example.com`, ...body },
  });
  expect(response.statusCode, response.body).toBe(201);
  return response.json();
}

export async function sql<T = Record<string, unknown>>(ctx: TestContext, text: string, params: unknown[] = []): Promise<T[]> {
  const result = await ctx.database.pool.query(text, params);
  return result.rows as T[];
}

export function expectValidation(response: { statusCode: number; body: string; json(): any }, ...fields: string[]) {
  expect(response.statusCode, response.body).toBe(422);
  const body = response.json();
  expect(body.error.code).toBe('validation_failed');
  for (const field of fields) expect(Object.keys(body.error.details.issues), response.body).toContain(field);
}

export function expectConflict(response: { statusCode: number; body: string; json(): any }) {
  expect(response.statusCode, response.body).toBe(409);
  expect(response.json().error.code).toBe('conflict');
}

/**
 * `dto` (a write's response or event payload, built inside the transaction) equals `stored` (read
 * after commit). The one allowed difference: a transaction that commits more than 50 ms after its
 * write is re-stamped at commit (migration 0001, for `updated_since` pollers), so the stored
 * `updated_at` may be later than the one the write saw, never earlier.
 */
export function expectSameDto(dto: Record<string, unknown>, stored: Record<string, unknown>) {
  const { updated_at: dtoUpdatedAt, ...dtoRest } = dto;
  const { updated_at: storedUpdatedAt, ...storedRest } = stored;
  expect(dtoRest).toEqual(storedRest);
  expect(Date.parse(storedUpdatedAt as string)).toBeGreaterThanOrEqual(Date.parse(dtoUpdatedAt as string));
}
