import pg from 'pg';

/**
 * The hash-partitioned schema variant (issue 34, item 6; docs/scale-out.md). Every tenant table of a
 * migrated database becomes `PARTITION BY HASH (org_id)`. PostgreSQL then refuses any primary key,
 * unique constraint or unique index without org_id, and any foreign key whose referenced columns are
 * not such a key — the same rules Citus applies to tables distributed by org_id. The test run
 * converts its template with this (TEST_SCHEMA_VARIANT=partitioned), so the whole suite exercises
 * the application against tables PostgreSQL treats as shardable.
 *
 * Everything is read from the catalogs, never from a copy of the schema, so a new migration is
 * converted without touching this file. Nothing is pre-checked: PostgreSQL is the judge, and each of
 * its refusals is reported with the table and constraint or index it concerns.
 */

/** Tables with an org_id that stay plain: the tenants themselves, and directories keyed by a hash or token. */
export const PLAIN_TABLES = ['organisations', 'api_key_hashes', 'verification_link_tokens', 'document_request_tokens'] as const;

export type PartitionOptions = {
  /** Hash partitions per table. A few are enough to make every key rule apply. */
  partitions?: number;
  /** Tables with an org_id column left as they are. */
  plainTables?: readonly string[];
};

export type Refusal = { table: string; object: string; statement: string; message: string; detail?: string };

/** Thrown when PostgreSQL refuses the variant; nothing was changed (one transaction, rolled back). */
export class PartitioningRefused extends Error {
  constructor(readonly refusals: Refusal[]) {
    super(
      `PostgreSQL refused the hash-partitioned (org_id) variant of ${new Set(refusals.map((refusal) => refusal.table)).size} table(s):\n` +
        refusals
          .map(
            (refusal) =>
              `  - ${refusal.table} / ${refusal.object}: ${refusal.message}${refusal.detail ? ` (${refusal.detail})` : ''}\n      ${refusal.statement}`,
          )
          .join('\n'),
    );
    this.name = 'PartitioningRefused';
  }
}

type Table = {
  oid: number;
  qualified: string; // quoted, schema-qualified
  schema: string;
  name: string;
  unlogged: boolean;
  replicaIdentity: string;
  reloptions: string[] | null;
  owner: string;
  comment: string | null;
  copyColumns: string[];
  identityColumns: string[];
  ownedSequences: Array<{ sequence: string; column: string }>;
  columnSettings: Array<{ column: string; statisticsTarget: number | null; options: string[] | null }>;
  grants: Array<{ grantee: string; privilege: string; grantable: boolean }>;
  keys: Array<{ name: string; definition: string; comment: string | null }>;
  indexes: Array<{ name: string; definition: string }>;
  indexComments: Array<{ name: string; comment: string }>;
  triggers: Array<{ name: string; definition: string; enabled: string; comment: string | null }>;
  statistics: Array<{
    name: string;
    schema: string;
    definition: string;
    columns: string;
    kinds: string[];
    target: number | null;
    comment: string | null;
  }>;
};

type ForeignKey = { table: string; name: string; definition: string; comment: string | null };

const ident = (name: string) => `"${name.replaceAll('"', '""')}"`;
const literal = (text: string) => `'${text.replaceAll("'", "''")}'`;

async function rows<T extends pg.QueryResultRow>(client: pg.ClientBase, text: string, values: unknown[] = []): Promise<T[]> {
  return (await client.query<T>(text, values)).rows;
}

async function tenantTables(
  client: pg.ClientBase,
  plainTables: readonly string[],
): Promise<Array<{ oid: number; schema: string; name: string }>> {
  return rows(
    client,
    `SELECT c.oid::int AS oid, n.nspname AS schema, c.relname AS name
       FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE c.relkind = 'r' AND NOT c.relispartition
        AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'drizzle') AND n.nspname NOT LIKE 'pg\\_%'
        AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'org_id' AND NOT a.attisdropped)
        AND c.relname <> ALL ($1::text[])
      ORDER BY n.nspname, c.relname`,
    [plainTables],
  );
}

/** What the variant cannot carry over, found before anything changes so the message is about the cause. */
async function unsupported(client: pg.ClientBase, oid: number, table: string): Promise<string[]> {
  const [found] = await rows<{ rls: boolean; policies: number; rules: number; inherits: number; publications: number }>(
    client,
    `SELECT c.relrowsecurity AS rls,
            (SELECT count(*) FROM pg_policy WHERE polrelid = c.oid)::int AS policies,
            (SELECT count(*) FROM pg_rewrite WHERE ev_class = c.oid AND rulename <> '_RETURN')::int AS rules,
            (SELECT count(*) FROM pg_inherits WHERE inhrelid = c.oid OR inhparent = c.oid)::int AS inherits,
            (SELECT count(*) FROM pg_publication_rel WHERE prrelid = c.oid)::int AS publications
       FROM pg_class c WHERE c.oid = $1`,
    [oid],
  );
  const problems: string[] = [];
  if (found!.rls || found!.policies > 0) problems.push(`${table}: row-level security / policies`);
  if (found!.rules > 0) problems.push(`${table}: rules`);
  if (found!.inherits > 0) problems.push(`${table}: table inheritance`);
  if (found!.publications > 0) problems.push(`${table}: publication membership`);
  return problems;
}

async function describeTable(client: pg.ClientBase, oid: number, schema: string, name: string): Promise<Table> {
  const [table] = await rows<{
    qualified: string;
    unlogged: boolean;
    replica: string;
    reloptions: string[] | null;
    owner: string;
    comment: string | null;
  }>(
    client,
    `SELECT c.oid::regclass::text AS qualified, c.relpersistence = 'u' AS unlogged, c.relreplident AS replica,
            c.reloptions, pg_get_userbyid(c.relowner) AS owner, obj_description(c.oid, 'pg_class') AS comment
       FROM pg_class c WHERE c.oid = $1`,
    [oid],
  );
  const columns = await rows<{ name: string; generated: string; identity: string; target: number | null; options: string[] | null }>(
    client,
    `SELECT attname AS name, attgenerated AS generated, attidentity AS identity, attstattarget::int AS target, attoptions AS options
       FROM pg_attribute WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped ORDER BY attnum`,
    [oid],
  );
  // Sequences a column owns (bigserial): the new table must own them before the old one is dropped.
  const ownedSequences = await rows<{ sequence: string; column: string }>(
    client,
    `SELECT d.objid::regclass::text AS sequence, a.attname AS column
       FROM pg_depend d
       JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'
       JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
      WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass
        AND d.refobjid = $1 AND d.deptype = 'a'`,
    [oid],
  );
  const grants = await rows<{ grantee: string; privilege: string; grantable: boolean }>(
    client,
    `SELECT CASE WHEN acl.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(acl.grantee)) END AS grantee,
            acl.privilege_type AS privilege, acl.is_grantable AS grantable
       FROM pg_class c, aclexplode(c.relacl) acl
      WHERE c.oid = $1 AND acl.grantee <> c.relowner`,
    [oid],
  );
  const keys = await rows<{ name: string; definition: string; comment: string | null }>(
    client,
    `SELECT conname AS name, pg_get_constraintdef(oid) AS definition, obj_description(oid, 'pg_constraint') AS comment
       FROM pg_constraint WHERE conrelid = $1 AND contype IN ('p', 'u', 'x')
      ORDER BY contype = 'p' DESC, conname`,
    [oid],
  );
  const indexes = await rows<{ name: string; definition: string }>(
    client,
    `SELECT i.indexrelid::regclass::text AS name, pg_get_indexdef(i.indexrelid) AS definition
       FROM pg_index i
      WHERE i.indrelid = $1
        AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid AND c.conrelid = i.indrelid AND c.contype IN ('p', 'u', 'x'))
      ORDER BY 1`,
    [oid],
  );
  const indexComments = await rows<{ name: string; comment: string }>(
    client,
    `SELECT indexrelid::regclass::text AS name, obj_description(indexrelid, 'pg_class') AS comment
       FROM pg_index WHERE indrelid = $1 AND obj_description(indexrelid, 'pg_class') IS NOT NULL`,
    [oid],
  );
  const triggers = await rows<{ name: string; definition: string; enabled: string; comment: string | null }>(
    client,
    `SELECT tgname AS name, pg_get_triggerdef(oid) AS definition, tgenabled AS enabled, obj_description(oid, 'pg_trigger') AS comment
       FROM pg_trigger WHERE tgrelid = $1 AND NOT tgisinternal ORDER BY tgname`,
    [oid],
  );
  const statistics = await rows<{
    name: string;
    schema: string;
    definition: string;
    columns: string;
    kinds: string[];
    target: number | null;
    comment: string | null;
  }>(
    client,
    `SELECT stxname AS name, stxnamespace::regnamespace::text AS schema, pg_get_statisticsobjdef(oid) AS definition,
            pg_get_statisticsobjdef_columns(oid) AS columns, stxkind::text[] AS kinds, stxstattarget::int AS target,
            obj_description(oid, 'pg_statistic_ext') AS comment
       FROM pg_statistic_ext WHERE stxrelid = $1 ORDER BY stxname`,
    [oid],
  );
  return {
    oid,
    schema,
    name,
    qualified: table!.qualified,
    unlogged: table!.unlogged,
    replicaIdentity: table!.replica,
    reloptions: table!.reloptions,
    owner: table!.owner,
    comment: table!.comment,
    copyColumns: columns.filter((column) => column.generated === '').map((column) => column.name),
    identityColumns: columns.filter((column) => column.identity !== '').map((column) => column.name),
    ownedSequences,
    // -1 (PostgreSQL ≤ 16) or NULL (17+) is the default target.
    columnSettings: columns
      .filter((column) => (column.target !== null && column.target >= 0) || column.options !== null)
      .map((column) => ({
        column: column.name,
        statisticsTarget: column.target !== null && column.target >= 0 ? column.target : null,
        options: column.options,
      })),
    grants,
    keys,
    indexes,
    indexComments,
    triggers,
    statistics,
  };
}

async function foreignKeysTouching(client: pg.ClientBase, oids: number[]): Promise<ForeignKey[]> {
  return rows(
    client,
    `SELECT conrelid::regclass::text AS table, conname AS name, pg_get_constraintdef(oid) AS definition,
            obj_description(oid, 'pg_constraint') AS comment
       FROM pg_constraint
      WHERE contype = 'f' AND (conrelid = ANY ($1::oid[]) OR confrelid = ANY ($1::oid[]))
      ORDER BY conrelid::regclass::text, conname`,
    [oids],
  );
}

const STATISTICS_KINDS: Record<string, string> = { d: 'ndistinct', f: 'dependencies', m: 'mcv' };

/**
 * Converts every tenant table of the database `client` is connected to, in one transaction. Throws
 * PartitioningRefused (and changes nothing) when PostgreSQL refuses any key, index or foreign key.
 */
export async function convertToHashPartitioned(
  client: pg.ClientBase,
  options: PartitionOptions = {},
): Promise<{ tables: string[]; alreadyPartitioned: Array<{ table: string; key: string }> }> {
  const partitions = options.partitions ?? 4;
  const plainTables = options.plainTables ?? PLAIN_TABLES;
  const refusals: Refusal[] = [];

  await client.query('BEGIN');
  try {
    const found = await tenantTables(client, plainTables);
    // A tenant table a migration already partitions (by time, say) is left as it is and named: its keys
    // answer to its own partition key, so the variant says nothing about org_id there.
    const alreadyPartitioned = await rows<{ table: string; key: string }>(
      client,
      `SELECT c.oid::regclass::text AS table, pg_get_partkeydef(c.oid) AS key
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.relkind = 'p' AND NOT c.relispartition AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'drizzle')
          AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'org_id' AND NOT a.attisdropped)
          AND c.relname <> ALL ($1::text[])
        ORDER BY 1`,
      [plainTables],
    );
    const problems: string[] = [];
    for (const table of found) problems.push(...(await unsupported(client, table.oid, table.name)));
    if (problems.length > 0) throw new Error(`the hash-partitioned variant does not carry over: ${problems.join('; ')}`);
    const tables: Table[] = [];
    for (const table of found) tables.push(await describeTable(client, table.oid, table.schema, table.name));
    const foreignKeys = await foreignKeysTouching(
      client,
      tables.map((table) => table.oid),
    );

    // A statement PostgreSQL may refuse runs under a savepoint, so every refusal is collected, not only the first.
    const attempt = async (table: string, object: string, statement: string) => {
      await client.query('SAVEPOINT partition_step');
      try {
        await client.query(statement);
        await client.query('RELEASE SAVEPOINT partition_step');
      } catch (error) {
        await client.query('ROLLBACK TO SAVEPOINT partition_step');
        const failure = error as pg.DatabaseError;
        refusals.push({ table, object, statement, message: failure.message, ...(failure.detail ? { detail: failure.detail } : {}) });
      }
    };

    // Foreign keys in both directions go first (the old tables are dropped) and come back last (their
    // referenced keys must exist by then).
    for (const key of foreignKeys) await client.query(`ALTER TABLE ${key.table} DROP CONSTRAINT ${ident(key.name)}`);

    for (const table of tables) {
      const target = `${ident(table.schema)}.${ident(table.name)}`;
      const staging = `${ident(table.schema)}.${ident(`${table.name}__by_org`.slice(0, 63))}`;
      await client.query(
        `CREATE TABLE ${staging} (LIKE ${target} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED INCLUDING IDENTITY
           INCLUDING COMMENTS INCLUDING COMPRESSION INCLUDING STORAGE) PARTITION BY HASH (org_id)`,
      );
      // A partitioned table has no storage: persistence and storage parameters belong to its partitions.
      const storage = table.reloptions ? ` WITH (${table.reloptions.join(', ')})` : '';
      const partitionNames = Array.from(
        { length: partitions },
        (_, remainder) => `${ident(table.schema)}.${ident(`${table.name}_p${remainder}`)}`,
      );
      for (const [remainder, partition] of partitionNames.entries()) {
        await client.query(
          `CREATE ${table.unlogged ? 'UNLOGGED ' : ''}TABLE ${partition}
             PARTITION OF ${staging} FOR VALUES WITH (MODULUS ${partitions}, REMAINDER ${remainder})${storage}`,
        );
      }
      const columns = table.copyColumns.map(ident).join(', ');
      await client.query(`INSERT INTO ${staging} (${columns}) OVERRIDING SYSTEM VALUE SELECT ${columns} FROM ${target}`);
      for (const column of table.identityColumns) {
        const [sequences] = await rows<{ from: string; to: string }>(
          client,
          'SELECT pg_get_serial_sequence($1, $3) AS from, pg_get_serial_sequence($2, $3) AS to',
          [target, staging, column],
        );
        const [position] = await rows<{ last_value: string; is_called: boolean }>(
          client,
          `SELECT last_value, is_called FROM ${sequences!.from}`,
        );
        await client.query('SELECT setval($1, $2, $3)', [sequences!.to, position!.last_value, position!.is_called]);
      }
      for (const owned of table.ownedSequences)
        await client.query(`ALTER SEQUENCE ${owned.sequence} OWNED BY ${staging}.${ident(owned.column)}`);
      // RESTRICT: anything else depending on the table (a view, say) stops the conversion, naming it.
      await client.query(`DROP TABLE ${target} RESTRICT`);
      await client.query(`ALTER TABLE ${staging} RENAME TO ${ident(table.name)}`);

      if (table.comment !== null) await client.query(`COMMENT ON TABLE ${target} IS ${literal(table.comment)}`);
      for (const relation of [target, ...partitionNames]) await client.query(`ALTER TABLE ${relation} OWNER TO ${ident(table.owner)}`);
      for (const grant of table.grants) {
        await client.query(`GRANT ${grant.privilege} ON ${target} TO ${grant.grantee}${grant.grantable ? ' WITH GRANT OPTION' : ''}`);
      }
      for (const setting of table.columnSettings) {
        if (setting.statisticsTarget !== null)
          await client.query(`ALTER TABLE ${target} ALTER COLUMN ${ident(setting.column)} SET STATISTICS ${setting.statisticsTarget}`);
        if (setting.options)
          await client.query(`ALTER TABLE ${target} ALTER COLUMN ${ident(setting.column)} SET (${setting.options.join(', ')})`);
      }
      for (const key of table.keys)
        await attempt(table.name, key.name, `ALTER TABLE ${target} ADD CONSTRAINT ${ident(key.name)} ${key.definition}`);
      for (const index of table.indexes) await attempt(table.name, index.name, index.definition);
      for (const key of table.keys) {
        if (key.comment !== null)
          await attempt(table.name, key.name, `COMMENT ON CONSTRAINT ${ident(key.name)} ON ${target} IS ${literal(key.comment)}`);
      }
      for (const index of table.indexComments)
        await attempt(table.name, index.name, `COMMENT ON INDEX ${index.name} IS ${literal(index.comment)}`);
      if (table.replicaIdentity === 'f') await client.query(`ALTER TABLE ${target} REPLICA IDENTITY FULL`);
      if (table.replicaIdentity === 'n') await client.query(`ALTER TABLE ${target} REPLICA IDENTITY NOTHING`);
      if (table.replicaIdentity === 'i') throw new Error(`${table.name}: REPLICA IDENTITY USING INDEX is not carried over`);

      for (const trigger of table.triggers) {
        await attempt(table.name, trigger.name, trigger.definition);
        const state = { D: 'DISABLE', R: 'ENABLE REPLICA', A: 'ENABLE ALWAYS' }[trigger.enabled];
        if (state) await attempt(table.name, trigger.name, `ALTER TABLE ${target} ${state} TRIGGER ${ident(trigger.name)}`);
        if (trigger.comment !== null)
          await attempt(table.name, trigger.name, `COMMENT ON TRIGGER ${ident(trigger.name)} ON ${target} IS ${literal(trigger.comment)}`);
      }

      // Statistics on a partitioned table describe the whole table; a query pruned to one partition is
      // planned with that partition's own, so each partition gets a copy too.
      for (const statistic of table.statistics) {
        const kinds = statistic.kinds.filter((kind) => kind in STATISTICS_KINDS).map((kind) => STATISTICS_KINDS[kind]);
        const kindList = statistic.kinds.includes('e') && statistic.kinds.length === 1 ? '' : ` (${kinds.join(', ')})`;
        const copies = [
          { name: statistic.name, on: target, definition: statistic.definition },
          ...partitionNames.map((on, remainder) => {
            const name = `${statistic.name}_p${remainder}`.slice(0, 63);
            return {
              name,
              on,
              definition: `CREATE STATISTICS ${statistic.schema}.${ident(name)}${kindList} ON ${statistic.columns} FROM ${on}`,
            };
          }),
        ];
        for (const copy of copies) {
          await attempt(table.name, copy.name, copy.definition);
          const qualified = `${statistic.schema}.${ident(copy.name)}`;
          if (statistic.target !== null && statistic.target >= 0)
            await attempt(table.name, copy.name, `ALTER STATISTICS ${qualified} SET STATISTICS ${statistic.target}`);
          if (statistic.comment !== null)
            await attempt(table.name, copy.name, `COMMENT ON STATISTICS ${qualified} IS ${literal(statistic.comment)}`);
        }
      }
    }

    for (const key of foreignKeys) {
      const table = key.table.replace(/^public\./, '').replaceAll('"', '');
      await attempt(table, key.name, `ALTER TABLE ${key.table} ADD CONSTRAINT ${ident(key.name)} ${key.definition}`);
      if (key.comment !== null)
        await attempt(table, key.name, `COMMENT ON CONSTRAINT ${ident(key.name)} ON ${key.table} IS ${literal(key.comment)}`);
    }

    if (refusals.length > 0) throw new PartitioningRefused(refusals);
    await client.query('COMMIT');
    for (const table of tables) await client.query(`ANALYZE ${ident(table.schema)}.${ident(table.name)}`);
    return { tables: tables.map((table) => table.name), alreadyPartitioned };
  } catch (error) {
    await client.query('ROLLBACK');
    throw error;
  }
}

/** Converts the database at `url` (see convertToHashPartitioned). */
export async function convertDatabaseToHashPartitioned(
  url: string,
  options: PartitionOptions = {},
): ReturnType<typeof convertToHashPartitioned> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return await convertToHashPartitioned(client, options);
  } finally {
    await client.end();
  }
}
