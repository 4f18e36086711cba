import { InvalidArgumentError } from 'commander';
import { userInfo } from 'node:os';
import type { Writable } from 'node:stream';
import { createLogger, serializeError } from '../shared/logging.js';
import { loadConfig, type Config } from '../config/config.js';
import type { Database } from '../db/client.js';
import { connect } from '../db/connect.js';
import { isAppError } from '../shared/app-error.js';
import { connectionLevelMessage, isDatabaseError } from '../shared/database-errors.js';
import type { Actor } from '../shared/actor.js';
import { lazyJobQueue } from '../shared/job-runner.js';
import { lazyLinkSealer } from '../shared/text-sealer.js';
import { createServices, type Services } from '../services.js';

export type CommandContext = { config: Config; database: Database; services: Services; actor: Actor };

/**
 * Where a command reads its environment and writes its output: the process's own in `bin/svc.js`, or
 * buffers when a test runs the CLI in-process. A stream is all a command writes to (the audit export
 * streams its data), with `isTTY` when it is a terminal.
 */
export type CliIo = {
  stdout: Writable & { isTTY?: boolean };
  stderr: Writable & { isTTY?: boolean; columns?: number };
  env: NodeJS.ProcessEnv;
};

/** Thrown by `fail` to end the command with an exit code: the caller of the program turns it into the process's. */
export class CliExit extends Error {
  constructor(readonly code: number) {
    super(`svc exited with code ${code}`);
  }
}

/** How a command runs, when not as every other: */
export type CommandOptions<T> = {
  /**
   * A result that can be a finding rather than a failure (`svc audit verify` finding a broken chain):
   * the command still prints its one document on stdout, and this turns it into the process's exit
   * code, with `message` on stderr for a reader of the terminal.
   */
  exitCode?(result: T): number;
  message?(result: T): string;
  /** false: do not apply migrations first, so a read-only connection (a read-only role, a standby) serves. */
  migrate?: boolean;
  /** false: the command wrote its own stdout (`svc audit export` streams its data there): print nothing after it. */
  print?(result: T): boolean;
};

/** What every command uses to read its configuration, print its result and fail, bound to one `CliIo`. */
export type CliRunner = ReturnType<typeof createCliRunner>;

export function createCliRunner(io: CliIo) {
  /** The exit code a command sets without ending at once (`svc audit verify` finding a broken chain). */
  let exitCode = 0;

  /** Logs go to stderr so stdout carries exactly one JSON document. */
  function logger(config: Config) {
    const level = config.logLevel === 'info' ? 'warn' : config.logLevel;
    return io.stderr === process.stderr
      ? createLogger({ ...config, logLevel: level }, 2)
      : createLogger({ ...config, logLevel: level }, io.stderr);
  }

  function printJson(value: unknown): void {
    io.stdout.write(`${JSON.stringify(value, null, 2)}\n`);
  }

  function fail(error: unknown): never {
    if (error instanceof CliExit) throw error;
    if (isAppError(error)) {
      const issues = (error.details as { issues?: Record<string, string[]> } | undefined)?.issues;
      const detail = issues
        ? Object.entries(issues)
            .map(([field, messages]) => `  ${field}: ${messages.join(' ')}`)
            .join('\n')
        : '';
      io.stderr.write(`error: ${error.message}${detail ? `\n${detail}` : ''}\n`);
    } else if (isDatabaseError(error)) {
      // A failed statement's message quotes its SQL and bound values (personal data): name it by state.
      // A connection-level error (FATAL, or SQLSTATE class 08) comes from no statement, and its message
      // (an unknown database, a pooler refusing a startup parameter) is what the operator needs.
      const logged = serializeError(error);
      const where = [logged.constraint && `constraint ${logged.constraint}`, logged.table && `table ${logged.table}`]
        .filter(Boolean)
        .join(', ');
      const serverMessage = connectionLevelMessage(error);
      io.stderr.write(
        `error: the database refused the command (${logged.type} ${logged.sqlState ?? logged.code ?? ''}${where ? `, ${where}` : ''})${serverMessage ? `: ${serverMessage}` : ''}\n`,
      );
    } else {
      io.stderr.write(`error: ${error instanceof Error ? error.message : String(error)}\n`);
    }
    throw new CliExit(1);
  }

  function config(): Config {
    try {
      return loadConfig(io.env);
    } catch (error) {
      return fail(error);
    }
  }

  /** Runs one operator command against the configured (or embedded) database and prints its result. */
  async function runCommand<T>(work: (context: CommandContext) => Promise<T>, options: CommandOptions<T> = {}): Promise<void> {
    const settings = config();
    const log = logger(settings);
    let connection: Awaited<ReturnType<typeof connect>> | undefined;
    let jobs: ReturnType<typeof lazyJobQueue> | undefined;
    try {
      connection = await connect(settings, { info: (message) => log.info(message) }, { migrate: options.migrate });
      const { database } = connection;
      jobs = lazyJobQueue(database);
      const services = createServices({ config: settings, database, sealer: lazyLinkSealer(settings), jobs });
      const result = await work({ config: settings, database, services, actor: { type: 'operator', id: `cli:${userInfo().username}` } });
      await jobs.stop();
      await connection.close();
      if (options.print?.(result) ?? true) printJson(result);
      const code = options.exitCode?.(result) ?? 0;
      if (code !== 0) {
        const message = options.message?.(result);
        if (message) io.stderr.write(`${message}\n`);
        exitCode = code;
      }
    } catch (error) {
      await jobs?.stop().catch(() => {});
      await connection?.close().catch(() => {});
      fail(error);
    }
  }

  return {
    io,
    logger,
    printJson,
    fail,
    config,
    runCommand,
    setExitCode(code: number) {
      exitCode = code;
    },
    get exitCode() {
      return exitCode;
    },
  };
}

export function parseList(value: string | undefined): string[] | undefined {
  if (value === undefined) return undefined;
  return value
    .split(',')
    .map((part) => part.trim())
    .filter(Boolean);
}

/** A commander argument parser accepting exactly one of `values`. */
export function oneOf<T extends string>(values: readonly T[]) {
  return (value: string): T => {
    if (!values.includes(value as T)) throw new InvalidArgumentError(`must be one of ${values.join(', ')}`);
    return value as T;
  };
}

export function parseInteger(name: string) {
  return (value: string): number => {
    if (!/^-?\d+$/.test(value)) throw new Error(`${name} must be a whole number, got "${value}"`);
    return Number(value);
  };
}
