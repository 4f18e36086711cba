import { sql } from 'drizzle-orm';
import { prepared, wakeAfterCommit, type Executor } from '../db/client.js';
import { auditLog } from '../db/schema.js';
import type { Actor } from './actor.js';

/*
 * The audit writer: what every module calls to append its audit rows, in the transaction of the change.
 * It is shared rather than kept in the audit module because the audit module reads other modules (to
 * resolve a subject or a key); with the writer there, those modules would import it back.
 * Chaining, reading, export and purge stay in src/modules/audit.
 */

/** The channel an audit write wakes once committed: the sealers of every instance (modules/audit/audit-chain.sealer.ts). */
export const AUDIT_CHANNEL = 'audit_log';

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

/** Appends audit rows; the audit repository (modules/audit/audit.repository.ts) has these too. */
export function createAuditWriter() {
  // Every change writes one: a Drizzle prepared query, each value bound as given (`before` and `after` already JSON).
  const bound = (name: string) => sql`${sql.placeholder(name)}`;
  const insertEntry = prepared('audit_log_insert', (executor, name) =>
    executor
      .insert(auditLog)
      .values({
        orgId: bound('orgId'),
        actorType: bound('actorType'),
        actorId: bound('actorId'),
        action: bound('action'),
        subjectType: bound('subjectType'),
        subjectId: bound('subjectId'),
        before: bound('before'),
        after: bound('after'),
        requestId: bound('requestId'),
        idempotencyKey: bound('idempotencyKey'),
      })
      .prepare(name),
  );
  const json = (value: unknown) => (value === undefined || value === null ? null : JSON.stringify(value));
  // The database makes `after` from `before` and the changes: `before` is encoded and sent once, not
  // twice. Drizzle prepares query builders only, so the INSERT … SELECT is the WITH of a select.
  const insertChange = prepared('audit_log_insert_change', (executor, name) => {
    const columns = sql.join(
      [
        auditLog.orgId,
        auditLog.actorType,
        auditLog.actorId,
        auditLog.action,
        auditLog.subjectType,
        auditLog.subjectId,
        auditLog.before,
        auditLog.after,
        auditLog.requestId,
        auditLog.idempotencyKey,
      ].map((column) => sql.identifier(column.name)),
      sql`, `,
    );
    const inserted = executor.$with('inserted', { one: sql`1` }).as(sql`INSERT INTO ${auditLog} (${columns})
      SELECT ${bound('orgId')}, ${bound('actorType')}, ${bound('actorId')}, ${bound('action')}, ${bound('subjectType')}, ${bound('subjectId')},
             change.before, change.before || change.changes, ${bound('requestId')}, ${bound('idempotencyKey')}
        FROM (SELECT ${bound('before')}::jsonb AS before, ${bound('changes')}::jsonb AS changes) AS change
      RETURNING 1`);
    return executor
      .with(inserted)
      .select({ one: sql<number>`1` })
      .from(inserted)
      .prepare(name);
  });

  /** The values every audit row binds besides its before and after. */
  const whoAndWhat = (entry: Omit<AuditEntry, 'before' | 'after'>) => ({
    orgId: entry.orgId,
    actorType: entry.actor.type,
    actorId: entry.actor.id,
    action: entry.action,
    subjectType: entry.subjectType,
    subjectId: entry.subjectId,
    requestId: entry.actor.requestId ?? null,
    idempotencyKey: entry.actor.idempotencyKey ?? null,
  });

  /** An entry's columns besides before and after, as the many-rows document names them. */
  const documentEntry = (entry: Omit<AuditEntry, 'before' | 'after'>) => {
    const who = whoAndWhat(entry);
    return {
      org_id: who.orgId,
      actor_type: who.actorType,
      actor_id: who.actorId,
      action: who.action,
      subject_type: who.subjectType,
      subject_id: who.subjectId,
      request_id: who.requestId,
      idempotency_key: who.idempotencyKey,
    };
  };

  /**
   * Many rows in one statement. They travel as one JSON document (an array parameter would escape
   * every character of every snapshot); a row with `changes` has `before || changes` as its `after`.
   */
  async function insertMany(
    rows: Array<ReturnType<typeof documentEntry> & { before: unknown; after?: unknown; changes?: Record<string, unknown> }>,
    tx: Executor,
  ): Promise<void> {
    if (rows.length === 0) return;
    await tx.execute(sql`
      INSERT INTO ${auditLog} (org_id, actor_type, actor_id, action, subject_type, subject_id, before, after, request_id, idempotency_key)
      SELECT org_id, actor_type, actor_id, action, subject_type, subject_id, before, coalesce(after, before || changes), request_id, idempotency_key
        FROM jsonb_to_recordset(${JSON.stringify(rows)}::jsonb)
          AS entry (org_id uuid, actor_type text, actor_id text, action text, subject_type text, subject_id uuid, before jsonb, after jsonb,
                    changes jsonb, request_id text, idempotency_key text)`);
    wakeAfterCommit(tx, AUDIT_CHANNEL);
  }

  return {
    async record(entry: AuditEntry, tx: Executor): Promise<void> {
      await insertEntry(tx, Object.assign(whoAndWhat(entry), { before: json(entry.before), after: json(entry.after) }));
      // The sealer chains the row once it is committed; no statement of the writer's waits for it.
      wakeAfterCommit(tx, AUDIT_CHANNEL);
    },

    /**
     * Records many changes in one statement, each as `recordChange` would (a background batch: the
     * review sweep, a policy's re-dating). `after` is made in the database from `before` and the changes.
     */
    async recordChanges(entries: AuditChangeEntry[], tx: Executor): Promise<void> {
      await insertMany(
        entries.map((entry) => ({ ...documentEntry(entry), before: entry.before, changes: entry.changes })),
        tx,
      );
    },

    /** Records many entries in one statement, each as `record` would (a bulk import's batch). */
    async recordMany(entries: AuditEntry[], tx: Executor): Promise<void> {
      await insertMany(
        entries.map((entry) => ({ ...documentEntry(entry), before: entry.before ?? null, after: entry.after ?? null })),
        tx,
      );
    },

    /** Records a change as `record` would with `after: { ...entry.before, ...entry.changes }`. */
    async recordChange(entry: AuditChangeEntry, tx: Executor): Promise<void> {
      await insertChange(
        tx,
        Object.assign(whoAndWhat(entry), { before: JSON.stringify(entry.before), changes: JSON.stringify(entry.changes) }),
      );
      wakeAfterCommit(tx, AUDIT_CHANNEL);
    },
  };
}
export type AuditWriter = ReturnType<typeof createAuditWriter>;
