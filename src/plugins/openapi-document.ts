import { randomBytes } from 'node:crypto';
import { buildApp } from '../app.js';
import { loadConfig } from '../config/config.js';
import { createDatabase } from '../db/client.js';
import { createTextSealer } from '../shared/text-sealer.js';

/**
 * The OpenAPI document exactly as the server serves it, built without a database: the app gets a
 * pool that is never queried (pg connects lazily) and never listens. The configuration is the
 * defaults, not this machine's environment, so the output is the same everywhere.
 */
export async function generateOpenApiDocument(): Promise<Record<string, unknown>> {
  const database = createDatabase('postgres://openapi-generator.invalid:5432/unused', { poolSize: 1 });
  // A throwaway key: nothing is sealed here, and no key file is written.
  const app = await buildApp({ config: loadConfig({}), database, logger: false, linkSealer: createTextSealer(randomBytes(32)) });
  try {
    await app.ready();
    return app.swagger() as unknown as Record<string, unknown>;
  } finally {
    await app.close();
    await database.close();
  }
}

/** The committed file's bytes: two-space JSON with a final newline (key order is deterministic). */
export function serializeOpenApiDocument(document: unknown): string {
  return `${JSON.stringify(document, null, 2)}\n`;
}
