import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createAuditChainSealer, type AuditChainSealer } from '../../src/modules/audit/audit-chain.sealer.js';
import { createEventsFeedSealer, type EventsFeedSealer } from '../../src/modules/events/events-feed.sealer.js';
import { createOutboxRepository } from '../../src/shared/outbox.js';
import { generateOpenApiDocument } from '../../src/plugins/openapi-document.js';
import { createEntity, createIndividual } from '../entities/entity-test-helpers.js';
import { createTestContext, type TestContext, type TestOrg } from '../helpers/harness.js';

/**
 * The one list envelope (spec, GET /customers; DESIGN.md §8): has_more is true only when another page
 * exists and next_cursor is null on the last page, on every list, feeds included; a feed adds
 * resume_cursor, never null.
 */

type Envelope = { object: string; data: Array<Record<string, unknown>>; has_more: boolean; next_cursor: string | null; limit: number };
type JsonSchema = { type?: string | string[]; properties?: Record<string, JsonSchema>; required?: string[] };

const FEEDS = ['/events', '/audit-events'];
/** More pages than any walk here needs: a paginator still going after them would never end. */
const MAX_PAGES = 50;
const PER_LIST = 5;
const WEBHOOK_URL = 'https://93.184.215.14/hooks/list-envelope';

let ctx: TestContext;
let auditSealer: AuditChainSealer;
let feedSealer: EventsFeedSealer;
beforeAll(async () => {
  ctx = await createTestContext();
  auditSealer = createAuditChainSealer({ database: ctx.database, pollIntervalMs: 60_000 });
  feedSealer = createEventsFeedSealer({ database: ctx.database, pollIntervalMs: 60_000 });
});
afterAll(async () => {
  await auditSealer?.stop();
  await feedSealer?.stop();
  await ctx?.close();
});

/** A generic paginator: follows next_cursor until it is null, and nothing else of the list. */
async function paginate(org: TestOrg, url: string, limit: number): Promise<{ ids: string[]; pages: Envelope[] }> {
  const ids: string[] = [];
  const pages: Envelope[] = [];
  let cursor: string | null = null;
  do {
    if (pages.length === MAX_PAGES) throw new Error(`${url}: still a next_cursor after ${MAX_PAGES} pages; the walk never ends`);
    const response = await ctx.request('GET', url, { key: org.key, query: { limit: String(limit), ...(cursor ? { cursor } : {}) } });
    expect(response.statusCode, `${url}: ${response.body}`).toBe(200);
    const page = response.json<Envelope>();
    pages.push(page);
    ids.push(...page.data.map((item) => String(item.id)));
    cursor = page.next_cursor;
  } while (cursor !== null);
  return { ids, pages };
}

/** The GET operations of the document whose 200 answer is a cursor list, by path. */
async function cursorLists(): Promise<Map<string, JsonSchema>> {
  const document = (await generateOpenApiDocument()) as {
    paths: Record<string, Record<string, { responses?: Record<string, { content?: Record<string, { schema?: JsonSchema }> }> }>>;
  };
  const lists = new Map<string, JsonSchema>();
  for (const [path, operations] of Object.entries(document.paths)) {
    const schema = operations.get?.responses?.['200']?.content?.['application/json']?.schema;
    if (schema?.properties?.next_cursor !== undefined) lists.set(path, schema);
  }
  return lists;
}

describe('one list envelope', () => {
  it('when the document describes a cursor list, it is the one envelope: next_cursor string or null, has_more boolean; a feed adds resume_cursor, never null', async () => {
    const lists = await cursorLists();
    expect([...lists.keys()].sort()).toEqual(
      [
        '/audit-events',
        '/customers',
        '/customers/{id}/reviews',
        '/entities',
        '/entities/{id}/reviews',
        '/events',
        '/imports',
        '/imports/{id}/rows',
        '/webhook-endpoints',
        '/webhook-endpoints/{id}/deliveries',
      ].sort(),
    );
    for (const [path, schema] of lists) {
      const properties = schema.properties!;
      expect(properties.object?.type, path).toBe('string');
      expect(properties.has_more?.type, path).toBe('boolean');
      expect(properties.next_cursor?.type, path).toEqual(['string', 'null']);
      expect(schema.required, path).toEqual(expect.arrayContaining(['object', 'data', 'has_more', 'next_cursor', 'limit']));
      if (FEEDS.includes(path)) {
        expect(properties.resume_cursor?.type, path).toBe('string');
        expect(schema.required, path).toContain('resume_cursor');
      } else {
        expect(properties.resume_cursor, path).toBeUndefined();
      }
    }
  });

  it('when a generic paginator follows next_cursor until null, it ends on every list endpoint and collects every item exactly once', async () => {
    const org = await ctx.createOrg();
    const customers: string[] = [];
    const entities: string[] = [];
    const endpoints: string[] = [];
    for (let index = 0; index < PER_LIST; index += 1) {
      customers.push((await createIndividual(ctx, org)).id as string);
      entities.push((await createEntity(ctx, org)).id as string);
      const endpoint = await ctx.request('POST', '/v1/webhook-endpoints', {
        key: org.key,
        body: { url: `${WEBHOOK_URL}/${index}` },
      });
      expect(endpoint.statusCode, endpoint.body).toBe(201);
      endpoints.push(endpoint.json().id as string);
    }
    // Events for the feed, each queueing a delivery to every endpoint.
    const outbox = createOutboxRepository();
    for (let index = 0; index < PER_LIST; index += 1) {
      await ctx.database.transaction((tx) =>
        outbox.record({ orgId: org.id, type: 'customer.updated', customerId: null, customer: null }, tx),
      );
    }
    await feedSealer.sealOnce();
    await auditSealer.sealOnce();
    const column = async (text: string, params: unknown[]) =>
      (await ctx.database.pool.query<{ id: string }>(text, params)).rows.map((row) => String(row.id));
    const expected: Record<string, string[]> = {
      '/v1/customers': customers,
      '/v1/entities': entities,
      '/v1/webhook-endpoints': endpoints,
      [`/v1/webhook-endpoints/${endpoints[0]}/deliveries`]: await column(
        'SELECT id FROM webhook_deliveries WHERE org_id = $1 AND endpoint_id = $2',
        [org.id, endpoints[0]],
      ),
      '/v1/events': await column('SELECT id FROM outbox_events WHERE org_id = $1 AND position IS NOT NULL', [org.id]),
      '/v1/audit-events': await column('SELECT sequence AS id FROM audit_log WHERE org_id = $1 AND sequence IS NOT NULL', [org.id]),
    };

    for (const [url, ids] of Object.entries(expected)) {
      expect(ids.length, url).toBeGreaterThanOrEqual(PER_LIST);
      const walk = await paginate(org, url, 2);
      expect(walk.ids.length, url).toBe(new Set(walk.ids).size);
      expect([...walk.ids].sort(), url).toEqual([...ids].sort());
      // has_more is true exactly on the pages a next_cursor follows.
      expect(
        walk.pages.map((page) => page.has_more),
        url,
      ).toEqual(walk.pages.map((_, index) => index < walk.pages.length - 1));
    }
  });
});
