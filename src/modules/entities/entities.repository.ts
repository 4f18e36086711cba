import { and, asc, eq, sql } from 'drizzle-orm';
import type { Executor } from '../../db/client.js';
import { beneficialOwners, customers, type CustomerRow } from '../../db/schema.js';

export type BeneficialOwnerWithPerson = {
  owner: typeof beneficialOwners.$inferSelect;
  person: CustomerRow;
};

/** Entity-specific lookups; generic customer reads and writes live in the customers repository. */
export function createEntitiesRepository() {
  async function firstEntity(tx: Executor, orgId: string, condition: ReturnType<typeof sql>) {
    const [row] = await tx
      .select()
      .from(customers)
      .where(and(eq(customers.orgId, orgId), eq(customers.kind, 'entity'), condition))
      .for('update');
    return row;
  }

  return {
    /**
     * The entities of `orgId` holding one of the given ABNs, ACNs or legal name + type pairs (the unique
     * indexes' expressions): for each, which key and its position in its list. Read without a lock: a
     * batch of upserts leaves a row whose key is taken to the single upsert, which locks what it
     * matches. One index probe per key (LATERAL), as for the customers' upsert candidates.
     */
    async holdersOfKeys(
      orgId: string,
      keys: { abns: string[]; acns: string[]; nameTypes: Array<{ name: string; type: string }> },
      tx: Executor,
    ): Promise<Array<{ key: 'abn' | 'acn' | 'nameType'; position: number; id: string }>> {
      const { rows } = await tx.execute<{ key: 'abn' | 'acn' | 'nameType'; position: string | number; id: string }>(sql`
        SELECT 'abn' AS key, wanted.position, found.id FROM unnest(${sql.param(keys.abns)}::text[]) WITH ORDINALITY AS wanted (abn, position)
        CROSS JOIN LATERAL (SELECT id FROM ${customers} WHERE org_id = ${orgId} AND kind = 'entity' AND abn = wanted.abn) AS found
        UNION ALL
        SELECT 'acn', wanted.position, found.id FROM unnest(${sql.param(keys.acns)}::text[]) WITH ORDINALITY AS wanted (acn, position)
        CROSS JOIN LATERAL (SELECT id FROM ${customers} WHERE org_id = ${orgId} AND kind = 'entity' AND acn = wanted.acn) AS found
        UNION ALL
        SELECT 'nameType', wanted.position, found.id
          FROM unnest(${sql.param(keys.nameTypes.map((key) => key.name))}::text[], ${sql.param(keys.nameTypes.map((key) => key.type))}::text[])
               WITH ORDINALITY AS wanted (name, type, position)
        CROSS JOIN LATERAL (SELECT id FROM ${customers}
                             WHERE org_id = ${orgId} AND kind = 'entity' AND lower(name) = lower(wanted.name) AND type = wanted.type) AS found`);
      return rows.map((row) => ({ key: row.key, position: Number(row.position) - 1, id: row.id }));
    },

    findByAbn: (orgId: string, abn: string, tx: Executor) => firstEntity(tx, orgId, sql`${customers.abn} = ${abn}`),
    findByAcn: (orgId: string, acn: string, tx: Executor) => firstEntity(tx, orgId, sql`${customers.acn} = ${acn}`),
    findByNameAndType: (orgId: string, name: string, type: string, tx: Executor) =>
      firstEntity(tx, orgId, sql`lower(${customers.name}) = lower(${name}) AND ${customers.type} = ${type}`),

    async listOwners(orgId: string, entityId: string, tx: Executor): Promise<BeneficialOwnerWithPerson[]> {
      return tx
        .select({ owner: beneficialOwners, person: customers })
        .from(beneficialOwners)
        .innerJoin(customers, and(eq(customers.id, beneficialOwners.customerId), eq(customers.orgId, beneficialOwners.orgId)))
        .where(and(eq(beneficialOwners.orgId, orgId), eq(beneficialOwners.entityId, entityId)))
        .orderBy(asc(beneficialOwners.createdAt), asc(beneficialOwners.id));
    },

    async findOwner(orgId: string, entityId: string, ownerId: string, tx: Executor): Promise<BeneficialOwnerWithPerson | undefined> {
      const [row] = await tx
        .select({ owner: beneficialOwners, person: customers })
        .from(beneficialOwners)
        .innerJoin(customers, and(eq(customers.id, beneficialOwners.customerId), eq(customers.orgId, beneficialOwners.orgId)))
        .where(and(eq(beneficialOwners.orgId, orgId), eq(beneficialOwners.entityId, entityId), eq(beneficialOwners.id, ownerId)));
      return row;
    },

    async findOwnerByPerson(orgId: string, entityId: string, customerId: string, tx: Executor) {
      const [row] = await tx
        .select()
        .from(beneficialOwners)
        .where(
          and(eq(beneficialOwners.orgId, orgId), eq(beneficialOwners.entityId, entityId), eq(beneficialOwners.customerId, customerId)),
        );
      return row;
    },

    /** Adds the person as an owner of the entity, or updates their holding when already one. */
    async upsertOwner(values: typeof beneficialOwners.$inferInsert, tx: Executor) {
      const [row] = await tx
        .insert(beneficialOwners)
        .values(values)
        .onConflictDoUpdate({
          target: [beneficialOwners.orgId, beneficialOwners.entityId, beneficialOwners.customerId],
          set: {
            holderType: values.holderType,
            roleTypes: values.roleTypes,
            percentageHeld: values.percentageHeld,
            kycRequired: values.kycRequired,
            updatedAt: sql`clock_timestamp()`,
          },
        })
        .returning();
      return row!;
    },
  };
}
export type EntitiesRepository = ReturnType<typeof createEntitiesRepository>;
