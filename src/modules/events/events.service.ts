import type { DataAccess } from '../../db/client.js';
import { AppError } from '../../shared/app-error.js';
import { isUuid } from '../../shared/ids.js';
import { feedPage } from '../../shared/list-envelope.js';
import type { CustomersRepository } from '../customers/customers.repository.js';
import type { RequestContext } from '../../shared/request-context.js';
import { checkFingerprint, filterFingerprint, notACursor, openCursor, signCursor, type CursorKey } from '../../shared/list-cursor.js';
import type { EventsRepository, FeedFilters } from './events.repository.js';
import type { EventDto, EventList, ListEventsQuery } from './events.schemas.js';

/** A feed cursor names a position: the consumer's next poll returns the events after it. */
function encodePosition(position: number, fingerprint: string, key: Buffer): string {
  return signCursor({ p: position, f: fingerprint }, key);
}

function decodePosition(cursor: string, fingerprint: string, key: Buffer): number {
  const fields = openCursor(cursor, key);
  // A customers' or entities' cursor verifies too (one key); it has no position.
  if (typeof fields.p !== 'number' || !Number.isSafeInteger(fields.p) || fields.p < 0) throw notACursor();
  checkFingerprint(fields, fingerprint);
  return fields.p;
}

const toDto = (payload: string): EventDto => JSON.parse(payload) as EventDto;

/**
 * The events feed: every event of the organisation, sealed in commit order (events-feed.sealer.ts),
 * read from the primary (a replica could lag behind a position its previous page returned).
 */
export function createEventsService(deps: {
  database: DataAccess;
  cursorKey: CursorKey;
  events: EventsRepository;
  customers: CustomersRepository;
}) {
  const { database, cursorKey, events, customers } = deps;

  /** A customer or entity of the organisation by UUID or external_id, as the operator CLI resolves it. */
  async function resolveRecord(orgId: string, ref: string): Promise<string> {
    const row =
      (await customers.findByRef(orgId, 'individual', ref, database.db)) ?? (await customers.findByRef(orgId, 'entity', ref, database.db));
    if (!row) throw AppError.notFound('Customer or entity');
    return row.id;
  }

  return {
    async list(ctx: RequestContext, query: ListEventsQuery): Promise<EventList> {
      const limit = query.limit ?? 50;
      const customerId = query.customer_id === undefined ? undefined : await resolveRecord(ctx.orgId, query.customer_id);
      const fingerprint = filterFingerprint({
        feed: 'events',
        type: query.type ?? null,
        // The record, not how it was named: its UUID and its external_id continue the same walk.
        customer_id: customerId ?? null,
        created_after: query.created_after?.toISOString() ?? null,
        created_before: query.created_before?.toISOString() ?? null,
      });
      const key = await cursorKey();
      const after = query.cursor === undefined ? 0 : decodePosition(query.cursor, fingerprint, key);
      const filters: FeedFilters = {
        after,
        types: query.type,
        customerId,
        createdAfter: query.created_after,
        createdBefore: query.created_before,
      };
      const rows = await events.list(ctx.orgId, filters, limit + 1, database.db);
      const page = rows.slice(0, limit);
      // resume_cursor is never null: an empty page hands back the position it started from, so the consumer resumes there.
      const resumeAt = page.at(-1)?.position ?? after;
      return feedPage(
        page.map((row) => toDto(row.payload)),
        limit,
        rows.length > limit,
        encodePosition(resumeAt, fingerprint, key),
      );
    },

    /** One event, sealed or not yet; a malformed id is simply not found. */
    async get(ctx: RequestContext, id: string): Promise<EventDto> {
      const row = isUuid(id) ? await events.find(ctx.orgId, id, database.db) : undefined;
      if (!row) throw AppError.notFound('Event');
      return toDto(row.payload);
    },
  };
}
