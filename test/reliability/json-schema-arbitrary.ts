import fc from 'fast-check';

type Schema = {
  $ref?: string;
  type?: string | string[];
  enum?: unknown[];
  const?: unknown;
  format?: string;
  minLength?: number;
  maxLength?: number;
  minimum?: number;
  maximum?: number;
  exclusiveMinimum?: number;
  minItems?: number;
  maxItems?: number;
  items?: Schema;
  properties?: Record<string, Schema>;
  required?: string[];
  anyOf?: Schema[];
  oneOf?: Schema[];
  allOf?: Schema[];
};

/**
 * fast-check arbitraries from the OpenAPI document's JSON schemas: values that satisfy the schema
 * most of the time, with enough edge cases (bounds, empty strings, unicode) to probe validation.
 */
export function arbitraryFor(schema: Schema | undefined, components: Record<string, Schema>, depth = 0): fc.Arbitrary<unknown> {
  if (!schema || depth > 6) return fc.jsonValue({ maxDepth: 2 });
  if (schema.$ref) return arbitraryFor(components[schema.$ref.split('/').pop()!], components, depth + 1);
  if (schema.const !== undefined) return fc.constant(schema.const);
  if (schema.enum) return fc.constantFrom(...schema.enum);
  const options = schema.anyOf ?? schema.oneOf;
  if (options) return fc.oneof(...options.map((option) => arbitraryFor(option, components, depth + 1)));
  if (schema.allOf?.length) return arbitraryFor(schema.allOf[0], components, depth + 1);
  const types = Array.isArray(schema.type) ? schema.type : [schema.type ?? 'object'];
  return fc.oneof(...types.map((type) => arbitraryForType(type, schema, components, depth)));
}

function arbitraryForType(type: string, schema: Schema, components: Record<string, Schema>, depth: number): fc.Arbitrary<unknown> {
  switch (type) {
    case 'null':
      return fc.constant(null);
    case 'boolean':
      return fc.boolean();
    case 'integer':
      return fc.integer({ min: schema.minimum ?? -1000, max: schema.maximum ?? 1000 });
    case 'number':
      return fc.double({ min: schema.minimum ?? -1000, max: schema.maximum ?? 1000, noNaN: true });
    case 'string':
      return stringFor(schema);
    case 'array':
      return fc.array(arbitraryFor(schema.items, components, depth + 1), {
        minLength: schema.minItems ?? 0,
        maxLength: Math.min(schema.maxItems ?? 5, 5),
      });
    default: {
      const properties = schema.properties ?? {};
      const required = new Set(schema.required ?? []);
      const record: Record<string, fc.Arbitrary<unknown>> = {};
      for (const [name, property] of Object.entries(properties)) record[name] = arbitraryFor(property, components, depth + 1);
      return fc.record(record, { requiredKeys: [...required].filter((key) => key in record) });
    }
  }
}

function stringFor(schema: Schema): fc.Arbitrary<string> {
  switch (schema.format) {
    case 'email':
      return fc.emailAddress();
    case 'uuid':
      return fc.uuid();
    case 'date':
      return fc
        .date({ min: new Date('1990-01-01'), max: new Date('2030-01-01'), noInvalidDate: true })
        .map((date) => date.toISOString().slice(0, 10));
    case 'date-time':
      return fc.date({ min: new Date('1990-01-01'), max: new Date('2030-01-01'), noInvalidDate: true }).map((date) => date.toISOString());
    case 'uri':
      return fc.webUrl();
    default:
      return fc.oneof(
        fc.string({ minLength: schema.minLength ?? 0, maxLength: Math.min(schema.maxLength ?? 40, 300) }),
        fc.string({ unit: 'grapheme', maxLength: 20 }),
        fc.stringMatching(/^[0-9 ]{0,14}$/),
        fc.constantFrom('', ' ', 'null', '0', '-1', '\u0000', '💥', "'; DROP TABLE customers; --", 'x'.repeat(300)),
      );
  }
}
