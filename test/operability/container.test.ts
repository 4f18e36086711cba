import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { DCLinter } from 'dclint';
import { DockerfileParser, type Instruction } from 'dockerfile-ast';
import { validate as lintDockerfile } from 'dockerfile-utils';
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { loadConfig } from '../../src/config/config.js';
import { createTestContext, type TestContext } from '../helpers/harness.js';

const ROOT = join(import.meta.dirname, '..', '..');
const read = (file: string) => readFileSync(join(ROOT, file), 'utf8');
const run = promisify(execFile);

type Service = {
  image?: string;
  build?: string;
  command?: string[];
  environment?: Record<string, string>;
  ports?: string[];
  volumes?: string[];
  depends_on?: Record<string, { condition: string }>;
  healthcheck?: { test?: string[]; disable?: boolean };
};
type Compose = { services: Record<string, Service>; volumes: Record<string, unknown> };

describe('docker-compose.yml', () => {
  const compose = parse(read('docker-compose.yml'), { merge: true }) as Compose;

  it('when linted (compose-spec schema and best-practice rules), it has no error or warning', () => {
    const linter = new DCLinter({ rules: {}, quiet: false, debug: false, exclude: [] });
    const [result] = linter.lintFiles([join(ROOT, 'docker-compose.yml')], false);
    expect(result?.messages.map((message: { rule: string; message: string }) => `${message.rule}: ${message.message}`)).toEqual([]);
    expect(result).toMatchObject({ errorCount: 0, warningCount: 0 });
  });

  it('when started, postgres keeps its data in a named volume and reports health with pg_isready', () => {
    const postgres = compose.services.postgres!;
    expect(postgres.image).toBe('postgres:17');
    const [volume] = postgres.volumes ?? [];
    expect(volume).toMatch(/^[\w-]+:\/var\/lib\/postgresql\/data$/);
    expect(Object.keys(compose.volumes)).toContain(volume!.split(':')[0]);
    expect(postgres.healthcheck?.test?.join(' ')).toContain('pg_isready');
  });

  it('when started, api and worker wait for a healthy postgres and run the same image', () => {
    for (const name of ['api', 'worker']) {
      const service = compose.services[name]!;
      expect(service.build).toBe('.');
      expect(service.image).toBe(compose.services.api!.image);
      expect(service.depends_on?.postgres?.condition).toBe('service_healthy');
    }
    expect(compose.services.worker!.command).toEqual(['node', 'bin/svc.js', 'worker']);
    expect(compose.services.api!.command).toBeUndefined(); // the image's CMD: svc serve
    expect(compose.services.api!.ports).toEqual(['127.0.0.1:8080:8080', '127.0.0.1:9464:9464']);
  });

  it('when configured, api serves /metrics on its own METRICS_PORT, not on the API port, and the worker has none', () => {
    const api = loadConfig(compose.services.api!.environment);
    expect(api.metricsPort).toBe(9464);
    expect(api.metricsPort).not.toBe(api.port);
    expect(compose.services.api!.ports).toContain(`127.0.0.1:${api.metricsPort}:${api.metricsPort}`);
    expect(loadConfig(compose.services.worker!.environment).metricsPort).toBeUndefined();
  });

  it('when configured, no service allows private webhook targets or extra webhook ports', () => {
    for (const name of ['api', 'worker']) {
      const config = loadConfig(compose.services[name]!.environment);
      expect(config.webhookAllowPrivateUrls).toBe(false);
      expect(config.webhookAllowedPorts).toEqual([]);
    }
  });

  it('when configured, api runs no in-process worker and both configurations pass the service\'s own validation', () => {
    const api = loadConfig(compose.services.api!.environment);
    expect(api.webhookWorker).toBe(false);
    expect(api.databaseUrl).toMatch(/^postgres:\/\/[^@]+@postgres:5432\//);
    const worker = loadConfig(compose.services.worker!.environment);
    expect(worker.databaseUrl).toBe(api.databaseUrl);
  });
});

describe('Dockerfile', () => {
  const source = read('Dockerfile');
  const instructions = DockerfileParser.parse(source).getInstructions();
  const froms = instructions.filter((instruction) => instruction.getKeyword() === 'FROM');
  const runtimeStart = instructions.indexOf(froms.at(-1)!);
  const runtime = instructions.slice(runtimeStart);
  const args = (list: Instruction[], keyword: string) =>
    list.filter((instruction) => instruction.getKeyword() === keyword).map((instruction) => instruction.getArgumentsContent() ?? '');

  it('when linted, it has no problem', () => {
    expect(lintDockerfile(source).map((problem) => `${problem.range.start.line + 1}: ${problem.message}`)).toEqual([]);
  });

  it('when built, a build stage compiles and a slim runtime stage installs production dependencies only', () => {
    expect(froms.map((from) => from.getArgumentsContent())).toEqual(['node:20-bookworm-slim AS build', 'node:20-bookworm-slim AS runtime']);
    expect(args(instructions.slice(0, runtimeStart), 'RUN')).toEqual(expect.arrayContaining(['npm ci --no-audit --no-fund', 'npm run build']));
    expect(args(runtime, 'RUN').join(' ')).toContain('npm ci --omit=dev');
    expect(source).toMatch(/COPY --from=build \/app\/dist \.\/dist/);
    expect(args(runtime, 'COPY')).toEqual(expect.arrayContaining(['migrations ./migrations', 'bin ./bin']));
    expect(args(runtime, 'ENV').join(' ')).toMatch(/NODE_ENV=production/);
  });

  it('when run, it is a non-root user serving `svc serve` on 8080 with a /readyz healthcheck', () => {
    const [user] = args(runtime, 'USER');
    expect(user).toBeDefined();
    expect(['root', '0']).not.toContain(user);
    expect(args(runtime, 'EXPOSE')).toEqual(['8080']);
    expect(args(runtime, 'CMD')).toEqual(['["node", "bin/svc.js", "serve"]']);
    expect(args(runtime, 'HEALTHCHECK')[0]).toContain('/readyz');
  });

  it('when the build context is sent, local state and dependencies are left out but every copied path is in', () => {
    const ignored = read('.dockerignore').split('\n').map((line) => line.trim()).filter((line) => line && !line.startsWith('#'));
    expect(ignored).toEqual(expect.arrayContaining(['node_modules', 'dist', 'data', '.git', '.env']));
    for (const copied of ['package.json', 'package-lock.json', 'tsconfig.json', 'tsconfig.build.json', 'src', 'migrations', 'bin']) {
      expect(ignored).not.toContain(copied);
    }
  });
});

describe('the image healthcheck command', () => {
  let ctx: TestContext;
  let app: FastifyInstance;
  let port: number;
  const healthcheck = () => {
    const exec = JSON.parse(read('Dockerfile').match(/HEALTHCHECK[^\n]*\\\n\s*CMD (\[.*\])/)![1]!) as string[];
    return run(exec[0]!, exec.slice(1), { env: { ...process.env, PORT: String(port) } })
      .then(() => 0)
      .catch((error: { code?: number }) => error.code ?? 1);
  };

  beforeAll(async () => {
    ctx = await createTestContext();
    app = await ctx.buildInstance();
    await app.listen({ port: 0, host: '127.0.0.1' });
    port = (app.server.address() as { port: number }).port;
  });
  afterAll(async () => ctx?.close());

  it('when the service is ready, it exits 0; when nothing answers, it exits non-zero', async () => {
    expect(await healthcheck()).toBe(0);
    await app.close();
    expect(await healthcheck()).not.toBe(0);
  });
});
