import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Reporter, TestProject, Vitest } from 'vitest/node';

/*
 * The log scan (issue 27). Every app the test harness builds logs at debug level, with the service's
 * own logger options, into a file of its test file's own in one directory per run (log-collector.ts);
 * spawned `svc` processes add their JSON lines; the harness records the personal values the tests
 * send. When the run ends, every line is checked, and the run fails on any line that holds
 *
 *   - a personal value a test sent (a name, an email, a phone: see sentValuesToLookFor),
 *   - an email address at all,
 *   - SQL text (a statement, its placeholders, a driver's "Failed query" or "params:"),
 *   - an API key (`svc_live_` anywhere).
 *
 * The reporter (LogScanReporter, in both vitest configs) scans when the run ends and fails it with
 * the offending lines; should the reporter have been replaced (`--reporter` on the command line),
 * the global setup's teardown scans instead (finishLogScan). LOG_SCAN_KEEP=1 keeps the directory.
 */

export const LOG_FILE_SUFFIX = '.log.ndjson';
export const SENT_FILE_SUFFIX = '.sent.ndjson';
const SCANNED_MARKER = 'scanned';

export type LogScanRule = 'sent personal data' | 'email address' | 'SQL text' | 'API key';
/** A line that breaks one rule or more, with what matched each rule, and the test file whose run wrote it. */
export type LogScanViolation = { source: string; line: string; broken: Array<{ rule: LogScanRule; match: string }> };

/**
 * SQL as a log line would carry it. Each pattern needs SQL's own shape (a keyword followed by what
 * only a statement has), so that words like "select" or "update" in a message do not count.
 */
const SQL_PATTERNS: RegExp[] = [
  /Failed query/i, // drizzle-orm's message: the statement and then its parameters
  /\bparams: /, // the second half of that message
  /\bSQL statement\b/, // PostgreSQL's context (`where`) of a failure inside a function
  // Identifiers may be quoted, and inside a JSON line the quotes are escaped (\"customers\").
  /\binsert\s+into\s+(?:\\?"|[a-z_])/i,
  /\bdelete\s+from\s+(?:\\?"|[a-z_])/i,
  /\bupdate\s+(?:\\?"[^"\\]+\\?"|[a-z_][\w.]*)\s+set\s/i,
  // A select list (`*`, a quoted name, a list, a call) then FROM, within one JSON string; or FROM … WHERE.
  /\bselect\s+(?:distinct\s+)?(?:\*|\\?"|[a-z_][\w.]*\s*(?:,|\(|\bas\b))(?:[^"\\]|\\.){0,400}?\sfrom\s/i,
  /\bselect\s(?:[^"\\]|\\.){0,400}?\sfrom\s+(?:\\?"[^"\\]+\\?"|[a-z_][\w.]*)\s+where\s/i,
  /(?:^|[\s(,=])\$\d{1,3}(?![\w$])/, // a bind placeholder: ($1, $2)
];
const API_KEY = /svc_live_/;
const EMAIL = /[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}/;

/** The first characters of a value, by which candidates are looked up at each place in a line. */
const PREFIX = 5;
const WORD_CHARACTER = /[\p{L}\p{N}_]/u;

function isWordCharacter(character: string | undefined): boolean {
  if (character === undefined || character === '') return false;
  const code = character.charCodeAt(0);
  if (code < 128) return (code >= 48 && code <= 57) || (code >= 65 && code <= 90) || (code >= 97 && code <= 122) || code === 95;
  return WORD_CHARACTER.test(character);
}

/**
 * Which of the values the tests sent are looked for: at least five characters, and not one
 * lower-case word. Shorter values (`Ada`, `Li`) and single lower-case words (`admin`, `trust`) occur
 * in ordinary lines (messages, routes, field names) and would fail the run for nothing; the names,
 * emails and phones of the tests' people are longer, capitalised, or hold digits, `@` or spaces.
 * Values are looked for case-insensitively and as whole words (not inside a longer word or number).
 */
export function sentValuesToLookFor(values: Iterable<string>): string[] {
  const kept = new Set<string>();
  for (const value of values) {
    const trimmed = value.trim();
    if (trimmed.length < PREFIX || /^[a-z]+$/.test(trimmed)) continue;
    kept.add(trimmed.toLowerCase());
    // As it appears inside a JSON line when it holds a quote, a backslash or a control character.
    const escaped = JSON.stringify(trimmed).slice(1, -1).toLowerCase();
    if (escaped !== trimmed.toLowerCase()) kept.add(escaped);
  }
  return [...kept];
}

/** Looks up many values in many lines: candidates by their first characters, tried only where a word starts. */
function valueMatcher(values: string[]): (line: string) => string | undefined {
  const byPrefix = new Map<string, string[]>();
  for (const value of values) {
    const key = value.slice(0, PREFIX);
    const list = byPrefix.get(key);
    if (list) list.push(value);
    else byPrefix.set(key, [value]);
  }
  return (line) => {
    if (byPrefix.size === 0) return undefined;
    const lower = line.toLowerCase();
    for (let index = 0; index + PREFIX <= lower.length; index += 1) {
      if (index > 0 && isWordCharacter(lower[index - 1]) && isWordCharacter(lower[index])) continue;
      const candidates = byPrefix.get(lower.slice(index, index + PREFIX));
      if (!candidates) continue;
      for (const value of candidates) {
        if (!lower.startsWith(value, index)) continue;
        const after = lower[index + value.length];
        if (isWordCharacter(value[value.length - 1]) && isWordCharacter(after)) continue;
        return value;
      }
    }
    return undefined;
  };
}

/** The lines that break a rule, each with every rule it breaks. */
export function scanLogLines(lines: Iterable<{ line: string; source: string }>, sentValues: Iterable<string>): LogScanViolation[] {
  const sent = valueMatcher(sentValuesToLookFor(sentValues));
  const violations: LogScanViolation[] = [];
  for (const { line, source } of lines) {
    if (line.trim() === '') continue;
    const broken: LogScanViolation['broken'] = [];
    const value = sent(line);
    if (value !== undefined) broken.push({ rule: 'sent personal data', match: value });
    const email = line.includes('@') ? EMAIL.exec(line) : null;
    if (email && value === undefined) broken.push({ rule: 'email address', match: email[0] });
    const sql = SQL_PATTERNS.map((pattern) => pattern.exec(line)).find((found) => found !== null);
    if (sql) broken.push({ rule: 'SQL text', match: sql[0] });
    const key = API_KEY.exec(line);
    if (key) broken.push({ rule: 'API key', match: key[0] });
    if (broken.length > 0) violations.push({ source, line, broken });
  }
  return violations;
}

const MAX_REPORTED = 25;
const MAX_LINE = 400;

/** The failure message: how many lines broke which rule, then the first offending lines (shortened). */
export function formatViolations(violations: LogScanViolation[], scannedLines: number, directory?: string): string {
  const counts = new Map<LogScanRule, number>();
  for (const { broken } of violations) for (const { rule } of broken) counts.set(rule, (counts.get(rule) ?? 0) + 1);
  const summary = [...counts].map(([rule, count]) => `${count} × ${rule}`).join(', ');
  const shown = violations.slice(0, MAX_REPORTED).map((violation) => {
    const line = violation.line.length > MAX_LINE ? `${violation.line.slice(0, MAX_LINE)}…` : violation.line;
    const rules = violation.broken.map(({ rule, match }) => `${rule}: ${JSON.stringify(match)}`).join('; ');
    return `  [${rules}] written during ${violation.source}\n    ${line}`;
  });
  const more = violations.length > MAX_REPORTED ? [`  … and ${violations.length - MAX_REPORTED} more`] : [];
  const kept = directory ? [`(all lines kept in ${directory})`] : [];
  return [`Log scan: ${violations.length} of ${scannedLines} log lines break the rules (${summary}).`, ...shown, ...more, ...kept].join(
    '\n',
  );
}

function readLines(directory: string, suffix: string): Array<{ line: string; source: string }> {
  const lines: Array<{ line: string; source: string }> = [];
  for (const file of readdirSync(directory)
    .filter((name) => name.endsWith(suffix))
    .sort()) {
    const source = file.slice(0, -suffix.length);
    for (const line of readFileSync(join(directory, file), 'utf8').split('\n')) if (line !== '') lines.push({ line, source });
  }
  return lines;
}

export type LogScanResult = { scannedLines: number; sentValues: number; violations: LogScanViolation[] };

/** Scans every line collected in the run's directory against every value the tests sent. */
export function scanLogDirectory(directory: string): LogScanResult {
  const sent = readLines(directory, SENT_FILE_SUFFIX).map(({ line }) => JSON.parse(line) as string);
  const lines = readLines(directory, LOG_FILE_SUFFIX);
  return { scannedLines: lines.length, sentValues: sent.length, violations: scanLogLines(lines, sent) };
}

/** A new, empty directory for one run's collected lines (global-setup.ts provides it to the workers). */
export function createLogScanDirectory(): string {
  return mkdtempSync(join(tmpdir(), 'svc-log-scan-'));
}

/** Scans the run's directory, throws the failure message when a line breaks a rule, and marks it scanned. */
function scanAndMark(directory: string): void {
  const result = scanLogDirectory(directory);
  writeFileSync(join(directory, SCANNED_MARKER), result.violations.length === 0 ? 'passed' : 'failed');
  if (result.violations.length > 0) throw new Error(formatViolations(result.violations, result.scannedLines, directory));
  process.stdout.write(
    `Log scan: ${result.scannedLines} log lines, ${result.sentValues} sent values looked for; no line breaks the rules.\n`,
  );
}

/**
 * Fails the run when a collected line breaks a rule. Thrown from onTestRunEnd, the error is
 * printed as the run's "Unhandled Error" and the run exits non-zero.
 */
export class LogScanReporter implements Reporter {
  private vitest: Vitest | undefined;

  onInit(vitest: Vitest): void {
    this.vitest = vitest;
  }

  onTestRunEnd(): void {
    for (const directory of logScanDirectories(this.vitest?.projects ?? [])) scanAndMark(directory);
  }
}

function logScanDirectories(projects: readonly TestProject[]): string[] {
  const directories = projects
    .map((project) => project.getProvidedContext().logScanDir)
    .filter((directory) => typeof directory === 'string');
  return [...new Set(directories)].filter((directory) => existsSync(directory));
}

/**
 * The global setup's teardown: the scan, if the reporter did not run it, then the directory goes
 * (kept when the scan failed, for a look at every line). A teardown's error alone does not fail a
 * vitest run (it is only printed), hence the exit code.
 */
export function finishLogScan(directory: string): void {
  const marker = join(directory, SCANNED_MARKER);
  try {
    if (!existsSync(marker)) scanAndMark(directory);
  } catch (error) {
    process.exitCode = 1;
    throw error;
  }
  if (process.env.LOG_SCAN_KEEP) process.stdout.write(`Log scan: the collected lines are kept in ${directory}\n`);
  else if (readFileSync(marker, 'utf8') === 'passed') rmSync(directory, { recursive: true, force: true });
}
