/**
 * Background claims per organisation: a claimer first finds the organisations with due
 * work, then claims within each one, with org_id in every predicate, so each statement stays within
 * one organisation (one shard under Citus). These helpers keep it fair: one busy organisation cannot
 * starve the others.
 */

/** Sorts before every organisation id (they come from gen_random_uuid, never the nil UUID). */
const BEFORE_EVERY_ORG = '00000000-0000-0000-0000-000000000000';

/**
 * Where the next search for organisations with due work starts, in org_id order: just after the
 * last organisation reached when the previous search was cut short (so the ones beyond it come
 * next), else just after the first one served (so no organisation is always first to be served).
 */
export function createOrgRotation() {
  let after = BEFORE_EVERY_ORG;
  return {
    after(): string {
      return after;
    },
    found(orgIds: readonly string[], cutShort: boolean): void {
      const next = cutShort ? orgIds[orgIds.length - 1] : orgIds[0];
      after = next ?? BEFORE_EVERY_ORG;
    },
  };
}
export type OrgRotation = ReturnType<typeof createOrgRotation>;

/**
 * Up to `limit` organisations with due work in a rotating org_id order: those after the rotation's
 * start, then from the beginning again. `find(after, limit)` returns them in org_id order.
 */
export async function dueOrganisations(
  rotation: OrgRotation,
  limit: number,
  find: (after: string, limit: number) => Promise<string[]>,
): Promise<string[]> {
  const start = rotation.after();
  const orgIds = await find(start, limit);
  if (orgIds.length < limit && start !== BEFORE_EVERY_ORG) {
    for (const orgId of await find(BEFORE_EVERY_ORG, limit - orgIds.length)) {
      if (orgId > start || orgIds.includes(orgId)) break;
      orgIds.push(orgId);
    }
  }
  rotation.found(orgIds, orgIds.length === limit);
  return orgIds;
}

/**
 * Claims up to `wanted` rows across `orgIds`, an equal share from each; organisations that had more
 * than their share split whatever the others left, so a single busy organisation still gets the
 * whole batch. `claimIn` claims up to `limit` rows of one organisation.
 */
export async function claimFairly<T>(
  orgIds: readonly string[],
  wanted: number,
  claimIn: (orgId: string, limit: number) => Promise<T[]>,
): Promise<T[]> {
  const claimed: T[] = [];
  let open = [...orgIds];
  while (open.length > 0 && claimed.length < wanted) {
    const share = Math.ceil((wanted - claimed.length) / open.length);
    const more: string[] = [];
    for (const orgId of open) {
      const limit = Math.min(share, wanted - claimed.length);
      if (limit <= 0) break;
      const rows = await claimIn(orgId, limit);
      claimed.push(...rows);
      if (rows.length === limit) more.push(orgId);
    }
    open = more;
  }
  return claimed;
}
