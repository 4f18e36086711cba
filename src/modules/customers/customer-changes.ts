import { isDeepStrictEqual } from 'node:util';
import type { Executor } from '../../db/client.js';
import type { CustomerRow, NewCustomerRow } from '../../db/schema.js';
import { createAuditRepository, type Actor } from '../audit/audit.repository.js';
import { createOutboxRepository } from '../webhooks/outbox.repository.js';
import { auditSnapshot } from './customer-dto.js';

/** Only the columns whose value would really change; an empty result means a no-op write. */
export function changedColumns(row: CustomerRow, next: Partial<NewCustomerRow>): Partial<NewCustomerRow> {
  const changes: Partial<NewCustomerRow> = {};
  for (const [key, value] of Object.entries(next) as [keyof NewCustomerRow, unknown][]) {
    if (value === undefined) continue;
    const current = row[key as keyof CustomerRow];
    if (!isDeepStrictEqual(normalize(current), normalize(value))) (changes as Record<string, unknown>)[key] = value;
  }
  return changes;
}

function normalize(value: unknown): unknown {
  if (value instanceof Date) return value.getTime();
  return value ?? null;
}

/**
 * The side records of a change to a customer or entity, written in the change's transaction: an
 * audit row (actor, before, after) and, for a record the integration owns that changed after its
 * creation, a `customer.updated` event carrying the public DTO of that moment.
 */
export function createCustomerChangeRecorder(db: Executor) {
  const audit = createAuditRepository(db);
  const outbox = createOutboxRepository(db);
  return {
    async record(
      change: { actor: Actor; action: string; before: CustomerRow | undefined; after: CustomerRow; dto: unknown; fireUpdated?: boolean },
      tx: Executor,
    ): Promise<void> {
      const { after } = change;
      // Sent together: on the transaction's pipelined connection both leave in one write.
      const fireUpdated = change.before !== undefined && after.addedVia === 'INTEGRATION' && change.fireUpdated !== false;
      const auditRow = audit.record(
        {
          orgId: after.orgId,
          actor: change.actor,
          action: change.action,
          subjectType: after.kind === 'entity' ? 'entity' : 'customer',
          subjectId: after.id,
          before: change.before ? auditSnapshot(change.before) : null,
          after: auditSnapshot(after),
        },
        tx,
      );
      const event = fireUpdated ? outbox.record({ orgId: after.orgId, type: 'customer.updated', customerId: after.id, customer: change.dto }, tx) : undefined;
      await Promise.all([auditRow, event]);
    },
  };
}
export type CustomerChangeRecorder = ReturnType<typeof createCustomerChangeRecorder>;
