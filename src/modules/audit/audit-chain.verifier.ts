import type { Executor } from '../../db/client.js';
import type { ServiceSecretsRepository } from '../service-secrets/service-secrets.repository.js';
import { chainHash, checkpointSignatureMatches, GENESIS_HASH, type ChainRow } from './audit-chain.js';
import type { AuditRepository, ChainHead } from './audit.repository.js';

/**
 * What broke the chain at a row: a row changed, missing, added, out of its place, or the tail cut
 * off; or a purge's checkpoint forged, edited or deleted.
 */
export type ChainProblem = 'edited' | 'deleted' | 'inserted' | 'reordered' | 'truncated' | 'checkpoint';

export type ChainBreak = {
  /** The sequence of the row the problem is at (for a deleted or truncated row: the sequence it had). */
  sequence: number;
  /** That row's audit id; null when the row is gone (deleted, truncated). */
  id: string | null;
  problem: ChainProblem;
  /** One sentence for the operator, naming the neighbouring rows where it helps. */
  detail: string;
};

export type ChainVerdict =
  | {
      ok: true;
      org_id: string;
      rows: number;
      first_sequence: number | null;
      last_sequence: number | null;
      head_hash: string | null;
      unsealed: number;
    }
  | { ok: false; org_id: string; rows_checked: number; broken_at: ChainBreak };

type StoredRow = ChainRow & { hash: string | null };

/** Rows read per query: the walk holds one page (and a few rows of lookahead) at a time. */
const PAGE = 2_000;

/**
 * Recomputes an organisation's chain from its first row (or the checkpoint a purge left before it)
 * to its head, on `tx` (the caller opens it REPEATABLE READ and READ ONLY, so the rows and the head
 * are one snapshot and nothing can be written). Stops at the first row whose hash does not follow,
 * and says what most likely happened there:
 *
 * - a missing sequence: deleted; the tail missing against the head: truncated;
 * - the row's neighbours still chain around it as if it were not there: inserted;
 * - the row and a later one each verify in the other's place: reordered;
 * - the rows after it verify one sequence further on: a row was deleted and the rest renumbered;
 * - otherwise the row itself no longer matches its hash: edited.
 */
export async function verifyChain(
  audit: AuditRepository,
  secrets: ServiceSecretsRepository,
  orgId: string,
  tx: Executor,
): Promise<ChainVerdict> {
  const head = await audit.findHead(orgId, tx);
  const unsealed = await audit.countUnsealed(orgId, tx);
  const broken = (rowsChecked: number, at: ChainBreak): ChainVerdict => ({
    ok: false,
    org_id: orgId,
    rows_checked: rowsChecked,
    broken_at: at,
  });
  const rowAt = (sequence: number) => audit.chainRowAt(orgId, sequence, tx);
  const hashBefore = async (sequence: number): Promise<string | undefined> => {
    if (sequence === 1) return GENESIS_HASH;
    const row = await rowAt(sequence - 1);
    if (row) return row.hash ?? undefined;
    const checkpoint = await audit.checkpointAtOrBelow(orgId, sequence - 1, tx);
    return checkpoint?.sequence === sequence - 1 ? checkpoint.hash : undefined;
  };
  /** `row` as if it were sealed at `sequence`: what its hash covers there. */
  const placedAt = (row: ChainRow, sequence: number): ChainRow => ({ ...row, sequence });

  // Every checkpoint must carry its signature: one edited, or made up without the key, is named before any row.
  const checkpoints = await audit.checkpoints(orgId, tx);
  if (checkpoints.length > 0) {
    const value = await secrets.find('audit_checkpoint_hmac', tx);
    const key = value !== undefined && /^(?:[0-9a-f]{2})+$/i.test(value) ? Buffer.from(value, 'hex') : undefined;
    for (const checkpoint of checkpoints) {
      if (!key || !checkpointSignatureMatches(key, { orgId, sequence: checkpoint.sequence, hash: checkpoint.hash }, checkpoint.signature)) {
        return broken(0, {
          sequence: checkpoint.sequence,
          id: null,
          problem: 'checkpoint',
          detail: key
            ? `the checkpoint at sequence ${checkpoint.sequence} does not match its signature: its hash or signature was changed, or it was not written by a purge`
            : `the checkpoint at sequence ${checkpoint.sequence} cannot be checked: service_secrets.audit_checkpoint_hmac is missing`,
        });
      }
    }
  }
  // The chain starts after the latest checkpoint: rows at or below it are a purge's still to be deleted.
  const startAfter = checkpoints.at(-1);

  let rows = 0;
  let first: number | null = null;
  let previousHash: string | undefined = startAfter?.hash ?? GENESIS_HASH;
  let previous: StoredRow | undefined;
  let expected = (startAfter?.sequence ?? 0) + 1;

  for (let from = expected; ;) {
    const page = await audit.chainFrom(orgId, from, PAGE, tx);
    for (const row of page) {
      if (first === null) {
        first = row.sequence;
        // Rows missing from the start: a purge whose checkpoint is gone, or rows deleted.
        if (row.sequence !== expected) {
          const missing = expected;
          const recordedBy = await audit.purgeRecordedFor(orgId, row.sequence - 1, tx);
          if (recordedBy !== undefined) {
            return broken(0, {
              sequence: row.sequence - 1,
              id: null,
              problem: 'checkpoint',
              detail: `the checkpoint at sequence ${row.sequence - 1}, which the purge recorded in row ${recordedBy}, is missing: the chain cannot be checked before row ${row.id} (sequence ${row.sequence})`,
            });
          }
          return broken(0, {
            sequence: missing,
            id: null,
            problem: 'deleted',
            detail: `sequences ${missing} to ${row.sequence - 1} are missing before row ${row.id} (sequence ${row.sequence}), with no checkpoint to start from`,
          });
        }
      }
      if (row.sequence !== expected) {
        return broken(rows, {
          sequence: expected,
          id: null,
          problem: 'deleted',
          detail: `sequence ${expected} is missing: ${previous ? `row ${previous.id} (sequence ${previous.sequence})` : 'the start'} is followed by row ${row.id} (sequence ${row.sequence})`,
        });
      }
      if (row.hash !== chainHash(previousHash, row)) {
        return broken(rows, await diagnose(row, previousHash, previous));
      }
      rows += 1;
      previous = row;
      previousHash = row.hash;
      expected += 1;
    }
    if (page.length < PAGE) break;
    from = page[page.length - 1]!.sequence + 1;
  }

  const tailBreak = await compareWithHead(head, previous);
  if (tailBreak) return broken(rows, tailBreak);
  return {
    ok: true,
    org_id: orgId,
    rows,
    first_sequence: first,
    last_sequence: previous?.sequence ?? null,
    head_hash: previous?.hash ?? null,
    unsealed,
  };

  /** Why `row` (at sequence s) does not follow `previousHash`, the stored hash before it. */
  async function diagnose(row: StoredRow, previousHash: string, before: StoredRow | undefined): Promise<ChainBreak> {
    const s = row.sequence;
    const name = `row ${row.id} (sequence ${s})`;
    const next = await rowAt(s + 1);

    // Reordered: a later row verifies here, and this row verifies in that row's place.
    for (let from = s + 1; ;) {
      const page = await audit.chainFrom(orgId, from, PAGE, tx);
      for (const other of page) {
        if (other.hash !== chainHash(previousHash, placedAt(other, s))) continue;
        const beforeOther = other.sequence === s + 1 ? other.hash : await hashBefore(other.sequence);
        if (beforeOther !== undefined && row.hash === chainHash(beforeOther, placedAt(row, other.sequence))) {
          return {
            sequence: s,
            id: String(row.id),
            problem: 'reordered',
            detail: `${name} and row ${other.id} (sequence ${other.sequence}) have swapped places`,
          };
        }
        break;
      }
      if (page.length < PAGE) break;
      from = page[page.length - 1]!.sequence + 1;
    }

    // Inserted: the next row verifies in this row's place, chained to the row before it.
    if (next && next.hash === chainHash(previousHash, placedAt(next, s))) {
      return {
        sequence: s,
        id: String(row.id),
        problem: 'inserted',
        detail: `${name} is not part of the chain: row ${next.id} after it was sealed at sequence ${s}`,
      };
    }
    // Inserted with a hash of its own that chains (a forgery computed after the fact): this row verifies one place back.
    if (before && before.sequence >= 2) {
      const twoBack = await hashBefore(before.sequence);
      if (twoBack !== undefined && row.hash === chainHash(twoBack, placedAt(row, s - 1))) {
        return {
          sequence: before.sequence,
          id: String(before.id),
          problem: 'inserted',
          detail: `row ${before.id} (sequence ${before.sequence}) is not part of the chain: ${name} after it was sealed at sequence ${before.sequence}`,
        };
      }
    } else if (before && before.sequence === 1 && row.hash === chainHash(GENESIS_HASH, placedAt(row, 1))) {
      return {
        sequence: 1,
        id: String(before.id),
        problem: 'inserted',
        detail: `row ${before.id} (sequence 1) is not part of the chain: ${name} was sealed at sequence 1`,
      };
    }

    // Deleted and the rest renumbered down: the next row follows this one's hash one sequence further on.
    const renumbered = next
      ? next.hash !== null && row.hash !== null && next.hash === chainHash(row.hash, placedAt(next, s + 2))
      : head !== undefined && head.lastSequence === s + 1 && head.lastHash === row.hash;
    if (renumbered) {
      return {
        sequence: s,
        id: null,
        problem: 'deleted',
        detail: `the row sealed at sequence ${s} is missing and the rows after it were renumbered: ${name} was sealed at sequence ${s + 1}`,
      };
    }

    return {
      sequence: s,
      id: String(row.id),
      problem: 'edited',
      detail: `${name} no longer matches its hash: its content or hash was changed after it was sealed`,
    };
  }

  /** The chain's tail against the head the sealer keeps: rows cut off, added after it, or a changed last row. */
  async function compareWithHead(head: ChainHead | undefined, last: StoredRow | undefined): Promise<ChainBreak | undefined> {
    const headSequence = head?.lastSequence ?? 0;
    if (!last) {
      if (headSequence === 0) return undefined;
      // Every row purged behind a checkpoint at the head is a purged chain, not a truncated one.
      const checkpoint = await audit.checkpointAtOrBelow(orgId, headSequence, tx);
      if (checkpoint?.sequence === headSequence && checkpoint.hash === head?.lastHash) return undefined;
      const missing = (checkpoint?.sequence ?? 0) + 1;
      return {
        sequence: missing,
        id: null,
        problem: 'truncated',
        detail: `the chain has no rows from sequence ${missing} on, but its head is at sequence ${headSequence}`,
      };
    }
    if (last.sequence < headSequence) {
      return {
        sequence: last.sequence + 1,
        id: null,
        problem: 'truncated',
        detail: `the chain ends at row ${last.id} (sequence ${last.sequence}) but its head is at sequence ${headSequence}: the rows after it are missing`,
      };
    }
    if (last.sequence > headSequence) {
      const extra = await rowAt(headSequence + 1);
      return {
        sequence: headSequence + 1,
        id: extra ? String(extra.id) : null,
        problem: 'inserted',
        detail: `the chain goes on past its head (sequence ${headSequence}) to sequence ${last.sequence}: rows were added after it`,
      };
    }
    if (last.hash !== head?.lastHash) {
      return {
        sequence: last.sequence,
        id: String(last.id),
        problem: 'edited',
        detail: `row ${last.id} (sequence ${last.sequence}) does not match the hash the head recorded for it`,
      };
    }
    return undefined;
  }
}
