import { eq } from 'drizzle-orm';
import type { Executor } from '../../db/client.js';
import { serviceSecrets } from '../../db/schema.js';

/** Names of the rows of service_secrets (each seeded by a migration). */
export type ServiceSecretName = 'list_cursor_hmac';

export function createServiceSecretsRepository(db: Executor) {
  return {
    async find(name: ServiceSecretName, tx: Executor = db): Promise<string | undefined> {
      const [row] = await tx.select({ value: serviceSecrets.value }).from(serviceSecrets).where(eq(serviceSecrets.name, name));
      return row?.value;
    },
  };
}
