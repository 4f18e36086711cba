import { linkTokenHash } from '../../shared/link-tokens.js';
import rateLimit from '@fastify/rate-limit';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { answerFor, isClientAbort } from '../../plugins/errors.plugin.js';
import type { ConnectionAnswer } from '../../plugins/request-timeouts.plugin.js';
import { AppError } from '../../shared/app-error.js';
import { DOCUMENT_TYPE_CODES, MAX_DOCUMENT_BYTES } from '../documents/document-types.js';
import { multipartFormOf, narrowMultipartForm, registerMultipartIntake, type FormNarrowing } from '../documents/multipart-intake.js';
import { allowanceMessage, notOutstandingMessage, type UploadPageView } from './document-requests.service.js';
import { MAX_DOCUMENTS_PER_REQUEST } from './document-requests.schemas.js';
import { renderErrorPage, renderInvalidLinkPage, renderThankYouPage, renderUploadPage, UPLOAD_PAGE_HEADERS } from './upload-page.view.js';

/** Where the contact lands once every requested document has arrived: it names no token, since the link is spent by then. */
const THANK_YOU_PATH = '/documents/received';
const MAX_FILE_MIB = MAX_DOCUMENT_BYTES / (1024 * 1024);

const tokenParams = z.object({ token: z.string().max(256) }).strict();
/** The rate limits' window: a minute. */
const RATE_WINDOW_MS = 60_000;

/** The link token a request names, if its route has one (read before validation: any string). */
function tokenOf(request: FastifyRequest): string | undefined {
  const token = (request.params as { token?: unknown } | undefined)?.token;
  return typeof token === 'string' ? token : undefined;
}

/**
 * The contact's upload page (outside /v1, unauthenticated: the link's token is the only credential, and
 * it opens this one request's page and nothing else). Plain HTML, no script, a strict CSP;
 * post/redirect/get so a reload never sends the files twice. Every answer of this context, errors
 * included, is a page with the same headers.
 */
export async function uploadPageRoutes(fastify: FastifyInstance): Promise<void> {
  const app = fastify.withTypeProvider<ZodTypeProvider>();
  const service = app.services.documentRequests;

  app.addHook('onRequest', (_request, reply, done) => {
    reply.headers(UPLOAD_PAGE_HEADERS);
    done();
  });

  // Rate limits, before anything is looked up or read: per client address, then per link. In memory,
  // on each instance (@fastify/rate-limit's local store): a flood guard that costs the database nothing.
  await app.register(rateLimit, { global: false });
  const { perIp, perLink } = app.deps.config.uploadPageRateLimit;
  const limits = [
    { window: 'upload_page_ip', limit: perIp, check: app.createRateLimit({ max: perIp, timeWindow: RATE_WINDOW_MS }) },
    {
      window: 'upload_page_link',
      limit: perLink,
      check: app.createRateLimit({
        max: perLink,
        timeWindow: RATE_WINDOW_MS,
        keyGenerator: (request) => linkTokenHash(tokenOf(request) ?? ''),
      }),
    },
  ] as const;
  app.addHook('onRequest', async (request, reply) => {
    for (const { window, limit, check } of limits) {
      if (window === 'upload_page_link' && tokenOf(request) === undefined) continue;
      const state = await check(request);
      if (!state.isAllowed && state.isExceeded) {
        reply.header('Retry-After', String(Math.max(1, state.ttlInSeconds)));
        app.metrics?.rateLimited(window);
        throw new AppError('rate_limited', 429, `Too many requests: at most ${limit} a minute.`, {
          limit,
          window_seconds: RATE_WINDOW_MS / 1000,
        });
      }
    }
  });

  const html = (reply: FastifyReply, status: number, body: string) => reply.code(status).type('text/html; charset=utf-8').send(body);
  const invalid = (reply: FastifyReply) => html(reply, 404, renderInvalidLinkPage());

  // Errors of this context are pages too: an upload refused (413, 415, 422) shows the form again with
  // the reason; anything else, a short page with the status.
  app.setErrorHandler(async (error, request: FastifyRequest, reply) => {
    const appError = answerFor(error, request, reply);
    const token = tokenOf(request);
    // A client that hung up mid-body reads no page, and a rate-limited one gets no lookup: the form is not shown again for them.
    const showForm = appError.status < 500 && appError.status !== 429 && !isClientAbort(error, request);
    if (showForm && token !== undefined && request.method === 'POST') {
      const view = await service.openPage(token).catch(() => undefined);
      if (!view) return invalid(reply);
      return html(reply, appError.status, renderUploadPage(view, { error: pageMessage(appError), maxFileMiB: MAX_FILE_MIB }));
    }
    return html(
      reply,
      appError.status,
      renderErrorPage(
        appError.status >= 500
          ? 'Something went wrong on our side. Please try again later.'
          : appError.status === 429
            ? `Too many requests for this page. Please wait ${String(reply.getHeader('Retry-After') ?? 60)} seconds and try again.`
            : appError.message,
      ),
    );
  });

  app.get(THANK_YOU_PATH, { schema: { hide: true } }, async (_request, reply) => html(reply, 200, renderThankYouPage()));

  app.get('/documents/:token', { schema: { hide: true, params: tokenParams } }, async (request, reply) => {
    const view = await service.openPage(request.params.token);
    if (!view) return invalid(reply);
    const received = view.items.filter((item) => item.received).length;
    const notice =
      received > 0 ? `Received ${received} of ${view.items.length} document types. Upload the rest when you have them.` : undefined;
    return html(reply, 200, renderUploadPage(view, { notice, maxFileMiB: MAX_FILE_MIB }));
  });

  await app.register(async (uploads) => {
    // A link that opens nothing is refused before a byte of the body is read or spooled; for one that
    // opens a request, the form may carry files of its outstanding types only (each file's field is the
    // type it answers), and no more than its allowance has left: any other part is refused by its
    // headers, before a byte of it is spooled.
    uploads.addHook('preParsing', async (request) => {
      const { token } = request.params as { token: string };
      const view = await service.openPage(token);
      if (!view) throw new AppError('not_found', 404, 'The link is not valid.');
      narrowMultipartForm(request, uploadForm(view));
    });
    registerMultipartIntake(uploads, { fileFields: DOCUMENT_TYPE_CODES, maxFiles: MAX_DOCUMENTS_PER_REQUEST, textFields: {} });
    uploads
      .withTypeProvider<ZodTypeProvider>()
      .post(
        '/documents/:token',
        { schema: { hide: true, params: tokenParams }, config: { connectionErrorAnswer } },
        async (request, reply) => {
          const { token } = request.params;
          // Each file's field is the type code it answers.
          const outcome = await service.receive(token, multipartFormOf(request).files, { maxDocuments: MAX_DOCUMENTS_PER_REQUEST });
          if (outcome.kind === 'invalid') return invalid(reply);
          // Post/redirect/get: the page (or, once the link is spent, the thank-you page) is fetched anew.
          return reply
            .code(303)
            .header('Location', outcome.fulfilled ? THANK_YOU_PATH : `/documents/${token}`)
            .type('text/html; charset=utf-8')
            .send('');
        },
      );
  });
}

/** What the page's form may carry now: files of the outstanding types, as many as the allowance has left. */
function uploadForm(view: UploadPageView): FormNarrowing {
  const outstanding = view.items.filter((item) => !item.received).map((item) => item.code);
  const received = new Set(view.items.filter((item) => item.received).map((item) => item.code));
  return {
    fileFields: outstanding,
    maxFiles: Math.max(0, MAX_DOCUMENTS_PER_REQUEST - view.documentCount),
    refusedFileField: (field) => notOutstandingMessage(view.request.types, received, field),
    tooManyFiles: allowanceMessage(MAX_DOCUMENTS_PER_REQUEST, view.documentCount),
  };
}

/** A timeout's answer, written on the connection itself (request-timeouts.plugin.ts): a page like every other answer here. */
function connectionErrorAnswer(error: AppError): ConnectionAnswer {
  const message =
    error.status === 408 ? 'The upload took too long to arrive and was stopped. Nothing was uploaded. Please try again.' : error.message;
  return { headers: { ...UPLOAD_PAGE_HEADERS, 'Content-Type': 'text/html; charset=utf-8' }, body: renderErrorPage(message) };
}

/** What the contact reads for a refused upload. */
function pageMessage(error: AppError): string {
  switch (error.status) {
    case 413:
      return `A file is too large: each file may be at most ${MAX_FILE_MIB} MiB. Nothing was uploaded.`;
    case 415:
      return 'A file is not a PDF, PNG or JPEG document. Nothing was uploaded.';
    case 422: {
      const issues = (error.details?.issues ?? {}) as Record<string, string[]>;
      const messages = Object.values(issues).flat();
      return `${messages.length > 0 ? messages.join(' ') : error.message} Nothing was uploaded.`;
    }
    default:
      return 'The upload could not be read. Please try again.';
  }
}
