import { sql } from 'drizzle-orm';
import type { Database } from '../../db/client.js';
import { SCOPES } from '../../plugins/route-scopes.js';
import { createApiKeysService } from '../api-keys/api-keys.service.js';
import { createOrganisationsRepository } from './organisations.repository.js';
import { FEATURES } from './organisations.schemas.js';
import { createOrganisationsService } from './organisations.service.js';

const BOOTSTRAP_LOCK_ID = 7_264_119_002;

/**
 * Whether the database has no organisation yet: on an external database the first start then says
 * how to create one, since nothing is created for it.
 */
export async function hasNoOrganisation(deps: { database: Database }): Promise<boolean> {
  return (await createOrganisationsRepository(deps.database.db).count()) === 0;
}

/**
 * On the first start of an empty database: a sandbox organisation with every feature and 100
 * credits, and an all-scopes key whose plaintext is returned exactly this once. Later starts (and a
 * second instance racing this one) get undefined. Called on the embedded (development) database
 * only, never on DATABASE_URL: a working key printed there would land in a deployment's logs.
 */
export async function bootstrapSandbox(deps: { database: Database }): Promise<{ orgId: string; key: string } | undefined> {
  const { database } = deps;
  const organisations = createOrganisationsService({ database });
  const repository = createOrganisationsRepository(database.db);
  const keys = createApiKeysService({ database });
  return database.transaction(async (tx) => {
    await tx.execute(sql`SELECT pg_advisory_xact_lock(${BOOTSTRAP_LOCK_ID})`);
    if ((await repository.count(tx)) > 0) return undefined;
    const organisation = await organisations.create({
      name: 'Sandbox',
      features: [...FEATURES],
      credits: 100,
      isSandbox: true,
    });
    const key = await keys.create({ orgId: organisation.id, scopes: [...SCOPES], label: 'sandbox (all scopes)' });
    return { orgId: organisation.id, key: key.key };
  });
}
