import type { DataAccess } from '../../db/client.js';
import type { CursorKey } from '../../shared/list-cursor.js';
import { createServiceSecretsRepository } from './service-secrets.repository.js';

const MIN_KEY_BYTES = 32;
/** Per database handle (one per app instance): services built on it share one read of the key. */
const loadedKeys = new WeakMap<DataAccess, Promise<Buffer>>();

/**
 * The cursor key of service_secrets, read once per process on first use and kept: it is the same
 * for every instance on the database. A failed read is forgotten, so the next list tries again.
 */
export function cursorKeyLoader(database: DataAccess): CursorKey {
  return () => {
    let key = loadedKeys.get(database);
    if (!key) {
      key = readCursorKey(database);
      loadedKeys.set(database, key);
      const loading = key;
      loading.catch(() => {
        if (loadedKeys.get(database) === loading) loadedKeys.delete(database);
      });
    }
    return key;
  };
}

async function readCursorKey(database: DataAccess): Promise<Buffer> {
  const value = await createServiceSecretsRepository().find('list_cursor_hmac', database.db);
  const key = value !== undefined && /^(?:[0-9a-f]{2})+$/i.test(value) ? Buffer.from(value, 'hex') : undefined;
  if (!key || key.length < MIN_KEY_BYTES) {
    throw new Error(`service_secrets.list_cursor_hmac is missing or shorter than ${MIN_KEY_BYTES} bytes of hex; run the migrations`);
  }
  return key;
}
