import { and, asc, eq, inArray, or, sql, type SQL } from 'drizzle-orm';
import type { Executor } from '../../db/client.js';
import { customers, groupParties, groups, groupTemplates, type TemplateRole } from '../../db/schema.js';

export type GroupTemplateRow = typeof groupTemplates.$inferSelect;
export type GroupRow = typeof groups.$inferSelect;
export type GroupPartyRow = typeof groupParties.$inferSelect;
export type NewGroupParty = Pick<GroupPartyRow, 'roleLabel' | 'partyType' | 'required' | 'checkTrigger' | 'customerId'>;
export type CustomerRef = { id: string; externalId: string | null; kind: 'individual' | 'entity' };

export type TemplateContent = {
  code: string;
  name: string;
  description: string;
  industry: string;
  roles: TemplateRole[];
};

/** Pre-built rows whose code is still in the curated set; retired codes stay in the table but are not offered. */
function offeredTemplate(curatedCodes: readonly string[]): SQL {
  return curatedCodes.length
    ? or(eq(groupTemplates.source, 'CUSTOM'), inArray(groupTemplates.code, [...curatedCodes]))!
    : eq(groupTemplates.source, 'CUSTOM');
}

export function createGroupsRepository() {
  return {
    /**
     * Inserts the organisation's copies of the curated templates, or brings existing copies up to
     * date. Rows already equal are not touched (no write, no updated_at change); custom rows are never
     * overwritten. Rows go in code order so concurrent syncs lock them in the same order.
     */
    async upsertCuratedTemplates(orgId: string, templates: readonly TemplateContent[], tx: Executor): Promise<number> {
      if (templates.length === 0) return 0;
      const rows = [...templates]
        .sort((a, b) => (a.code < b.code ? -1 : a.code > b.code ? 1 : 0))
        .map((template) => ({
          orgId,
          code: template.code,
          name: template.name,
          description: template.description,
          industry: template.industry,
          source: 'PRE_BUILT' as const,
          isVerified: true,
          roles: template.roles,
        }));
      const written = await tx
        .insert(groupTemplates)
        .values(rows)
        .onConflictDoUpdate({
          target: [groupTemplates.orgId, groupTemplates.code],
          set: {
            name: sql`excluded.name`,
            description: sql`excluded.description`,
            industry: sql`excluded.industry`,
            isVerified: sql`excluded.is_verified`,
            roles: sql`excluded.roles`,
            updatedAt: sql`clock_timestamp()`,
          },
          setWhere: sql`${groupTemplates.source} = 'PRE_BUILT' AND (
            ${groupTemplates.name}, ${groupTemplates.description}, ${groupTemplates.industry}, ${groupTemplates.isVerified}, ${groupTemplates.roles}
          ) IS DISTINCT FROM (excluded.name, excluded.description, excluded.industry, excluded.is_verified, excluded.roles)`,
        })
        .returning({ id: groupTemplates.id });
      return written.length;
    },

    async insertCustomTemplate(orgId: string, template: TemplateContent, tx: Executor): Promise<GroupTemplateRow | undefined> {
      const [row] = await tx
        .insert(groupTemplates)
        .values({ orgId, ...template, source: 'CUSTOM', isVerified: false })
        .onConflictDoNothing({ target: [groupTemplates.orgId, groupTemplates.code] })
        .returning();
      return row;
    },

    /** Curated first (by code), then custom ones in creation order. */
    async listTemplates(orgId: string, curatedCodes: readonly string[], tx: Executor): Promise<GroupTemplateRow[]> {
      return tx
        .select()
        .from(groupTemplates)
        .where(and(eq(groupTemplates.orgId, orgId), offeredTemplate(curatedCodes)))
        .orderBy(
          sql`CASE WHEN ${groupTemplates.source} = 'PRE_BUILT' THEN 0 ELSE 1 END`,
          sql`CASE WHEN ${groupTemplates.source} = 'PRE_BUILT' THEN ${groupTemplates.code} END`,
          asc(groupTemplates.createdAt),
          asc(groupTemplates.id),
        );
    },

    async findTemplate(orgId: string, id: string, curatedCodes: readonly string[], tx: Executor): Promise<GroupTemplateRow | undefined> {
      const [row] = await tx
        .select()
        .from(groupTemplates)
        .where(and(eq(groupTemplates.orgId, orgId), eq(groupTemplates.id, id), offeredTemplate(curatedCodes)));
      return row;
    },

    /** Customers of the organisation matching any of the ids or external ids (individuals and entities alike). */
    async findCustomers(orgId: string, refs: { ids: string[]; externalIds: string[] }, tx: Executor): Promise<CustomerRef[]> {
      const matches: SQL[] = [];
      if (refs.ids.length) matches.push(inArray(customers.id, refs.ids));
      if (refs.externalIds.length) matches.push(inArray(customers.externalId, refs.externalIds));
      if (matches.length === 0) return [];
      return tx
        .select({ id: customers.id, externalId: customers.externalId, kind: customers.kind })
        .from(customers)
        .where(and(eq(customers.orgId, orgId), or(...matches)));
    },

    /**
     * Inserts an ACTIVE group unless an ACTIVE group of the organisation already holds the same
     * reference; the partial unique index decides, so concurrent requests cannot both insert.
     * Returns undefined when the reference was taken.
     */
    async insertGroupUnlessReferenced(
      values: { orgId: string; name: string; reference: string | null; templateId: string | null; industry: string | null },
      tx: Executor,
    ): Promise<GroupRow | undefined> {
      const [row] = await tx
        .insert(groups)
        .values({ ...values, status: 'ACTIVE' })
        .onConflictDoNothing({
          target: [groups.orgId, groups.reference],
          where: sql`status = 'ACTIVE' AND reference IS NOT NULL`,
        })
        .returning();
      return row;
    },

    async findActiveGroupByReference(orgId: string, reference: string, tx: Executor): Promise<GroupRow | undefined> {
      const [row] = await tx
        .select()
        .from(groups)
        .where(and(eq(groups.orgId, orgId), eq(groups.reference, reference), eq(groups.status, 'ACTIVE')));
      return row;
    },

    async insertParties(orgId: string, groupId: string, parties: NewGroupParty[], tx: Executor): Promise<GroupPartyRow[]> {
      if (parties.length === 0) return [];
      const rows = await tx
        .insert(groupParties)
        .values(parties.map((party, position) => ({ ...party, orgId, groupId, position })))
        .returning();
      return rows.sort((a, b) => a.position - b.position);
    },

    async listParties(orgId: string, groupId: string, tx: Executor): Promise<GroupPartyRow[]> {
      return tx
        .select()
        .from(groupParties)
        .where(and(eq(groupParties.orgId, orgId), eq(groupParties.groupId, groupId)))
        .orderBy(asc(groupParties.position));
    },
  };
}
export type GroupsRepository = ReturnType<typeof createGroupsRepository>;
