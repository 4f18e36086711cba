import { createHash } from 'node:crypto';
import { and, asc, eq, getTableColumns, gt, inArray, is, lte, Param, sql, SQL, type Subquery } from 'drizzle-orm';
import { unionAll } from 'drizzle-orm/pg-core';
import { prepared, type Executor } from '../../db/client.js';
import { customerCounts, customers, LATE_CHANGE, type CustomerRow, type NewCustomerRow } from '../../db/schema.js';
import { EARLIEST_INSTANT } from '../../shared/dates.schema.js';
import { isUuid } from '../../shared/ids.js';
import { REVIEW_STATUSES, type ReviewStatus } from './review-model.js';

/** The customers table's columns by property name: statements built by hand name and encode values with them. */
const customerColumns = getTableColumns(customers);
const customerColumnEntries = Object.entries(customerColumns);

/** A customers row as a raw statement returns it (column names, driver values), as the query builder maps it. */
function toCustomerRow(raw: Record<string, unknown>): CustomerRow {
  const row: Record<string, unknown> = {};
  for (const [key, column] of customerColumnEntries) {
    const value = raw[column.name];
    row[key] = value === null || value === undefined ? null : column.mapFromDriverValue(value);
  }
  return row as CustomerRow;
}

/**
 * Customers rows (or changes) grouped by the columns they set, each group with those columns' names
 * and its rows as a JSON document for jsonb_populate_recordset (a column it leaves out is not in the
 * group's statement). `extra` adds fields of a row's own to its document entry.
 */
function groupsBySetColumns<T>(
  items: T[],
  valuesOf: (item: T) => Partial<NewCustomerRow>,
  extra: (item: T) => Record<string, unknown> = () => ({}),
): Array<{ names: string[]; document: Array<Record<string, unknown>> }> {
  const groups = new Map<string, T[]>();
  for (const item of items) {
    const values = valuesOf(item);
    const signature = (Object.keys(values) as Array<keyof NewCustomerRow>)
      .filter((key) => values[key] !== undefined)
      .sort()
      .join(',');
    const group = groups.get(signature);
    if (group) group.push(item);
    else groups.set(signature, [item]);
  }
  return [...groups].map(([signature, group]) => {
    const keys = signature.split(',').filter((key) => key !== '') as Array<keyof NewCustomerRow>;
    const names = keys.map((key) => customerColumns[key].name);
    const document = group.map((item) => {
      const values = valuesOf(item);
      const record: Record<string, unknown> = extra(item);
      keys.forEach((key, index) => {
        const value = values[key];
        record[names[index]!] = value instanceof Date ? value.toISOString() : value;
      });
      return record;
    });
    return { names, document };
  });
}

export type CustomerKind = 'individual' | 'entity';

export type ListFilters = {
  kind: CustomerKind;
  kycStatus?: string;
  amlStatus?: string;
  updatedSince?: Date;
  externalId?: string;
  type?: string;
  /** review_status is any of these. */
  reviewStatuses?: readonly ReviewStatus[];
  /** next_review_at is before this instant (a record without a date never matches). */
  reviewDueBefore?: Date;
  eddRequired?: boolean;
  after?: { createdAt: Date; id: string };
};

type LockOption = { forUpdate?: boolean };
/** What a list read learnt of its whole filtered set besides the page: its exact size, when it counted it. */
export type KnownCount = { total?: number };

/** Distinct column sets an UPDATE is prepared for; others are built per call (never seen in practice). */
const MAX_UPDATE_SHAPES = 200;

/**
 * The equality filters other than review_status (reviewStatusCondition): each has an index that
 * yields its rows in list order (edd_required=true: the partial customers_edd_list_idx), or is a
 * column of every list index.
 */
function equalityConditions(orgId: string, filters: ListFilters): SQL[] {
  const conditions: SQL[] = [eq(customers.orgId, orgId), eq(customers.kind, filters.kind)];
  if (filters.kycStatus) conditions.push(eq(customers.kycStatus, filters.kycStatus));
  if (filters.amlStatus) conditions.push(eq(customers.amlStatus, filters.amlStatus));
  if (filters.externalId) conditions.push(eq(customers.externalId, filters.externalId));
  if (filters.type) conditions.push(eq(customers.type, filters.type));
  // As the partial index's predicate itself, so the planner matches it whatever the plan's parameters.
  if (filters.eddRequired !== undefined)
    conditions.push(filters.eddRequired ? sql`${customers.eddRequired}` : sql`NOT ${customers.eddRequired}`);
  return conditions;
}

/**
 * The review statuses a list is narrowed to, without duplicates; undefined when it is not narrowed
 * (none given, or all four: every record has one).
 */
function reviewStatusesOf(filters: ListFilters): ReviewStatus[] | undefined {
  if (!filters.reviewStatuses) return undefined;
  const statuses = [...new Set(filters.reviewStatuses)];
  return REVIEW_STATUSES.every((status) => statuses.includes(status)) ? undefined : statuses;
}

/**
 * review_status as one condition: an equality on customers_review_list_idx for one status; for several,
 * `IN`, which no index yields in list order, so list pages read one part per status (list).
 */
function reviewStatusCondition(statuses: ReviewStatus[] | undefined): SQL | undefined {
  if (!statuses) return undefined;
  return statuses.length === 1 ? eq(customers.reviewStatus, statuses[0]!) : inArray(customers.reviewStatus, statuses);
}

/** review_due_before: a range on next_review_at, which only customers_review_due_idx (by date) and customers_review_list_idx (by status) hold. */
const dueBefore = (before: Date): SQL => sql`${customers.nextReviewAt} < ${before.toISOString()}::timestamptz`;

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

/**
 * review_due_before: up to this many rows dated before it, a page reads them all from
 * customers_review_due_idx (by date) and keeps the first in list order; beyond, it first tries the
 * next DUE_WINDOW rows in list order (listDueBefore). Either costs about √(page × records)
 * index entries where they cost the same (10,000 at a million records); set above that point, so
 * that when it is reached the window holds a page with room to spare.
 */
const DUE_PROBE = 20_000;
/** How many rows in list order a page of review_due_before reads before it reads by date instead. */
const DUE_WINDOW = 20_000;

const listOrder = [asc(customers.createdAt), asc(customers.id)];

/** The first `limit` rows of parts that are each an index range in list order, merged (a Merge Append): their positions. */
function firstInOrder(tx: Executor, parts: SQL[], limit: number) {
  const [first, second, ...rest] = parts.map((part) =>
    tx
      .select({ createdAt: customers.createdAt, id: customers.id })
      .from(customers)
      .where(part)
      .orderBy(...listOrder)
      .limit(limit),
  );
  return unionAll(first!, second!, ...rest)
    .orderBy(asc(sql`created_at`), asc(sql`id`))
    .limit(limit)
    .as('page');
}

/** A subquery named `page` of the positions (created_at, id) of a page's rows. */
type PagePositions = Subquery<'page', Record<string, unknown>>;
/** A column of the page's positions, named in full (a field of a raw subquery would be named bare, and clash with the table's). */
const position = (column: 'created_at' | 'id') => sql`${sql.identifier('page')}.${sql.identifier(column)}`;

/** The rows at a page's positions, in list order: only the page's rows are read from the table. */
function pageRows(tx: Executor, orgId: string, page: PagePositions): Promise<CustomerRow[]> {
  return tx
    .select(customerColumns)
    .from(customers)
    .innerJoin(page, and(eq(customers.orgId, orgId), sql`${customers.id} = ${position('id')}`))
    .orderBy(asc(position('created_at')), asc(position('id')));
}

/**
 * A page of review_due_before. No index yields the rows dated before a time in list order: the due
 * index is in date order and the review list index in date order only within a status. So:
 *  - the rows dated before it (of the statuses asked) are counted first, up to DUE_PROBE + 1, index-only
 *    on customers_review_due_idx;
 *  - up to DUE_PROBE, they are all read from that index and the first after the cursor in list order
 *    kept. The read is fenced (OFFSET 0), so the planner cannot prefer walking a list index in order
 *    and checking each row's date instead, which reads every row after the cursor when the dated rows
 *    are bunched before it (review dates follow creation dates). Without other filters, the count is
 *    the list's total_count too (`known`);
 *  - beyond, the next DUE_WINDOW rows in list order (of the statuses asked, merged from
 *    customers_review_list_idx, dates checked in the index), if that holds a full page; else as above.
 * So a page reads about DUE_PROBE + DUE_WINDOW index entries at most, plus, when the rows dated before
 * the time are many yet sparse in list order, those rows: bounded by the rows that match the date, not
 * by the organisation's size. With filters that customers_review_list_idx does not hold (edd_required,
 * updated_since), a page always reads by date.
 */
async function listDueBefore(
  orgId: string,
  filters: ListFilters,
  before: Date,
  statuses: ReviewStatus[] | undefined,
  limit: number,
  tx: Executor,
  known: KnownCount,
): Promise<CustomerRow[]> {
  const conditions = equalityConditions(orgId, filters);
  const cursor = filters.after ? after(filters.after) : undefined;
  const dated = and(eq(customers.orgId, orgId), eq(customers.kind, filters.kind), reviewStatusCondition(statuses), dueBefore(before))!;
  const [probed] = await tx.select({ count: sql<number>`count(*)::int` }).from(
    tx
      .select({ one: sql`1` })
      .from(customers)
      .where(dated)
      .limit(DUE_PROBE + 1)
      .as('probed'),
  );
  const count = probed?.count ?? 0;
  const onlyDated = !filters.kycStatus && !filters.amlStatus && !filters.type && filters.eddRequired === undefined && !filters.updatedSince;
  if (count <= DUE_PROBE && onlyDated) known.total = count;

  if (count > DUE_PROBE && !filters.updatedSince && filters.eddRequired === undefined) {
    const [first, ...others] = (statuses ?? REVIEW_STATUSES).map((status) =>
      tx
        .select({ createdAt: customers.createdAt, id: customers.id, nextReviewAt: customers.nextReviewAt })
        .from(customers)
        .where(and(...conditions, eq(customers.reviewStatus, status), cursor))
        .orderBy(...listOrder)
        .limit(DUE_WINDOW),
    );
    const scanned = (
      others.length === 0
        ? first!
        : unionAll(first!, others[0]!, ...others.slice(1))
            .orderBy(asc(sql`created_at`), asc(sql`id`))
            .limit(DUE_WINDOW)
    ).as('scanned');
    const page = tx
      .select({ createdAt: scanned.createdAt, id: scanned.id })
      .from(scanned)
      .where(sql`${scanned.nextReviewAt} < ${before.toISOString()}::timestamptz`)
      .orderBy(asc(scanned.createdAt), asc(scanned.id))
      .limit(limit)
      .as('page');
    const rows = await pageRows(tx, orgId, page);
    // A full page within the window is the page: every row before its last one in list order was in the window.
    if (rows.length === limit) return rows;
  }
  const where = and(
    ...conditions,
    reviewStatusCondition(statuses),
    dueBefore(before),
    cursor,
    filters.updatedSince ? gt(customers.updatedAt, filters.updatedSince) : undefined,
  );
  const matched = sql`(SELECT ${customers.createdAt}, ${customers.id} FROM ${customers} WHERE ${where} OFFSET 0) AS matched`;
  const page = tx
    .select({ createdAt: sql<Date>`matched.created_at`.as('created_at'), id: sql<string>`matched.id`.as('id') })
    .from(matched)
    .orderBy(asc(sql`matched.created_at`), asc(sql`matched.id`))
    .limit(limit)
    .as('page');
  return pageRows(tx, orgId, page);
}

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

    /**
     * Inserts each record of `orgId` unless one of its unique keys is taken (as insertIfAbsent); returns
     * those inserted. The rows travel as one JSON document read by jsonb_populate_recordset: a query
     * builder's multi-row VALUES binds every cell as its own parameter, which costs more to build than
     * the insert costs to run. Rows are grouped by the columns they set, so a column a row leaves out
     * takes its default, as in a single insert.
     */
    async insertManyIfAbsent(orgId: string, values: NewCustomerRow[], tx: Executor): Promise<CustomerRow[]> {
      if (values.some((row) => row.orgId !== orgId)) throw new Error('insertManyIfAbsent: every row must be of the organisation given');
      const created: CustomerRow[] = [];
      for (const { names, document } of groupsBySetColumns(values, (row) => row)) {
        const columns = sql.join(
          names.map((name) => sql.identifier(name)),
          sql`, `,
        );
        const { rows: inserted } = await tx.execute<Record<string, unknown>>(sql`
          INSERT INTO ${customers} (${columns})
          SELECT ${columns} FROM jsonb_populate_recordset(NULL::customers, ${JSON.stringify(document)}::jsonb)
          ON CONFLICT DO NOTHING
          RETURNING *`);
        for (const row of inserted) created.push(toCustomerRow(row));
      }
      return created;
    },

    /**
     * Writes each change to its record of `orgId`, already locked by the caller (as updateLocked does
     * one); returns the updated_at the database stamped on each, by id (a record not found is absent).
     * The changes travel as one JSON document, grouped by the columns they set: one statement per group.
     */
    async updateManyLocked(
      orgId: string,
      changes: Array<{ id: string; values: Partial<NewCustomerRow> }>,
      tx: Executor,
    ): Promise<Map<string, Date>> {
      const stamped = new Map<string, Date>();
      for (const { names, document } of groupsBySetColumns(
        changes,
        (change) => change.values,
        (change) => ({ id: change.id }),
      )) {
        if (names.length === 0 || names.includes(customerColumns.id.name) || names.includes(customerColumns.orgId.name)) {
          throw new Error('updateManyLocked: each change sets at least one column, never the id or the organisation');
        }
        const { rows } = await tx.execute<{ id: string; updated_at: string | Date }>(sql`
          UPDATE ${customers} AS record
             SET ${sql.join(
               names.map((name) => sql`${sql.identifier(name)} = change.${sql.identifier(name)}`),
               sql`, `,
             )}
            FROM jsonb_populate_recordset(NULL::customers, ${JSON.stringify(document)}::jsonb) AS change
           WHERE record.org_id = ${orgId} AND record.id = change.id
          RETURNING record.id, record.updated_at`);
        for (const row of rows) stamped.set(row.id, customerColumns.updatedAt.mapFromDriverValue(row.updated_at) as Date);
      }
      return stamped;
    },

    /**
     * The records a batch of upserts may match, locked: those holding one of `externalIds` (any kind),
     * and the individuals with one of the name + email pairs (case-insensitive, the unique index's
     * expression). Two index lookups per key at most, whatever the organisation's size.
     */
    async lockUpsertCandidates(
      orgId: string,
      externalIds: string[],
      pairs: Array<{ name: string; email: string }>,
      tx: Executor,
    ): Promise<CustomerRow[]> {
      // One index probe per key (LATERAL): a filter over the organisation's records is what the planner
      // picks for `= ANY` while an import grows the table faster than its statistics follow.
      const { rows } = await tx.execute<Record<string, unknown>>(sql`
        SELECT found.* FROM unnest(${sql.param(externalIds)}::text[]) AS wanted (external_id)
        CROSS JOIN LATERAL (
          SELECT * FROM ${customers}
           WHERE org_id = ${orgId} AND external_id = wanted.external_id
             FOR UPDATE
        ) AS found
        UNION ALL
        SELECT found.* FROM unnest(${sql.param(pairs.map((pair) => pair.email))}::text[], ${sql.param(pairs.map((pair) => pair.name))}::text[])
                       AS wanted (email, name)
        CROSS JOIN LATERAL (
          SELECT * FROM ${customers}
           WHERE org_id = ${orgId} AND kind = 'individual' AND email IS NOT NULL
             AND lower(email) = lower(wanted.email) AND lower(name) = lower(wanted.name)
             FOR UPDATE
        ) AS found`);
      return rows.map(toCustomerRow);
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
     * the status, AML, review status, EDD or entity type index) in that order; the planner picks it per
     * call (unnamed statements, planned with their values: a generic plan could not tell a status a
     * handful of rows hold from one half of them hold). Parts that are each their own index range in
     * that order, merged, with only the page's rows read: the three parts of changedSinceParts with
     * updated_since, one part per status when review_status names several, and both together (each
     * part of one times each of the other). review_due_before: see listDueBefore. `known.total` is set
     * when the page's read also counted the whole filtered set (so count() need not run).
     */
    async list(orgId: string, filters: ListFilters, limit: number, tx: Executor, known: KnownCount = {}): Promise<CustomerRow[]> {
      const statuses = reviewStatusesOf(filters);
      if (statuses?.length === 0) return [];
      if (filters.reviewDueBefore && !filters.externalId)
        return listDueBefore(orgId, filters, filters.reviewDueBefore, statuses, limit, tx, known);
      const conditions = equalityConditions(orgId, filters);
      if (filters.reviewDueBefore) conditions.push(dueBefore(filters.reviewDueBefore));
      const since = filters.updatedSince;
      // external_id is one row at most: one plain read, whatever the other filters.
      const inParts = !filters.externalId;
      const sinceParts: Array<SQL | undefined> =
        since && inParts && hasPartsBefore(since)
          ? changedSinceParts(since, filters.after)
          : [and(filters.after ? after(filters.after) : undefined, since ? gt(customers.updatedAt, since) : undefined)];
      const statusParts =
        statuses && statuses.length > 1 && inParts
          ? statuses.map((status) => eq(customers.reviewStatus, status))
          : [reviewStatusCondition(statuses)];
      const parts = statusParts.flatMap((status) => sinceParts.map((part) => and(...conditions, status, part)!));
      if (parts.length === 1) {
        return tx
          .select()
          .from(customers)
          .where(parts[0])
          .orderBy(...listOrder)
          .limit(limit);
      }
      return pageRows(tx, orgId, firstInOrder(tx, parts, limit));
    },

    /**
     * `include=total_count`. Without updated_since (or with external_id, one row at most), the sum of
     * the counters that migrations 0011 and 0019 keep per status, review status and EDD flag
     * (customer_counts): a fixed number of rows whatever the organisation's size. With
     * review_due_before, the rows dated before it, counted index-only (bounded by those rows). With
     * updated_since, rows are counted in the parts of changedSinceParts; those created after `since`
     * by whichever side of `since` is the smaller (the counters give the whole), so the cost is
     * bounded by the rows changed since `since` and by the rows created before it, never by the
     * organisation's size alone (docs/decisions.md).
     */
    async count(orgId: string, filters: ListFilters, tx: Executor): Promise<number> {
      const statuses = reviewStatusesOf(filters);
      if (statuses?.length === 0) return 0;
      const equality = equalityConditions(orgId, filters);
      const status = reviewStatusCondition(statuses);
      if (status) equality.push(status);
      if (filters.externalId || filters.reviewDueBefore) {
        // external_id: one row at most. review_due_before: the rows dated before it, index-only on
        // customers_review_due_idx (its columns hold review_status too): bounded by those rows.
        const [row] = await tx
          .select({ count: sql<number>`count(*)::int` })
          .from(customers)
          .where(
            and(
              ...equality,
              filters.reviewDueBefore ? dueBefore(filters.reviewDueBefore) : undefined,
              filters.updatedSince ? gt(customers.updatedAt, filters.updatedSince) : undefined,
            ),
          );
        return row?.count ?? 0;
      }
      const total = async () => {
        const counted = [eq(customerCounts.orgId, orgId), eq(customerCounts.kind, filters.kind)];
        if (filters.kycStatus) counted.push(eq(customerCounts.kycStatus, filters.kycStatus));
        if (filters.amlStatus) counted.push(eq(customerCounts.amlStatus, filters.amlStatus));
        if (filters.type) counted.push(eq(customerCounts.type, filters.type));
        if (statuses) counted.push(inArray(customerCounts.reviewStatus, statuses));
        if (filters.eddRequired !== undefined) counted.push(eq(customerCounts.eddRequired, filters.eddRequired));
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

    /**
     * The review sweep's claim: up to `limit` of the organisation's SCHEDULED reviews whose date is
     * not after `now` become DUE (reason SCHEDULED_DATE), oldest date first. SKIP LOCKED: a row another
     * sweep or a writer holds is left to the next claim, and once claimed a row no longer matches, so
     * each review is made due once, however many instances sweep.
     */
    async claimDueReviews(orgId: string, now: Date, limit: number, tx: Executor): Promise<CustomerRow[]> {
      return tx
        .update(customers)
        .set({ reviewStatus: 'DUE', reviewReasons: ['SCHEDULED_DATE'] })
        .where(
          sql`(${customers.orgId}, ${customers.id}) IN (
            SELECT org_id, id FROM customers
             WHERE org_id = ${orgId} AND review_status = 'SCHEDULED' AND next_review_at <= ${now.toISOString()}::timestamptz
             ORDER BY next_review_at LIMIT ${limit} FOR UPDATE SKIP LOCKED)`,
        )
        .returning();
    },

    /** Up to `limit` of the organisation's DUE reviews due since `dueBy` or earlier become OVERDUE (as claimDueReviews). */
    async claimOverdueReviews(orgId: string, dueBy: Date, limit: number, tx: Executor): Promise<CustomerRow[]> {
      return tx
        .update(customers)
        .set({ reviewStatus: 'OVERDUE' })
        .where(
          sql`(${customers.orgId}, ${customers.id}) IN (
            SELECT org_id, id FROM customers
             WHERE org_id = ${orgId} AND review_status = 'DUE' AND next_review_at <= ${dueBy.toISOString()}::timestamptz
             ORDER BY next_review_at LIMIT ${limit} FOR UPDATE SKIP LOCKED)`,
        )
        .returning();
    },

    /** Writes the review and EDD columns of many records in one statement (a policy's re-dating batch). */
    async setReviewColumns(
      orgId: string,
      rows: Array<Pick<CustomerRow, 'id' | 'reviewStatus' | 'nextReviewAt' | 'reviewReasons' | 'eddRequired' | 'eddReasons'>>,
      tx: Executor,
    ): Promise<void> {
      if (rows.length === 0) return;
      await tx.execute(sql`
        UPDATE customers AS c
           SET review_status = v.review_status,
               next_review_at = v.next_review_at,
               review_reasons = ARRAY(SELECT jsonb_array_elements_text(v.review_reasons::jsonb)),
               edd_required = v.edd_required,
               edd_reasons = ARRAY(SELECT jsonb_array_elements_text(v.edd_reasons::jsonb))
          FROM unnest(${sql.param(rows.map((row) => row.id))}::uuid[], ${sql.param(rows.map((row) => row.reviewStatus))}::text[],
                      ${sql.param(rows.map((row) => row.nextReviewAt?.toISOString() ?? null))}::timestamptz[],
                      ${sql.param(rows.map((row) => JSON.stringify(row.reviewReasons)))}::text[],
                      ${sql.param(rows.map((row) => row.eddRequired))}::boolean[],
                      ${sql.param(rows.map((row) => JSON.stringify(row.eddReasons)))}::text[])
            AS v (id, review_status, next_review_at, review_reasons, edd_required, edd_reasons)
         WHERE c.org_id = ${orgId} AND c.id = v.id`);
    },

    /** The next `limit` records of the organisation after `afterId` in id order, locked (a policy's re-dating batch). */
    async lockBatchAfter(orgId: string, afterId: string | null, limit: number, tx: Executor): Promise<CustomerRow[]> {
      return tx
        .select()
        .from(customers)
        .where(and(eq(customers.orgId, orgId), afterId ? gt(customers.id, afterId) : undefined))
        .orderBy(asc(customers.id))
        .limit(limit)
        .for('update');
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
