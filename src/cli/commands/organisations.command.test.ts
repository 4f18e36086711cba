import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { createTestContext, type TestContext } from '../../../test/helpers/harness.js';
import { runSvcInProcess } from '../../../test/helpers/cli-in-process.js';

// The svc commands run in this process (runSvcInProcess).
vi.setConfig({ testTimeout: 60_000 });

let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

const svc = (args: string[]) => runSvcInProcess(args, { DATABASE_URL: ctx.databaseUrl });

describe('svc org list', () => {
  it('when the database has no organisation, it prints an empty JSON array and exits 0', async () => {
    const result = await svc(['org', 'list']);
    expect(result.code, result.stderr).toBe(0);
    expect(JSON.parse(result.stdout)).toEqual([]);
  });

  it('when organisations exist, it prints one JSON array of them, oldest first, each as org show prints it', async () => {
    const first = await ctx.createOrg();
    const second = await ctx.createOrg({ features: [], credits: 0 });

    const result = await svc(['org', 'list']);
    expect(result.code, result.stderr).toBe(0);
    const listed = JSON.parse(result.stdout) as Array<{ id: string }>;
    expect(listed.map((organisation) => organisation.id)).toEqual([first.id, second.id]);
    for (const organisation of listed) {
      const shown = await svc(['org', 'show', organisation.id]);
      expect(shown.code, shown.stderr).toBe(0);
      expect(organisation).toEqual(JSON.parse(shown.stdout));
    }
  });
});
