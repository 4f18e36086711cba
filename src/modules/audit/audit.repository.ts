import { and, asc, eq } from 'drizzle-orm';
import { boundAsGiven as bound, builtOnce } from '../../db/built-once.js';
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
  // Every change writes one: built once (see built-once.ts).
  const insertEntry = builtOnce('audit_log_insert', () =>
    db.insert(auditLog).values({
      orgId: bound('orgId'),
      actorType: bound('actorType'),
      actorId: bound('actorId'),
      action: bound('action'),
      subjectType: bound('subjectType'),
      subjectId: bound('subjectId'),
      before: bound('before'),
      after: bound('after'),
      requestId: bound('requestId'),
    }),
  );
  const json = (value: unknown) => (value === undefined || value === null ? null : JSON.stringify(value));

  return {
    async record(entry: AuditEntry, tx: Executor = db): Promise<void> {
      await insertEntry.run(tx, {
        orgId: entry.orgId,
        actorType: entry.actor.type,
        actorId: entry.actor.id,
        action: entry.action,
        subjectType: entry.subjectType,
        subjectId: entry.subjectId,
        before: json(entry.before),
        after: json(entry.after),
        requestId: entry.actor.requestId ?? null,
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
