import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from '../../src/config/config.js';
import { createDatabase } from '../../src/db/client.js';
import { startBackgroundJobs } from '../../src/jobs.js';
import { createAuditChainSealer } from '../../src/modules/audit/audit-chain.sealer.js';
import { createTestContext, type TestContext } from '../helpers/harness.js';

let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => {
  await ctx?.close();
});

async function sequences(orgId: string): Promise<Array<number | null>> {
  const { rows } = await ctx.database.pool.query<{ sequence: string | null }>(
    'SELECT sequence FROM audit_log WHERE org_id = $1 ORDER BY id',
    [orgId],
  );
  return rows.map((row) => (row.sequence === null ? null : Number(row.sequence)));
}

/** The warnings a logger received, for startBackgroundJobs (which takes a pino logger). */
function recordingLogger() {
  const warnings: string[] = [];
  const logger = {
    warn: (...args: unknown[]) => void warnings.push(args.map((arg) => (typeof arg === 'string' ? arg : '')).join(' ')),
    info: () => {},
    error: () => {},
    debug: () => {},
    child: () => logger,
  };
  return { logger: logger as unknown as Parameters<typeof startBackgroundJobs>[0]['logger'], warnings };
}

describe('AUDIT_SEALING (a diagnostic switch)', () => {
  it('when AUDIT_SEALING is unset, sealing is on; off turns it off; any other value is named as a configuration error', () => {
    expect(loadConfig({}).auditSealing).toBe(true);
    expect(loadConfig({ AUDIT_SEALING: 'off' }).auditSealing).toBe(false);
    expect(loadConfig({ AUDIT_SEALING: 'on' }).auditSealing).toBe(true);
    expect(() => loadConfig({ AUDIT_SEALING: 'later' })).toThrow(ConfigError);
    try {
      loadConfig({ AUDIT_SEALING: 'later' });
    } catch (error) {
      expect((error as ConfigError).problems).toEqual([expect.stringMatching(/^AUDIT_SEALING: must be one of/)]);
    }
  });

  it('when an instance runs with AUDIT_SEALING=off, it seals nothing and says so; an instance with sealing on then chains the rows it left', async () => {
    const database = createDatabase(ctx.databaseUrl, { poolSize: 3 });
    const { logger, warnings } = recordingLogger();
    const jobs = await startBackgroundJobs({ config: { ...ctx.config, auditSealing: false }, database, logger, webhookWorker: false });
    const org = await ctx.createOrg();
    try {
      for (const n of [1, 2]) {
        const created = await ctx.request('POST', '/v1/customers', {
          key: org.key,
          body: { fullName: `Person ${n}`, email: `p${n}@example.com` },
        });
        expect(created.statusCode, created.body).toBe(201);
      }
      // Well past the sealer's 1 s poll and its wake after a commit: a running sealer would have sealed both.
      await new Promise((resolve) => setTimeout(resolve, 2_500));
      // Every row of the organisation (its creation's too), not only the customers'.
      const left = await sequences(org.id);
      expect(left.length).toBeGreaterThanOrEqual(2);
      expect(left.every((sequence) => sequence === null)).toBe(true);
      expect(warnings.some((warning) => /AUDIT_SEALING=off/.test(warning))).toBe(true);
    } finally {
      await jobs.stop();
      await database.close();
    }
    const sealer = createAuditChainSealer({ database: ctx.database, pollIntervalMs: 60_000 });
    try {
      await sealer.sealOnce();
    } finally {
      await sealer.stop();
    }
    const sealed = await sequences(org.id);
    expect(sealed).toEqual(sealed.map((_, index) => index + 1));
  });
});
