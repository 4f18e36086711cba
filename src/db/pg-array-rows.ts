import { createRequire } from 'node:module';

type FieldDescription = { dataTypeID: number; format?: string };
type TypeSource = { getTypeParser(oid: number, format: string): (value: string) => unknown };
type PgResult = {
  rowAsArray: boolean;
  fields: FieldDescription[];
  _parsers: Array<(value: string) => unknown> | undefined;
  _types: TypeSource | undefined;
};

const require = createRequire(import.meta.url);

/**
 * Column descriptions that results share (a named statement's, kept by StatementBatch for its later
 * runs), each with the parsers made for it the first time, and the type source they came from.
 */
const sharedDescriptions = new WeakMap<FieldDescription[], { source: TypeSource; parsers: Array<(value: string) => unknown> } | null>();

/**
 * Marks `fields` as the description of every later result of one statement: array results read with
 * the same type source share the parsers made for the first (looking up a parser per column, per
 * result, is most of what describing a 45-column result costs once it is not parsed again).
 */
export function shareParsersOf(fields: FieldDescription[]): void {
  if (!sharedDescriptions.has(fields)) sharedDescriptions.set(fields, null);
}

/**
 * pg builds, for every result, an empty row object keyed by the result's column names (a
 * null-prototype object copied with a spread), which it uses only to make rows as objects. For a
 * 45-column row that costs ~8 µs per statement (bench/README.md), the largest single item of a GET
 * after the socket writes, and it is pure waste for results read as arrays, which Drizzle's selects
 * and our built-once statements are. This skips it for those; results read as objects are untouched.
 * Idempotent; checked by src/db/pg-array-rows.test.ts against pg's own behaviour.
 */
export function skipRowTemplateForArrayResults(): void {
  const Result = require('pg/lib/result.js') as { prototype: { addFields(fields: FieldDescription[]): void } & { __arrayRowsPatched?: boolean } };
  const types = require('pg-types') as TypeSource;
  const prototype = Result.prototype;
  if (prototype.__arrayRowsPatched) return;
  const addFields = prototype.addFields;
  prototype.addFields = function addFieldsWithoutTemplate(this: PgResult, fieldDescriptions: FieldDescription[]) {
    if (!this.rowAsArray) return addFields.call(this, fieldDescriptions);
    this.fields = fieldDescriptions;
    const source = this._types ?? types;
    const shared = sharedDescriptions.get(fieldDescriptions);
    if (shared && shared.source === source) {
      this._parsers = shared.parsers;
      return;
    }
    if (fieldDescriptions.length) this._parsers = new Array(fieldDescriptions.length);
    for (let i = 0; i < fieldDescriptions.length; i++) {
      const description = fieldDescriptions[i]!;
      this._parsers![i] = source.getTypeParser(description.dataTypeID, description.format || 'text');
    }
    if (shared === null && this._parsers) sharedDescriptions.set(fieldDescriptions, { source, parsers: this._parsers });
  };
  Object.defineProperty(prototype, '__arrayRowsPatched', { value: true });
}
