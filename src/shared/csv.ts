import { stringify, type Options } from 'csv-stringify/sync';

/**
 * The one CSV writer of the service: every CSV file it writes goes through `csvRow`/`csvRows`.
 *
 * - **Formula injection** (OWASP "CSV Injection"): a cell whose text begins with `=`, `+`, `-`, `@`, a
 *   tab or a carriage return (and the full-width `＝ ＋ － ＠` some spreadsheets also read as such) is
 *   written with a single quote in front, csv-stringify's `escape_formulas`, so a spreadsheet shows the
 *   text instead of evaluating it. Anyone who can send an Idempotency-Key or an X-Request-Id controls
 *   some cells of an audit export, for one.
 * - **Round trip.** A cell that already begins with quotes followed by such a character gets one
 *   more quote too, so `csvCellValue` (which removes one quote from a cell of quotes and then such a
 *   character) gives back every value exactly: `=1` is written `'=1`, `'=1` is written `''=1`, and
 *   `'abc` stays `'abc`. A reader that recomputes hashes from the cells (the audit export's verifier)
 *   undoes it with `csvCellValue`.
 * - **Nulls** follow PostgreSQL's COPY … CSV: null is an empty unquoted field, an empty string is `""`.
 * - A cell beginning with `#` is quoted, so no record line starts as a comment line does (the audit
 *   export's last line is `# manifest {…}`).
 */

/** The first characters a spreadsheet may read as the start of a formula: those csv-stringify's `escape_formulas` neutralises. */
const FORMULA_START = '=+\\-@\\t\\r\\uFF1D\\uFF0B\\uFF0D\\uFF20';
/** A value of quotes then a formula start: escape_formulas leaves it (it starts with a quote), so it gets its quote here. */
const QUOTED_FORMULA = new RegExp(`^'+[${FORMULA_START}]`);

const OPTIONS: Options = {
  escape_formulas: true,
  // An empty string is "" (null stays an empty unquoted field); a leading # is quoted.
  quoted_match: [/^$/, /^#/],
  record_delimiter: '\n',
  eof: true,
  cast: { string: (value) => (QUOTED_FORMULA.test(value) ? `'${value}` : value) },
};

/** A CSV cell: text, or null for an empty unquoted field. */
export type CsvCell = string | null;

/** Records as CSV text, each ending in a newline, every cell neutralised as described above. */
export function csvRows(rows: ReadonlyArray<ReadonlyArray<CsvCell>>): string {
  return rows.length === 0 ? '' : stringify(rows as CsvCell[][], OPTIONS);
}

/** One record as a CSV line (with its newline). */
export const csvRow = (cells: ReadonlyArray<CsvCell>): string => csvRows([cells]);

/** The value a cell's text (already unquoted by the CSV parser) was written from: one neutralising quote removed. */
export function csvCellValue(text: string): string;
export function csvCellValue(text: string | null): string | null;
export function csvCellValue(text: string | null): string | null {
  return text !== null && QUOTED_FORMULA.test(text) ? text.slice(1) : text;
}

/**
 * The values of one record csvRow wrote (its text without the final newline): quotes undone, an
 * empty unquoted field null, and each cell's neutralising quote removed (csvCellValue).
 */
export function parseCsvRow(text: string): CsvCell[] {
  const fields: CsvCell[] = [];
  let index = 0;
  for (;;) {
    if (text[index] === '"') {
      let value = '';
      index += 1;
      for (;;) {
        const quote = text.indexOf('"', index);
        if (quote < 0) throw new Error('an unterminated quoted field');
        value += text.slice(index, quote);
        if (text[quote + 1] === '"') {
          value += '"';
          index = quote + 2;
        } else {
          index = quote + 1;
          break;
        }
      }
      fields.push(csvCellValue(value));
    } else {
      const comma = text.indexOf(',', index);
      const end = comma < 0 ? text.length : comma;
      const value = text.slice(index, end);
      if (value.includes('"')) throw new Error('a quote inside an unquoted field');
      fields.push(value === '' ? null : csvCellValue(value));
      index = end;
    }
    if (index === text.length) return fields;
    if (text[index] !== ',') throw new Error('text after a quoted field');
    index += 1;
  }
}
