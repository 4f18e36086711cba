import { and, asc, eq, gt, inArray, sql, type SQL } from 'drizzle-orm';
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
  const once = <T>(build: () => T) => {
    let built: T | undefined;
    return () => (built ??= build());
  };
  const prepared = {
    byId: once(() =>
      db
        .select()
        .from(customers)
        .where(and(eq(customers.orgId, placeholder.orgId), eq(customers.kind, placeholder.kind), eq(customers.id, placeholder.ref)))
        .prepare('customers_find_by_id'),
    ),
    byExternalRef: once(() =>
      db
        .select()
        .from(customers)
        .where(and(eq(customers.orgId, placeholder.orgId), eq(customers.kind, placeholder.kind), eq(customers.externalId, placeholder.ref)))
        .prepare('customers_find_by_external_ref'),
    ),
  };

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
      if (tx === db && !lock.forUpdate) {
        // The hot read path (GET by id): named prepared statements, built once, planned once per connection.
        const [byId] = isUuid(ref) ? await prepared.byId().execute({ orgId, kind, ref }) : [];
        if (byId) return byId;
        const [byExternalId] = await prepared.byExternalRef().execute({ orgId, kind, ref });
        return byExternalId;
      }
      const lookup = (match: SQL) => {
        const query = tx.select().from(customers).where(and(eq(customers.orgId, orgId), eq(customers.kind, kind), match));
        return first(lock.forUpdate ? query.for('update') : query);
      };
      return (isUuid(ref) ? await lookup(eq(customers.id, ref)) : undefined) ?? lookup(eq(customers.externalId, ref));
    },

    async findByExternalId(orgId: string, externalId: string, tx: Executor = db, lock: LockOption = {}): Promise<CustomerRow | undefined> {
      const query = tx.select().from(customers).where(and(eq(customers.orgId, orgId), eq(customers.externalId, externalId)));
      return first(lock.forUpdate ? query.for('update') : query);
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
      const [row] = await tx
        .update(customers)
        .set(values)
        .where(and(eq(customers.orgId, orgId), eq(customers.id, id)))
        .returning();
      return row!;
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
