import { z } from 'zod';

/**
 * Every date and date-time the service accepts lies in years 0001 to 9999. PostgreSQL refuses year
 * 0000 (there is no year zero in its calendar) and ISO 8601 needs a sign and six digits past 9999,
 * which neither JSON clients nor PostgreSQL's input parser expect; so a value outside this range
 * would reach SQL and fail there as a 500 instead of a 422 naming the field.
 */
export const EARLIEST_INSTANT = new Date('0001-01-01T00:00:00.000Z');
const LATEST_INSTANT = new Date('9999-12-31T23:59:59.999Z');

const CALENDAR_DATE_FORMAT_MESSAGE = 'Must be a date in the form yyyy-mm-dd.';
const CALENDAR_DATE_RANGE_MESSAGE = 'Must be a date from 0001-01-01 to 9999-12-31.';
const DATE_TIME_FORMAT_MESSAGE = 'Must be an ISO 8601 date-time, e.g. 2026-01-31T09:00:00Z.';
// An offset can move an instant across a year boundary (9999-12-31T23:59:59-14:00 is in year 10000
// in UTC), so both the year as written and the instant in UTC are bounded.
const DATE_TIME_RANGE_MESSAGE =
  'Must lie between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59.999Z, both as written and once converted to UTC.';

/** Whether an instant lies in the service's date range (false for an invalid Date). */
export function isWithinDateBounds(instant: Date): boolean {
  const time = instant.getTime();
  return time >= EARLIEST_INSTANT.getTime() && time <= LATEST_INSTANT.getTime();
}

/**
 * Why a date-time written as `written` (starting with a four-digit year) and read as `instant` is
 * refused, or undefined when it is in range. Shared by the request schemas and the operator CLI.
 */
export function dateTimeRangeProblem(written: string, instant: Date): string | undefined {
  if (Number.isNaN(instant.getTime())) return DATE_TIME_FORMAT_MESSAGE;
  if (written.startsWith('0000') || !isWithinDateBounds(instant)) return DATE_TIME_RANGE_MESSAGE;
  return undefined;
}

/**
 * yyyy-mm-dd, a real calendar date (2026-02-30 and 2023-02-29 are refused) in years 0001 to 9999.
 * The output is the same string: date columns store it as written, with no JS Date in between
 * (a JS Date would need care for years 0 to 99, which Date.UTC maps to 1900 onwards).
 */
export function calendarDateSchema() {
  return z.iso.date({ error: CALENDAR_DATE_FORMAT_MESSAGE }).transform((value, context) => {
    // The format check admits 0000 (and its 02-29); five-digit years never pass it.
    if (value.startsWith('0000')) {
      context.issues.push({ code: 'custom', message: CALENDAR_DATE_RANGE_MESSAGE, input: value });
      return z.NEVER;
    }
    return value;
  });
}

/**
 * An ISO 8601 date-time with seconds and a Z or ±hh:mm offset, as a Date within years 0001 to
 * 9999 (see DATE_TIME_RANGE_MESSAGE). The transform runs only once the format check has passed.
 */
export function dateTimeSchema() {
  return z.iso.datetime({ offset: true, error: DATE_TIME_FORMAT_MESSAGE }).transform((value, context) => {
    const instant = new Date(value);
    const problem = dateTimeRangeProblem(value, instant);
    if (problem) {
      context.issues.push({ code: 'custom', message: problem, input: value });
      return z.NEVER;
    }
    return instant;
  });
}
