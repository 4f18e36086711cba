import { formatFieldPath } from './errors.plugin.js';

/**
 * The text rules every string of a request obeys (body, query string, path parameters), applied
 * to the parsed values in one preValidation hook (app.ts) so that no route can miss them and the
 * schemas see the normalised text (docs/decisions.md, "Text in requests"):
 *
 * - NFC: a name typed with a composed "é" and one with "e" + U+0301 are the same text, so an
 *   upsert matches the same record and lengths are counted on one form.
 * - No C0 or C1 control character (U+0000–U+001F, U+007F–U+009F): PostgreSQL text cannot hold
 *   NUL, and CR/LF, ESC or BEL in a name reach email subjects, logs and terminals. The fields of
 *   MULTI_LINE_FIELDS may hold tab, line feed and carriage return.
 * - No unpaired surrogate: it is not a character, and UTF-8 encoding would silently replace it
 *   with U+FFFD, storing something other than what was sent.
 * - Outside MULTI_LINE_FIELDS, no line or paragraph separator (U+2028, U+2029), and no bidi
 *   embedding, override or isolate control (U+202A–U+202E, U+2066–U+2069), with which a name
 *   can display as another (the "Trojan Source" reordering).
 */

/**
 * Prose and postal addresses: the only fields where a line break is legitimate. Never a name,
 * email, id or reference (those reach email subjects, headers and matching).
 */
const MULTI_LINE_FIELDS: ReadonlySet<string> = new Set(['customMessage', 'address', 'notes']);

// Printable ASCII is already NFC and holds nothing the rules refuse: the one test most strings get.
/* eslint-disable no-control-regex -- the patterns below match control characters on purpose: they are what the text rules refuse */
const PRINTABLE_ASCII = /^[\x20-\x7e]*$/;
// With the u flag a surrogate range matches only a surrogate that is not part of a valid pair.
const UNSAFE_SINGLE_LINE = /[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]/u;
const UNSAFE_MULTI_LINE = /[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]/u;

const NUL = /\x00/;
const LONE_SURROGATE = /[\ud800-\udfff]/u;
const SINGLE_LINE_CONTROL = /[\x01-\x1f\x7f-\x9f]/;
const MULTI_LINE_CONTROL = /[\x01-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]/;
const LINE_SEPARATOR = /[\u2028\u2029]/;
const BIDI_CONTROL = /[\u202a-\u202e\u2066-\u2069]/;
/* eslint-enable no-control-regex */

const NUL_MESSAGE = 'Must not contain NUL characters (U+0000).';

/** What is wrong with a string the quick test refused (a refusal is rare, so the detail is worked out only then). */
function problemsOf(value: string, multiLine: boolean): string[] {
  const problems: string[] = [];
  if (NUL.test(value)) problems.push(NUL_MESSAGE);
  if (multiLine ? MULTI_LINE_CONTROL.test(value) : SINGLE_LINE_CONTROL.test(value)) {
    problems.push(
      multiLine
        ? 'Must not contain control characters (U+0000–U+001F, U+007F–U+009F) other than tab, line feed and carriage return.'
        : 'Must not contain control characters (U+0000–U+001F, U+007F–U+009F); line breaks and tabs included.',
    );
  }
  if (LONE_SURROGATE.test(value)) problems.push('Must be valid Unicode text: it contains an unpaired surrogate (U+D800–U+DFFF).');
  if (!multiLine && LINE_SEPARATOR.test(value)) problems.push('Must not contain line or paragraph separators (U+2028, U+2029).');
  if (!multiLine && BIDI_CONTROL.test(value)) {
    problems.push('Must not contain bidirectional embedding, override or isolate controls (U+202A–U+202E, U+2066–U+2069).');
  }
  return problems;
}

/**
 * The string as stored (NFC), or the reasons it is refused. The same string is returned when
 * nothing changes, so a caller writes back only a string that differs.
 */
export function cleanText(value: string, multiLine = false): string | { problems: string[] } {
  return PRINTABLE_ASCII.test(value) ? value : cleanUnusual(value, multiLine);
}

function cleanUnusual(value: string, multiLine: boolean): string | { problems: string[] } {
  if ((multiLine ? UNSAFE_MULTI_LINE : UNSAFE_SINGLE_LINE).test(value)) return { problems: problemsOf(value, multiLine) };
  return value.normalize('NFC');
}

export type TextIssues = Record<string, string[]>;

function addIssue(issues: TextIssues | undefined, path: string, problems: string[]): TextIssues {
  // No prototype: a field named like an Object method ("constructor") must not collide with it.
  const target = issues ?? (Object.create(null) as TextIssues);
  (target[path] ??= []).push(...problems);
  return target;
}

/**
 * Cleans the strings of a flat map (query string, path parameters; a repeated query parameter is
 * an array) in place. Returns the issues by name, or `issues` unchanged when all is well.
 */
export function cleanFlatValues(values: Record<string, unknown>, issues: TextIssues | undefined): TextIssues | undefined {
  for (const name in values) {
    const value = values[name];
    if (typeof value === 'string') {
      const cleaned = cleanText(value);
      if (typeof cleaned !== 'string') issues = addIssue(issues, name, cleaned.problems);
      else if (cleaned !== value) values[name] = cleaned;
    } else if (Array.isArray(value)) {
      for (let index = 0; index < value.length; index++) {
        const item: unknown = value[index];
        if (typeof item !== 'string') continue;
        const cleaned = cleanText(item);
        if (typeof cleaned !== 'string') issues = addIssue(issues, name, cleaned.problems);
        else if (cleaned !== item) value[index] = cleaned;
      }
    }
  }
  return issues;
}

type Container = Record<string, unknown> | unknown[];
/** A container still to visit; `parent` and `key` rebuild its field path, only when an issue needs it. */
type Frame = { node: Container; key: string | number | undefined; field: string | undefined; parent: Frame | undefined; depth: number };

/**
 * No request schema nests deeper than a few levels; past this a body is refused rather than walked,
 * so that neither the walk nor the field paths of its issues grow with a hostile nesting depth.
 */
export const MAX_BODY_DEPTH = 32;
/** Enough to name every field of any honest request; a body with more is refused all the same. */
const MAX_ISSUES = 100;

function pathOf(frame: Frame, key: string | number): string {
  const segments: Array<string | number> = [key];
  for (let at: Frame | undefined = frame; at?.key !== undefined; at = at.parent) segments.push(at.key);
  return formatFieldPath(segments.reverse());
}

/**
 * Cleans every string of a parsed JSON body in place, iteratively (a deep body must not overflow
 * the stack). Object keys are left to the schemas, which refuse any key they do not name. Returns
 * the issues by field path (`parties[1].roleLabel`), at most MAX_ISSUES of them.
 */
export function cleanJsonTree(root: Container, issues: TextIssues | undefined): TextIssues | undefined {
  const stack: Frame[] = [{ node: root, key: undefined, field: undefined, parent: undefined, depth: 1 }];
  let reported = 0;
  const report = (frame: Frame, key: string | number, problems: string[]) => {
    issues = addIssue(issues, pathOf(frame, key), problems);
    reported++;
  };
  while (stack.length > 0 && reported < MAX_ISSUES) {
    const frame = stack.pop()!;
    const node = frame.node;
    if (frame.depth > MAX_BODY_DEPTH) {
      report(frame.parent!, frame.key!, [`Must not nest more than ${MAX_BODY_DEPTH} levels deep.`]);
      continue;
    }
    if (Array.isArray(node)) {
      for (let index = 0; index < node.length && reported < MAX_ISSUES; index++) {
        const value: unknown = node[index];
        if (typeof value === 'string') {
          if (PRINTABLE_ASCII.test(value)) continue;
          const cleaned = cleanUnusual(value, frame.field !== undefined && MULTI_LINE_FIELDS.has(frame.field));
          if (typeof cleaned !== 'string') report(frame, index, cleaned.problems);
          else if (cleaned !== value) node[index] = cleaned;
        } else if (value !== null && typeof value === 'object') {
          stack.push({ node: value as Container, key: index, field: frame.field, parent: frame, depth: frame.depth + 1 });
        }
      }
    } else {
      for (const key in node) {
        if (reported >= MAX_ISSUES) break;
        const value = node[key];
        if (typeof value === 'string') {
          if (PRINTABLE_ASCII.test(value)) continue;
          const cleaned = cleanUnusual(value, MULTI_LINE_FIELDS.has(key));
          if (typeof cleaned !== 'string') report(frame, key, cleaned.problems);
          else if (cleaned !== value) node[key] = cleaned;
        } else if (value !== null && typeof value === 'object') {
          stack.push({ node: value as Container, key, field: key, parent: frame, depth: frame.depth + 1 });
        }
      }
    }
  }
  return issues;
}
