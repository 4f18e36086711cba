import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { loadConfig, type Config } from '../../src/config/config.js';
import { buildApp } from '../../src/app.js';
import { createDatabase, type Database } from '../../src/db/client.js';
import type { DataAccess } from '../../src/db/client.js';
import type { JobQueue } from '../../src/shared/job-runner.js';
import { createServices, type ServiceDeps, type Services } from '../../src/services.js';
import { FEATURES, type Feature, type Payer } from '../../src/modules/organisations/organisations.schemas.js';
import { SCOPES } from '../../src/shared/scopes.js';
import { createTestDatabase } from './database.js';
import { collectingLoggerOptions, recordSent } from './log-collector.js';
import { MultipartBody } from './multipart.js';
import { createTextSealer, type TextSealer } from '../../src/shared/text-sealer.js';

export const ALL_SCOPES = [...SCOPES];

export type TestOrg = { id: string; key: string; keyId: string };

export type RequestOptions = {
  key?: string | null;
  body?: unknown;
  headers?: Record<string, string>;
  query?: Record<string, string>;
  remoteAddress?: string;
};

export type TestContext = {
  app: FastifyInstance;
  database: Database;
  databaseUrl: string;
  config: Config;
  /** A second app instance on the same database, as a second server behind a load balancer would be. */
  buildInstance(overrides?: Partial<Config>): Promise<FastifyInstance>;
  createOrg(options?: { features?: Feature[]; credits?: number; defaultPayer?: Payer; scopes?: string[] }): Promise<TestOrg>;
  createKey(
    orgId: string,
    options?: { scopes?: string[]; expiresAt?: Date; allowIps?: string[]; burstLimit?: number; dailyLimit?: number },
  ): Promise<{ id: string; key: string }>;
  request(method: string, url: string, options?: RequestOptions, app?: FastifyInstance): Promise<LightMyRequestResponse>;
  close(): Promise<void>;
};

/** The link encryption key of every test app (LINK_ENCRYPTION_KEY), so a test can open what its app sealed. */
export const TEST_LINK_ENCRYPTION_KEY = '5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed';

/** Opens (and seals) link-bearing text as the test apps do. */
export function testLinkSealer(): TextSealer {
  return createTextSealer(Buffer.from(TEST_LINK_ENCRYPTION_KEY, 'hex'));
}

export function testConfig(overrides: Partial<Config> = {}): Config {
  return {
    ...loadConfig({
      LINK_ENCRYPTION_KEY: TEST_LINK_ENCRYPTION_KEY,
      LOG_LEVEL: 'silent',
      PUBLIC_BASE_URL: 'https://app.example.test',
      RATE_LIMIT_BURST: '10000',
      RATE_LIMIT_DAILY: '1000000',
      UPLOAD_PAGE_RATE_LIMIT_PER_IP: '100000',
      UPLOAD_PAGE_RATE_LIMIT_PER_LINK: '100000',
    }),
    ...overrides,
  };
}

const NO_JOBS: JobQueue = {
  send() {
    return Promise.reject(new Error('these services were built without a job queue: pass `jobs`'));
  },
};

/**
 * The composition root's services on `database`, built as a test app builds them (its config, with
 * `config` over it, and its link key); `jobs` is needed only by writes that send a job (emails).
 */
export function testServices(
  database: DataAccess,
  overrides: Partial<Omit<ServiceDeps, 'config'>> & { config?: Partial<Config> } = {},
): Services {
  const { config, ...deps } = overrides;
  return createServices({ config: testConfig(config), database, sealer: testLinkSealer(), jobs: NO_JOBS, ...deps });
}

/** A real app on a real, fresh Postgres database of this test file's own. */
export async function createTestContext(overrides: Partial<Config> = {}): Promise<TestContext> {
  const testDatabase = await createTestDatabase();
  const config = testConfig({ ...overrides, databaseUrl: testDatabase.url });
  const database = createDatabase(testDatabase.url, { poolSize: 20 });
  const instances: FastifyInstance[] = [];
  const instanceDatabases: Database[] = [];

  const build = async (instanceOverrides: Partial<Config> = {}, db: Database = database) => {
    // Logs at debug level into the run's log scan (helpers/log-scan.ts); TEST_LOGS=1 shows them too.
    const instance = await buildApp({
      config: { ...config, ...instanceOverrides },
      database: db,
      logger: collectingLoggerOptions(),
      validateResponses: true,
    });
    // What the app received, however a test sent it (ctx.request or app.inject): the scan looks for it in the logs.
    instance.addHook('onResponse', (request, _reply, done) => {
      recordSent(request.body, request.query);
      done();
    });
    await instance.ready();
    instances.push(instance);
    return instance;
  };
  const app = await build();
  const { organisations, apiKeys: keys } = testServices(database);

  const context: TestContext = {
    app,
    database,
    databaseUrl: testDatabase.url,
    config,
    async buildInstance(instanceOverrides = {}) {
      const own = createDatabase(testDatabase.url, { poolSize: 20 });
      instanceDatabases.push(own);
      return build(instanceOverrides, own);
    },
    async createOrg(options = {}) {
      const org = await organisations.create({
        name: `Org ${Math.random().toString(36).slice(2, 8)}`,
        features: options.features ?? [...FEATURES],
        credits: options.credits ?? 100,
        defaultPayer: options.defaultPayer ?? 'organization',
      });
      const key = await keys.create({ orgId: org.id, scopes: options.scopes ?? ALL_SCOPES });
      return { id: org.id, key: key.key, keyId: key.id };
    },
    async createKey(orgId, options = {}) {
      const key = await keys.create({ orgId, scopes: options.scopes ?? ALL_SCOPES, ...options });
      return { id: key.id, key: key.key };
    },
    async request(method, url, options = {}, target = app) {
      // Recorded here too: an app of a test's own does not record, nor does any app a body it refuses unparsed.
      const form = options.body instanceof MultipartBody ? options.body : undefined;
      recordSent(form ? undefined : options.body, options.query, Object.fromEntries(new URL(url, 'http://test.invalid').searchParams));
      const headers: Record<string, string> = { ...(form ? { 'content-type': form.contentType } : {}), ...(options.headers ?? {}) };
      if (options.key) headers.authorization = `Bearer ${options.key}`;
      return target.inject({
        method: method as 'GET',
        url,
        query: options.query,
        headers,
        remoteAddress: options.remoteAddress,
        ...(form ? { payload: form.payload } : options.body !== undefined ? { payload: options.body as object } : {}),
      });
    },
    async close() {
      for (const instance of instances) await instance.close();
      for (const db of instanceDatabases) await db.close();
      await database.close();
      await testDatabase.drop();
    },
  };
  return context;
}
