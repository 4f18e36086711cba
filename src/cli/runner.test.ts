import { sql } from 'drizzle-orm';
import { PassThrough, Writable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createDatabase, type Database } from '../db/client.js';
import { AppError } from '../shared/app-error.js';
import { createTestDatabase, type TestDatabase } from '../../test/helpers/database.js';
import { CliExit, createCliRunner } from './runner.js';

/** What `fail` writes on stderr, and the exit code it ends the command with. */
function failureText(error: unknown): { text: string; exitCode: unknown } {
  let text = '';
  const stderr = new Writable({
    write(chunk: Buffer, _encoding, callback) {
      text += chunk.toString();
      callback();
    },
  });
  const cli = createCliRunner({ stdout: new PassThrough(), stderr, env: {} });
  try {
    cli.fail(error);
  } catch (thrown) {
    return { text, exitCode: thrown instanceof CliExit ? thrown.code : undefined };
  }
  return { text, exitCode: undefined };
}

describe('svc failure output', () => {
  let testDatabase: TestDatabase;
  let database: Database;
  beforeAll(async () => {
    testDatabase = await createTestDatabase();
    database = createDatabase(testDatabase.url, { poolSize: 2 });
  });
  afterAll(async () => {
    await database.close();
    await testDatabase.drop();
  });

  it('when a statement fails, it names the SQL state and never prints the statement or its values', async () => {
    const email = 'jane.failure@example.com';
    const error = await database.db.execute(sql`SELECT ${email}::uuid AS id FROM customers`).then(
      () => undefined,
      (thrown: unknown) => thrown,
    );
    expect(error).toBeDefined();
    const { text, exitCode } = failureText(error);
    expect(exitCode).toBe(1);
    expect(text).toMatch(/^error: the database refused the command \(\w+ 22P02\)\n$/);
    expect(text).not.toContain(email);
    expect(text).not.toMatch(/select/i);
  });

  it('when the connection itself is refused (FATAL), it prints the server message: it names no statement or value', async () => {
    const missing = createDatabase(`${testDatabase.url}_missing`, { poolSize: 1 });
    const error = await missing.db.execute(sql`SELECT 1`).then(
      () => undefined,
      (thrown: unknown) => thrown,
    );
    await missing.close();
    const { text, exitCode } = failureText(error);
    expect(exitCode).toBe(1);
    expect(text).toMatch(/^error: the database refused the command \(\w+ 3D000\): database "[a-z0-9_]+_missing" does not exist\n$/);
  });

  it('when a pooler refuses a startup parameter (08P01, FATAL), it prints the pooler message', () => {
    const refused = Object.assign(new Error('unsupported startup parameter: statement_timeout'), { severity: 'FATAL', code: '08P01' });
    const { text } = failureText(refused);
    expect(text).toBe('error: the database refused the command (Error 08P01): unsupported startup parameter: statement_timeout\n');
  });

  it('when the service refuses the command, it prints the message meant for the operator', () => {
    const { text, exitCode } = failureText(AppError.validation({ name: ['Required.'] }));
    expect(exitCode).toBe(1);
    expect(text).toContain('name: Required.');
  });
});
