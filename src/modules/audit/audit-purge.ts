import type { DataAccess } from '../../db/client.js';
import { AppError } from '../../shared/app-error.js';
import type { ServiceSecretsRepository } from '../service-secrets/service-secrets.repository.js';
import { chainHash, checkpointSignature, checkpointSignatureMatches, GENESIS_HASH } from './audit-chain.js';
import { AUDIT_PURGED_ACTION, createAuditRepository } from './audit.repository.js';
import type { Actor } from '../../shared/actor.js';

/** Rows deleted per transaction: one short transaction, like the retention job's other batches. */
const DEFAULT_AUDIT_PURGE_BATCH = 1_000;
/** Rows read per query while checking the range a purge is about to checkpoint. */
const CHECK_PAGE = 2_000;

export type AuditPurgeResult = {
  org_id: string;
  /** Rows this run deleted. */
  purged: number;
  /** The checkpoint the chain now starts from (this run's or an earlier purge's); null when nothing was ever purged. */
  checkpoint: { sequence: number; hash: string } | null;
};

export type AuditPurge = ReturnType<typeof createAuditPurge>;

/**
 * The one way audit rows leave the database, for `svc audit purge` and the retention job alike.
 *
 * A purge removes a prefix of the chain: the sealed rows up to S, the last row of the run of sealed
 * rows from the chain's start that were all created before the date (so no row created on or after
 * it goes, even one sealed behind a late commit). Before it deletes anything it recomputes the rows
 * from the previous checkpoint (or the start) to S: a broken range is refused, never signed over.
 * Then, in the transaction of the first batch, it writes the checkpoint (S, hash of row S, HMAC) and
 * an `audit_log.purged` row; the later batches are transactions of their own. Until the last batch
 * commits, rows at or below the checkpoint may remain: the verifier starts after the checkpoint and
 * ignores them, and the next purge (or the next run of the job) removes them.
 *
 * Unsealed rows are never purged (they are not in the chain yet), nor is the head moved: sealing
 * goes on behind a purge as before, and a writer never waits on it (it only inserts).
 */
export function createAuditPurge(deps: {
  database: DataAccess;
  secrets: ServiceSecretsRepository;
  batchSize?: number;
  /** Called after each committed batch that removed rows (the retention metric). */
  onPurged?: (rows: number) => void;
}) {
  const { database, secrets } = deps;
  const batchSize = deps.batchSize ?? DEFAULT_AUDIT_PURGE_BATCH;
  const audit = createAuditRepository();

  /** The hash of row `through` when rows after `from` up to it chain from `previousHash`; a refusal naming the first row that does not. */
  async function checkRange(orgId: string, from: number, previousHash: string, through: number): Promise<string> {
    let expected = from + 1;
    let previous = previousHash;
    while (expected <= through) {
      const page = await audit.chainFrom(orgId, expected, Math.min(CHECK_PAGE, through - expected + 1), database.db);
      if (page.length === 0 || page[0]!.sequence !== expected) throw brokenChain(orgId, expected, 'is missing');
      for (const row of page) {
        if (row.sequence !== expected) throw brokenChain(orgId, expected, 'is missing');
        if (row.hash !== chainHash(previous, row)) throw brokenChain(orgId, expected, `(row ${row.id}) does not match its hash`);
        previous = row.hash;
        expected += 1;
      }
    }
    return previous;
  }

  return {
    /** `years` before now on the database's clock: the latest date a purge accepts. */
    retentionCutoff: (years: number) => audit.retentionCutoff(years, database.db),

    async purge(
      orgId: string,
      before: Date,
      options: { actor: Actor; retentionYears: number; signal?: AbortSignal },
    ): Promise<AuditPurgeResult> {
      const cutoff = await audit.retentionCutoff(options.retentionYears, database.db);
      if (before.getTime() > cutoff.getTime()) {
        const message = `${before.toISOString()} is inside the audit retention of ${options.retentionYears} years (AUDIT_RETENTION_YEARS): the latest date a purge accepts is ${cutoff.toISOString()}. Nothing was purged.`;
        throw AppError.validation({ before: [message] }, 'The purge is refused: its date is inside the retention period.');
      }

      const latest = await audit.latestCheckpoint(orgId, database.db);
      const boundary = await audit.purgeBoundary(orgId, before, database.db);
      if (!latest && boundary === 0) return { org_id: orgId, purged: 0, checkpoint: null };
      // A checkpoint not signed with the key would let whoever wrote it delete rows inside retention.
      const key = Buffer.from(
        (await secrets.find('audit_checkpoint_hmac', database.db)) ?? (await secrets.ensure('audit_checkpoint_hmac', database.db)),
        'hex',
      );
      if (latest && !checkpointSignatureMatches(key, { orgId, sequence: latest.sequence, hash: latest.hash }, latest.signature)) {
        throw AppError.conflict(
          `The audit chain of organisation ${orgId} starts from a checkpoint (sequence ${latest.sequence}) whose signature does not match; run svc audit verify. Nothing was purged.`,
        );
      }
      let checkpoint = latest ? { sequence: latest.sequence, hash: latest.hash } : null;
      let purged = 0;
      const counted = (rows: number) => {
        if (rows > 0) {
          purged += rows;
          deps.onPurged?.(rows);
        }
        return rows;
      };

      if (boundary > (latest?.sequence ?? 0)) {
        const hash = await checkRange(orgId, latest?.sequence ?? 0, latest?.hash ?? GENESIS_HASH, boundary);
        const next = { sequence: boundary, hash };
        const signature = checkpointSignature(key, { orgId, ...next });
        const first = await database.transaction(async (tx) => {
          // A purge at the same boundary at the same time wrote it already (and its audit row).
          if (await audit.insertCheckpoint(orgId, { ...next, signature }, tx)) {
            await audit.record(
              {
                orgId,
                actor: options.actor,
                action: AUDIT_PURGED_ACTION,
                subjectType: 'organisation',
                subjectId: orgId,
                before: null,
                after: { before: before.toISOString(), checkpoint: next },
              },
              tx,
            );
          }
          return audit.deleteSealedThrough(orgId, boundary, batchSize, tx);
        });
        checkpoint = next;
        if (counted(first) < batchSize) return { org_id: orgId, purged, checkpoint };
      }

      // The rest in transactions of their own; also what an interrupted earlier purge left at or below its checkpoint.
      if (checkpoint) {
        while (
          !options.signal?.aborted &&
          counted(await audit.deleteSealedThrough(orgId, checkpoint.sequence, batchSize, database.db)) >= batchSize
        ) {
          /* next batch */
        }
      }
      return { org_id: orgId, purged, checkpoint };
    },
  };
}

function brokenChain(orgId: string, sequence: number, what: string): AppError {
  return AppError.conflict(
    `The audit chain of organisation ${orgId} is broken at sequence ${sequence}: it ${what}. A purge never checkpoints a broken chain; run svc audit verify. Nothing was purged.`,
  );
}
