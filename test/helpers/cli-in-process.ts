import { Writable } from 'node:stream';
import { runCliOutcome } from '../../src/cli/program.js';
import { collectProcessOutput } from './log-collector.js';
import type { SvcEnv, SvcResult } from './svc-process.js';

/** A stream that keeps what is written to it as text. */
function textSink(): Writable & { text(): string } {
  const chunks: Buffer[] = [];
  const sink = new Writable({
    write(chunk: Buffer | string, _encoding, callback) {
      chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk));
      callback();
    },
  });
  return Object.assign(sink, { text: () => Buffer.concat(chunks).toString('utf8') });
}

/**
 * Runs one `svc` command in this process, as `bin/svc.js` would in its own: the same program, with its
 * stdout and stderr captured and the environment a spawned `svc` gets from `runSvc` (PATH, HOME,
 * LOG_LEVEL=debug and `env`; never this process's DATABASE_URL). Its log lines join the run's log scan.
 * A test spawns `svc` only where the process itself is the subject (exit on signals, the README's
 * first start, `bin/svc.js`).
 */
export async function runSvcInProcess(args: string[], env: SvcEnv = {}): Promise<SvcResult> {
  const environment: NodeJS.ProcessEnv = { PATH: process.env.PATH, HOME: process.env.HOME, LOG_LEVEL: 'debug', HOST: '127.0.0.1' };
  for (const [name, value] of Object.entries(env)) {
    if (value === undefined) delete environment[name];
    else environment[name] = value;
  }
  const stdout = textSink();
  const stderr = textSink();
  const { code } = await runCliOutcome(args, { stdout, stderr, env: environment });
  collectProcessOutput(stderr.text());
  return { code, stdout: stdout.text(), stderr: stderr.text() };
}
