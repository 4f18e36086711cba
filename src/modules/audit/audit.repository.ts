import { and, asc, eq, sql } from 'drizzle-orm';
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

/** An audit entry whose `after` is `before` with `changes` over its top-level fields (`{ ...before, ...changes }`). */
export type AuditChangeEntry = Omit<AuditEntry, 'after'> & { before: Record<string, unknown>; changes: Record<string, unknown> };

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
  // The database makes `after` from `before` and the changes: `before` is encoded and sent once, not twice.
  const insertChange = builtOnce('audit_log_insert_change', () => {
    const columns = sql.join(
      [auditLog.orgId, auditLog.actorType, auditLog.actorId, auditLog.action, auditLog.subjectType, auditLog.subjectId, auditLog.before, auditLog.after, auditLog.requestId].map(
        (column) => sql.identifier(column.name),
      ),
      sql`, `,
    );
    return sql`INSERT INTO ${auditLog} (${columns})
      SELECT ${bound('orgId')}, ${bound('actorType')}, ${bound('actorId')}, ${bound('action')}, ${bound('subjectType')}, ${bound('subjectId')},
             change.before, change.before || change.changes, ${bound('requestId')}
        FROM (SELECT ${bound('before')}::jsonb AS before, ${bound('changes')}::jsonb AS changes) AS change`;
  });
  const json = (value: unknown) => (value === undefined || value === null ? null : JSON.stringify(value));

  /** The values every audit row binds besides its before and after. */
  const whoAndWhat = (entry: Omit<AuditEntry, 'before' | 'after'>) => ({
    orgId: entry.orgId,
    actorType: entry.actor.type,
    actorId: entry.actor.id,
    action: entry.action,
    subjectType: entry.subjectType,
    subjectId: entry.subjectId,
    requestId: entry.actor.requestId ?? null,
  });

  return {
    async record(entry: AuditEntry, tx: Executor = db): Promise<void> {
      await insertEntry.run(tx, Object.assign(whoAndWhat(entry), { before: json(entry.before), after: json(entry.after) }));
    },

    /** Records a change as `record` would with `after: { ...entry.before, ...entry.changes }`. */
    async recordChange(entry: AuditChangeEntry, tx: Executor = db): Promise<void> {
      await insertChange.run(tx, Object.assign(whoAndWhat(entry), { before: JSON.stringify(entry.before), changes: JSON.stringify(entry.changes) }));
    },

    /** In the order written: by time, the id breaking ties only (a global sequence is no order across machines, DESIGN §9). */
    async listForSubject(orgId: string, subjectId: string, tx: Executor = db) {
      return tx
        .select()
        .from(auditLog)
        .where(and(eq(auditLog.orgId, orgId), eq(auditLog.subjectId, subjectId)))
        .orderBy(asc(auditLog.createdAt), asc(auditLog.id));
    },
  };
}
export type AuditRepository = ReturnType<typeof createAuditRepository>;
