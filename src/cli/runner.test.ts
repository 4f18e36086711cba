import { sql } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { createDatabase, type Database } from '../db/client.js';
import { AppError } from '../shared/app-error.js';
import { createTestDatabase, type TestDatabase } from '../../test/helpers/database.js';
import { fail } from './runner.js';

/** What `fail` writes on stderr, with the process exit it asks for caught. */
function failureText(error: unknown): { text: string; exitCode: unknown } {
  let text = '';
  const write = vi.spyOn(process.stderr, 'write').mockImplementation((chunk: string | Uint8Array) => {
    text += String(chunk);
    return true;
  });
  const exit = vi.spyOn(process, 'exit').mockImplementation(((code?: number) => {
    throw Object.assign(new Error('exit'), { exitCode: code });
  }) as never);
  try {
    fail(error);
  } catch (thrown) {
    return { text, exitCode: (thrown as { exitCode?: unknown }).exitCode };
  } finally {
    write.mockRestore();
    exit.mockRestore();
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

  it('when the service refuses the command, it prints the message meant for the operator', () => {
    const { text, exitCode } = failureText(AppError.validation({ name: ['Required.'] }));
    expect(exitCode).toBe(1);
    expect(text).toContain('name: Required.');
  });
});
