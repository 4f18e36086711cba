import pg from 'pg';
import { sql } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { createRetentionRepository } from '../../src/modules/retention/retention.repository.js';
import { createEmptyDatabase, type TestDatabase } from '../helpers/database.js';
import { createTestContext, type TestContext } from '../helpers/harness.js';
import { PLAIN_TABLES, PartitioningRefused, convertToHashPartitioned } from '../helpers/partitioned-schema.js';

// The hash-partitioned variant (issue 34, item 6): the converter against schemas of its own, and the
// run's template when the run uses the variant (TEST_SCHEMA_VARIANT=partitioned, npm run test:partitioned).

const cleanups: Array<() => Promise<void>> = [];
afterAll(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup();
});

async function fixtureDatabase(schema: string): Promise<{ client: pg.Client; database: TestDatabase }> {
  const database = await createEmptyDatabase();
  const client = new pg.Client({ connectionString: database.url });
  await client.connect();
  cleanups.push(async () => {
    await client.end();
    await database.drop();
  });
  await client.query(schema);
  return { client, database };
}

async function relkind(client: pg.Client, table: string): Promise<string> {
  return (await client.query<{ relkind: string }>('SELECT relkind FROM pg_class WHERE oid = $1::regclass', [table])).rows[0]!.relkind;
}

/** Everything the variant must keep of a table, as the catalogs describe it. */
async function fingerprint(client: pg.Client, table: string) {
  const one = async (text: string) => (await client.query(text, [table])).rows;
  // A foreign key into a partitioned table is kept by PostgreSQL as one copy per partition (conparentid
  // set): bookkeeping, not another key.
  return {
    columns: await one(`SELECT attname, format_type(atttypid, atttypmod) AS type, attnotnull, attgenerated, attidentity, attcompression,
                               attstorage, attstattarget, pg_get_expr(d.adbin, d.adrelid) AS default, col_description(a.attrelid, a.attnum) AS comment
                          FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                         WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`),
    constraints:
      await one(`SELECT conname, contype, pg_get_constraintdef(oid) AS definition, obj_description(oid, 'pg_constraint') AS comment
                              FROM pg_constraint WHERE conrelid = $1::regclass AND conparentid = 0 ORDER BY conname`),
    referencedBy: await one(`SELECT conrelid::regclass::text AS from, conname, pg_get_constraintdef(oid) AS definition
                               FROM pg_constraint WHERE confrelid = $1::regclass AND conparentid = 0 ORDER BY 1, 2`),
    // A partitioned table's index reads "ON ONLY t": the same index.
    indexes: (
      await one(`SELECT indexrelid::regclass::text AS name, pg_get_indexdef(indexrelid) AS definition, obj_description(indexrelid, 'pg_class') AS comment
                           FROM pg_index WHERE indrelid = $1::regclass ORDER BY 1`)
    ).map((row) => ({ ...row, definition: String(row.definition).replace(' ON ONLY ', ' ON ') })),
    triggers: await one(
      `SELECT tgname, pg_get_triggerdef(oid) AS definition, tgenabled FROM pg_trigger WHERE tgrelid = $1::regclass AND NOT tgisinternal ORDER BY 1`,
    ),
    statistics: await one(
      `SELECT stxname, pg_get_statisticsobjdef(oid) AS definition, stxkind FROM pg_statistic_ext WHERE stxrelid = $1::regclass ORDER BY 1`,
    ),
    relation: await one(
      `SELECT obj_description($1::regclass, 'pg_class') AS comment, pg_get_userbyid(relowner) AS owner FROM pg_class WHERE oid = $1::regclass`,
    ),
  };
}

// org_id leads every key, as DESIGN.md §9 asks; everything the converter claims to keep appears at least once.
const READY_SCHEMA = `
  CREATE TABLE organisations (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), name text NOT NULL);
  CREATE TABLE trigger_log (id bigserial PRIMARY KEY, what text NOT NULL);
  CREATE TABLE parents (
    org_id uuid NOT NULL REFERENCES organisations (id) ON DELETE CASCADE,
    id uuid NOT NULL DEFAULT gen_random_uuid(),
    code text NOT NULL,
    n integer NOT NULL DEFAULT 0 CONSTRAINT parents_n_not_negative CHECK (n >= 0),
    n_twice integer GENERATED ALWAYS AS (n * 2) STORED,
    stamped text,
    payload jsonb,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT parents_pkey PRIMARY KEY (org_id, id),
    CONSTRAINT parents_org_code_key UNIQUE (org_id, code)
  );
  ALTER TABLE parents ALTER COLUMN payload SET STORAGE EXTERNAL, ALTER COLUMN payload SET COMPRESSION pglz, ALTER COLUMN code SET STATISTICS 500;
  COMMENT ON TABLE parents IS 'the parent records';
  COMMENT ON COLUMN parents.code IS 'unique within an organisation';
  COMMENT ON CONSTRAINT parents_n_not_negative ON parents IS 'never below zero';
  CREATE UNIQUE INDEX parents_lower_code_key ON parents (org_id, lower(code)) WHERE n > 0;
  CREATE INDEX parents_recent_idx ON parents (org_id, created_at DESC, id) WHERE n > 10;
  COMMENT ON INDEX parents_recent_idx IS 'recent busy parents';
  CREATE STATISTICS parents_n_code_stats (ndistinct, dependencies) ON n, code FROM parents;
  CREATE STATISTICS parents_lag_stats ON ((n + 1)) FROM parents;
  CREATE TABLE children (
    org_id uuid NOT NULL,
    id bigserial NOT NULL,
    parent_id uuid NOT NULL,
    note text,
    CONSTRAINT children_pkey PRIMARY KEY (org_id, id),
    CONSTRAINT children_parent_fk FOREIGN KEY (org_id, parent_id) REFERENCES parents (org_id, id) ON DELETE CASCADE
  );
  CREATE INDEX children_parent_idx ON children (org_id, parent_id);
  CREATE UNLOGGED TABLE counters (
    org_id uuid NOT NULL,
    id bigint GENERATED ALWAYS AS IDENTITY,
    hits integer NOT NULL DEFAULT 0,
    PRIMARY KEY (org_id, id)
  );
  -- A directory: keyed by a token, stays plain; its key into parents must follow parents' conversion.
  CREATE TABLE parent_tokens (
    token text PRIMARY KEY,
    org_id uuid NOT NULL,
    parent_id uuid NOT NULL,
    CONSTRAINT parent_tokens_parent_fk FOREIGN KEY (org_id, parent_id) REFERENCES parents (org_id, id) DEFERRABLE INITIALLY DEFERRED
  );
  CREATE FUNCTION parents_stamp() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN NEW.stamped := 'before ' || TG_OP; RETURN NEW; END $$;
  CREATE FUNCTION log_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN INSERT INTO trigger_log (what) VALUES (TG_NAME || ' ' || TG_LEVEL); RETURN NULL; END $$;
  CREATE TRIGGER parents_stamp BEFORE INSERT OR UPDATE ON parents FOR EACH ROW EXECUTE FUNCTION parents_stamp();
  CREATE TRIGGER parents_statement AFTER INSERT ON parents FOR EACH STATEMENT EXECUTE FUNCTION log_trigger();
  CREATE TRIGGER parents_changed AFTER UPDATE OF n ON parents FOR EACH ROW WHEN (OLD.n IS DISTINCT FROM NEW.n) EXECUTE FUNCTION log_trigger();
  CREATE CONSTRAINT TRIGGER parents_at_commit AFTER INSERT ON parents DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (pg_trigger_depth() = 0) EXECUTE FUNCTION log_trigger();
  CREATE TRIGGER parents_disabled AFTER DELETE ON parents FOR EACH ROW EXECUTE FUNCTION log_trigger();
  ALTER TABLE parents DISABLE TRIGGER parents_disabled;

  -- Partitioned by a migration already (by time): left as it is, and named.
  CREATE TABLE archived (org_id uuid NOT NULL, id uuid NOT NULL, created_at timestamptz NOT NULL, PRIMARY KEY (id, created_at))
    PARTITION BY RANGE (created_at);

  INSERT INTO organisations (id, name) SELECT gen_random_uuid(), 'org ' || g FROM generate_series(1, 8) g;
  INSERT INTO parents (org_id, code, n) SELECT o.id, 'code ' || g, g FROM organisations o, generate_series(1, 20) g;
  INSERT INTO children (org_id, parent_id, note) SELECT org_id, id, 'child' FROM parents;
  INSERT INTO counters (org_id) SELECT id FROM organisations;
  INSERT INTO parent_tokens (token, org_id, parent_id) SELECT md5(id::text), org_id, id FROM parents WHERE n = 1;
  TRUNCATE trigger_log;
`;

const TENANT_TABLES = ['parents', 'children', 'counters'];

describe('the hash-partitioned schema variant, converting a schema', () => {
  let fixture: { client: pg.Client; database: TestDatabase };
  let before: Record<string, Awaited<ReturnType<typeof fingerprint>>>;
  let rowsBefore: Record<string, string>;

  beforeAll(async () => {
    fixture = await fixtureDatabase(READY_SCHEMA);
    before = {};
    rowsBefore = {};
    for (const table of [...TENANT_TABLES, 'parent_tokens', 'organisations']) {
      before[table] = await fingerprint(fixture.client, table);
      rowsBefore[table] = (
        await fixture.client.query(`SELECT md5(string_agg(t::text, ',' ORDER BY t::text)) AS rows FROM ${table} t`)
      ).rows[0].rows;
    }
    const result = await convertToHashPartitioned(fixture.client, { plainTables: ['organisations', 'parent_tokens'] });
    expect(result.tables.sort()).toEqual([...TENANT_TABLES].sort());
    expect(result.alreadyPartitioned).toEqual([{ table: 'archived', key: 'RANGE (created_at)' }]);
  });

  it('when every key starts with org_id, each tenant table becomes PARTITION BY HASH (org_id) with 4 partitions; organisations and directories stay plain', async () => {
    for (const table of TENANT_TABLES) {
      expect(await relkind(fixture.client, table)).toBe('p');
      const key = await fixture.client.query(
        `SELECT pg_get_partkeydef($1::regclass) AS key, (SELECT count(*)::int FROM pg_inherits WHERE inhparent = $1::regclass) AS partitions`,
        [table],
      );
      expect(key.rows[0]).toEqual({ key: 'HASH (org_id)', partitions: 4 });
    }
    expect(await relkind(fixture.client, 'organisations')).toBe('r');
    expect(await relkind(fixture.client, 'parent_tokens')).toBe('r');
  });

  it('when converted, columns, defaults, NOT NULL and CHECK constraints, keys, indexes (partial ones too), foreign keys both ways, triggers, statistics, comments and rows are all kept', async () => {
    for (const table of [...TENANT_TABLES, 'parent_tokens', 'organisations']) {
      expect({ name: table, ...(await fingerprint(fixture.client, table)) }).toEqual({ name: table, ...before[table] });
      const rows = (await fixture.client.query(`SELECT md5(string_agg(t::text, ',' ORDER BY t::text)) AS rows FROM ${table} t`)).rows[0]
        .rows;
      expect({ table, rows }).toEqual({ table, rows: rowsBefore[table] });
    }
  });

  it('when an unlogged table is converted, its partitions are unlogged', async () => {
    const partitions = await fixture.client.query(
      `SELECT c.relpersistence FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'counters'::regclass`,
    );
    expect(partitions.rows.map((row) => row.relpersistence)).toEqual(['u', 'u', 'u', 'u']);
  });

  it('when rows are added after the conversion, bigserial and identity columns continue after the copied rows, and the sequence belongs to the new table', async () => {
    const { client } = fixture;
    const org = (await client.query('SELECT id FROM organisations LIMIT 1')).rows[0].id;
    const parent = (await client.query('SELECT id FROM parents WHERE org_id = $1 LIMIT 1', [org])).rows[0].id;
    const child = await client.query('INSERT INTO children (org_id, parent_id) VALUES ($1, $2) RETURNING id::int', [org, parent]);
    expect(child.rows[0].id).toBe(161);
    const counter = await client.query('INSERT INTO counters (org_id) VALUES ($1) RETURNING id::int', [org]);
    expect(counter.rows[0].id).toBe(9);
    expect((await client.query(`SELECT pg_get_serial_sequence('children', 'id') AS sequence`)).rows[0].sequence).toBe(
      'public.children_id_seq',
    );
  });

  it('when rows change, the row, statement and deferred constraint triggers fire as before, and a disabled one stays disabled', async () => {
    const { client } = fixture;
    await client.query('TRUNCATE trigger_log');
    const org = (await client.query('SELECT id FROM organisations LIMIT 1')).rows[0].id;
    await client.query('BEGIN');
    const inserted = await client.query(
      `INSERT INTO parents (org_id, code, n) VALUES ($1, 'fresh', 1), ($1, 'fresher', 2) RETURNING stamped, n_twice`,
      [org],
    );
    const beforeCommit = (await client.query('SELECT what FROM trigger_log ORDER BY id')).rows.map((row) => row.what);
    await client.query('COMMIT');
    const afterCommit = (await client.query('SELECT what FROM trigger_log ORDER BY id')).rows.map((row) => row.what);
    expect(inserted.rows).toEqual([
      { stamped: 'before INSERT', n_twice: 2 },
      { stamped: 'before INSERT', n_twice: 4 },
    ]);
    expect(beforeCommit).toEqual(['parents_statement STATEMENT']);
    expect(afterCommit).toEqual(['parents_statement STATEMENT', 'parents_at_commit ROW', 'parents_at_commit ROW']);
    await client.query('TRUNCATE trigger_log');
    await client.query(`UPDATE parents SET n = n + 100 WHERE org_id = $1 AND code = 'fresh'`, [org]);
    await client.query(`DELETE FROM parents WHERE org_id = $1 AND code = 'fresher'`, [org]);
    expect((await client.query('SELECT what FROM trigger_log ORDER BY id')).rows.map((row) => row.what)).toEqual(['parents_changed ROW']);
  });

  it('when a parent is deleted, its children cascade away, and keys, checks and the directory still refuse what they refused', async () => {
    const { client } = fixture;
    const [first, second] = (await client.query('SELECT id FROM organisations ORDER BY id LIMIT 2')).rows.map((row) => row.id as string);
    const parent = (await client.query(`SELECT id FROM parents WHERE org_id = $1 AND code = 'code 3'`, [first])).rows[0].id;
    await client.query('DELETE FROM parents WHERE org_id = $1 AND id = $2', [first, parent]);
    expect(
      (await client.query('SELECT count(*)::int AS n FROM children WHERE org_id = $1 AND parent_id = $2', [first, parent])).rows[0].n,
    ).toBe(0);
    const refused = async (text: string, values: unknown[]) =>
      client.query(text, values).then(
        () => 'accepted',
        (error: pg.DatabaseError) => error.code,
      );
    expect(await refused(`INSERT INTO parents (org_id, code) VALUES ($1, 'code 4')`, [first])).toBe('23505'); // unique (org_id, code)
    expect(await refused(`INSERT INTO parents (org_id, code, n) VALUES ($1, 'CODE 4', 5)`, [first])).toBe('23505'); // partial unique on lower(code)
    expect(await refused(`INSERT INTO parents (org_id, code, n) VALUES ($1, 'negative', -1)`, [first])).toBe('23514');
    expect(await refused(`INSERT INTO parents (org_id, code) VALUES (gen_random_uuid(), 'orphan')`, [])).toBe('23503');
    // Another organisation's parent is out of reach: the composite key carries org_id.
    const other = (await client.query('SELECT id FROM parents WHERE org_id = $1 LIMIT 1', [second])).rows[0].id;
    expect(await refused('INSERT INTO children (org_id, parent_id) VALUES ($1, $2)', [first, other])).toBe('23503');
    expect(await refused(`INSERT INTO parent_tokens (token, org_id, parent_id) VALUES ('t', $1, $2)`, [first, other])).toBe('23503');
    expect(
      await refused(`INSERT INTO parent_tokens (token, org_id, parent_id) SELECT 't2', org_id, id FROM parents WHERE org_id = $1 LIMIT 1`, [
        first,
      ]),
    ).toBe('accepted');
  });
});

describe('the hash-partitioned schema variant, refusing a schema', () => {
  it('when a tenant table has a key without org_id, PostgreSQL refuses it, the error names each table and constraint or index, and nothing is changed', async () => {
    const { client } = await fixtureDatabase(`
      CREATE TABLE organisations (id uuid PRIMARY KEY);
      CREATE TABLE things (id uuid PRIMARY KEY, org_id uuid NOT NULL REFERENCES organisations (id), token text, code text);
      CREATE UNIQUE INDEX things_token_key ON things (token);
      CREATE UNIQUE INDEX things_org_code_key ON things (org_id, code);
      CREATE TABLE parts (org_id uuid NOT NULL, id uuid NOT NULL, thing_id uuid REFERENCES things (id), PRIMARY KEY (org_id, id));
    `);
    const error = await convertToHashPartitioned(client).then(
      () => undefined,
      (failure: unknown) => failure,
    );
    expect(error).toBeInstanceOf(PartitioningRefused);
    const refusals = (error as PartitioningRefused).refusals.map(({ table, object, detail }) => ({ table, object, detail }));
    expect(refusals).toEqual([
      {
        table: 'things',
        object: 'things_pkey',
        detail: 'PRIMARY KEY constraint on table "things" lacks column "org_id" which is part of the partition key.',
      },
      {
        table: 'things',
        object: 'things_token_key',
        detail: 'UNIQUE constraint on table "things" lacks column "org_id" which is part of the partition key.',
      },
      { table: 'parts', object: 'parts_thing_id_fkey', detail: undefined },
    ]);
    expect((error as Error).message).toMatch(
      /things \/ things_pkey: unique constraint on partitioned table must include all partitioning columns/,
    );
    expect((error as Error).message).toMatch(
      /parts \/ parts_thing_id_fkey: there is no unique constraint matching given keys for referenced table "things"/,
    );
    expect(await relkind(client, 'things')).toBe('r');
    expect(await relkind(client, 'parts')).toBe('r');
    expect(
      (await client.query(`SELECT count(*)::int AS n FROM pg_class WHERE relname LIKE '%\\_p0' OR relname LIKE '%\\_\\_by\\_org'`)).rows[0]
        .n,
    ).toBe(0);
  });
});

describe('the run on the variant', () => {
  let ctx: TestContext;
  beforeAll(async () => {
    ctx = await createTestContext();
    cleanups.push(() => ctx.close());
  });

  it.runIf(inject('schemaVariant') === 'partitioned')(
    'when TEST_SCHEMA_VARIANT=partitioned, every table with an org_id but organisations and the directories is hash-partitioned on org_id in a test database',
    async () => {
      const tables = await ctx.database.db.execute<{ relname: string; relkind: string; key: string | null }>(sql`
        SELECT c.relname, c.relkind, pg_get_partkeydef(c.oid) AS key
          FROM pg_class c
         WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p') AND NOT c.relispartition
           AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'org_id' AND NOT a.attisdropped)
         ORDER BY 1`);
      const plain = tables.rows.filter((row) => (PLAIN_TABLES as readonly string[]).includes(row.relname));
      const tenant = tables.rows.filter((row) => !(PLAIN_TABLES as readonly string[]).includes(row.relname));
      expect(tenant.length).toBeGreaterThan(10);
      expect(tenant.filter((row) => row.key !== 'HASH (org_id)')).toEqual([]);
      expect(plain.every((row) => row.relkind === 'r')).toBe(true);
    },
  );

  it.runIf(inject('schemaVariant') === 'plain')(
    "when TEST_SCHEMA_VARIANT is unset, no table of a test database is partitioned, but for the job queue's own",
    async () => {
      // pg-boss partitions its job table by queue, by design (src/shared/job-runner.ts).
      const partitioned = await ctx.database.db.execute<{ n: number }>(
        sql`SELECT count(*)::int AS n FROM pg_class WHERE relkind = 'p' AND relnamespace <> 'pgboss'::regnamespace`,
      );
      expect(partitioned.rows[0]!.n).toBe(0);
    },
  );

  // ctid is a row's place within one table: in a partitioned (or distributed) table, each partition
  // has its own, so a purge that picks rows by ctid alone also hits other partitions' rows.
  it('when expired idempotency records are purged, the live records of other organisations all stay', async () => {
    const orgs = [];
    for (let index = 0; index < 12; index += 1) orgs.push(await ctx.createOrg());
    for (const [index, org] of orgs.entries()) {
      await ctx.database.db.execute(sql`
        INSERT INTO idempotency_keys (api_key_id, key, org_id, fingerprint, created_at)
        VALUES (${org.keyId}, ${`purge-${index}`}, ${org.id}, 'f', clock_timestamp() - ${index === 0 ? sql`interval '25 hours'` : sql`interval '0 hours'`})`);
    }
    const retention = createRetentionRepository();
    let deleted = 0;
    for (const org of orgs) deleted += await retention.purgeIdempotencyKeys(org.id, 24, 1000, ctx.database.db);
    const left = await ctx.database.db.execute<{ key: string }>(
      sql`SELECT key FROM idempotency_keys WHERE key LIKE 'purge-%' ORDER BY key`,
    );
    expect(deleted).toBe(1);
    expect(left.rows.map((row) => row.key).sort()).toEqual(
      orgs
        .slice(1)
        .map((_, index) => `purge-${index + 1}`)
        .sort(),
    );
  });
});
