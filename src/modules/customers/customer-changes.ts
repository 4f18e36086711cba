import { isDeepStrictEqual } from 'node:util';
import type { Executor } from '../../db/client.js';
import type { CustomerRow, NewCustomerRow } from '../../db/schema.js';
import { createAuditWriter } from '../../shared/audit-writer.js';
import type { Actor } from '../../shared/actor.js';
import { createOutboxRepository, RECORD_UPDATED_AT } from '../../shared/outbox.js';
import { auditChanges, auditSnapshot } from './customer-dto.js';

/** Only the columns whose value would really change; an empty result means a no-op write. */
export function changedColumns(row: CustomerRow, next: Partial<NewCustomerRow>): Partial<NewCustomerRow> {
  const changes: Partial<NewCustomerRow> = {};
  for (const [key, value] of Object.entries(next) as [keyof NewCustomerRow, unknown][]) {
    if (value === undefined) continue;
    const current = row[key];
    if (!isDeepStrictEqual(normalize(current), normalize(value))) (changes as Record<string, unknown>)[key] = value;
  }
  return changes;
}

function normalize(value: unknown): unknown {
  if (value instanceof Date) return value.getTime();
  return value ?? null;
}

/**
 * Statements sent together in one transaction: every one settles before the caller goes on (none may
 * outlive the transaction), then the first failure in sending order is the one reported (a statement
 * behind a failed one fails only because the transaction was aborted).
 */
async function allInOrder<T extends readonly unknown[]>(statements: T): Promise<{ -readonly [K in keyof T]: Awaited<T[K]> }> {
  const outcomes = await Promise.allSettled(statements);
  for (const outcome of outcomes) if (outcome.status === 'rejected') throw outcome.reason;
  return outcomes.map((outcome) => (outcome as PromiseFulfilledResult<unknown>).value) as { -readonly [K in keyof T]: Awaited<T[K]> };
}

/** The records the integration owns: those its API calls or its bulk imports created. */
const INTEGRATION_OWNED: ReadonlySet<string> = new Set(['INTEGRATION', 'BULK_IMPORT']);

/** A record the integration owns that changed after its creation fires `customer.updated`. */
function firesUpdated(change: { before: CustomerRow | undefined; after: CustomerRow; fireUpdated?: boolean }): boolean {
  return change.before !== undefined && INTEGRATION_OWNED.has(change.after.addedVia) && change.fireUpdated !== false;
}

/** Whether a change moved a review into DUE (a review already due or overdue does not fire again). */
export function becameDue(before: Pick<CustomerRow, 'reviewStatus'> | undefined, after: Pick<CustomerRow, 'reviewStatus'>): boolean {
  return after.reviewStatus === 'DUE' && before?.reviewStatus !== 'DUE' && before?.reviewStatus !== 'OVERDUE';
}

/**
 * The side records of a change to a customer or entity, written in the change's transaction: an
 * audit row (actor, before, after) and, for a record the integration owns that changed after its
 * creation, a `customer.updated` event carrying the public DTO of that moment.
 */
export function createCustomerChangeRecorder() {
  const audit = createAuditWriter();
  const outbox = createOutboxRepository();
  return {
    /**
     * Writes `diff` to `before` (read under lock in this transaction) through `update` and records the
     * change: the row after it is `before` with `diff` and the updated_at the database stamps, so the
     * audit row and event are built from it (the event's updated_at is read from the record as the
     * event is written). Returns that row and its DTO.
     */
    async writeChange<Dto extends { updated_at: string }>(
      change: {
        actor: Actor;
        action: string;
        before: CustomerRow;
        diff: Partial<NewCustomerRow>;
        toDto(row: CustomerRow): Dto;
        fireUpdated?: boolean;
      },
      update: () => Promise<{ updatedAt: Date } | undefined>,
      tx: Executor,
    ): Promise<{ row: CustomerRow; dto: Dto }> {
      const expected = { ...change.before, ...change.diff };
      // Object.assign, not a spread with new names: adding properties to a spread copy is V8's slow path.
      const recorded = Object.assign({}, change, {
        after: expected,
        dto: { ...change.toDto(expected), updated_at: RECORD_UPDATED_AT },
        updatedAtFromRecord: true,
      });
      // The side records need nothing from the UPDATE's answer, only to run after it: sent right behind
      // it, all three share a round trip. When the UPDATE fails, its error is the one to report.
      const [stamped] = await allInOrder([update(), this.record(recorded, tx)] as const);
      if (!stamped) throw new Error(`customer ${change.before.id} vanished under its lock`);
      const row = Object.assign({}, expected, stamped);
      return { row, dto: change.toDto(row) };
    },

    /**
     * Many changes written and recorded as writeChange would each (a bulk import's batch): `update`
     * writes every diff in one go and returns the updated_at stamped on each record by id; their audit
     * rows go in one statement sent with it, and the events they fire in one statement after it, their
     * DTOs made from the rows with that updated_at.
     */
    async writeChanges(
      changes: Array<{ actor: Actor; action: string; before: CustomerRow; diff: Partial<NewCustomerRow> }>,
      toDto: (row: CustomerRow) => unknown,
      update: () => Promise<Map<string, Date>>,
      tx: Executor,
    ): Promise<void> {
      if (changes.length === 0) return;
      const entry = (change: (typeof changes)[number]) => ({
        orgId: change.before.orgId,
        actor: change.actor,
        action: change.action,
        subjectType: change.before.kind === 'entity' ? 'entity' : 'customer',
        subjectId: change.before.id,
        before: auditSnapshot(change.before),
        changes: auditChanges(change.diff),
      });
      const [stamped] = await allInOrder([update(), audit.recordChanges(changes.map(entry), tx)] as const);
      const rows = changes.map((change): CustomerRow => {
        const updatedAt = stamped.get(change.before.id);
        if (!updatedAt) throw new Error(`customer ${change.before.id} vanished under its lock`);
        return Object.assign({}, change.before, change.diff, { updatedAt });
      });
      const events: Parameters<typeof outbox.recordMany>[0] = [];
      changes.forEach((change, index) => {
        const after = rows[index]!;
        const fromImport = change.actor.importId !== undefined;
        const updated = firesUpdated({ before: change.before, after });
        const due = becameDue(change.before, after);
        if (!updated && !due) return;
        const event = { orgId: after.orgId, customerId: after.id, customer: toDto(after), fromImport };
        if (updated) events.push({ ...event, type: 'customer.updated' });
        if (due) events.push({ ...event, type: 'customer.review_due' });
      });
      await outbox.recordMany(events, tx);
    },

    /**
     * Records the creation of many records (a bulk import's batch) as `record` would each: their audit
     * rows in one statement; the events a creation fires, if any, one by one, with `toDto` of the record.
     */
    async recordCreated(
      created: Array<{ actor: Actor; action: string; after: CustomerRow }>,
      toDto: (row: CustomerRow) => unknown,
      tx: Executor,
    ): Promise<void> {
      await audit.recordMany(
        created.map(({ actor, action, after }) => ({
          orgId: after.orgId,
          actor,
          action,
          subjectType: after.kind === 'entity' ? 'entity' : 'customer',
          subjectId: after.id,
          before: null,
          after: auditSnapshot(after),
        })),
        tx,
      );
      for (const change of created) {
        if (becameDue(undefined, change.after)) {
          await this.record({ ...change, dto: toDto(change.after), before: undefined, eventsOnly: true }, tx);
        }
      }
    },

    async record(
      change: {
        actor: Actor;
        action: string;
        before: CustomerRow | undefined;
        after: CustomerRow;
        dto: unknown;
        fireUpdated?: boolean;
        /** The DTO's updated_at is RECORD_UPDATED_AT, to be read from the record (see writeChange). */
        updatedAtFromRecord?: boolean;
        /** `after` is `before` with these columns: the audit row's `after` is made from them (see recordChange in shared/audit-writer.ts). */
        diff?: Partial<NewCustomerRow>;
        /** Its audit row is written already (recordCreated): only the events. */
        eventsOnly?: boolean;
      },
      tx: Executor,
    ): Promise<void> {
      const { after } = change;
      const fireUpdated = firesUpdated(change);
      const entry = {
        orgId: after.orgId,
        actor: change.actor,
        action: change.action,
        subjectType: after.kind === 'entity' ? 'entity' : 'customer',
        subjectId: after.id,
      };
      // Independent of each other: sent together, they share a round trip (pg's pipeline mode).
      const auditRow = change.eventsOnly
        ? undefined
        : change.before && change.diff
          ? audit.recordChange(
              Object.assign(entry, { before: auditSnapshot(change.before), changes: auditChanges(change.diff as Partial<CustomerRow>) }),
              tx,
            )
          : audit.record(
              Object.assign(entry, { before: change.before ? auditSnapshot(change.before) : null, after: auditSnapshot(after) }),
              tx,
            );
      const event = fireUpdated
        ? outbox.record(
            {
              orgId: after.orgId,
              type: 'customer.updated',
              customerId: after.id,
              customer: change.dto,
              updatedAtFromRecord: change.updatedAtFromRecord,
              fromImport: change.actor.importId !== undefined,
            },
            tx,
          )
        : undefined;
      // A change that makes a review due (a trigger, or the sandbox's simulate-due) tells the integration in the same transaction.
      const reviewDue = becameDue(change.before, after)
        ? outbox.record(
            {
              orgId: after.orgId,
              type: 'customer.review_due',
              customerId: after.id,
              customer: change.dto,
              updatedAtFromRecord: change.updatedAtFromRecord,
              fromImport: change.actor.importId !== undefined,
            },
            tx,
          )
        : undefined;
      await allInOrder([auditRow, event, reviewDue] as const);
    },
  };
}
export type CustomerChangeRecorder = ReturnType<typeof createCustomerChangeRecorder>;
