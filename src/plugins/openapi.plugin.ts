import fastifySwagger, { type SwaggerTransform, type SwaggerTransformObject } from '@fastify/swagger';
import type { FastifyApiReferenceOptions } from '@scalar/fastify-api-reference';
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import fp from 'fastify-plugin';
import { jsonSchemaTransform, jsonSchemaTransformObject } from 'fastify-type-provider-zod';
import type { OpenAPIV3_1 } from 'openapi-types';
import { ROUTE_SCOPES, routeKey } from './route-scopes.js';
// Imported for its registration: the envelope becomes `#/components/schemas/Error`.
import '../shared/error-envelope.schema.js';

export const API_VERSION = '1.0.0';
/** The API's name: the document's `info.title`, the /docs page title and the `name` of `GET /`. */
export const API_TITLE = 'Verification API';
export const API_SUMMARY = 'Customer and entity verification API (AML/CTF customer due diligence).';
/** Where the reference page and the document are served (unauthenticated, outside /v1). */
export const DOCS_PATH = '/docs';
export const OPENAPI_PATH = '/openapi.json';
const V1_PREFIX = '/v1';
const IDEMPOTENT_METHODS = new Set(['POST', 'PATCH', 'PUT', 'DELETE']);
/** Internal marker set by the per-route transform and consumed (removed) by the document transform. */
const ROUTE_MARKER = 'x-svc-route';

type Operation = OpenAPIV3_1.OperationObject & { [ROUTE_MARKER]?: { method: string; hasInput: boolean; scoped: boolean } };
type ResponseRef = OpenAPIV3_1.ReferenceObject | OpenAPIV3_1.ResponseObject;

const ref = (kind: 'schemas' | 'responses' | 'headers' | 'parameters', name: string) => ({ $ref: `#/components/${kind}/${name}` });

const errorResponse = (description: string, headers: string[]): OpenAPIV3_1.ResponseObject => ({
  description,
  headers: Object.fromEntries(headers.map((name) => [name, ref('headers', name)])),
  content: { 'application/json': { schema: ref('schemas', 'Error') } },
});

const RATE_HEADERS = ['X-Request-Id', 'RateLimit', 'RateLimit-Policy'];

/**
 * Error responses v1 operations can produce, each naming every `error.code` its status carries (the
 * codes are the `AppError` codes of src/). Added to an operation unless the route documents that
 * status itself; a route that does gets this wording unless it gives its own.
 */
const COMPONENT_RESPONSES: Record<string, OpenAPIV3_1.ResponseObject> = {
  BadRequest: errorResponse(
    'Bad request: `invalid_json` — the body is not valid UTF-8 JSON or does not match its `Content-Length`; `bad_request` — the HTTP request itself is malformed (for example a missing or repeated `Host` header, or the connection closed before the whole body arrived).',
    RATE_HEADERS,
  ),
  Unauthorized: errorResponse(
    "Unauthorized: `unauthorized` — the API key is missing, malformed, unknown, expired or revoked, `Authorization` is repeated, or the caller's IP address is not on the key's allowlist. One message for all of them, so a caller cannot tell which. Carries `WWW-Authenticate: Bearer`.",
    ['X-Request-Id', 'WWW-Authenticate'],
  ),
  InsufficientCredits: errorResponse(
    'Payment required: `insufficient_credits` — the organisation lacks the credits for an organisation-paid check; nothing was started or charged.',
    RATE_HEADERS,
  ),
  Forbidden: errorResponse(
    "Forbidden: `forbidden_scope` — the API key lacks the operation's scope (`details.required_scope` names it); `feature_disabled` — a feature the request needs is off for the organisation (`details.feature` names it, e.g. Groups, or `kyb_extra_methods` for the `contact_led` method).",
    RATE_HEADERS,
  ),
  NotFound: errorResponse(
    "Not found: `not_found` — no such record in the API key's organisation (an id of another organisation answers the same), or an id longer than any record can have.",
    RATE_HEADERS,
  ),
  Conflict: errorResponse(
    'Conflict: `conflict` — the record is not in a state the request can act on (e.g. KYB already started, an `external_id` clash on upsert, a stored `type` or `origin` that differs); `idempotency_conflict` — the `Idempotency-Key` was already used with a different request; `record_locked` — another request is changing the record right now, retry after `Retry-After` seconds.',
    [...RATE_HEADERS, 'Retry-After'],
  ),
  PayloadTooLarge: errorResponse('Payload too large: `payload_too_large` — the body exceeds 1 MiB.', RATE_HEADERS),
  UnsupportedMediaType: errorResponse(
    'Unsupported media type: `unsupported_media_type` — the body is not sent as `application/json`, or it is content-encoded (only `Content-Encoding: identity`).',
    RATE_HEADERS,
  ),
  ValidationFailed: errorResponse(
    'Validation failed: `validation_failed` — the path, query or body is invalid; `details.issues` maps each field path to its messages.',
    RATE_HEADERS,
  ),
  RateLimited: errorResponse(
    "Rate limited: `rate_limited` — the API key's burst or daily limit is exhausted; `details.limit` and `details.window_seconds` name the window. Retry after `Retry-After` seconds.",
    [...RATE_HEADERS, 'Retry-After'],
  ),
  InternalError: errorResponse('Internal error: `internal` — nothing was changed; quote `details.request_id` to support.', RATE_HEADERS),
  ServiceUnavailable: errorResponse(
    'Service unavailable: `database_unavailable` — the database is briefly unreachable or overloaded; `service_unavailable` — this server is shutting down. Nothing was changed; retry after `Retry-After` seconds.',
    [...RATE_HEADERS, 'Retry-After'],
  ),
};

/** The component that describes each error status, for error responses a route declares itself. */
const RESPONSE_BY_STATUS: Record<string, string> = {
  '400': 'BadRequest',
  '401': 'Unauthorized',
  '402': 'InsufficientCredits',
  '403': 'Forbidden',
  '404': 'NotFound',
  '409': 'Conflict',
  '413': 'PayloadTooLarge',
  '415': 'UnsupportedMediaType',
  '422': 'ValidationFailed',
  '429': 'RateLimited',
  '500': 'InternalError',
  '503': 'ServiceUnavailable',
};
const SUCCESS_DESCRIPTIONS: Record<string, string> = { '200': 'OK', '201': 'Created', '202': 'Accepted', '204': 'No content' };
/** What @fastify/swagger writes when a response schema carries no description. */
const DEFAULT_DESCRIPTION = 'Default Response';

const COMPONENT_HEADERS: Record<string, OpenAPIV3_1.HeaderObject> = {
  'X-Request-Id': {
    description:
      'The request id (yours from `X-Request-Id` when it is 1–128 characters of `[A-Za-z0-9._:-]`, else generated). Quote it to support.',
    schema: { type: 'string' },
  },
  RateLimit: {
    description: 'Remaining quota per window (IETF httpapi RateLimit draft), e.g. `"burst";r=24;t=1, "daily";r=99871;t=43200`.',
    schema: { type: 'string' },
  },
  'RateLimit-Policy': {
    description: 'The key\'s limits per window (IETF httpapi RateLimit draft), e.g. `"burst";q=25;w=1, "daily";q=100000;w=86400`.',
    schema: { type: 'string' },
  },
  'Retry-After': { description: 'Seconds to wait before retrying.', schema: { type: 'integer', minimum: 0 } },
  'WWW-Authenticate': { description: 'Always `Bearer`.', schema: { type: 'string' } },
  'Idempotent-Replayed': {
    description: '`true` when this response is the stored answer to an earlier request with the same `Idempotency-Key`.',
    schema: { type: 'string', enum: ['true'] },
  },
};

const IDEMPOTENCY_KEY_PARAMETER: OpenAPIV3_1.ParameterObject = {
  name: 'Idempotency-Key',
  in: 'header',
  required: false,
  description:
    'Makes a retry safe: a repeat with the same key within 24 hours replays the original response (with `Idempotent-Replayed: true`) instead of repeating the change. The same key with a different request answers 409 `idempotency_conflict`. Keys are scoped to the API key.',
  schema: { type: 'string', minLength: 1, maxLength: 255 },
  example: '5f0c7a52-8f1e-4a2b-9a43-1d7c2f0d9b10',
};

/** `/v1/customers/:id/aml` → `Customers`; the first path segment names the resource group. */
function defaultTag(url: string): string {
  const first =
    url
      .slice(V1_PREFIX.length)
      .split('/')
      .find((segment) => segment !== '') ?? 'API';
  const words = first.replace(/-/g, ' ');
  return words.charAt(0).toUpperCase() + words.slice(1);
}

/** `GET /v1/entities/:id/ubos` → `getEntitiesByIdUbos`: unique and predictable; routes may set a better one. */
function defaultOperationId(method: string, url: string): string {
  const pascal = (value: string) =>
    value
      .split(/[^A-Za-z0-9]+/)
      .filter(Boolean)
      .map((word) => word.charAt(0).toUpperCase() + word.slice(1))
      .join('');
  const parts = url
    .slice(V1_PREFIX.length)
    .split('/')
    .filter(Boolean)
    .map((segment) => (segment.startsWith(':') ? `By${pascal(segment.slice(1))}` : pascal(segment)));
  return `${method.toLowerCase()}${parts.join('')}`;
}

/**
 * Per route: the zod schemas become JSON Schema, and every /v1 operation gets its security
 * requirement with the scope from ROUTE_SCOPES, a default operationId, tag and summary, and a
 * marker read by the document transform below.
 */
const transformRoute: SwaggerTransform = (input) => {
  const result = jsonSchemaTransform(input) as { schema: Record<string, unknown>; url: string };
  const { route } = input;
  const schema = result.schema;
  if (!schema || schema.hide) return result;
  // Everything outside /v1 is unauthenticated: it overrides the document-wide bearer requirement.
  if (!route.url.startsWith(`${V1_PREFIX}/`)) {
    schema.security = [];
    return result;
  }

  const methods = (Array.isArray(route.method) ? route.method : [route.method]).filter((m) => m !== 'HEAD');
  const method = methods[0] ?? 'GET';
  const key = routeKey(method, route.url);
  const scope = ROUTE_SCOPES[key];
  const scopeText = scope === undefined ? '' : scope === null ? 'Any valid API key.' : `Required scope: \`${scope}\`.`;

  schema.operationId ??= defaultOperationId(method, route.url);
  schema.tags ??= [defaultTag(route.url)];
  schema.summary ??= `${method} ${route.url.slice(V1_PREFIX.length).replace(/:(\w+)/g, '{$1}')}`;
  schema.description = [schema.description, scopeText].filter(Boolean).join('\n\n');
  schema.security = [{ bearerAuth: scope ? [scope] : [] }];
  if (scope) schema['x-required-scope'] = scope;
  schema[ROUTE_MARKER] = {
    method,
    hasInput: Boolean(schema.body || schema.querystring || schema.params || route.url.includes(':')),
    // A route open to any valid key has no scope to lack; only routes with one can answer forbidden_scope.
    scoped: Boolean(scope),
  };
  return result;
};

function addCommonResponses(operation: Operation): void {
  const marker = operation[ROUTE_MARKER];
  if (!marker) return;
  delete operation[ROUTE_MARKER];
  const mutating = IDEMPOTENT_METHODS.has(marker.method);
  const hasBody = operation.requestBody !== undefined;
  // A JSON body is parsed for any request that sends one, so invalid_json applies wherever a body is sent.
  const sendsBody = hasBody || mutating;

  const declaresIdempotencyKey = (operation.parameters ?? []).some(
    (parameter) => 'in' in parameter && parameter.in === 'header' && parameter.name.toLowerCase() === 'idempotency-key',
  );
  if (mutating && !declaresIdempotencyKey) {
    operation.parameters = [...(operation.parameters ?? []), ref('parameters', 'IdempotencyKey')];
  }

  const responses: Record<string, ResponseRef> = { ...(operation.responses ?? {}) };
  for (const [status, response] of Object.entries(responses)) {
    if ('$ref' in response) continue;
    const standard = COMPONENT_RESPONSES[RESPONSE_BY_STATUS[status] ?? ''];
    if (standard) {
      // An error status the route documents itself (to give its own schema or description) keeps
      // them, and gets the standard wording and headers where it has none.
      if (response.description === DEFAULT_DESCRIPTION) response.description = standard.description;
      response.headers ??= structuredClone(standard.headers);
      continue;
    }
    if (!/^2\d\d$/.test(status)) continue;
    if (response.description === DEFAULT_DESCRIPTION) response.description = SUCCESS_DESCRIPTIONS[status] ?? 'Success';
    response.headers = {
      ...Object.fromEntries(RATE_HEADERS.map((name) => [name, ref('headers', name)])),
      ...(mutating ? { 'Idempotent-Replayed': ref('headers', 'Idempotent-Replayed') } : {}),
      ...(response.headers ?? {}),
    };
  }
  const common: Array<[string, string, boolean]> = [
    ['400', 'BadRequest', sendsBody],
    ['401', 'Unauthorized', true],
    ['403', 'Forbidden', marker.scoped],
    ['404', 'NotFound', hasPathParameter(operation)],
    ['409', 'Conflict', mutating],
    ['413', 'PayloadTooLarge', hasBody],
    ['415', 'UnsupportedMediaType', hasBody],
    ['422', 'ValidationFailed', marker.hasInput || mutating],
    ['429', 'RateLimited', true],
    ['500', 'InternalError', true],
    ['503', 'ServiceUnavailable', true],
  ];
  for (const [status, name, applies] of common) {
    if (applies && responses[status] === undefined) responses[status] = ref('responses', name);
  }
  operation.responses = Object.fromEntries(Object.entries(responses).sort(([a], [b]) => a.localeCompare(b)));
}

function hasPathParameter(operation: Operation): boolean {
  return (operation.parameters ?? []).some((parameter) => 'in' in parameter && parameter.in === 'path');
}

/**
 * The zod transform emits an `…Input` twin of every registered schema; keep only the twins some
 * request actually refers to (the error envelope, for one, is only ever a response).
 */
function pruneUnusedInputSchemas(document: OpenAPIV3_1.Document): void {
  const schemas = document.components?.schemas;
  if (!schemas) return;
  const text = JSON.stringify(document);
  for (const name of Object.keys(schemas)) {
    if (name.endsWith('Input') && !text.includes(`"#/components/schemas/${name}"`)) delete schemas[name];
  }
}

const HTTP_METHODS = ['get', 'put', 'post', 'delete', 'options', 'head', 'patch', 'trace'] as const;

/** Whole document: zod registry components, then the shared error responses, headers and parameters. */
const transformDocument: SwaggerTransformObject = (input) => {
  const document = jsonSchemaTransformObject(input) as OpenAPIV3_1.Document;
  const tags = new Set<string>();
  for (const pathItem of Object.values(document.paths ?? {})) {
    for (const method of HTTP_METHODS) {
      const operation = pathItem?.[method] as Operation | undefined;
      if (!operation) continue;
      addCommonResponses(operation);
      for (const tag of operation.tags ?? []) tags.add(tag);
    }
  }
  document.components = {
    ...document.components,
    // Copies: the document is handed out (and cached) and must not share objects with these tables.
    responses: { ...structuredClone(COMPONENT_RESPONSES), ...document.components?.responses },
    headers: { ...structuredClone(COMPONENT_HEADERS), ...document.components?.headers },
    parameters: { IdempotencyKey: structuredClone(IDEMPOTENCY_KEY_PARAMETER), ...document.components?.parameters },
  };
  pruneUnusedInputSchemas(document);
  const described = new Map((document.tags ?? []).map((tag) => [tag.name, tag]));
  document.tags = [...new Set([...described.keys(), ...tags])].sort().map((name) => described.get(name) ?? { name });
  return document;
};

/** One description per tag the routes use; the openapi test fails for a tag without one. */
const TAGS: OpenAPIV3_1.TagObject[] = [
  {
    name: 'Customers',
    description:
      "Individual customers (`INDIVIDUAL`, `SOLE_TRADER`), verified by KYC: create or upsert by `externalId`, read by the service's id or your own external id, list and poll for changes with `updated_since`, update, and record the designated services you provide them. Ingesting never starts verification, sends an email or spends credits.",
  },
  {
    name: 'Entities',
    description:
      'Entity customers (`COMPANY`, `TRUST`, `PARTNERSHIP`, `SMSF`, `OTHER`), verified by KYB: create or upsert by `externalId`, read, list and poll for changes, update. Ingesting never starts verification, sends an email or spends credits.',
  },
  {
    name: 'AML',
    description: 'The AML screening status and flags of an individual or an entity (scope `aml:read`).',
  },
  {
    name: 'Beneficial owners',
    description:
      'The beneficial owners (UBOs) of an entity: list and add them, and send one the link to verify themselves (this emails them and charges like a KYC start).',
  },
  {
    name: 'Entity documents',
    description:
      "Documents supporting an entity's verification (trust deeds, partnership agreements, …): upload one as multipart/form-data (PDF, PNG or JPEG by content, at most 10 MiB; 1 credit, paid by the organisation), list an entity's documents and download their content.",
  },
  {
    name: 'Verification',
    description:
      "Start KYC for an individual or KYB for an entity. Only these operations (and back-office staff) start verification: they email the customer or the contact a secure link and spend the organisation's credits or bill the customer (402 `insufficient_credits` when an organisation-paid check lacks credits), except the `manual` KYB lane, which does neither.",
  },
  {
    name: 'Groups',
    description:
      "Group workspaces for multi-party deals or matters, created from a group template or from explicit party slots, and the templates available to the organisation. Needs the organisation's `groups` feature (403 `feature_disabled` otherwise).",
  },
  {
    name: 'Entity documents',
    description:
      "An entity's documents (PDF, PNG or JPEG, at most 10 MiB each) and requests to the entity's contact to upload them through a secure link: a request emails the contact and costs 1 credit (or bills the customer), the contact's uploads are covered by it, and the request is FULFILLED once every requested type has arrived or EXPIRED at its due time.",
  },
  {
    name: 'Events',
    description:
      'The events feed (scope `events:read`): every event of the organisation, the same envelopes webhooks carry, in the order the changes committed. Keep the last `resume_cursor` (never null; `next_cursor` is null on the last page, as on every list) and poll with it to never miss an event; events are kept `EVENT_RETENTION_DAYS` (30 by default).',
  },
  {
    name: 'Webhooks',
    description:
      'Your webhook endpoints (scope `webhooks:write`): register, list, update, disable, delete, rotate the signing secret with a grace period during which deliveries carry both signatures, send a test event, read the delivery log with every attempt, and retry a delivery. The `whsec_` secret is shown only on create and on rotate.',
  },
  {
    name: 'Audit',
    description:
      "The compliance trail (scope `audit:read`): every recorded change, by whom (API key, operator or the service) and when, with its old and new values, in the order of the organisation's tamper-evident hash chain. Personal data appears as stored; secrets never do.",
  },
  {
    name: 'Ongoing due diligence',
    description:
      "The organisation's review policy (scopes `policy:read` and `policy:write`): months between customer reviews per risk rating, whether customers who need enhanced due diligence are reviewed at the HIGH interval, the high-risk jurisdictions (by default the FATF call-for-action list) and when a due review becomes overdue.",
  },
  {
    name: 'Imports',
    description:
      'Bulk imports of an existing client list (scopes `imports:write` to upload and cancel, `imports:read` to read): upload a CSV or NDJSON file of individuals or entities (up to 100,000 rows, 50 MiB), applied in the background in batches exactly as the single-record upserts would apply each row (`added_via` BULK_IMPORT, audited per record, never starting verification or charging), with a dry run, progress and counts per outcome, each row’s outcome and error (as JSON pages or a CSV download of the failed rows to fix and re-import), cancel between batches and one `import.completed` event. Imports are kept `IMPORT_RETENTION_DAYS` (30 by default) after they finish; the records they created stay.',
  },
  {
    name: 'Catalog',
    description:
      'The read-only catalogs: designated-service codes used in `designatedServices`, `preExistingServices` and `service_codes`, and entity document type codes. Any valid API key may read them.',
  },
];

const DESCRIPTION = `${API_SUMMARY}

Authenticate every request with \`Authorization: Bearer svc_live_…\`; each operation names the scope its key needs. Errors always use the \`Error\` envelope; each error status lists the \`error.code\` values it carries. Every response carries \`X-Request-Id\`; authenticated responses carry \`RateLimit\` and \`RateLimit-Policy\`. POST, PATCH, PUT and DELETE accept an \`Idempotency-Key\` header. Responses are forward-compatible: ignore fields you do not recognise.`;

/**
 * The configuration of the reference page at /docs (options of @scalar/fastify-api-reference, served
 * in the page as JSON). It shows this API and nothing of Scalar's hosted services: no "Open API
 * Client" button, no "Ask AI" agent, no "Generate MCP", no developer toolbar (Deploy, Share …), no
 * telemetry. The Scalar page turns the agent, MCP and the toolbar on by itself when opened on
 * localhost, which is where a newcomer opens it.
 */
const REFERENCE_CONFIGURATION = {
  url: OPENAPI_PATH,
  pageTitle: `${API_TITLE} reference`,
  metaData: { title: `${API_TITLE} reference`, description: API_SUMMARY },
  // No fonts or anything else from a CDN: the page and its script come from the package.
  withDefaultFonts: false,
  hideClientButton: true,
  showDeveloperTools: 'never',
  agent: { disabled: true },
  mcp: { disabled: true },
  telemetry: false,
  // The key a reader enters under Authentication is sent as `Authorization: Bearer …`.
  authentication: { preferredSecurityScheme: 'bearerAuth' },
} satisfies FastifyApiReferenceOptions['configuration'];

/**
 * The OpenAPI 3.1 document of every v1 route (from the routes' zod schemas), served at
 * `GET /openapi.json`, and the interactive reference at `GET /docs` (assets from the package).
 * Registered before the route modules so its onRoute hook sees every route.
 */
export const openapiPlugin = fp(
  async (app: FastifyInstance) => {
    await app.register(fastifySwagger, {
      openapi: {
        openapi: '3.1.0',
        info: {
          title: API_TITLE,
          version: API_VERSION,
          description: DESCRIPTION,
        },
        // Relative, so the served document points at the deployment serving it and the committed
        // one does not depend on PUBLIC_BASE_URL; paths are relative to it, as in the spec.
        servers: [{ url: V1_PREFIX, description: 'This deployment' }],
        // Every operation needs a key; each names its scope in its own requirement.
        security: [{ bearerAuth: [] }],
        tags: TAGS,
        components: {
          securitySchemes: {
            bearerAuth: {
              type: 'http',
              scheme: 'bearer',
              bearerFormat: 'svc_live_…',
              description:
                'An API key `svc_live_<32 or more characters>`, issued with a set of scopes. The scope each operation needs is in its security requirement and description.',
            },
          },
        },
      },
      transform: transformRoute,
      transformObject: transformDocument,
    });

    app.get(OPENAPI_PATH, { schema: { hide: true } }, async (_request, reply) => {
      reply.type('application/json; charset=utf-8');
      return app.swagger();
    });

    const reference = referencePage();
    // The app ignores trailing slashes: `/docs/` answers `/docs` too (the page redirects it to `/docs/`).
    for (const url of [`${DOCS_PATH}/`, `${DOCS_PATH}/${REFERENCE_SCRIPT_PATH}`]) {
      app.get(url, { schema: { hide: true }, logLevel: 'warn' }, reference);
    }
  },
  { name: 'openapi' },
);

/** Where Scalar's plugin serves the page's script, relative to the page (the page's `<script src>`). */
const REFERENCE_SCRIPT_PATH = 'js/scalar.js';

/**
 * The reference page and its script, as Scalar's fastify plugin serves them. The plugin's module holds
 * its browser bundle as one string literal (about 20 MB of heap with the module's own source), so it
 * is loaded on the first request for the page, into an app of its own that these routes hand the
 * request to: an instance nobody opens the reference on never holds it.
 */
function referencePage(): (request: FastifyRequest, reply: FastifyReply) => Promise<FastifyReply> {
  let loaded: Promise<FastifyInstance> | undefined;
  const load = async () => {
    const { default: apiReference } = await import('@scalar/fastify-api-reference');
    const reference = Fastify({ routerOptions: { ignoreTrailingSlash: true } });
    await reference.register(apiReference, { routePrefix: DOCS_PATH, configuration: REFERENCE_CONFIGURATION });
    await reference.ready();
    return reference;
  };
  return async (request, reply) => {
    loaded ??= load().catch((error: unknown) => {
      loaded = undefined;
      throw error;
    });
    const answer = await (await loaded).inject({ method: 'GET', url: request.url });
    reply.code(answer.statusCode);
    for (const name of ['content-type', 'location']) {
      const value = answer.headers[name];
      if (value !== undefined) reply.header(name, value);
    }
    return reply.send(answer.rawPayload);
  };
}
