import { createHash } from 'node:crypto';
import { and, asc, eq, getTableColumns, gt, inArray, is, lte, Param, sql, SQL } from 'drizzle-orm';
import { unionAll } from 'drizzle-orm/pg-core';
import { prepared, type Executor } from '../../db/client.js';
import { customerCounts, customers, LATE_CHANGE, type CustomerRow, type NewCustomerRow } from '../../db/schema.js';
import { EARLIEST_INSTANT } from '../../shared/dates.schema.js';
import { isUuid } from '../../shared/ids.js';

export type CustomerKind = 'individual' | 'entity';

export type ListFilters = {
  kind: CustomerKind;
  kycStatus?: string;
  amlStatus?: string;
  updatedSince?: Date;
  externalId?: string;
  type?: string;
  after?: { createdAt: Date; id: string };
};

type LockOption = { forUpdate?: boolean };

const customerColumns = getTableColumns(customers);
/** Distinct column sets an UPDATE is prepared for; others are built per call (never seen in practice). */
const MAX_UPDATE_SHAPES = 200;

/** The filters other than updated_since: each is an equality on a column of every list index. */
function equalityConditions(orgId: string, filters: ListFilters): SQL[] {
  const conditions: SQL[] = [eq(customers.orgId, orgId), eq(customers.kind, filters.kind)];
  if (filters.kycStatus) conditions.push(eq(customers.kycStatus, filters.kycStatus));
  if (filters.amlStatus) conditions.push(eq(customers.amlStatus, filters.amlStatus));
  if (filters.externalId) conditions.push(eq(customers.externalId, filters.externalId));
  if (filters.type) conditions.push(eq(customers.type, filters.type));
  return conditions;
}

type Position = { createdAt: Date; id: string };
/** The greatest id: a part starting after (t, MAX_ID) starts after every row created at t. */
const MAX_ID = 'ffffffff-ffff-ffff-ffff-ffffffffffff';
/** A row-order comparison an index range can start at. */
const after = (position: Position): SQL =>
  sql`(${customers.createdAt}, ${customers.id}) > (${position.createdAt.toISOString()}::timestamptz, ${position.id}::uuid)`;
const later = (a: Position, b: Position): Position =>
  a.createdAt.getTime() !== b.createdAt.getTime() ? (a.createdAt > b.createdAt ? a : b) : a.id > b.id ? a : b;

/** How far back a row that is not "late" (LATE_CHANGE) can have been created and still be changed after `since`. */
const LATE_AFTER_MS = 1000;

/**
 * The rows changed after `since`, as three disjoint parts that each have an index yielding them in
 * (created_at, id) order (docs/decisions.md, "Lists at a million records"):
 *  - created after `since` (so changed after it too): a range of the list or a filter's index;
 *  - created in the second up to `since` and changed after it: a range of the same index;
 *  - created earlier and changed after `since`: such a row changed more than a second after its
 *    creation, so it is in the partial "late" indexes, by creation or by change time.
 * A row created more than a second before `since` and not late changed at most a second after its
 * creation, so by `since`: no row is missed, whatever the clocks did. Each part keeps
 * `updated_at > since`, so none depends on updated_at >= created_at.
 *
 * Each part has one lower bound, the later of the cursor and the part's own start: a B-tree cannot
 * combine a row comparison with a scalar bound on created_at, and would start at the cursor and filter
 * its way up to the part.
 */
function changedSinceParts(since: Date, cursor: Position | undefined): SQL[] {
  const changed = gt(customers.updatedAt, since);
  const justBefore = new Date(since.getTime() - LATE_AFTER_MS);
  // The part's own start as a scalar bound when the cursor lies before it: the planner estimates a
  // scalar range from its histogram, a row comparison only with a fixed guess.
  const startingAfter = (start: Position | undefined) => {
    if (start && (!cursor || later(start, cursor) === start)) return gt(customers.createdAt, start.createdAt);
    return cursor ? after(cursor) : undefined;
  };
  return [
    and(startingAfter({ createdAt: since, id: MAX_ID }), changed)!,
    and(startingAfter({ createdAt: justBefore, id: MAX_ID }), lte(customers.createdAt, since), changed)!,
    and(startingAfter(undefined), lte(customers.createdAt, justBefore), LATE_CHANGE, changed)!,
  ];
}

/**
 * Whether updated_since leaves room for the parts: within the first second of year 1 the second
 * before it is not a time PostgreSQL takes, and every row was changed after it anyway, so the
 * list index read in order with `updated_at` checked in it answers as fast.
 */
const hasPartsBefore = (since: Date) => since.getTime() - LATE_AFTER_MS >= EARLIEST_INSTANT.getTime();

/** Counted up to this many rows before the other side of `created_at = since` is counted instead. */
const COUNT_PROBE = 1_000;

export function createCustomersRepository(db: Executor) {
  const placeholder = {
    orgId: sql.placeholder('orgId'),
    kind: sql.placeholder('kind'),
    ref: sql.placeholder('ref'),
  };
  type LookupValues = { orgId: string; kind?: CustomerKind; ref: string };
  /** A select of whole customer rows as a Drizzle prepared query; `FOR UPDATE` for the write paths' locking reads. */
  const select = (name: string, where: SQL, lock?: 'for update') =>
    prepared<LookupValues, CustomerRow[]>(name, (executor, statement) => {
      const query = executor.select().from(customers).where(where);
      return (lock ? query.for('update') : query).prepare(statement);
    });
  const byKindAndId = and(eq(customers.orgId, placeholder.orgId), eq(customers.kind, placeholder.kind), eq(customers.id, placeholder.ref))!;
  const byKindAndExternalId = and(
    eq(customers.orgId, placeholder.orgId),
    eq(customers.kind, placeholder.kind),
    eq(customers.externalId, placeholder.ref),
  )!;
  const byExternalIdOnly = and(eq(customers.orgId, placeholder.orgId), eq(customers.externalId, placeholder.ref))!;
  // The hot paths (GET by id, the upsert's match, PATCH and PUT): named prepared statements, built
  // once per connection, planned once per connection, run on the pool or in the caller's transaction.
  const lookupsWith = (lock?: 'for update') => ({
    byId: select(lock ? 'customers_find_by_id_for_update' : 'customers_find_by_id', byKindAndId, lock),
    byExternalRef: select(lock ? 'customers_find_by_external_ref_for_update' : 'customers_find_by_external_ref', byKindAndExternalId, lock),
    byExternalId: select(lock ? 'customers_by_external_id_for_update' : 'customers_by_external_id', byExternalIdOnly, lock),
  });
  const lookups = { read: lookupsWith(), lock: lookupsWith('for update') };
  type Update = (executor: Executor, values: Record<string, unknown>) => Promise<Array<Partial<CustomerRow>>>;
  const updates = new Map<string, Update>();
  /** What an UPDATE returns: the whole row, or only the updated_at the database stamps itself. */
  type Returned = 'row' | 'stamp';

  /**
   * The UPDATE of exactly these columns of record `id`, prepared once per column set, with its bound
   * values (undefined: build it per call, with updatePerCall).
   */
  function updateOf(
    orgId: string,
    id: string,
    values: Partial<NewCustomerRow>,
    returned: Returned,
  ): { statement: Update; bound: Record<string, unknown> } | undefined {
    const keys = Object.keys(values)
      .filter((key) => values[key as keyof NewCustomerRow] !== undefined)
      .sort();
    const bound: Record<string, unknown> = { $orgId: orgId, $id: id };
    for (const key of keys) {
      const value = values[key as keyof NewCustomerRow];
      if (is(value, SQL) || is(value, Param)) return undefined;
      // Encoded here, as Drizzle encodes a value it binds itself: a null stays SQL NULL (not jsonb 'null').
      bound[key] = value === null ? null : customerColumns[key as keyof typeof customerColumns].mapToDriverValue(value);
    }
    const shape = `${returned}:${keys.join(',')}`;
    let statement = updates.get(shape);
    if (!statement) {
      if (updates.size >= MAX_UPDATE_SHAPES) return undefined;
      // Named after its column set: every repository instance gives one set the same name and text.
      const name = `customers_update_${createHash('sha256').update(shape).digest('hex').slice(0, 12)}`;
      statement = prepared(name, (executor, statementName) => {
        const update = executor
          .update(customers)
          // A placeholder inside SQL is bound as given (in a column's place it would be encoded by the column, a null as jsonb 'null').
          .set(Object.fromEntries(keys.map((key) => [key, sql`${sql.placeholder(key)}`])))
          .where(and(eq(customers.orgId, sql.placeholder('$orgId')), eq(customers.id, sql.placeholder('$id'))));
        return (returned === 'row' ? update.returning() : update.returning({ updatedAt: customers.updatedAt })).prepare(statementName);
      });
      updates.set(shape, statement);
    }
    return { statement, bound };
  }

  const updatePerCall = (tx: Executor, orgId: string, id: string, values: Partial<NewCustomerRow>) =>
    tx
      .update(customers)
      .set(values)
      .where(and(eq(customers.orgId, orgId), eq(customers.id, id)));

  async function first(query: Promise<CustomerRow[]>): Promise<CustomerRow | undefined> {
    const [row] = await query;
    return row;
  }

  return {
    async findById(orgId: string, id: string, tx: Executor, lock: LockOption = {}): Promise<CustomerRow | undefined> {
      if (!isUuid(id)) return undefined;
      const query = tx
        .select()
        .from(customers)
        .where(and(eq(customers.orgId, orgId), eq(customers.id, id)));
      return first(lock.forUpdate ? query.for('update') : query);
    },

    /**
     * A path `{id}`: the service's UUID or the caller's external_id, detected by format. A
     * UUID-shaped value that is not an id is still tried as an external_id. Two primary-key or
     * unique-index lookups at most (one `id = … OR external_id = …` filter would scan the organisation).
     */
    async findByRef(orgId: string, kind: CustomerKind, ref: string, tx: Executor, lock: LockOption = {}): Promise<CustomerRow | undefined> {
      const lookup = lock.forUpdate ? lookups.lock : lookups.read;
      const byId = isUuid(ref) ? (await lookup.byId(tx, { orgId, kind, ref }))[0] : undefined;
      return byId ?? (await lookup.byExternalRef(tx, { orgId, kind, ref }))[0];
    },

    async findByExternalId(orgId: string, externalId: string, tx: Executor, lock: LockOption = {}): Promise<CustomerRow | undefined> {
      return (await (lock.forUpdate ? lookups.lock : lookups.read).byExternalId(tx, { orgId, ref: externalId }))[0];
    },

    /** Case-insensitive full name + email among individuals (the unique index's expression). */
    async findIndividualByNameAndEmail(orgId: string, name: string, email: string, tx: Executor, lock: LockOption = {}) {
      const query = tx
        .select()
        .from(customers)
        .where(
          and(
            eq(customers.orgId, orgId),
            eq(customers.kind, 'individual'),
            sql`lower(${customers.email}) = lower(${email})`,
            sql`lower(${customers.name}) = lower(${name})`,
            sql`${customers.email} IS NOT NULL`,
          ),
        );
      return first(lock.forUpdate ? query.for('update') : query);
    },

    /** Inserts unless any unique key (external_id, name+email, ABN, ACN, name+type) is taken. */
    async insertIfAbsent(values: NewCustomerRow, tx: Executor): Promise<CustomerRow | undefined> {
      const [row] = await tx.insert(customers).values(values).onConflictDoNothing().returning();
      return row;
    },

    async update(orgId: string, id: string, values: Partial<NewCustomerRow>, tx: Executor): Promise<CustomerRow> {
      const built = updateOf(orgId, id, values, 'row');
      if (built) return (await built.statement(tx, built.bound))[0] as CustomerRow;
      const [row] = await updatePerCall(tx, orgId, id, values).returning();
      return row!;
    },

    /**
     * Writes `values` to a record the caller read `FOR UPDATE` in this transaction, and returns only
     * the updated_at the database stamped (undefined: no such record). The rest of the row is what the
     * caller read with these values, since the stamp trigger is the only writer besides the caller;
     * reading back every column would cost the upsert measurably (bench/README.md).
     */
    async updateLocked(orgId: string, id: string, values: Partial<NewCustomerRow>, tx: Executor): Promise<{ updatedAt: Date } | undefined> {
      const built = updateOf(orgId, id, values, 'stamp');
      if (built) {
        const [row] = await built.statement(tx, built.bound);
        return row ? { updatedAt: row.updatedAt! } : undefined;
      }
      const [row] = await updatePerCall(tx, orgId, id, values).returning({ updatedAt: customers.updatedAt });
      return row;
    },

    /**
     * Run before the first page of every list walk (a poll's first statement): returns a time, to the millisecond
     * (rounded down), such that every change of the organisation's customers stamped before it has
     * committed or rolled back; it waits for the writers still in flight (migration 0009), never
     * holding up new ones. A change that a statement started afterwards cannot see has a later
     * updated_at. Always a statement of its own on the pool, never in a caller's transaction: a
     * REPEATABLE READ snapshot taken earlier would miss the changes waited for. Each wait is bounded
     * by lock_timeout (55P03). On a standby it cannot see the primary's writers: polls read the primary.
     */
    async drainChanges(orgId: string): Promise<Date> {
      const { rows } = await db.execute<{ drained: number }>(
        sql`SELECT floor(extract(epoch FROM customers_changes_drained(${orgId})) * 1000)::bigint AS drained`,
      );
      return new Date(Number(rows[0]!.drained));
    },

    /**
     * One page in (created_at, id) order. Without updated_since, one index range (the list index, or
     * the status, AML or entity type index) in that order; the planner picks it per call (unnamed
     * statements, planned with their values: a generic plan could not tell a status a handful of
     * rows hold from one half of them hold). With updated_since, the page's ids come from the three parts
     * of changedSinceParts, each its own index-only range, merged, and only the page's rows are read.
     */
    async list(orgId: string, filters: ListFilters, limit: number, tx: Executor): Promise<CustomerRow[]> {
      const conditions = equalityConditions(orgId, filters);
      const order = [asc(customers.createdAt), asc(customers.id)];
      if (!filters.updatedSince || filters.externalId || !hasPartsBefore(filters.updatedSince)) {
        if (filters.after) conditions.push(after(filters.after));
        if (filters.updatedSince) conditions.push(gt(customers.updatedAt, filters.updatedSince));
        return tx
          .select()
          .from(customers)
          .where(and(...conditions))
          .orderBy(...order)
          .limit(limit);
      }
      const [createdAfter, createdJustBefore, changedLate] = changedSinceParts(filters.updatedSince, filters.after).map((part) =>
        tx
          .select({ createdAt: customers.createdAt, id: customers.id })
          .from(customers)
          .where(and(...conditions, part))
          .orderBy(...order)
          .limit(limit),
      );
      const page = unionAll(createdAfter!, createdJustBefore!, changedLate!)
        .orderBy(asc(sql`created_at`), asc(sql`id`))
        .limit(limit)
        .as('page');
      return tx
        .select(customerColumns)
        .from(customers)
        .innerJoin(page, and(eq(customers.orgId, orgId), eq(customers.id, page.id)))
        .orderBy(asc(page.createdAt), asc(page.id));
    },

    /**
     * `include=total_count`. Without updated_since (or with external_id, one row at most), the sum of
     * the counters that migration 0011 keeps per status (customer_counts): a fixed number of rows
     * whatever the organisation's size. With updated_since, rows are counted in the parts of
     * changedSinceParts; those created after `since` by whichever side of `since` is the smaller
     * (the counters give the whole), so the cost is bounded by the rows changed since `since` and by
     * the rows created before it, never by the organisation's size alone (docs/decisions.md).
     */
    async count(orgId: string, filters: ListFilters, tx: Executor): Promise<number> {
      const equality = equalityConditions(orgId, filters);
      if (filters.externalId) {
        const [row] = await tx
          .select({ count: sql<number>`count(*)::int` })
          .from(customers)
          .where(and(...equality, filters.updatedSince ? gt(customers.updatedAt, filters.updatedSince) : undefined));
        return row?.count ?? 0;
      }
      const total = async () => {
        const counted = [eq(customerCounts.orgId, orgId), eq(customerCounts.kind, filters.kind)];
        if (filters.kycStatus) counted.push(eq(customerCounts.kycStatus, filters.kycStatus));
        if (filters.amlStatus) counted.push(eq(customerCounts.amlStatus, filters.amlStatus));
        if (filters.type) counted.push(eq(customerCounts.type, filters.type));
        const [row] = await tx
          .select({ count: sql<number>`coalesce(sum(${customerCounts.records}), 0)::bigint` })
          .from(customerCounts)
          .where(and(...counted));
        return Number(row?.count ?? 0);
      };
      if (!filters.updatedSince) return total();
      const countOf = async (where: SQL, cap?: number) => {
        const rows = tx
          .select({ one: sql`1` })
          .from(customers)
          .where(and(...equality, where));
        const [row] = await tx
          .select({ count: sql<number>`count(*)::int` })
          .from((cap === undefined ? rows : rows.limit(cap)).as('counted'));
        return row?.count ?? 0;
      };
      const since = filters.updatedSince;
      if (!hasPartsBefore(since)) {
        // Every row created after `since` was changed after it: the whole less the few created by then and not changed since.
        return (await total()) - (await countOf(and(lte(customers.createdAt, since), lte(customers.updatedAt, since))!));
      }
      const [createdAfter, ...earlier] = changedSinceParts(since, undefined);
      let count = 0;
      for (const part of earlier) count += await countOf(part);
      // Rows created after `since` were changed after it too (updated_at >= created_at, migration
      // 0009's stamp): counted directly, or as the whole (the counters) less those created up to `since`,
      // whichever side the probes find small; when both are large, directly.
      const createdUpTo = lte(customers.createdAt, since);
      const probed = await countOf(createdAfter!, COUNT_PROBE);
      if (probed < COUNT_PROBE) return count + probed;
      const before = await countOf(createdUpTo, COUNT_PROBE);
      if (before < COUNT_PROBE) return count + (await total()) - before;
      return count + (await countOf(createdAfter!));
    },

    async findManyByIds(orgId: string, ids: string[], tx: Executor): Promise<CustomerRow[]> {
      if (ids.length === 0) return [];
      return tx
        .select()
        .from(customers)
        .where(and(eq(customers.orgId, orgId), inArray(customers.id, ids)));
    },
  };
}
export type CustomersRepository = ReturnType<typeof createCustomersRepository>;
