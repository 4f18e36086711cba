import { and, asc, eq, gt, gte, inArray, isNotNull, isNull, lt, lte, sql, type SQL } from 'drizzle-orm';
import type { Executor } from '../../db/client.js';
import { organisationsWith } from '../../db/skip-scan.js';
import { apiKeys, auditChainHeads, auditCheckpoints, auditLog } from '../../db/schema.js';
import { createAuditWriter } from '../../shared/audit-writer.js';
import type { ChainRow } from './audit-chain.js';

/** The action of the audit row a purge writes with its checkpoint (audit-purge.ts). */
export const AUDIT_PURGED_ACTION = 'audit_log.purged';

/** A sealed row as GET /v1/audit-events reads it, with the label of the acting API key. */
export type AuditEventRow = Omit<ChainRow, 'orgId' | 'id'> & { id: number; keyLabel: string | null };

export type AuditEventFilters = {
  /** Only rows after this sequence (0: from the start). */
  after: number;
  subjectId?: string;
  actor?: { type: 'api_key' | 'operator' | 'system' | 'contact'; id?: string };
  actions?: readonly string[];
  createdAfter?: Date;
  createdBefore?: Date;
};

/** The head of an organisation's chain: its last sealed sequence and hash, and when it moved. */
export type ChainHead = { lastSequence: number; lastHash: string | null; updatedAt: Date };

/** The columns of a chain row (the canonical content's), as Drizzle maps them. */
const chainColumns = {
  orgId: auditLog.orgId,
  id: auditLog.id,
  createdAt: auditLog.createdAt,
  actorType: auditLog.actorType,
  actorId: auditLog.actorId,
  action: auditLog.action,
  subjectType: auditLog.subjectType,
  subjectId: auditLog.subjectId,
  before: auditLog.before,
  after: auditLog.after,
  requestId: auditLog.requestId,
  idempotencyKey: auditLog.idempotencyKey,
};

export function createAuditRepository() {
  return {
    ...createAuditWriter(),

    // --- GET /v1/audit-events -------------------------------------------------------------------

    /**
     * Up to `limit` sealed rows after `filters.after`, ascending by sequence: a range scan of
     * audit_log_chain_idx (org_id, sequence), or of audit_log_subject_idx (org_id, subject_id,
     * sequence) with a subject. The acting key's label comes from its row; no secret column is read.
     */
    async listSealed(orgId: string, filters: AuditEventFilters, limit: number, tx: Executor): Promise<AuditEventRow[]> {
      const conditions: SQL[] = [eq(auditLog.orgId, orgId), isNotNull(auditLog.sequence), gt(auditLog.sequence, filters.after)];
      if (filters.subjectId !== undefined) conditions.push(eq(auditLog.subjectId, filters.subjectId));
      if (filters.actor !== undefined) {
        conditions.push(eq(auditLog.actorType, filters.actor.type));
        if (filters.actor.id !== undefined) conditions.push(eq(auditLog.actorId, filters.actor.id));
      }
      if (filters.actions !== undefined) conditions.push(inArray(auditLog.action, [...filters.actions]));
      if (filters.createdAfter !== undefined) conditions.push(gt(auditLog.createdAt, filters.createdAfter));
      if (filters.createdBefore !== undefined) conditions.push(lt(auditLog.createdAt, filters.createdBefore));
      const rows = await tx
        .select({
          id: auditLog.id,
          sequence: auditLog.sequence,
          createdAt: auditLog.createdAt,
          actorType: auditLog.actorType,
          actorId: auditLog.actorId,
          keyLabel: apiKeys.label,
          action: auditLog.action,
          subjectType: auditLog.subjectType,
          subjectId: auditLog.subjectId,
          before: auditLog.before,
          after: auditLog.after,
          requestId: auditLog.requestId,
          idempotencyKey: auditLog.idempotencyKey,
        })
        .from(auditLog)
        // The CASE keeps the cast away from the ids of other actors, which are not API keys (and not all UUIDs).
        .leftJoin(
          apiKeys,
          and(
            eq(apiKeys.orgId, auditLog.orgId),
            sql`${apiKeys.id} = CASE WHEN ${auditLog.actorType} = 'api_key' THEN ${auditLog.actorId}::uuid END`,
          ),
        )
        .where(and(...conditions))
        .orderBy(asc(auditLog.sequence))
        .limit(limit);
      return rows as AuditEventRow[];
    },

    /** Whether the organisation has any audit row (sealed or not) about `subjectId`. */
    async hasSubject(orgId: string, subjectId: string, tx: Executor): Promise<boolean> {
      const rows = await tx
        .select({ one: sql<number>`1` })
        .from(auditLog)
        .where(and(eq(auditLog.orgId, orgId), eq(auditLog.subjectId, subjectId)))
        .limit(1);
      return rows.length > 0;
    },

    // --- The sealer (audit-chain.sealer.ts) -----------------------------------------------------

    /**
     * Organisations after `after` (org_id order) with rows not sealed yet, at most `limit`: a skip
     * scan of the small partial index audit_log_unsealed_idx, one probe per organisation.
     */
    async organisationsWithUnsealedRows(after: string, limit: number, tx: Executor): Promise<string[]> {
      return organisationsWith(tx, { table: 'audit_log', pending: sql`sequence IS NULL`, after, limit });
    },

    /** The organisation's head row, so there is always one to lock; a statement of its own (see lockHead). */
    async ensureHead(orgId: string, tx: Executor): Promise<void> {
      await tx.insert(auditChainHeads).values({ orgId }).onConflictDoNothing({ target: auditChainHeads.orgId });
    },

    /**
     * Locks the organisation's head and returns it, or undefined when another sealer holds it (that
     * one is sealing this organisation now; waiting would only queue behind it).
     */
    async lockHead(orgId: string, tx: Executor): Promise<ChainHead | undefined> {
      const [head] = await tx
        .select({ lastSequence: auditChainHeads.lastSequence, lastHash: auditChainHeads.lastHash, updatedAt: auditChainHeads.updatedAt })
        .from(auditChainHeads)
        .where(eq(auditChainHeads.orgId, orgId))
        .for('update', { skipLocked: true });
      return head;
    },

    /**
     * The oldest `limit` unsealed rows, by (created_at, id). It must be a statement after lockHead's:
     * READ COMMITTED gives it a snapshot taken once the head was locked, so it sees every row the
     * previous holder sealed and takes none of them again.
     */
    async unsealedRows(orgId: string, limit: number, tx: Executor): Promise<Array<Omit<ChainRow, 'sequence'>>> {
      return tx
        .select(chainColumns)
        .from(auditLog)
        .where(and(eq(auditLog.orgId, orgId), isNull(auditLog.sequence)))
        .orderBy(asc(auditLog.createdAt), asc(auditLog.id))
        .limit(limit);
    },

    /**
     * Writes the sequences and hashes of `sealed` (in chain order) and moves the head to the last of
     * them, in one statement; returns how many rows it sealed. A row sealed meanwhile (which the head
     * lock rules out) is left alone and not counted, so the caller can refuse the batch.
     */
    async seal(orgId: string, sealed: ReadonlyArray<{ id: number; sequence: number; hash: string }>, tx: Executor): Promise<number> {
      const last = sealed[sealed.length - 1];
      if (!last) return 0;
      const result = await tx.execute<{ sealed: number }>(sql`
        WITH batch AS (
          SELECT * FROM jsonb_to_recordset(${JSON.stringify(sealed)}::jsonb) AS v(id bigint, sequence bigint, hash text)
        ),
        sealed AS (
          UPDATE audit_log a
             SET sequence = batch.sequence, hash = batch.hash
            FROM batch
           WHERE a.org_id = ${orgId} AND a.id = batch.id AND a.sequence IS NULL
          RETURNING 1
        ),
        head AS (
          UPDATE audit_chain_heads
             SET last_sequence = ${last.sequence}, last_hash = ${last.hash}, updated_at = clock_timestamp()
           WHERE org_id = ${orgId}
          RETURNING 1
        )
        SELECT (SELECT count(*) FROM sealed)::int AS sealed, (SELECT count(*) FROM head)::int AS head`);
      return result.rows[0]?.sealed ?? 0;
    },

    // --- svc audit head / verify ----------------------------------------------------------------

    async findHead(orgId: string, tx: Executor): Promise<ChainHead | undefined> {
      const [head] = await tx
        .select({ lastSequence: auditChainHeads.lastSequence, lastHash: auditChainHeads.lastHash, updatedAt: auditChainHeads.updatedAt })
        .from(auditChainHeads)
        .where(eq(auditChainHeads.orgId, orgId));
      return head;
    },

    /** Sealed rows from `fromSequence` on (inclusive), in chain order, with their stored hashes. */
    async chainFrom(orgId: string, fromSequence: number, limit: number, tx: Executor): Promise<Array<ChainRow & { hash: string | null }>> {
      const rows = await tx
        .select({ ...chainColumns, sequence: auditLog.sequence, hash: auditLog.hash })
        .from(auditLog)
        .where(and(eq(auditLog.orgId, orgId), gte(auditLog.sequence, fromSequence)))
        .orderBy(asc(auditLog.sequence))
        .limit(limit);
      return rows as Array<ChainRow & { hash: string | null }>;
    },

    /** The sealed row at `sequence`, if there is one. */
    async chainRowAt(orgId: string, sequence: number, tx: Executor): Promise<(ChainRow & { hash: string | null }) | undefined> {
      const [row] = await this.chainFrom(orgId, sequence, 1, tx);
      return row?.sequence === sequence ? row : undefined;
    },

    /** How many rows are committed but not sealed yet. */
    async countUnsealed(orgId: string, tx: Executor): Promise<number> {
      const [row] = await tx
        .select({ count: sql<number>`count(*)::int` })
        .from(auditLog)
        .where(and(eq(auditLog.orgId, orgId), isNull(auditLog.sequence)));
      return row?.count ?? 0;
    },

    // --- svc audit export ------------------------------------------------------------------------

    /**
     * The sealed sequences an export of rows created in [from, to) covers: the first sequence created
     * at or after `from`, the last created before `to`, and how many sealed rows lie between them.
     * Sequences follow commit order and created_at does not quite (a long transaction commits after
     * rows it predates), so the export takes the whole range between them: a slice that verifies.
     */
    async exportRange(
      orgId: string,
      from: Date | undefined,
      to: Date | undefined,
      tx: Executor,
    ): Promise<{ first: number; last: number } | undefined> {
      const conditions: SQL[] = [eq(auditLog.orgId, orgId), isNotNull(auditLog.sequence)];
      if (from !== undefined) conditions.push(gte(auditLog.createdAt, from));
      if (to !== undefined) conditions.push(lt(auditLog.createdAt, to));
      const [row] = await tx
        .select({ first: sql<string | null>`min(${auditLog.sequence})`, last: sql<string | null>`max(${auditLog.sequence})` })
        .from(auditLog)
        .where(and(...conditions));
      if (!row || row.first === null || row.last === null) return undefined;
      return { first: Number(row.first), last: Number(row.last) };
    },

    /** How many sealed rows lie between two sequences (inclusive): the export's progress total. */
    async countSealedBetween(orgId: string, first: number, last: number, tx: Executor): Promise<number> {
      const [row] = await tx
        .select({ count: sql<number>`count(*)::int` })
        .from(auditLog)
        .where(and(eq(auditLog.orgId, orgId), gte(auditLog.sequence, first), lte(auditLog.sequence, last)));
      return row?.count ?? 0;
    },

    /**
     * Up to `limit` sealed rows from `fromSequence` to `toSequence` (inclusive), in chain order, with
     * their hashes and the acting key's label (no secret column): one keyset page of an export.
     */
    async exportPage(
      orgId: string,
      fromSequence: number,
      toSequence: number,
      limit: number,
      tx: Executor,
    ): Promise<Array<ChainRow & { hash: string | null; keyLabel: string | null }>> {
      const rows = await tx
        .select({ ...chainColumns, sequence: auditLog.sequence, hash: auditLog.hash, keyLabel: apiKeys.label })
        .from(auditLog)
        .leftJoin(
          apiKeys,
          and(
            eq(apiKeys.orgId, auditLog.orgId),
            sql`${apiKeys.id} = CASE WHEN ${auditLog.actorType} = 'api_key' THEN ${auditLog.actorId}::uuid END`,
          ),
        )
        .where(and(eq(auditLog.orgId, orgId), gte(auditLog.sequence, fromSequence), lte(auditLog.sequence, toSequence)))
        .orderBy(asc(auditLog.sequence))
        .limit(limit);
      return rows as Array<ChainRow & { hash: string | null; keyLabel: string | null }>;
    },

    /** The latest checkpoint at or below `sequence` (a purge removed the rows up to it). */
    async checkpointAtOrBelow(orgId: string, sequence: number, tx: Executor) {
      const [row] = await tx
        .select({ sequence: auditCheckpoints.sequence, hash: auditCheckpoints.hash })
        .from(auditCheckpoints)
        .where(and(eq(auditCheckpoints.orgId, orgId), lte(auditCheckpoints.sequence, sequence)))
        .orderBy(sql`${auditCheckpoints.sequence} DESC`)
        .limit(1);
      return row;
    },

    // --- svc audit purge and the retention job (audit-purge.ts) --------------------------------

    /** `years` before now on the database's clock (the one created_at is written on). */
    async retentionCutoff(years: number, tx: Executor): Promise<Date> {
      const result = await tx.execute<{ cutoff: string }>(
        sql`SELECT (clock_timestamp() - make_interval(years => ${years}::int))::text AS cutoff`,
      );
      return new Date(result.rows[0]!.cutoff);
    },

    /**
     * The last sequence of the longest run of sealed rows from the start of the chain that were all
     * created before `before`: the row before the first sealed one created at or after it, else the
     * last sealed row (0: none). A range scan of audit_log_chain_idx that stops at the first young row.
     */
    async purgeBoundary(orgId: string, before: Date, tx: Executor): Promise<number> {
      const result = await tx.execute<{ boundary: string | null }>(sql`
        SELECT COALESCE(
          (SELECT sequence - 1 FROM audit_log
            WHERE org_id = ${orgId} AND sequence IS NOT NULL AND created_at >= ${before.toISOString()}::timestamptz
            ORDER BY sequence LIMIT 1),
          (SELECT max(sequence) FROM audit_log WHERE org_id = ${orgId} AND sequence IS NOT NULL),
          0)::text AS boundary`);
      return Number(result.rows[0]?.boundary ?? 0);
    },

    /** The organisation's checkpoints with their signatures, oldest first (one per purge: a short list). */
    async checkpoints(orgId: string, tx: Executor) {
      return tx
        .select({ sequence: auditCheckpoints.sequence, hash: auditCheckpoints.hash, signature: auditCheckpoints.signature })
        .from(auditCheckpoints)
        .where(eq(auditCheckpoints.orgId, orgId))
        .orderBy(asc(auditCheckpoints.sequence));
    },

    /** The latest checkpoint with its signature, if any. */
    async latestCheckpoint(orgId: string, tx: Executor) {
      const [row] = await tx
        .select({ sequence: auditCheckpoints.sequence, hash: auditCheckpoints.hash, signature: auditCheckpoints.signature })
        .from(auditCheckpoints)
        .where(eq(auditCheckpoints.orgId, orgId))
        .orderBy(sql`${auditCheckpoints.sequence} DESC`)
        .limit(1);
      return row;
    },

    /** Writes a checkpoint; false when one is already at that sequence (a purge running at the same time wrote it). */
    async insertCheckpoint(
      orgId: string,
      checkpoint: { sequence: number; hash: string; signature: string },
      tx: Executor,
    ): Promise<boolean> {
      const inserted = await tx
        .insert(auditCheckpoints)
        .values({ orgId, ...checkpoint })
        .onConflictDoNothing({ target: [auditCheckpoints.orgId, auditCheckpoints.sequence] })
        .returning({ sequence: auditCheckpoints.sequence });
      return inserted.length > 0;
    },

    /**
     * Deletes up to `limit` sealed rows at or below `sequence`, lowest first. Writers only insert
     * audit rows and the sealer only updates unsealed ones, so nothing else holds these; SKIP LOCKED
     * leaves a row held anyway for the next batch rather than waiting on it.
     */
    async deleteSealedThrough(orgId: string, sequence: number, limit: number, tx: Executor): Promise<number> {
      const result = await tx.execute(sql`
        WITH chosen AS (
          SELECT id FROM audit_log
           WHERE org_id = ${orgId} AND sequence IS NOT NULL AND sequence <= ${sequence}
           ORDER BY sequence
           LIMIT ${limit}
           FOR UPDATE SKIP LOCKED)
        DELETE FROM audit_log a USING chosen
         WHERE a.org_id = ${orgId} AND a.id = chosen.id`);
      return result.rowCount ?? 0;
    },

    /** The id of the audit row a purge wrote when it checkpointed `sequence`, sealed or not (a probe of audit_log_subject_idx). */
    async purgeRecordedFor(orgId: string, sequence: number, tx: Executor): Promise<string | undefined> {
      const [row] = await tx
        .select({ id: auditLog.id })
        .from(auditLog)
        .where(
          and(
            eq(auditLog.orgId, orgId),
            eq(auditLog.subjectId, orgId),
            eq(auditLog.action, AUDIT_PURGED_ACTION),
            sql`(${auditLog.after} -> 'checkpoint' ->> 'sequence') = ${String(sequence)}`,
          ),
        )
        .limit(1);
      return row === undefined ? undefined : String(row.id);
    },
  };
}
export type AuditRepository = ReturnType<typeof createAuditRepository>;
