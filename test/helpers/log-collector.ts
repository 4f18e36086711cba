import { appendFileSync } from 'node:fs';
import { basename, join } from 'node:path';
import type { FastifyServerOptions } from 'fastify';
import pino, { type DestinationStream } from 'pino';
import { expect, inject } from 'vitest';
import { loggerOptions } from '../../src/shared/logging.js';
import { LOG_FILE_SUFFIX, SENT_FILE_SUFFIX } from './log-scan.js';

/*
 * The worker side of the log scan (log-scan.ts): every log line the tests make the service write,
 * at debug level, goes to a file of this test file's own in the run's directory, and so does every
 * personal value the tests send; the scan reads them all when the run ends.
 */

/** This test file's name in the run's directory: which file a leak came from, and no clash between workers. */
function fileStem(): string {
  const testPath = expect.getState().testPath;
  const name = testPath ? basename(testPath).replace(/[^\w.-]/g, '_') : 'worker';
  return `${name}-${process.pid}`;
}

let destination: DestinationStream | undefined;

/**
 * The collector: sync writes, so every line is on disk when its test ends (the scan runs right
 * after the last one) and none is lost when a worker exits. One per test file (vitest loads this
 * module anew for each), shared by every app it builds.
 */
function collector(): DestinationStream {
  destination ??= pino.destination({ dest: join(inject('logScanDir'), `${fileStem()}${LOG_FILE_SUFFIX}`), sync: true, append: true });
  return destination;
}

/**
 * Logger options for an app the harness builds: the service's own (serializers, redaction, request
 * context) at debug level, the most the service ever writes, into the collector; with TEST_LOGS=1
 * also on stderr.
 */
export function collectingLoggerOptions(): NonNullable<FastifyServerOptions['logger']> {
  const options = loggerOptions({ logLevel: 'debug' });
  const stream = process.env.TEST_LOGS
    ? pino.multistream([
        { level: 'debug', stream: collector() },
        { level: 'debug', stream: process.stderr },
      ])
    : collector();
  return { ...options, stream };
}

/** A stream for a test's own logger: each line goes to the collector as well as to `sink`. */
export function collectInto(sink: { write(line: string): void }): { write(line: string): void } {
  return {
    write(chunk: string) {
      collector().write(chunk);
      sink.write(chunk);
    },
  };
}

/** Log lines another process wrote (a spawned `svc`): its JSON lines join the collector, anything else (CLI messages) does not. */
export function collectProcessOutput(output: string): void {
  const lines = output.split('\n').filter((line) => line.startsWith('{') && line.includes('"level":'));
  if (lines.length > 0) collector().write(`${lines.join('\n')}\n`);
}

/**
 * Keys whose string values are personal data (compared lower-cased), at any depth of a body or
 * query: a customer's, a contact's, a representative's or a beneficial owner's name, email, phone.
 */
const PERSONAL_KEYS = new Set(
  [
    'email',
    'emails',
    'fullName',
    'full_name',
    'name',
    'firstName',
    'first_name',
    'middleName',
    'middle_name',
    'lastName',
    'last_name',
    'phone',
    'legalName',
    'legal_name',
    'businessName',
    'business_name',
    'recipient',
    'to',
  ].map((key) => key.toLowerCase()),
);

const recorded = new Set<string>();

function record(value: string): void {
  if (recorded.has(value)) return;
  recorded.add(value);
  appendFileSync(join(inject('logScanDir'), `${fileStem()}${SENT_FILE_SUFFIX}`), `${JSON.stringify(value)}\n`);
}

function walk(value: unknown, personal: boolean, depth: number): void {
  if (depth > 12) return;
  if (typeof value === 'string') {
    if (personal) record(value);
    return;
  }
  if (value === null || typeof value !== 'object') return;
  if (Array.isArray(value)) {
    for (const item of value) walk(item, personal, depth + 1);
    return;
  }
  for (const [key, item] of Object.entries(value)) walk(item, PERSONAL_KEYS.has(key.toLowerCase()), depth + 1);
}

/**
 * Records the personal values in what a test sent (a body, a query): names, emails and phones at
 * any depth. Which of them count is the scan's decision (see sentValuesToLookFor in log-scan.ts).
 */
export function recordSent(...values: unknown[]): void {
  for (const value of values) {
    if (typeof value === 'string') {
      // A body sent as text: JSON when it parses, otherwise nothing to walk.
      try {
        walk(JSON.parse(value), false, 0);
      } catch {
        // not JSON
      }
    } else walk(value, false, 0);
  }
}
