import { createRequire } from 'node:module';

type Normalize = (config: unknown, values?: unknown, callback?: unknown) => Record<string, unknown>;
type PgUtils = { normalizeQueryConfig: Normalize & { __plainCopy?: boolean } };

const require = createRequire(import.meta.url);

/**
 * pg copies every query config it is given, so that it never mutates the caller's object, through
 * `Object.getOwnPropertyDescriptors` and `Object.defineProperties`: ~2.2 µs per statement on this
 * machine against ~0.1 µs for `Object.assign` (bench/README.md), two statements per GET. For a plain
 * object (what Drizzle and this project pass) the two copies are the same: its own properties are
 * enumerable data properties on `Object.prototype`. Anything else (a class instance, a
 * null-prototype object) still goes through pg's own copy. Idempotent; checked by
 * src/db/pg-query-config.test.ts against pg's behaviour.
 */
export function copyPlainQueryConfigsCheaply(): void {
  const utils = require('pg/lib/utils.js') as PgUtils;
  const normalize = utils.normalizeQueryConfig;
  if (normalize.__plainCopy) return;
  const copyingPlainObjects: Normalize = (config, values, callback) => {
    if (typeof config !== 'object' || config === null || Object.getPrototypeOf(config) !== Object.prototype) {
      return normalize(config, values, callback);
    }
    const copy = Object.assign({}, config) as Record<string, unknown>;
    if (values) {
      if (typeof values === 'function') copy.callback = values;
      else copy.values = values;
    }
    if (callback) copy.callback = callback;
    return copy;
  };
  Object.defineProperty(copyingPlainObjects, '__plainCopy', { value: true });
  utils.normalizeQueryConfig = copyingPlainObjects;
}
