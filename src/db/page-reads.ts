import { sql } from 'drizzle-orm';
import { isDatabaseUnavailable, type DataAccess, type Executor } from './client.js';

/** Where a list page was read, and why (the `list_page_reads_total` labels). */
export type PageTarget = 'replica' | 'primary';
export type PageReason =
  /** The replica had replayed the primary's watermark: the page read there. */
  | 'replayed'
  /** No replica configured. */
  | 'no_replica'
  /** The replica had not replayed the watermark yet (or is not a standby: no replay position). */
  | 'lagging'
  /** The replica failed (refused, timed out, cancelled by a recovery conflict): the page read the primary. */
  | 'replica_error'
  /** The replica failed recently and is left alone until its retry time. */
  | 'replica_down';

export type PageReads = {
  /**
   * Runs `read` (the statements of one list page) on the replica when it has replayed everything
   * the primary had committed when this call began, else on the primary. `read` gets the executor to
   * run all of its statements on, and must write nothing. Call it after anything the page's
   * exactness waits for on the primary (the drain of migration 0009): see docs/decisions.md, "Read
   * replicas, exact".
   */
  read<T>(read: (executor: Executor) => Promise<T>): Promise<T>;
};

export type PageReadsOptions = {
  primary: DataAccess;
  replica?: DataAccess;
  /**
   * Compare the replica's replay position with the primary's watermark before reading there. Only
   * tests turn it off (the negative control that shows what it prevents).
   */
  exact?: boolean;
  /** How long a replica that failed is left alone before a page tries it again. */
  retryAfterMs?: number;
  /** Told where each page read, for metrics. */
  observe?: (target: PageTarget, reason: PageReason) => void;
  now?: () => number;
};

const REPLICA_RETRY_AFTER_MS = 5_000;

/** Returned by the replica's transaction when it is behind: the page then reads the primary. */
const BEHIND = Symbol('replica behind');

export function createPageReads(options: PageReadsOptions): PageReads {
  const { primary, replica } = options;
  const exact = options.exact ?? true;
  const retryAfterMs = options.retryAfterMs ?? REPLICA_RETRY_AFTER_MS;
  const now = options.now ?? Date.now;
  const observe = options.observe ?? (() => {});
  let downUntil = 0;

  const onPrimary = async <T>(read: (executor: Executor) => Promise<T>, reason: PageReason): Promise<T> => {
    const result = await read(primary.db);
    observe('primary', reason);
    return result;
  };

  return {
    async read<T>(read: (executor: Executor) => Promise<T>): Promise<T> {
      if (!replica) return onPrimary(read, 'no_replica');
      if (now() < downUntil) return onPrimary(read, 'replica_down');
      // The end of every WAL record the primary has inserted so far, committed or not: every
      // commit visible to a statement that ended before this one (the drain) is inside it. The
      // insert position, not pg_current_wal_lsn(): an asynchronous commit's record may not be
      // written yet, and a replica reaching it has replayed it all the same.
      const watermark = exact ? await primary.db.execute<{ lsn: string }>(sql`SELECT pg_current_wal_insert_lsn()::text AS lsn`) : undefined;
      let outcome: T | typeof BEHIND;
      try {
        // READ COMMITTED: each statement takes a new snapshot, so the page's statements see
        // everything replayed when the replay position was read, on this same connection.
        outcome = await replica.transaction<T | typeof BEHIND>(
          async (tx) => {
            if (watermark) {
              // NULL (not in recovery: not a standby of this primary) counts as behind.
              const [row] = (
                await tx.execute<{ replayed: boolean | null }>(
                  sql`SELECT pg_last_wal_replay_lsn() >= ${watermark.rows[0]!.lsn}::pg_lsn AS replayed`,
                )
              ).rows;
              if (row?.replayed !== true) return BEHIND;
            }
            return read(tx);
          },
          { isolationLevel: 'read committed', accessMode: 'read only' },
        );
      } catch (error) {
        // Whatever failed on the replica, the primary answers this page; only an unreachable replica
        // is left alone for a while, a single failed statement (a recovery conflict) is not.
        if (isDatabaseUnavailable(error)) downUntil = now() + retryAfterMs;
        return onPrimary(read, 'replica_error');
      }
      if (outcome === BEHIND) return onPrimary(read, 'lagging');
      observe('replica', 'replayed');
      return outcome;
    },
  };
}
