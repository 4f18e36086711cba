/**
 * The first start of a development deployment: the embedded database's sandbox organisation and key,
 * or, on an empty external database, how to create one. Used by `svc serve` only.
 */
import { sql } from 'drizzle-orm';
import type { DataAccess } from '../db/client.js';
import { SCOPES } from '../shared/scopes.js';
import { createAuditWriter } from '../shared/audit-writer.js';
import { createApiKeysRepository } from '../modules/api-keys/api-keys.repository.js';
import { createApiKeysService } from '../modules/api-keys/api-keys.service.js';
import { createOrganisationsRepository } from '../modules/organisations/organisations.repository.js';
import { FEATURES } from '../modules/organisations/organisations.schemas.js';
import { createOrganisationsService } from '../modules/organisations/organisations.service.js';

const BOOTSTRAP_LOCK_ID = 7_264_119_002;

/**
 * Whether the database has no organisation yet: on an external database the first start then says
 * how to create one, since nothing is created for it.
 */
export async function hasNoOrganisation(deps: { database: DataAccess }): Promise<boolean> {
  return (await createOrganisationsRepository().count(deps.database.db)) === 0;
}

/**
 * On the first start of an empty database: a sandbox organisation with every feature and 100
 * credits, and an all-scopes key whose plaintext is returned exactly this once. Later starts (and a
 * second instance racing this one) get undefined. Called on the embedded (development) database
 * only, never on DATABASE_URL: a working key printed there would land in a deployment's logs.
 */
export async function bootstrapSandbox(deps: { database: DataAccess }): Promise<{ orgId: string; key: string } | undefined> {
  const { database } = deps;
  const repository = createOrganisationsRepository();
  const audit = createAuditWriter();
  const organisations = createOrganisationsService({ database, organisations: repository, audit });
  const keys = createApiKeysService({ database, keys: createApiKeysRepository(), organisations: repository, audit });
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

export function printSandboxKey(sandbox: { orgId: string; key: string }, port: number): void {
  const lines = [
    '',
    'First start: created a sandbox organisation (every feature on, 100 credits) and an all-scopes API key.',
    'The key is shown only this once; keep it somewhere safe:',
    '',
    `  ${sandbox.key}`,
    '',
    // The operator CLI takes the organisation by id (`key create --org`, `webhook add --org`, …).
    'The sandbox organisation (`npm run -s svc -- org list` shows it again):',
    '',
    `  ${sandbox.orgId}`,
    '',
    'Try it:',
    '',
    `  curl -H "Authorization: Bearer ${sandbox.key}" http://localhost:${port}/v1/customers`,
    '',
    `API reference: http://localhost:${port}/docs`,
    '',
  ];
  process.stdout.write(`${lines.join('\n')}\n`);
}

/** Printed on each start while an external database has no organisation: nothing is created on it unasked. */
export function printOrganisationHint(): void {
  const lines = [
    '',
    'This database (DATABASE_URL) has no organisation yet, and none is created for you. Create one and an',
    "API key with the operator CLI, from the service's directory (`docker compose exec api …` in the compose stack):",
    '',
    '  node bin/svc.js org create --name "My organisation" --credits 100',
    `  node bin/svc.js key create --org <id printed above> --scopes ${SCOPES.join(',')}`,
    '',
    'The key is printed by that command only, once.',
    '',
  ];
  process.stdout.write(`${lines.join('\n')}\n`);
}
