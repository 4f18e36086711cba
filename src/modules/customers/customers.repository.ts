import { and, asc, eq, getTableColumns, gt, inArray, is, Param, sql, SQL } from 'drizzle-orm';
import { boundAsGiven, builtOnce, rowMapper, type BuiltOnce } from '../../db/built-once.js';
import type { Executor } from '../../db/client.js';
import { customers, type CustomerRow, type NewCustomerRow } from '../../db/schema.js';
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

const toCustomerRow = rowMapper(customers);
const customerColumns = getTableColumns(customers);
/** Distinct column sets an UPDATE is built once for; others are built per call (never seen in practice). */
const MAX_UPDATE_SHAPES = 200;

function filterConditions(orgId: string, filters: ListFilters): SQL[] {
  const conditions: SQL[] = [eq(customers.orgId, orgId), eq(customers.kind, filters.kind)];
  if (filters.kycStatus) conditions.push(eq(customers.kycStatus, filters.kycStatus));
  if (filters.amlStatus) conditions.push(eq(customers.amlStatus, filters.amlStatus));
  if (filters.updatedSince) conditions.push(gt(customers.updatedAt, filters.updatedSince));
  if (filters.externalId) conditions.push(eq(customers.externalId, filters.externalId));
  if (filters.type) conditions.push(eq(customers.type, filters.type));
  return conditions;
}

export function createCustomersRepository(db: Executor) {
  const placeholder = {
    orgId: sql.placeholder('orgId'),
    kind: sql.placeholder('kind'),
    ref: sql.placeholder('ref'),
  };
  /** A select of whole customer rows, built once; `FOR UPDATE` for the write paths' locking reads. */
  const select = (prefix: string, where: SQL, lock?: 'for update') =>
    builtOnce(prefix, () => {
      const query = db.select().from(customers).where(where);
      return lock ? query.for('update') : query;
    });
  const byKindAndId = and(eq(customers.orgId, placeholder.orgId), eq(customers.kind, placeholder.kind), eq(customers.id, placeholder.ref))!;
  const byKindAndExternalId = and(eq(customers.orgId, placeholder.orgId), eq(customers.kind, placeholder.kind), eq(customers.externalId, placeholder.ref))!;
  const byExternalIdOnly = and(eq(customers.orgId, placeholder.orgId), eq(customers.externalId, placeholder.ref))!;
  // The hot paths (GET by id, the upsert's match, PATCH and PUT): named prepared statements, built
  // once, planned once per connection, run on the pool or in the caller's transaction.
  const lookupsWith = (lock?: 'for update') => ({
    byId: select(lock ? 'customers_find_by_id_for_update' : 'customers_find_by_id', byKindAndId, lock),
    byExternalRef: select(lock ? 'customers_find_by_external_ref_for_update' : 'customers_find_by_external_ref', byKindAndExternalId, lock),
    byExternalId: select(lock ? 'customers_by_external_id_for_update' : 'customers_by_external_id', byExternalIdOnly, lock),
  });
  const lookups = { read: lookupsWith(), lock: lookupsWith('for update') };
  /** Migration 0009: the database clock once every change of the organisation stamped before it has committed, in epoch ms. */
  const drained = builtOnce('customers_changes_drained', () => sql`SELECT floor(extract(epoch FROM customers_changes_drained(${placeholder.orgId})) * 1000)::bigint`);
  const updates = new Map<string, BuiltOnce>();
  /** What an UPDATE returns: the whole row, or only the updated_at the database stamps itself. */
  type Returned = 'row' | 'stamp';

  /**
   * The UPDATE of exactly these columns of record `id`, built once per column set, with its bound
   * values (undefined: build it per call, with updatePerCall).
   */
  function updateOf(
    orgId: string,
    id: string,
    values: Partial<NewCustomerRow>,
    returned: Returned,
  ): { statement: BuiltOnce; bound: Record<string, unknown> } | undefined {
    const keys = Object.keys(values).filter((key) => values[key as keyof NewCustomerRow] !== undefined).sort();
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
      statement = builtOnce('customers_update', () => {
        const update = db
          .update(customers)
          .set(Object.fromEntries(keys.map((key) => [key, boundAsGiven(key)])))
          .where(and(eq(customers.orgId, sql.placeholder('$orgId')), eq(customers.id, sql.placeholder('$id'))));
        return returned === 'row' ? update.returning() : update.returning({ updatedAt: customers.updatedAt });
      });
      updates.set(shape, statement);
    }
    return { statement, bound };
  }

  const updatePerCall = (tx: Executor, orgId: string, id: string, values: Partial<NewCustomerRow>) =>
    tx.update(customers).set(values).where(and(eq(customers.orgId, orgId), eq(customers.id, id)));

  async function firstOf(statement: BuiltOnce, tx: Executor, values: Record<string, unknown>): Promise<CustomerRow | undefined> {
    const { rows } = await statement.run(tx, values);
    return rows[0] ? toCustomerRow(rows[0]) : undefined;
  }

  async function first(query: Promise<CustomerRow[]>): Promise<CustomerRow | undefined> {
    const [row] = await query;
    return row;
  }

  return {
    async findById(orgId: string, id: string, tx: Executor = db, lock: LockOption = {}): Promise<CustomerRow | undefined> {
      if (!isUuid(id)) return undefined;
      const query = tx.select().from(customers).where(and(eq(customers.orgId, orgId), eq(customers.id, id)));
      return first(lock.forUpdate ? query.for('update') : query);
    },

    /**
     * A path `{id}`: the service's UUID or the caller's external_id, detected by format. A
     * UUID-shaped value that is not an id is still tried as an external_id. Two primary-key or
     * unique-index lookups at most (one `id = … OR external_id = …` filter would scan the organisation).
     */
    async findByRef(orgId: string, kind: CustomerKind, ref: string, tx: Executor = db, lock: LockOption = {}): Promise<CustomerRow | undefined> {
      const lookup = lock.forUpdate ? lookups.lock : lookups.read;
      const byId = isUuid(ref) ? await firstOf(lookup.byId, tx, { orgId, kind, ref }) : undefined;
      return byId ?? firstOf(lookup.byExternalRef, tx, { orgId, kind, ref });
    },

    async findByExternalId(orgId: string, externalId: string, tx: Executor = db, lock: LockOption = {}): Promise<CustomerRow | undefined> {
      return firstOf((lock.forUpdate ? lookups.lock : lookups.read).byExternalId, tx, { orgId, ref: externalId });
    },

    /** Case-insensitive full name + email among individuals (the unique index's expression). */
    async findIndividualByNameAndEmail(orgId: string, name: string, email: string, tx: Executor = db, lock: LockOption = {}) {
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
    async insertIfAbsent(values: NewCustomerRow, tx: Executor = db): Promise<CustomerRow | undefined> {
      const [row] = await tx.insert(customers).values(values).onConflictDoNothing().returning();
      return row;
    },

    async update(orgId: string, id: string, values: Partial<NewCustomerRow>, tx: Executor = db): Promise<CustomerRow> {
      const built = updateOf(orgId, id, values, 'row');
      if (built) return (await firstOf(built.statement, tx, built.bound))!;
      const [row] = await updatePerCall(tx, orgId, id, values).returning();
      return row!;
    },

    /**
     * Writes `values` to a record the caller read `FOR UPDATE` in this transaction, and returns only
     * the updated_at the database stamped (undefined: no such record). The rest of the row is what the
     * caller read with these values, since the stamp trigger is the only writer besides the caller;
     * reading back all 45 columns cost the upsert ~6% of its throughput (bench/README.md).
     */
    async updateLocked(orgId: string, id: string, values: Partial<NewCustomerRow>, tx: Executor = db): Promise<{ updatedAt: Date } | undefined> {
      const built = updateOf(orgId, id, values, 'stamp');
      if (built) {
        const { rows } = await built.statement.run(tx, built.bound);
        const stamp = rows[0]?.[0];
        return stamp === undefined ? undefined : { updatedAt: customers.updatedAt.mapFromDriverValue(stamp as string) as Date };
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
      const { rows } = await drained.run(db, { orgId });
      return new Date(Number(rows[0]![0]));
    },

    async list(orgId: string, filters: ListFilters, limit: number, tx: Executor = db): Promise<CustomerRow[]> {
      const conditions = filterConditions(orgId, filters);
      if (filters.after) {
        conditions.push(sql`(${customers.createdAt}, ${customers.id}) > (${filters.after.createdAt.toISOString()}::timestamptz, ${filters.after.id}::uuid)`);
      }
      return tx
        .select()
        .from(customers)
        .where(and(...conditions))
        .orderBy(asc(customers.createdAt), asc(customers.id))
        .limit(limit);
    },

    async count(orgId: string, filters: ListFilters, tx: Executor = db): Promise<number> {
      const [row] = await tx
        .select({ count: sql<number>`count(*)::int` })
        .from(customers)
        .where(and(...filterConditions(orgId, { ...filters, after: undefined })));
      return row?.count ?? 0;
    },

    async findManyByIds(orgId: string, ids: string[], tx: Executor = db): Promise<CustomerRow[]> {
      if (ids.length === 0) return [];
      return tx
        .select()
        .from(customers)
        .where(and(eq(customers.orgId, orgId), inArray(customers.id, ids)));
    },
  };
}
export type CustomersRepository = ReturnType<typeof createCustomersRepository>;
