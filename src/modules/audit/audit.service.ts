import type { DataAccess, Executor } from '../../db/client.js';
import { AppError } from '../../shared/app-error.js';
import { isUuid } from '../../shared/ids.js';
import { feedPage } from '../../shared/list-envelope.js';
import type { ApiKeysRepository } from '../api-keys/api-keys.repository.js';
import type { CustomersRepository } from '../customers/customers.repository.js';
import type { RequestContext } from '../../shared/request-context.js';
import { decodeSequenceCursor, encodeSequenceCursor, filterFingerprint, type CursorKey } from '../../shared/list-cursor.js';
import type { OrganisationsRepository } from '../organisations/organisations.repository.js';
import type { ServiceSecretsRepository } from '../service-secrets/service-secrets.repository.js';
import { GENESIS_HASH } from './audit-chain.js';
import { changesOf } from './audit-changes.js';
import { verifyChain, type ChainVerdict } from './audit-chain.verifier.js';
import {
  csvHeader,
  csvManifest,
  csvRecord,
  ndjsonManifest,
  ndjsonRecord,
  toExportRecord,
  type ExportFormat,
  type ExportManifest,
} from './audit-export.js';
import type { AuditPurge, AuditPurgeResult } from './audit-purge.js';
import type { AuditEventFilters, AuditEventRow, AuditRepository } from './audit.repository.js';
import type { Actor } from '../../shared/actor.js';
import type { AuditEventDto, AuditEventList, ListAuditEventsQuery } from './audit.schemas.js';

/**
 * An audit event as the API shows it. Its `id` is its sequence in the organisation's chain, not the
 * row's id: that comes from one sequence for every organisation, so another organisation's volume
 * could be read from its gaps. The row id stays in the export, whose hashes cover it.
 */
function toDto(row: AuditEventRow): AuditEventDto {
  return {
    id: String(row.sequence),
    sequence: row.sequence,
    created_at: row.createdAt.toISOString(),
    actor: { type: row.actorType as AuditEventDto['actor']['type'], id: row.actorId, key_label: row.keyLabel },
    action: row.action,
    subject: { type: row.subjectType, id: row.subjectId },
    changes: changesOf(row.before, row.after),
    request_id: row.requestId,
    idempotency_key: row.idempotencyKey,
  };
}

/** Rows an export reads per query: its memory holds one page (and its text) at a time. */
const EXPORT_PAGE = 5_000;

/** Where an export goes: `write` resolves once the chunk is taken (backpressure), `progress` after each page. */
export type ExportSink = {
  write(chunk: string): Promise<void>;
  start?(total: number): void;
  progress?(rows: number): void;
};

export type ExportOptions = { format: ExportFormat; from?: Date; to?: Date };

export type ChainHeadDto = { org_id: string; sequence: number; hash: string | null; sealed_at: string | null };

/**
 * The audit trail read back: GET /v1/audit-events (sealed rows only, in chain order) and the
 * operator's `svc audit head` and `svc audit verify`.
 */
export function createAuditService(deps: {
  database: DataAccess;
  cursorKey: CursorKey;
  audit: AuditRepository;
  auditPurge: AuditPurge;
  customers: CustomersRepository;
  keys: ApiKeysRepository;
  organisations: OrganisationsRepository;
  secrets: ServiceSecretsRepository;
}) {
  const { database, cursorKey, audit, auditPurge, customers, keys, organisations, secrets } = deps;

  /**
   * A subject of the organisation: a UUID some audit row of the organisation names (any kind of
   * record, also one since removed), else a customer or entity by external_id (or by UUID, once its
   * rows were purged). Anything else, another organisation's ids included, is not found.
   */
  async function resolveSubject(orgId: string, ref: string): Promise<string> {
    if (isUuid(ref) && (await audit.hasSubject(orgId, ref, database.db))) return ref;
    const record =
      (await customers.findByExternalId(orgId, ref, database.db)) ??
      (isUuid(ref) ? await customers.findById(orgId, ref, database.db) : undefined);
    if (!record) throw AppError.notFound('Subject');
    return record.id;
  }

  async function resolveActor(orgId: string, ref: string): Promise<NonNullable<AuditEventFilters['actor']>> {
    if (ref === 'operator' || ref === 'system' || ref === 'contact') return { type: ref };
    if (!isUuid(ref)) throw AppError.field('actor', 'Must be an API key id, operator, system or contact.');
    const key = await keys.findById(ref, database.db);
    if (!key || key.orgId !== orgId) throw AppError.notFound('API key');
    return { type: 'api_key', id: key.id };
  }

  /** The hash a row at `sequence` chains to: 64 zeros at 1, else the row's before it or a purge's checkpoint there; null if neither is left. */
  async function hashBefore(orgId: string, sequence: number, tx: Executor): Promise<string | null> {
    if (sequence === 1) return GENESIS_HASH;
    const row = await audit.chainRowAt(orgId, sequence - 1, tx);
    if (row) return row.hash;
    const checkpoint = await audit.checkpointAtOrBelow(orgId, sequence - 1, tx);
    return checkpoint?.sequence === sequence - 1 ? checkpoint.hash : null;
  }

  async function requireOrg(orgId: string): Promise<void> {
    if (!isUuid(orgId) || !(await organisations.findById(orgId, database.db))) throw AppError.notFound('Organisation');
  }

  return {
    async list(ctx: RequestContext, query: ListAuditEventsQuery): Promise<AuditEventList> {
      const limit = query.limit ?? 50;
      const subjectId = query.subject_id === undefined ? undefined : await resolveSubject(ctx.orgId, query.subject_id);
      const actor = query.actor === undefined ? undefined : await resolveActor(ctx.orgId, query.actor);
      const fingerprint = filterFingerprint({
        list: 'audit-events',
        // The subject, not how it was named: its UUID and its external_id continue the same walk.
        subject_id: subjectId ?? null,
        actor: actor ?? null,
        action: query.action ?? null,
        created_after: query.created_after?.toISOString() ?? null,
        created_before: query.created_before?.toISOString() ?? null,
      });
      const key = await cursorKey();
      const after = query.cursor === undefined ? 0 : decodeSequenceCursor(query.cursor, fingerprint, key);
      const filters: AuditEventFilters = {
        after,
        subjectId,
        actor,
        actions: query.action,
        createdAfter: query.created_after,
        createdBefore: query.created_before,
      };
      // From the primary: a replica could lag behind a sequence the previous page returned.
      const rows = await audit.listSealed(ctx.orgId, filters, limit + 1, database.db);
      const page = rows.slice(0, limit);
      // resume_cursor is never null: an empty page hands back where it started, so an auditor's next poll resumes there.
      return feedPage(page.map(toDto), limit, rows.length > limit, encodeSequenceCursor(page.at(-1)?.sequence ?? after, fingerprint, key));
    },

    /** The end of the organisation's chain, to publish elsewhere (a daily anchor reveals a truncation later). */
    async head(orgId: string): Promise<ChainHeadDto> {
      await requireOrg(orgId);
      const head = await audit.findHead(orgId, database.db);
      const sealed = head !== undefined && head.lastSequence > 0;
      return {
        org_id: orgId,
        sequence: head?.lastSequence ?? 0,
        hash: sealed ? head.lastHash : null,
        sealed_at: sealed ? head.updatedAt.toISOString() : null,
      };
    },

    /**
     * Deletes the organisation's sealed rows created before `before` behind a signed checkpoint
     * (audit-purge.ts, the retention job's code path too); refused for a date inside retention.
     */
    async purge(orgId: string, before: Date, options: { actor: Actor; retentionYears: number }): Promise<AuditPurgeResult> {
      await requireOrg(orgId);
      return auditPurge.purge(orgId, before, options);
    },

    /**
     * Writes the organisation's sealed rows created in [from, to) to `sink`, in sequence order, then
     * the manifest, all from one read-only snapshot (the rows, the previous hash and the count agree),
     * in keyset pages of EXPORT_PAGE rows: memory stays flat however long the chain.
     */
    async export(orgId: string, options: ExportOptions, sink: ExportSink): Promise<ExportManifest> {
      await requireOrg(orgId);
      const encode = options.format === 'csv' ? csvRecord : ndjsonRecord;
      return database.transaction(
        async (tx) => {
          const range = await audit.exportRange(orgId, options.from, options.to, tx);
          sink.start?.(range ? await audit.countSealedBetween(orgId, range.first, range.last, tx) : 0);
          if (options.format === 'csv') await sink.write(csvHeader());
          let rows = 0;
          let last: { sequence: number; hash: string | null } | undefined;
          for (let next = range?.first ?? 1; range && next <= range.last;) {
            const page = await audit.exportPage(orgId, next, range.last, EXPORT_PAGE, tx);
            if (page.length === 0) break;
            let chunk = '';
            for (const row of page) chunk += encode(toExportRecord(row));
            await sink.write(chunk);
            rows += page.length;
            last = page[page.length - 1]!;
            sink.progress?.(rows);
            next = last.sequence + 1;
          }
          const manifest: ExportManifest = {
            org_id: orgId,
            rows,
            first_sequence: range?.first ?? null,
            last_sequence: last?.sequence ?? null,
            prev_hash: range ? await hashBefore(orgId, range.first, tx) : null,
            head_hash: last?.hash ?? null,
            from: options.from?.toISOString() ?? null,
            to: options.to?.toISOString() ?? null,
            exported_at: new Date().toISOString(),
            format: options.format,
          };
          await sink.write(options.format === 'csv' ? csvManifest(manifest) : ndjsonManifest(manifest));
          return manifest;
        },
        { isolationLevel: 'repeatable read', accessMode: 'read only' },
      );
    },

    /** Recomputes the chain in one read-only snapshot: nothing it runs can write, and the head and rows agree. */
    async verify(orgId: string): Promise<ChainVerdict> {
      await requireOrg(orgId);
      return database.transaction((tx) => verifyChain(audit, secrets, orgId, tx), {
        isolationLevel: 'repeatable read',
        accessMode: 'read only',
      });
    },
  };
}
