import { and, asc, eq } from 'drizzle-orm';
import type { Executor } from '../../db/client.js';
import { auditLog } from '../../db/schema.js';

/** Who caused a change: an API key, an operator at the CLI, or the system itself. */
export type Actor = { type: 'api_key' | 'operator' | 'system'; id: string | null; requestId?: string };

export type AuditEntry = {
  orgId: string;
  actor: Actor;
  action: string;
  subjectType: string;
  subjectId: string | null;
  before: unknown;
  after: unknown;
};

export function createAuditRepository(db: Executor) {
  return {
    async record(entry: AuditEntry, tx: Executor = db): Promise<void> {
      await tx.insert(auditLog).values({
        orgId: entry.orgId,
        actorType: entry.actor.type,
        actorId: entry.actor.id,
        action: entry.action,
        subjectType: entry.subjectType,
        subjectId: entry.subjectId,
        before: entry.before ?? null,
        after: entry.after ?? null,
        requestId: entry.actor.requestId,
      });
    },

    async listForSubject(orgId: string, subjectId: string, tx: Executor = db) {
      return tx
        .select()
        .from(auditLog)
        .where(and(eq(auditLog.orgId, orgId), eq(auditLog.subjectId, subjectId)))
        .orderBy(asc(auditLog.id));
    },
  };
}
export type AuditRepository = ReturnType<typeof createAuditRepository>;
