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
    if (fieldDescriptions.length) this._parsers = new Array(fieldDescriptions.length);
    const source = this._types ?? types;
    for (let i = 0; i < fieldDescriptions.length; i++) {
      const description = fieldDescriptions[i]!;
      this._parsers![i] = source.getTypeParser(description.dataTypeID, description.format || 'text');
    }
  };
  Object.defineProperty(prototype, '__arrayRowsPatched', { value: true });
}
