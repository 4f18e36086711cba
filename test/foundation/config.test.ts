import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it, vi } from 'vitest';
import { ConfigError, loadConfig } from '../../src/config/config.js';
import { PROJECT_ROOT } from '../helpers/svc-process.js';
import { runSvcInProcess } from '../helpers/cli-in-process.js';

// The svc commands run in this process (runSvcInProcess).
vi.setConfig({ testTimeout: 120_000 });

const BAD_VALUES: Array<[variable: string, value: string, problem: RegExp]> = [
  ['PORT', 'abc', /port number/],
  ['PORT', '70000', /at most 65535/],
  ['PORT', '80.5', /port number|whole number/],
  ['DATABASE_URL', 'mysql://x', /postgres:\/\//],
  ['LOG_LEVEL', 'loud', /one of/],
  ['TRUST_PROXY', 'true', /never a blanket/],
  ['TRUST_PROXY', '*', /never a blanket/],
  ['TRUST_PROXY', 'not-an-ip', /not an IP address/],
  ['TRUST_PROXY', '10.0.0.0/99', /not an IP address/],
  ['RATE_LIMIT_BURST', '0', /greater than zero/],
  ['RATE_LIMIT_DAILY', '-5', /greater than zero/],
  ['RATE_LIMIT_BURST', '2.5', /whole number/],
  ['UPLOAD_PAGE_RATE_LIMIT_PER_IP', '0', /greater than zero/],
  ['UPLOAD_PAGE_RATE_LIMIT_PER_LINK', 'lots', /whole number/],
  ['WEBHOOK_WORKER', 'maybe', /one of/],
  ['IMPORT_WORKER', 'later', /one of/],
  ['WEBHOOK_ALLOW_PRIVATE_URLS', 'sure', /one of/],
  ['PUBLIC_BASE_URL', 'nope', /http\(s\) URL/],
  ['PUBLIC_BASE_URL', 'ftp://files.example.com', /http\(s\) URL/],
  ['SMTP_URL', 'http://mail.example.com', /smtp:\/\//],
  ['DATABASE_POOL_SIZE', 'many', /whole number/],
  ['WEBHOOK_ALLOWED_PORTS', '8443,abc', /"abc" is not a port number/],
  ['WEBHOOK_ALLOWED_PORTS', '0', /"0" is not a port number \(1-65535\)/],
  ['WEBHOOK_ALLOWED_PORTS', '70000', /"70000" is not a port number/],
  ['WEBHOOK_ALLOWED_PORTS', '8443;9443', /comma-separated/],
  ['WEBHOOK_DISABLE_AFTER_HOURS', 'soon', /whole number of hours/],
  ['WEBHOOK_DISABLE_AFTER_HOURS', '1.5', /whole number of hours/],
  ['WEBHOOK_DISABLE_AFTER_HOURS', '0', /at least 1 hour/],
  ['WEBHOOK_DISABLE_AFTER_HOURS', '8761', /at most 8760 hours/],
  ['METRICS_PORT', 'abc', /port number/],
  ['METRICS_PORT', '70000', /at most 65535/],
  ['METRICS_PORT', '8080', /must differ from PORT \(8080\)/],
  ['LINK_ENCRYPTION_KEY', 'short', /32 bytes/],
  ['LINK_ENCRYPTION_KEY', 'ab'.repeat(31), /32 bytes/],
];

function configErrorFor(environment: NodeJS.ProcessEnv): ConfigError {
  try {
    loadConfig(environment);
  } catch (error) {
    if (error instanceof ConfigError) return error;
    throw error;
  }
  throw new Error(`expected a ConfigError for ${JSON.stringify(environment)}`);
}

describe('configuration from the environment', () => {
  it.each(BAD_VALUES)('when %s=%s, it throws a ConfigError naming the variable and the problem', (variable, value, problem) => {
    const error = configErrorFor({ [variable]: value });
    expect(error.problems).toHaveLength(1);
    expect(error.problems[0]).toMatch(new RegExp(`^${variable}: `));
    expect(error.problems[0]).toMatch(problem);
    expect(error.message).toContain(variable);
  });

  it('when several variables are bad, it names every one of them', () => {
    const error = configErrorFor({ PORT: 'abc', LOG_LEVEL: 'loud', WEBHOOK_WORKER: 'maybe' });
    expect(error.problems.map((problem) => problem.split(':')[0]).sort()).toEqual(['LOG_LEVEL', 'PORT', 'WEBHOOK_WORKER']);
  });

  it('when nothing is set, it uses the documented defaults', () => {
    // toMatchObject: variables added by other modules bring their own default tests.
    expect(loadConfig({})).toMatchObject({
      port: 8080,
      host: '127.0.0.1',
      databaseUrl: undefined,
      dataDir: './data',
      logLevel: 'info',
      publicBaseUrl: 'http://localhost:8080',
      trustProxy: [],
      rateLimit: { burst: 25, daily: 100_000 },
      uploadPageRateLimit: { perIp: 60, perLink: 20 },
      smtpUrl: undefined,
      smtpFrom: 'Verification <no-reply@verification.local>',
      webhookWorker: true,
      importWorker: true,
      webhookAllowPrivateUrls: false,
      webhookAllowedPorts: [],
      webhookDisableAfterHours: 72,
      metricsPort: undefined,
      databasePoolSize: 10,
    });
  });

  it('when no database timeout is set, every connection gets the documented defaults, the query timeout a second past the statement timeout', () => {
    expect(loadConfig({}).database).toEqual({
      poolSize: 10,
      statementTimeoutMs: 10_000,
      lockTimeoutMs: 3_000,
      idleInTransactionTimeoutMs: 10_000,
      queryTimeoutMs: 11_000,
      connectTimeoutMs: 3_000,
      preparedStatements: true,
    });
    expect(loadConfig({ DATABASE_STATEMENT_TIMEOUT_MS: '20000', DATABASE_PREPARED_STATEMENTS: 'false' }).database).toMatchObject({
      queryTimeoutMs: 21_000,
      preparedStatements: false,
    });
  });

  it('when the client query timeout does not exceed the statement timeout, or the lock timeout is half of it or more, it names the variable', () => {
    expect(
      configErrorFor({ DATABASE_STATEMENT_TIMEOUT_MS: '5000', DATABASE_LOCK_TIMEOUT_MS: '2000', DATABASE_QUERY_TIMEOUT_MS: '5000' })
        .problems[0],
    ).toMatch(/^DATABASE_QUERY_TIMEOUT_MS: must be greater than/);
    expect(configErrorFor({ DATABASE_STATEMENT_TIMEOUT_MS: '5000', DATABASE_LOCK_TIMEOUT_MS: '2500' }).problems[0]).toMatch(
      /^DATABASE_LOCK_TIMEOUT_MS: must be less than half/,
    );
    expect(configErrorFor({ DATABASE_CONNECT_TIMEOUT_MS: '0' }).problems[0]).toMatch(/^DATABASE_CONNECT_TIMEOUT_MS:/);
  });

  it('when no request timeout is set, a request has 300 s to arrive and its body may pause 30 s; an idle bound over the request timeout names the variable', () => {
    expect(loadConfig({}).requestTimeouts).toEqual({ requestTimeoutMs: 300_000, bodyIdleTimeoutMs: 30_000 });
    expect(loadConfig({ REQUEST_TIMEOUT_MS: '120000', REQUEST_BODY_IDLE_TIMEOUT_MS: '10000' }).requestTimeouts).toEqual({
      requestTimeoutMs: 120_000,
      bodyIdleTimeoutMs: 10_000,
    });
    expect(configErrorFor({ REQUEST_TIMEOUT_MS: '20000' }).problems).toEqual([
      'REQUEST_BODY_IDLE_TIMEOUT_MS: must be at most REQUEST_TIMEOUT_MS (20000)',
    ]);
    expect(configErrorFor({ REQUEST_TIMEOUT_MS: '0' }).problems[0]).toMatch(/^REQUEST_TIMEOUT_MS: must be greater than zero/);
    expect(configErrorFor({ REQUEST_BODY_IDLE_TIMEOUT_MS: 'soon' }).problems[0]).toMatch(
      /^REQUEST_BODY_IDLE_TIMEOUT_MS: must be a whole number/,
    );
  });

  it('when a variable is set but empty, it is treated as unset', () => {
    const config = loadConfig({ PORT: '', DATABASE_URL: '', RATE_LIMIT_BURST: ' ', HOST: '' });
    expect(config.port).toBe(8080);
    expect(config.databaseUrl).toBeUndefined();
    expect(config.rateLimit.burst).toBe(25);
    expect(config.host).toBe('127.0.0.1');
  });

  it('when valid values are given, it parses them into the typed config', () => {
    const config = loadConfig({
      PORT: '0',
      DATABASE_URL: 'postgresql://app@db.internal:5432/verification',
      LOG_LEVEL: 'warn',
      TRUST_PROXY: '10.0.0.1, 192.168.0.0/16,2001:db8::/32',
      RATE_LIMIT_BURST: '5',
      RATE_LIMIT_DAILY: '1000',
      WEBHOOK_WORKER: 'off',
      IMPORT_WORKER: 'off',
      PUBLIC_BASE_URL: 'https://verify.example.com/',
      SMTP_URL: 'smtps://user:pass@mail.example.com',
      WEBHOOK_DISABLE_AFTER_HOURS: '168',
    });
    expect(config).toMatchObject({
      port: 0,
      databaseUrl: 'postgresql://app@db.internal:5432/verification',
      logLevel: 'warn',
      trustProxy: ['10.0.0.1', '192.168.0.0/16', '2001:db8::/32'],
      rateLimit: { burst: 5, daily: 1000 },
      webhookWorker: false,
      importWorker: false,
      publicBaseUrl: 'https://verify.example.com',
      smtpUrl: 'smtps://user:pass@mail.example.com',
      webhookDisableAfterHours: 168,
    });
  });

  it('when WEBHOOK_ALLOW_PRIVATE_URLS is unset, private webhook targets are blocked on the embedded database and on DATABASE_URL alike', () => {
    expect(loadConfig({}).webhookAllowPrivateUrls).toBe(false);
    expect(loadConfig({ DATABASE_URL: 'postgres://x@h/db' }).webhookAllowPrivateUrls).toBe(false);
    expect(loadConfig({ WEBHOOK_ALLOW_PRIVATE_URLS: 'true' }).webhookAllowPrivateUrls).toBe(true);
    expect(loadConfig({ DATABASE_URL: 'postgres://x@h/db', WEBHOOK_ALLOW_PRIVATE_URLS: 'yes' }).webhookAllowPrivateUrls).toBe(true);
    expect(loadConfig({ WEBHOOK_ALLOW_PRIVATE_URLS: 'false' }).webhookAllowPrivateUrls).toBe(false);
  });

  it('when WEBHOOK_ALLOWED_PORTS lists ports, they are parsed once each, spaces and empty items ignored', () => {
    expect(loadConfig({ WEBHOOK_ALLOWED_PORTS: ' 8443, 9443,,8443 ' }).webhookAllowedPorts).toEqual([8443, 9443]);
    expect(loadConfig({ WEBHOOK_ALLOWED_PORTS: '1,65535' }).webhookAllowedPorts).toEqual([1, 65535]);
  });

  it('when HOST is unset, it listens on loopback only, embedded database or DATABASE_URL; HOST=0.0.0.0 listens on every interface', () => {
    expect(loadConfig({}).host).toBe('127.0.0.1');
    expect(loadConfig({ DATABASE_URL: 'postgres://x@h/db' }).host).toBe('127.0.0.1');
    expect(loadConfig({ HOST: '0.0.0.0' }).host).toBe('0.0.0.0');
  });

  it('when the container image runs, it sets HOST=0.0.0.0 itself, in the stage that runs the service', () => {
    const dockerfile = readFileSync(join(PROJECT_ROOT, 'Dockerfile'), 'utf8');
    const runtimeStage = dockerfile.slice(dockerfile.lastIndexOf('\nFROM '));
    // An ENV instruction, its continuation lines included.
    const environment = [...runtimeStage.matchAll(/^ENV\s((?:.*\\\n)*.*)$/gm)].map((match) => match[1]!).join(' ');
    expect(environment).toMatch(/(?:^|\s)HOST=0\.0\.0\.0(?:\s|\\|$)/);
  });

  it("when METRICS_PORT is set, it is the metrics listener's port; 0 picks a free one even beside PORT=0", () => {
    expect(loadConfig({ METRICS_PORT: '9464' }).metricsPort).toBe(9464);
    expect(loadConfig({ PORT: '0', METRICS_PORT: '0' })).toMatchObject({ port: 0, metricsPort: 0 });
    expect(loadConfig({ PORT: '3000', METRICS_PORT: '8080' }).metricsPort).toBe(8080);
  });
});

describe('svc serve with a bad configuration', () => {
  it.each([
    ['PORT', 'abc'],
    ['DATABASE_URL', 'mysql://x'],
    ['TRUST_PROXY', 'true'],
  ])('when %s=%s, it exits non-zero naming the variable on stderr and printing nothing on stdout', async (variable, value) => {
    const result = await runSvcInProcess(['serve'], { DATABASE_URL: 'postgres://nobody@127.0.0.1:1/none', [variable]: value });
    expect(result.code).not.toBe(0);
    expect(result.code).not.toBeNull();
    expect(result.stderr).toContain(`${variable}: `);
    expect(result.stdout).toBe('');
  });
});
