import { eq, sql } from 'drizzle-orm';
import type { Executor } from '../../db/client.js';
import { serviceSecrets } from '../../db/schema.js';

/**
 * Names of the rows of service_secrets: `list_cursor_hmac` (seeded by migration 0010),
 * `audit_checkpoint_hmac` (the key of audit checkpoints, created by the first purge: see `ensure`).
 */
export type ServiceSecretName = 'list_cursor_hmac' | 'audit_checkpoint_hmac';

export function createServiceSecretsRepository() {
  return {
    async find(name: ServiceSecretName, tx: Executor): Promise<string | undefined> {
      const [row] = await tx.select({ value: serviceSecrets.value }).from(serviceSecrets).where(eq(serviceSecrets.name, name));
      return row?.value;
    },

    /**
     * The secret, created first if missing: 32 bytes of hex drawn as migration 0010 draws the cursor
     * key (two gen_random_uuid() from the server's CSPRNG, hashed). Concurrent first calls agree on
     * one row (the loser's insert does nothing and it reads the winner's).
     */
    async ensure(name: ServiceSecretName, tx: Executor): Promise<string> {
      await tx
        .insert(serviceSecrets)
        .values({ name, value: sql`encode(sha256((gen_random_uuid()::text || gen_random_uuid()::text)::bytea), 'hex')` })
        .onConflictDoNothing({ target: serviceSecrets.name });
      const value = await this.find(name, tx);
      if (value === undefined) throw new Error(`service_secrets.${name} could not be created`);
      return value;
    },
  };
}
export type ServiceSecretsRepository = ReturnType<typeof createServiceSecretsRepository>;
