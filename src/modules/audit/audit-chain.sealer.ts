import { createCommitOrderSealer, type CommitOrderSealer, type CommitOrderSealerOptions } from '../../shared/commit-order-sealer.js';
import { chainHash, GENESIS_HASH } from './audit-chain.js';
import { AUDIT_CHANNEL } from '../../shared/audit-writer.js';
import { timeSlicer } from '../../shared/time-slice.js';
import { createAuditRepository } from './audit.repository.js';

export type AuditChainSealer = CommitOrderSealer;

/**
 * Chains audit rows after they commit: gives each its sequence and hash (audit-chain.ts), in the
 * order they became visible. A row whose transaction commits late is sealed by a later pass, behind
 * every row that committed before it, so the order, once assigned, never changes. Writers never wait
 * on the chain: they insert with sequence null and go on.
 *
 * Per organisation, one transaction per batch: its head row exists (a statement of its own), is
 * locked with SKIP LOCKED (another instance sealing the organisation makes this one skip it, so a
 * sequence is never handed out twice), and then a new statement, whose snapshot sees whatever the
 * previous holder committed, reads the oldest unsealed rows; their hashes are computed here, chained
 * from the head's hash, and written with the head's move in one statement. The loop around it is the
 * events feed's too (commit-order-sealer.ts); rows written before the upgrade that added the chain are
 * sealed by the same loop.
 */
export function createAuditChainSealer(options: CommitOrderSealerOptions): AuditChainSealer {
  const { database } = options;
  const audit = createAuditRepository();

  /** Seals one batch of the organisation in a transaction; 0 when another sealer holds it or nothing is due. */
  function sealBatch(orgId: string, batchSize: number): Promise<number> {
    return database.transaction(async (tx) => {
      await audit.ensureHead(orgId, tx);
      const head = await audit.lockHead(orgId, tx);
      if (head === undefined) return 0;
      const rows = await audit.unsealedRows(orgId, batchSize, tx);
      let previous = head.lastHash ?? GENESIS_HASH;
      let sequence = head.lastSequence;
      const sealed: Array<{ id: number; sequence: number; hash: string }> = [];
      const slice = timeSlicer();
      for (const row of rows) {
        // Hashing a batch is CPU work: in slices, so requests served by this process are not held behind it.
        await slice();
        sequence += 1;
        previous = chainHash(previous, { ...row, sequence });
        sealed.push({ id: row.id as number, sequence, hash: previous });
      }
      const written = await audit.seal(orgId, sealed, tx);
      // Under the head lock nobody else seals these rows; should one have been, the batch would leave
      // a hole in the chain, so it is rolled back and read again on the next pass.
      if (written !== sealed.length)
        throw new Error(`audit sealer: ${sealed.length - written} of ${sealed.length} rows were sealed by someone else`);
      return written;
    });
  }

  return createCommitOrderSealer({
    ...options,
    channel: AUDIT_CHANNEL,
    what: 'audit chain',
    organisationsWithUnsealedRows: (after, limit) => audit.organisationsWithUnsealedRows(after, limit, database.db),
    sealBatch,
  });
}
