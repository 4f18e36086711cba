import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MAX_BODY_DEPTH } from '../../src/plugins/text-input.js';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';
import { createCustomer, createEntity, customerRow, emailsOf } from '../verification/verification-fixtures.js';

// The text rules of docs/decisions.md ("Text in requests"), applied to the parsed values of every
// route (src/plugins/text-input.ts) before the schemas see them.

let ctx: TestContext;
let org: TestOrg;
let sequence = 0;
const unique = () => `${Date.now().toString(36)}-${(sequence++).toString(36)}`;

beforeAll(async () => {
  ctx = await createTestContext();
  org = await ctx.createOrg({ credits: 50 });
});
afterAll(async () => ctx?.close());

type Envelope = { error: { code: string; message: string; details?: { issues?: Record<string, string[]> } } };

function expectRefused(response: { statusCode: number; json(): unknown; body: string }, field: string, mention: string | RegExp) {
  expect(response.statusCode, response.body).toBe(422);
  const body = response.json() as Envelope;
  expect(body.error.code).toBe('validation_failed');
  expect(Object.keys(body.error.details!.issues!)).toEqual([field]);
  expect(body.error.details!.issues![field]!.join(' ')).toMatch(mention);
}

const newPerson = (overrides: Record<string, unknown> = {}) => ({
  fullName: `Person ${unique()}`,
  email: `p-${unique()}@example.test`,
  ...overrides,
});

describe('NUL is checked on parsed values, not on the raw body text', () => {
  it('when a body string holds the escaped text "\\u0000" (a backslash, not a NUL), it is accepted and stored as sent', async () => {
    const fullName = 'Back\\u0000slash Person';
    const response = await ctx.request('POST', '/v1/customers', { key: org.key, body: newPerson({ fullName }) });
    expect(response.statusCode, response.body).toBe(201);
    expect(response.json().full_name).toBe(fullName);
  });

  it('when a nested body string contains U+0000, it answers 422 naming the nested field', async () => {
    const response = await ctx.request('POST', '/v1/entities', {
      key: org.key,
      body: { type: 'COMPANY', name: `Nul ${unique()} Pty Ltd`, contact: { fullName: 'Nul\u0000Contact', email: 'nul@example.test' } },
    });
    expectRefused(response, 'contact.fullName', /NUL/);
  });
});

describe('control characters', () => {
  it.each([
    ['CR LF', 'Ada\r\nBcc: victim@example.test'],
    ['LF', 'Ada\nLovelace'],
    ['TAB', 'Ada\tLovelace'],
    ['ESC', 'Ada\u001b[31mLovelace'],
    ['BEL', 'Ada\u0007Lovelace'],
    ['DEL', 'Ada\u007fLovelace'],
    ['NEL (C1 U+0085)', 'Ada\u0085Lovelace'],
    ['CSI (C1 U+009B)', 'Ada\u009b31mLovelace'],
  ])('when a name contains %s, it answers 422 naming the field', async (_name, fullName) => {
    expectRefused(
      await ctx.request('POST', '/v1/customers', { key: org.key, body: newPerson({ fullName }) }),
      'fullName',
      /control characters/,
    );
  });

  it('when an entity name (which reaches email subjects) contains CR LF, it answers 422 naming name', async () => {
    const response = await ctx.request('POST', '/v1/entities', { key: org.key, body: { type: 'COMPANY', name: 'Acme\r\nSubject: x' } });
    expectRefused(response, 'name', /control characters/);
  });

  it('when a group party label contains a line break, it answers 422 naming parties[1].roleLabel', async () => {
    const response = await ctx.request('POST', '/v1/groups', {
      key: org.key,
      body: { name: `Deal ${unique()}`, parties: [{ roleLabel: 'Vendor' }, { roleLabel: 'Purchaser\nand more' }] },
    });
    expectRefused(response, 'parties[1].roleLabel', /control characters/);
  });

  it('when several fields break the rules, every one is named', async () => {
    const response = await ctx.request('POST', '/v1/customers', { key: org.key, body: newPerson({ fullName: 'A\u0007', phone: '1\n2' }) });
    expect(response.statusCode).toBe(422);
    expect(Object.keys(response.json<Envelope>().error.details!.issues!).sort()).toEqual(['fullName', 'phone']);
  });

  it('when a query parameter contains a control character, it answers 422 naming the parameter', async () => {
    const response = await ctx.request('GET', '/v1/customers?external_id=a%1Bb', { key: org.key });
    expectRefused(response, 'external_id', /control characters/);
  });

  it('when a path id contains a control character, it answers 422 naming id', async () => {
    expectRefused(await ctx.request('GET', '/v1/customers/crm%0D%0Aone', { key: org.key }), 'id', /control characters/);
  });
});

describe('multi-line fields (customMessage, address)', () => {
  it('when a customMessage holds line breaks and tabs, they are kept as sent and reach the email body', async () => {
    const person = await createCustomer(ctx, org);
    const customMessage = 'Hello,\r\nplease finish this before Friday.\n\n\tThanks';
    const response = await ctx.request('POST', `/v1/customers/${person.id}/kyc`, { key: org.key, body: { customMessage } });
    expect(response.statusCode, response.body).toBe(200);
    const sent = (await emailsOf(ctx, org.id)).filter((email) => email.recipient === person.email);
    expect(sent[0]!.body).toContain(customMessage);
    expect(sent[0]!.subject).not.toMatch(/[\r\n]/);
  });

  it('when a customMessage holds another control character (ESC), it answers 422 naming customMessage', async () => {
    const entity = await createEntity(ctx, org);
    const response = await ctx.request('POST', `/v1/entities/${entity.id}/kyb`, { key: org.key, body: { customMessage: 'Hi\u001b[2J' } });
    expectRefused(response, 'customMessage', /other than tab, line feed and carriage return/);
  });

  it('when an address spans lines, it is stored as sent', async () => {
    const address = '1 Example St\nSydney NSW 2000';
    const response = await ctx.request('POST', '/v1/entities', {
      key: org.key,
      body: { type: 'COMPANY', name: `Lines ${unique()} Pty Ltd`, address },
    });
    expect(response.statusCode, response.body).toBe(201);
    expect((await customerRow(ctx, response.json().id)).address).toBe(address);
  });
});

describe('unpaired surrogates', () => {
  it.each([
    ['a lone high surrogate', 'Ada\ud800Lovelace'],
    ['a lone low surrogate', 'Ada\udc00Lovelace'],
    ['a pair in the wrong order', 'Ada\udc00\ud800Lovelace'],
    ['a high surrogate at the end', 'Ada Lovelace\ud83d'],
  ])('when a name holds %s, it answers 422 naming the field instead of storing U+FFFD', async (_name, fullName) => {
    expectRefused(await ctx.request('POST', '/v1/customers', { key: org.key, body: newPerson({ fullName }) }), 'fullName', /surrogate/);
  });

  it('when a name holds a valid surrogate pair (an emoji), it is stored exactly', async () => {
    const fullName = 'Ada 😀 Lovelace';
    const response = await ctx.request('POST', '/v1/customers', { key: org.key, body: newPerson({ fullName }) });
    expect(response.statusCode, response.body).toBe(201);
    expect(response.json().full_name).toBe(fullName);
  });

  it('when the body bytes are not valid UTF-8 (an encoded surrogate), it answers 400 invalid_json instead of storing U+FFFD', async () => {
    const payload = Buffer.concat([
      Buffer.from(`{"fullName":"Ada `),
      Buffer.from([0xed, 0xa0, 0x80]),
      Buffer.from(`","email":"u@example.test"}`),
    ]);
    const response = await ctx.app.inject({
      method: 'POST',
      url: '/v1/customers',
      headers: { authorization: `Bearer ${org.key}`, 'content-type': 'application/json' },
      payload,
    });
    expect(response.statusCode).toBe(400);
    expect(response.json()).toEqual({ error: { code: 'invalid_json', message: expect.stringContaining('UTF-8') } });
  });
});

describe('separators and bidi controls', () => {
  it.each([
    ['U+2028 LINE SEPARATOR', 'Ada\u2028Lovelace', /separators/],
    ['U+2029 PARAGRAPH SEPARATOR', 'Ada\u2029Lovelace', /separators/],
    ['U+202E RIGHT-TO-LEFT OVERRIDE', 'Ada \u202eecalevoL', /bidirectional/],
    ['U+202A LEFT-TO-RIGHT EMBEDDING', 'Ada \u202aLovelace\u202c', /bidirectional/],
    ['U+2066 LEFT-TO-RIGHT ISOLATE', 'Ada \u2066Lovelace\u2069', /bidirectional/],
  ])('when a name contains %s, it answers 422 naming the field', async (_name, fullName, mention) => {
    expectRefused(await ctx.request('POST', '/v1/customers', { key: org.key, body: newPerson({ fullName }) }), 'fullName', mention);
  });

  it('when a name in a right-to-left script uses the implicit marks (RLM), it is accepted', async () => {
    const fullName = 'דוד כהן\u200f';
    const response = await ctx.request('POST', '/v1/customers', { key: org.key, body: newPerson({ fullName }) });
    expect(response.statusCode, response.body).toBe(201);
    expect(response.json().full_name).toBe(fullName);
  });
});

describe('NFC normalisation', () => {
  const composed = 'Jos\u00e9 M\u00fcller';
  const decomposed = 'Jose\u0301 Mu\u0308ller';

  it('when a name is sent decomposed, it is stored composed (NFC)', async () => {
    const response = await ctx.request('POST', '/v1/customers', { key: org.key, body: newPerson({ fullName: decomposed }) });
    expect(response.statusCode, response.body).toBe(201);
    expect(response.json().full_name).toBe(composed);
  });

  it('when an upsert sends the decomposed form of a name created composed, it matches the same record', async () => {
    const email = `nfc-${unique()}@example.test`;
    const created = await ctx.request('POST', '/v1/customers', { key: org.key, body: { fullName: composed, email } });
    expect(created.statusCode, created.body).toBe(201);
    const again = await ctx.request('POST', '/v1/customers', {
      key: org.key,
      body: { fullName: decomposed, email, phone: '+61400000009' },
    });
    expect(again.statusCode, again.body).toBe(200);
    expect(again.json().id).toBe(created.json().id);
  });

  it('when a path id is the decomposed form of an external_id created composed, it finds the record', async () => {
    const externalId = `crm-\u00e9-${unique()}`;
    const created = await ctx.request('POST', '/v1/customers', { key: org.key, body: newPerson({ externalId }) });
    expect(created.statusCode, created.body).toBe(201);
    const response = await ctx.request('GET', `/v1/customers/${encodeURIComponent(externalId.normalize('NFD'))}`, { key: org.key });
    expect(response.statusCode, response.body).toBe(200);
    expect(response.json().id).toBe(created.json().id);
  });

  it('when a query filter is sent decomposed, it matches the composed external_id', async () => {
    const externalId = `crm-\u00fc-${unique()}`;
    const created = await ctx.request('POST', '/v1/customers', { key: org.key, body: newPerson({ externalId }) });
    expect(created.statusCode, created.body).toBe(201);
    const response = await ctx.request('GET', '/v1/customers', { key: org.key, query: { external_id: externalId.normalize('NFD') } });
    expect(response.statusCode, response.body).toBe(200);
    expect(response.json().data.map((row: { id: string }) => row.id)).toEqual([created.json().id]);
  });

  it('when a name is 255 characters composed but longer decomposed, it passes the length limit', async () => {
    const fullName = '\u00e9'.repeat(255);
    const response = await ctx.request('POST', '/v1/customers', { key: org.key, body: newPerson({ fullName: fullName.normalize('NFD') }) });
    expect(response.statusCode, response.body).toBe(201);
    expect(response.json().full_name).toBe(fullName);
  });
});

describe('hostile shapes', () => {
  const post = (payload: string) =>
    ctx.app.inject({
      method: 'POST',
      url: '/v1/customers',
      headers: { authorization: `Bearer ${org.key}`, 'content-type': 'application/json' },
      payload,
    });

  it('when a body nests far deeper than any schema, it answers 422 naming where, without walking (or overflowing the stack) any further', async () => {
    const depth = 100_000;
    const response = await post(`{"fullName":"Ada","email":"deep@example.test","x":${'['.repeat(depth)}"\\u0007"${']'.repeat(depth)}}`);
    expect(response.statusCode, response.body.slice(0, 300)).toBe(422);
    const issues = response.json<Envelope>().error.details!.issues!;
    expect(Object.keys(issues)).toEqual([`x${'[0]'.repeat(MAX_BODY_DEPTH - 1)}`]);
    expect(Object.values(issues)[0]).toEqual([expect.stringContaining(`${MAX_BODY_DEPTH} levels`)]);
  });

  it('when a body holds thousands of refused strings, it answers 422 naming at most 100 of them', async () => {
    const response = await post(
      JSON.stringify({ fullName: 'Ada', email: 'many@example.test', x: Array.from({ length: 5000 }, () => '\u0007') }),
    );
    expect(response.statusCode).toBe(422);
    expect(Object.keys(response.json<Envelope>().error.details!.issues!)).toHaveLength(100);
  });
});
