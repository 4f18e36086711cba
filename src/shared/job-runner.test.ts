import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext } from '../../test/helpers/harness.js';
import { QUEUES, startJobRunner, type JobRunner } from './job-runner.js';

let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

/** Waits until `read` returns something (polling), or fails after `seconds`. */
async function until<T>(read: () => Promise<T | undefined>, seconds = 15): Promise<T> {
  for (const deadline = Date.now() + seconds * 1000; Date.now() < deadline; await new Promise((resolve) => setTimeout(resolve, 50))) {
    const value = await read();
    if (value !== undefined) return value;
  }
  throw new Error(`condition not met within ${seconds} s`);
}

/** The jobs of `queue` in the database, with their state. */
async function jobsOf(queue: string): Promise<Array<{ id: string; state: string }>> {
  return (await ctx.database.query<{ id: string; state: string }>(`SELECT id, state FROM pgboss.job WHERE name = $1`, [queue])).rows;
}

describe('job runner', () => {
  it('when two runners share a database and schedule the retention job, each tick runs it once, not once per runner', async () => {
    const runs: string[] = [];
    const runners: JobRunner[] = [];
    try {
      for (const name of ['first', 'second']) {
        // A cron pass every second, as fast as pg-boss allows, so several passes meet the same tick.
        const runner = await startJobRunner(ctx.database, { cronMonitorIntervalSeconds: 1 });
        runners.push(runner);
        await runner.work(QUEUES.retention.name, {}, async (jobs) => void runs.push(...jobs.map(() => name)));
        // Every minute, where production has RETENTION_SCHEDULE: the test waits for one tick, not ten minutes.
        await runner.schedule(QUEUES.retention.name, '* * * * *');
      }
      await until(async () => (runs.length > 0 ? true : undefined), 75);
      // Every cron pass within the tick's due window finds its occurrence again; let three more pass.
      const cronOn = async () =>
        (await ctx.database.query<{ cron_on: Date }>('SELECT cron_on FROM pgboss.version')).rows[0]!.cron_on.getTime();
      const seen = [await cronOn()];
      await until(async () => {
        const latest = await cronOn();
        if (latest !== seen.at(-1)) seen.push(latest);
        return seen.length > 3 ? true : undefined;
      });

      // The passes may have reached the next minute's tick too: what must hold is one job per tick, run once.
      const ticks = (
        await ctx.database.query<{ tick: string; jobs: number }>(
          `SELECT date_trunc('minute', created_on)::text AS tick, count(*)::int AS jobs FROM pgboss.job WHERE name = $1 GROUP BY 1`,
          [QUEUES.retention.name],
        )
      ).rows;
      expect(ticks.every((tick) => tick.jobs === 1)).toBe(true);
      expect(runs).toHaveLength(ticks.length);
    } finally {
      for (const runner of runners) await runner.stop();
    }
  }, 120_000);

  it('when the runner is stopped while a job is in flight, stop waits for the job to finish, and the job completes', async () => {
    const runner = await startJobRunner(ctx.database, { schedule: false });
    const events: string[] = [];
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let started!: () => void;
    const inFlight = new Promise<void>((resolve) => (started = resolve));
    await runner.work(QUEUES.documentRequestExpiry.name, {}, async () => {
      started();
      await held;
      events.push('job finished');
    });
    await runner.send(ctx.database.db, QUEUES.documentRequestExpiry.name, {});
    await inFlight;

    const stopping = runner.stop().then(() => events.push('runner stopped'));
    // Stopping has begun and the job is still running: its row says so.
    expect((await jobsOf(QUEUES.documentRequestExpiry.name)).map((job) => job.state)).toEqual(['active']);
    expect(events).toEqual([]);
    release();
    await stopping;

    expect(events).toEqual(['job finished', 'runner stopped']);
    expect((await jobsOf(QUEUES.documentRequestExpiry.name)).map((job) => job.state)).toEqual(['completed']);
  });

  it("when a job is sent in a transaction, this process's worker takes it once the transaction commits, without waiting for its poll; a rollback sends nothing", async () => {
    // Polling once a minute: a job taken within the test was taken on the wake after its commit.
    const runner = await startJobRunner(ctx.database, { schedule: false, pollingIntervalSeconds: 60 });
    const taken: string[] = [];
    try {
      await runner.work<{ n: string }>(
        QUEUES.documentRequestExpiry.name,
        {},
        async (jobs) => void taken.push(...jobs.map((job) => job.data.n)),
      );
      await new Promise((resolve) => setTimeout(resolve, 300)); // past the worker's first (empty) poll
      await expect(
        ctx.database.transaction(async (tx) => {
          await runner.send(tx, QUEUES.documentRequestExpiry.name, { n: 'rolled back' });
          throw new Error('the change failed');
        }),
      ).rejects.toThrow('the change failed');
      await ctx.database.transaction((tx) => runner.send(tx, QUEUES.documentRequestExpiry.name, { n: 'committed' }));
      await until(async () => (taken.length > 0 ? true : undefined), 10);
      expect(taken).toEqual(['committed']);
    } finally {
      await runner.stop();
    }
  });
});
