import type { z } from 'zod';
import { upsertCustomerBody } from '../customers/customers.schemas.js';
import { upsertEntityBody } from '../entities/entities.schemas.js';

/** What an import holds: individuals (POST /v1/customers bodies) or entities (POST /v1/entities bodies). */
export const IMPORT_KINDS = ['individuals', 'entities'] as const;
export type ImportKind = (typeof IMPORT_KINDS)[number];

/** How a column's text becomes the JSON value of its field. */
type CellType = 'string' | 'boolean' | 'number' | 'list';
type Column = { path: string; segments: string[]; type: CellType };

/** Between the items of a list column (`designatedServices`, `preExistingServices`). */
export const LIST_SEPARATOR = ';';

/**
 * Columns the rows download adds in front of the file's own (import-rows CSV): an import accepts and
 * ignores them, so a corrected download of the failed rows can be imported again as it is.
 */
export const DOWNLOAD_COLUMNS = ['row_number', 'outcome', 'customer_id', 'error_code', 'error_message'] as const;
const IGNORED: ReadonlySet<string> = new Set(DOWNLOAD_COLUMNS);

type Def = { type: string; innerType?: z.ZodType; in?: z.ZodType; shape?: Record<string, z.ZodType> };
const defOf = (schema: z.ZodType): Def => (schema as unknown as { _zod: { def: Def } })._zod.def;

/** The schema a field's value is checked against first: optional, default, nullable and pipes (transforms) unwrapped. */
function unwrap(schema: z.ZodType): z.ZodType {
  let current = schema;
  for (let depth = 0; depth < 16; depth += 1) {
    const def = defOf(current);
    if (def.innerType && ['optional', 'nullable', 'default', 'prefault', 'readonly', 'nonoptional', 'catch'].includes(def.type)) {
      current = def.innerType;
    } else if (def.type === 'pipe' && def.in) {
      current = def.in;
    } else {
      return current;
    }
  }
  return current;
}

/** The leaf fields of a request body schema, in its order, dotted below nested objects (`risk.isNewCustomer`). */
function columnsOf(schema: z.ZodType, prefix: string[] = []): Column[] {
  const shape = defOf(unwrap(schema)).shape ?? {};
  return Object.entries(shape).flatMap(([key, child]): Column[] => {
    const segments = [...prefix, key];
    const def = defOf(unwrap(child));
    if (def.type === 'object') return columnsOf(child, segments);
    const type: CellType =
      def.type === 'boolean'
        ? 'boolean'
        : def.type === 'number' || def.type === 'int'
          ? 'number'
          : def.type === 'array'
            ? 'list'
            : 'string';
    return [{ path: segments.join('.'), segments, type }];
  });
}

/** The body schema of each kind: the very one its single-record route validates with. */
export const BODY_SCHEMAS = { individuals: upsertCustomerBody, entities: upsertEntityBody } as const satisfies Record<
  ImportKind,
  z.ZodType
>;

const COLUMNS: Record<ImportKind, ReadonlyMap<string, Column>> = {
  individuals: new Map(columnsOf(upsertCustomerBody).map((column) => [column.path, column])),
  entities: new Map(columnsOf(upsertEntityBody).map((column) => [column.path, column])),
};

/** The columns a file of `kind` may have, in the order of the single route's body. */
export function importColumns(kind: ImportKind): string[] {
  return [...COLUMNS[kind].keys()];
}

/** Whether `name` is a column of `kind` (or one of the rows download's, which are ignored). */
export function isKnownColumn(kind: ImportKind, name: string): boolean {
  return COLUMNS[kind].has(name) || IGNORED.has(name);
}

/** The top-level fields of the kind's body (an NDJSON line's keys). */
export function isKnownField(kind: ImportKind, name: string): boolean {
  return Object.hasOwn(defOf(BODY_SCHEMAS[kind]).shape ?? {}, name);
}

function cellValue(text: string, type: CellType): unknown {
  switch (type) {
    case 'boolean': {
      const lower = text.trim().toLowerCase();
      // Anything else stays text, so the schema refuses it with the single route's message.
      return lower === 'true' ? true : lower === 'false' ? false : text;
    }
    case 'number': {
      const trimmed = text.trim();
      return trimmed !== '' && Number.isFinite(Number(trimmed)) ? Number(trimmed) : text;
    }
    case 'list':
      return text
        .split(LIST_SEPARATOR)
        .map((item) => item.trim())
        .filter((item) => item !== '');
    default:
      return text;
  }
}

/**
 * The request body a CSV row stands for: each non-empty cell is its field (an empty cell is a field
 * left out), booleans `true`/`false` (any case), `;` between list items, dotted columns nested. The
 * body is then validated by the single route's schema, so a row fails exactly as its request would.
 */
export function csvRowToBody(kind: ImportKind, cells: Readonly<Record<string, string>>): Record<string, unknown> {
  const columns = COLUMNS[kind];
  const body: Record<string, unknown> = {};
  for (const [name, text] of Object.entries(cells)) {
    const column = columns.get(name);
    if (!column || text === '') continue;
    let target = body;
    for (const segment of column.segments.slice(0, -1)) {
      target = (target[segment] ??= {}) as Record<string, unknown>;
    }
    target[column.segments.at(-1)!] = cellValue(text, column.type);
  }
  return body;
}

/** An NDJSON row (a request body) as the cells of the kind's columns: for the rows download. */
export function bodyToCells(kind: ImportKind, body: unknown): Record<string, string> {
  const cells: Record<string, string> = {};
  if (body === null || typeof body !== 'object') return cells;
  for (const column of COLUMNS[kind].values()) {
    let value: unknown = body;
    for (const segment of column.segments) {
      value =
        value !== null && typeof value === 'object' && !Array.isArray(value) ? (value as Record<string, unknown>)[segment] : undefined;
    }
    if (value === undefined || value === null) continue;
    cells[column.path] = Array.isArray(value)
      ? value.map(String).join(LIST_SEPARATOR)
      : typeof value === 'object'
        ? JSON.stringify(value)
        : String(value);
  }
  return cells;
}

/** One example row per kind for the templates: valid, and it imports as a new record. */
export const TEMPLATE_EXAMPLES: Record<ImportKind, Readonly<Record<string, string>>> = {
  individuals: {
    externalId: 'crm-10442',
    type: 'INDIVIDUAL',
    fullName: 'Jane Citizen',
    email: 'jane@example.com',
    phone: '0400 000 000',
    firstName: 'Jane',
    lastName: 'Citizen',
    clientSinceDate: '2019-03-01',
    'preCommencementAssessment.significantChange': 'false',
    'preCommencementAssessment.resultingRisk': 'LOW',
    'preCommencementAssessment.assessedAt': '2024-06-30',
    'risk.isNewCustomer': 'false',
    'risk.metFaceToFace': 'true',
    designatedServices: 'PRO-REAL-ESTATE;PRO-CLIENT-MONEY',
  },
  entities: {
    type: 'COMPANY',
    name: 'Acme Holdings Pty Ltd',
    externalId: 'crm-acct-778',
    origin: 'AUSTRALIAN',
    abn: '51824753556',
    address: '1 Example St, Sydney NSW 2000',
    'contact.fullName': 'Sam Director',
    'contact.email': 'sam@acme.example',
    clientSinceDate: '2018-07-01',
    'preCommencementAssessment.significantChange': 'false',
    'preCommencementAssessment.resultingRisk': 'LOW',
    'risk.isNewCustomer': 'false',
    designatedServices: 'PRO-FORMATION',
  },
};
