import { createHash } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { Writable } from 'node:stream';
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp } from '../../src/app.js';
import { createAuditChainSealer } from '../../src/modules/audit/audit-chain.sealer.js';
import { MAX_DOCUMENT_BYTES } from '../../src/modules/documents/document-types.js';
import { loggerOptions, redactUrl } from '../../src/shared/logging.js';
import { expectNoSpooledFiles, spooledFiles, usePrivateTempDir } from '../documents/document-helpers.js';
import { createTestContext, type TestContext, testLinkSealer, testServices } from '../helpers/harness.js';
import { collectInto } from '../helpers/log-collector.js';
import { answerOf, openSocket, type RawAnswer } from '../helpers/raw-http.js';
import { auditOf, balanceOf, createEntity, eventsOf, ledgerOf } from '../verification/verification-fixtures.js';
import {
  documentsOf,
  makeOverdue,
  multipart,
  openRequest,
  PDF,
  pngOf,
  requestRow,
  tokensOf,
  upload,
} from './document-requests-fixtures.js';

let ctx: TestContext;
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

const TWO_TYPES = { types: ['CERTIFICATE_OF_REGISTRATION', 'ID_OF_OFFICEHOLDER'] };
const page = (token: string) => ctx.app.inject({ method: 'GET', url: `/documents/${token}` });

async function setup(body: Record<string, unknown> = TWO_TYPES, credits = 10) {
  const org = await ctx.createOrg({ credits });
  const entity = await createEntity(ctx, org);
  const { dto, token } = await openRequest(ctx, org, entity.id, body);
  return { org, entity, request: dto, token };
}

function expectPageHeaders(response: { headers: Record<string, unknown> }) {
  const csp = String(response.headers['content-security-policy']);
  expect(csp).toContain("default-src 'none'");
  expect(csp).toMatch(/style-src 'sha256-[A-Za-z0-9+/]+=*'/);
  expect(csp).toContain("form-action 'self'");
  expect(csp).toContain("base-uri 'none'");
  expect(csp).toContain("frame-ancestors 'none'");
  expect(csp).not.toContain('unsafe');
  expect(response.headers['referrer-policy']).toBe('no-referrer');
  expect(response.headers['cache-control']).toBe('no-store');
  expect(response.headers['x-content-type-options']).toBe('nosniff');
}

describe('GET /documents/{token}', () => {
  it('when the link is valid, it shows the organisation, the entity, the escaped message, the due date and one file input per type', async () => {
    const { entity, token } = await setup({ ...TWO_TYPES, message: '<script>alert("x")</script> & bring the originals' });
    const response = await page(token);
    expect(response.statusCode).toBe(200);
    expect(response.headers['content-type']).toBe('text/html; charset=utf-8');
    expectPageHeaders(response);
    const html = response.body;
    expect(html).not.toMatch(/<script/i);
    expect(html).toContain('&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; bring the originals');
    expect(html).toContain(String(entity.dto.name));
    expect(html).toMatch(/Org [a-z0-9]+ asks you/);
    expect(html).toContain('Certificate of registration');
    expect(html).toContain('Identity document of an officeholder');
    expect(html).toContain('<form method="post" enctype="multipart/form-data">');
    expect(html.match(/<input type="file"[^>]*accept=".pdf,.png,.jpg,.jpeg">/g)).toHaveLength(2);
    // No external asset of any kind.
    expect(html).not.toMatch(/(src|href)=/i);
  });

  it("when the page's inline stylesheet is hashed, the hash is the one the CSP allows", async () => {
    const { token } = await setup();
    const response = await page(token);
    const style = /<style>([\s\S]*?)<\/style>/.exec(response.body)![1]!;
    const hash = createHash('sha256').update(style).digest('base64');
    expect(String(response.headers['content-security-policy'])).toContain(`'sha256-${hash}'`);
  });

  it('when the token is unknown, malformed, expired or spent, it answers the same 404 page', async () => {
    const unknown = await page('A'.repeat(43));
    const malformed = await page('not-a-token');
    const expired = await setup();
    await makeOverdue(ctx, expired.request.id);
    const expiredPage = await page(expired.token);
    const spent = await setup({ types: ['OTHER'] });
    expect((await upload(ctx, spent.token, [['OTHER', PDF, 'a.pdf']])).statusCode).toBe(303);
    const spentPage = await page(spent.token);
    for (const response of [unknown, malformed, expiredPage, spentPage]) {
      expect(response.statusCode).toBe(404);
      expect(response.body).toBe(unknown.body);
      expectPageHeaders(response);
    }
  });

  it('when the page sees a past due time, the request expires at once (EXPIRED, event, audit, token deleted)', async () => {
    const { org, request, token } = await setup();
    await makeOverdue(ctx, request.id);
    expect((await page(token)).statusCode).toBe(404);
    expect((await requestRow(ctx, request.id)).status).toBe('EXPIRED');
    expect(await tokensOf(ctx, org.id)).toEqual([]);
    expect(await auditOf(ctx, org.id, request.id, 'document_request.expired')).toHaveLength(1);
    const statuses = (await eventsOf(ctx, org.id, 'document_request.updated')).map(
      (event) => (event.document as any).data.document_request.status,
    );
    expect(statuses).toEqual(['OPEN', 'EXPIRED']);
  });
});

describe('POST /documents/{token}', () => {
  it('when one of two types arrives, it is stored as uploaded_by contact with the request id, free of charge, and the page shows it received (303)', async () => {
    const { org, entity, request, token } = await setup();
    const balance = await balanceOf(ctx, org.id);
    const response = await upload(ctx, token, [['CERTIFICATE_OF_REGISTRATION', PDF, 'certificate.pdf']]);
    expect(response.statusCode, response.body).toBe(303);
    expect(response.headers.location).toBe(`/documents/${token}`);
    expectPageHeaders(response);

    const [document] = await documentsOf(ctx, org.id, request.id);
    expect(document).toMatchObject({
      entityId: entity.id,
      type: 'CERTIFICATE_OF_REGISTRATION',
      uploadedBy: 'contact',
      documentRequestId: request.id,
      mediaType: 'application/pdf',
      fileName: 'certificate.pdf',
    });
    expect(await balanceOf(ctx, org.id)).toBe(balance);
    expect((await ledgerOf(ctx, org.id)).map((row) => row.reason)).toEqual(['document_request']);
    expect((await requestRow(ctx, request.id)).status).toBe('OPEN');

    const after = await page(token);
    expect(after.body).toMatch(/Certificate of registration<\/span><span class="received">Received/);
    expect(after.body).toMatch(/Identity document of an officeholder<\/span><span class="outstanding">Outstanding/);
    expect(after.body.match(/<input type="file"/g)).toHaveLength(1);

    const listed = await ctx.request('GET', `/v1/entities/${entity.id}/document-requests`, { key: org.key });
    expect(listed.json().data[0]).toMatchObject({
      status: 'OPEN',
      received_types: ['CERTIFICATE_OF_REGISTRATION'],
      document_ids: [document!.id],
    });
  });

  it('when every requested type has arrived, the request is FULFILLED (event, audit row), its link is spent, and the contact lands on the thank-you page', async () => {
    const { org, entity, request, token } = await setup();
    expect((await upload(ctx, token, [['CERTIFICATE_OF_REGISTRATION', PDF, 'c.pdf']])).statusCode).toBe(303);
    const last = await upload(ctx, token, [['ID_OF_OFFICEHOLDER', pngOf(), 'id.png']]);
    expect(last.statusCode).toBe(303);
    expect(last.headers.location).toBe('/documents/received');
    const thanks = await ctx.app.inject({ method: 'GET', url: '/documents/received' });
    expect(thanks.statusCode).toBe(200);
    expect(thanks.body).toContain('Thank you');
    expectPageHeaders(thanks);

    const row = await requestRow(ctx, request.id);
    expect(row.status).toBe('FULFILLED');
    expect(row.fulfilledAt).not.toBeNull();
    expect(await tokensOf(ctx, org.id)).toEqual([]);
    const [audit] = await auditOf(ctx, org.id, request.id, 'document_request.fulfilled');
    // The contact did it, through the request's link: the trail names the request as the actor, and
    // GET /v1/audit-events finds it by actor=contact.
    expect(audit).toMatchObject({ actorType: 'contact', actorId: request.id, subjectType: 'document_request' });
    const uploads = await auditOf(ctx, org.id, entity.id, 'entity.document_uploaded');
    expect(uploads.map((row) => [row.actorType, row.actorId])).toEqual([
      ['contact', request.id],
      ['contact', request.id],
    ]);
    const sealer = createAuditChainSealer({ database: ctx.database, pollIntervalMs: 60_000 });
    try {
      await sealer.sealOnce();
    } finally {
      await sealer.stop();
    }
    const trail = await ctx.request('GET', '/v1/audit-events', { key: org.key, query: { actor: 'contact' } });
    expect(trail.statusCode, trail.body).toBe(200);
    expect(
      trail
        .json()
        .data.map((event: { action: string; actor: { type: string; id: string } }) => [event.action, event.actor.type, event.actor.id]),
    ).toEqual([
      ['entity.document_uploaded', 'contact', request.id],
      ['entity.document_uploaded', 'contact', request.id],
      ['document_request.fulfilled', 'contact', request.id],
    ]);
    const events = (await eventsOf(ctx, org.id, 'document_request.updated')).map((event) => (event.document as any).data.document_request);
    expect(events.map((dto: { status: string }) => dto.status)).toEqual(['OPEN', 'FULFILLED']);
    expect(events[1].received_types).toEqual(['CERTIFICATE_OF_REGISTRATION', 'ID_OF_OFFICEHOLDER']);
    expect(events[1].document_ids).toHaveLength(2);

    // Single-purpose: the spent link neither shows the page nor takes more files.
    const again = await upload(ctx, token, [['ID_OF_OFFICEHOLDER', PDF, 'again.pdf']]);
    expect(again.statusCode).toBe(404);
    expect(await documentsOf(ctx, org.id, request.id)).toHaveLength(2);
  });

  it('when several files arrive in one form, all are stored and one submission can fulfil the request', async () => {
    const { org, request, token } = await setup();
    const response = await upload(ctx, token, [
      ['CERTIFICATE_OF_REGISTRATION', PDF, 'c.pdf'],
      ['ID_OF_OFFICEHOLDER', pngOf(), 'front.png'],
      ['ID_OF_OFFICEHOLDER', pngOf(8), 'back.png'],
    ]);
    expect(response.statusCode).toBe(303);
    expect(await documentsOf(ctx, org.id, request.id)).toHaveLength(3);
    expect((await requestRow(ctx, request.id)).status).toBe('FULFILLED');
  });

  it('when a file input is left empty (filename="" and no bytes), it is skipped rather than refused', async () => {
    const { org, request, token } = await setup();
    const response = await upload(ctx, token, [
      ['CERTIFICATE_OF_REGISTRATION', PDF, 'c.pdf'],
      ['ID_OF_OFFICEHOLDER', Buffer.alloc(0), ''],
    ]);
    expect(response.statusCode, response.body).toBe(303);
    expect((await documentsOf(ctx, org.id, request.id)).map((document) => document.type)).toEqual(['CERTIFICATE_OF_REGISTRATION']);
  });

  it('when no file is chosen, it shows the page again with 422 and stores nothing', async () => {
    const { org, token } = await setup();
    const response = await upload(ctx, token, [['CERTIFICATE_OF_REGISTRATION', Buffer.alloc(0), '']]);
    expect(response.statusCode).toBe(422);
    expect(response.body).toContain('class="error"');
    expect(response.body).toContain('Choose at least one file');
    expectPageHeaders(response);
    expect(await documentsOf(ctx, org.id)).toEqual([]);
  });

  it('when a file is over 10 MiB, it shows the page again with 413 and stores nothing', async () => {
    const { org, token } = await setup();
    const big = Buffer.concat([PDF, Buffer.alloc(MAX_DOCUMENT_BYTES)]);
    const response = await upload(ctx, token, [['CERTIFICATE_OF_REGISTRATION', big, 'big.pdf']]);
    expect(response.statusCode).toBe(413);
    expect(response.body).toContain('too large');
    expect(response.body).toContain('<form method="post"');
    expectPageHeaders(response);
    expect(await documentsOf(ctx, org.id)).toEqual([]);
  });

  it('when a file is not a PDF, PNG or JPEG by content, it shows the page again with 415 and stores nothing', async () => {
    const { org, token } = await setup();
    const response = await upload(ctx, token, [
      ['CERTIFICATE_OF_REGISTRATION', Buffer.from('just some text, named like a pdf'), 'fake.pdf'],
    ]);
    expect(response.statusCode).toBe(415);
    expect(response.body).toContain('not a PDF, PNG or JPEG');
    expect(await documentsOf(ctx, org.id)).toEqual([]);
  });

  it('when a file is sent for a type the request does not ask for, it answers 422 and stores nothing', async () => {
    const { org, token } = await setup();
    const response = await upload(ctx, token, [
      ['CERTIFICATE_OF_REGISTRATION', PDF, 'c.pdf'],
      ['COMPANY_EXTRACT', PDF, 'extract.pdf'],
    ]);
    expect(response.statusCode).toBe(422);
    expect(await documentsOf(ctx, org.id)).toEqual([]);
  });

  it('when the body is not multipart/form-data, it answers a 415 page', async () => {
    const { token } = await setup();
    const response = await ctx.app.inject({
      method: 'POST',
      url: `/documents/${token}`,
      headers: { 'content-type': 'application/json' },
      payload: '{}',
    });
    expect(response.statusCode).toBe(415);
    expect(response.headers['content-type']).toBe('text/html; charset=utf-8');
    expectPageHeaders(response);
  });

  it('when a request has received 20 documents, a 21st is refused with 422 and nothing more is stored', async () => {
    const { org, request, token } = await setup();
    const twenty = Array.from(
      { length: 20 },
      (_, index) => ['CERTIFICATE_OF_REGISTRATION', PDF, `page-${index}.pdf`] as [string, Buffer, string],
    );
    expect((await upload(ctx, token, twenty)).statusCode).toBe(303);
    const response = await upload(ctx, token, [['ID_OF_OFFICEHOLDER', PDF, 'one-more.pdf']]);
    expect(response.statusCode).toBe(422);
    expect(response.body).toContain('at most 20 documents');
    expect(await documentsOf(ctx, org.id, request.id)).toHaveLength(20);
    expect((await requestRow(ctx, request.id)).status).toBe('OPEN');
  });

  it('when a token is used, it touches only its own request: another request of the same entity is unchanged', async () => {
    const { org, entity, request, token } = await setup({ types: ['OTHER'] });
    const other = await openRequest(ctx, org, entity.id, { types: ['OTHER'] });
    expect((await upload(ctx, token, [['OTHER', PDF, 'o.pdf']])).statusCode).toBe(303);
    expect((await requestRow(ctx, request.id)).status).toBe('FULFILLED');
    expect((await requestRow(ctx, other.dto.id)).status).toBe('OPEN');
    expect(await documentsOf(ctx, org.id, other.dto.id)).toEqual([]);
    expect((await page(other.token)).statusCode).toBe(200);
  });

  it('when a link token is presented as an API key, /v1 answers 401', async () => {
    const { entity, token } = await setup();
    const response = await ctx.request('GET', `/v1/entities/${entity.id}/document-requests`, { key: token });
    expect(response.statusCode).toBe(401);
  });

  it('when the request is past due, an upload expires it and is refused with the invalid-link page', async () => {
    const { org, request, token } = await setup();
    await makeOverdue(ctx, request.id);
    const response = await upload(ctx, token, [['CERTIFICATE_OF_REGISTRATION', PDF, 'c.pdf']]);
    expect(response.statusCode).toBe(404);
    expect((await requestRow(ctx, request.id)).status).toBe('EXPIRED');
    expect(await documentsOf(ctx, org.id)).toEqual([]);
  });
});

describe('parts judged by their headers, before they are spooled', () => {
  let server: FastifyInstance;
  let port: number;
  let restoreTempDir: (() => Promise<void>) | undefined;
  beforeAll(async () => {
    // Spool files are counted here: other test files' uploads must not land in the same directory.
    restoreTempDir = await usePrivateTempDir();
    server = await ctx.buildInstance();
    await server.listen({ host: '127.0.0.1', port: 0 });
    port = (server.server.address() as AddressInfo).port;
  });
  afterAll(async () => restoreTempDir?.());

  const BOUNDARY = 'svc-judged-parts';
  const filePart = (field: string, data: Buffer, name = 'doc.pdf') =>
    Buffer.concat([
      Buffer.from(
        `--${BOUNDARY}\r\nContent-Disposition: form-data; name="${field}"; filename="${name}"\r\nContent-Type: application/pdf\r\n\r\n`,
      ),
      data,
      Buffer.from('\r\n'),
    ]);

  /**
   * Posts `complete` parts and then the start of a part for `field` (a 10 MiB file, 64 KiB of it sent)
   * on a bare socket, announcing a 10 MiB body per part, and returns the answer together with whether
   * any spool file existed meanwhile (looked for until the answer came).
   */
  async function postUnfinished(token: string, complete: Buffer[], field: string): Promise<RawAnswer & { spooled: boolean }> {
    await expectNoSpooledFiles(); // what an earlier upload spooled is removed once its answer has gone
    const socket = await openSocket(port);
    const answer = answerOf(socket);
    let answered = false;
    void answer.then(() => (answered = true));
    let spooled = false;
    const watching = (async () => {
      while (!answered) {
        if ((await spooledFiles()).length > 0) spooled = true;
        await new Promise((resolve) => setTimeout(resolve, 5));
      }
    })();
    const body = Buffer.concat([
      ...complete,
      Buffer.from(
        `--${BOUNDARY}\r\nContent-Disposition: form-data; name="${field}"; filename="late.pdf"\r\nContent-Type: application/pdf\r\n\r\n`,
      ),
      pdfBytesOf(64 * 1024),
    ]);
    socket.write(
      `POST /documents/${token} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data; boundary=${BOUNDARY}\r\n` +
        `Content-Length: ${(complete.length + 1) * MAX_DOCUMENT_BYTES}\r\n\r\n`,
    );
    socket.write(body);
    const result = await answer;
    await watching;
    return { ...result, spooled };
  }

  const pdfBytesOf = (size: number) => Buffer.concat([PDF, Buffer.alloc(size - PDF.length, 0x20)]);

  it('when a part names a type the request does not ask for, it is refused at once: none of it is spooled and the answer comes with most of the body unsent', async () => {
    const { org, token } = await setup({ types: ['CERTIFICATE_OF_REGISTRATION'] });
    const answer = await postUnfinished(token, [], 'COMPANY_EXTRACT');
    expect(answer.status).toBe(422);
    expect(answer.body).toContain('This request does not ask for a document of type &quot;Company extract&quot;');
    expect(answer.spooled, 'a spool file existed').toBe(false);
    expect(await documentsOf(ctx, org.id)).toEqual([]);
  });

  it('when a part names a type already received, it is refused at once as well', async () => {
    const { org, request, token } = await setup();
    expect((await upload(ctx, token, [['CERTIFICATE_OF_REGISTRATION', PDF, 'c.pdf']])).statusCode).toBe(303);
    const answer = await postUnfinished(token, [], 'CERTIFICATE_OF_REGISTRATION');
    expect(answer.status).toBe(422);
    expect(answer.body).toContain('has been received already');
    expect(answer.spooled, 'a spool file existed').toBe(false);
    expect(await documentsOf(ctx, org.id, request.id)).toHaveLength(1);
  });

  it('when the files go beyond what is left of the allowance, the first one past it is refused at once and what was spooled is removed', async () => {
    const { org, request, token } = await setup();
    const nineteen = Array.from(
      { length: 19 },
      (_, index) => ['CERTIFICATE_OF_REGISTRATION', PDF, `p-${index}.pdf`] as [string, Buffer, string],
    );
    expect((await upload(ctx, token, nineteen)).statusCode).toBe(303);
    const answer = await postUnfinished(token, [filePart('ID_OF_OFFICEHOLDER', PDF, 'front.pdf')], 'ID_OF_OFFICEHOLDER');
    expect(answer.status).toBe(422);
    expect(answer.body).toContain('This request takes at most 20 documents; 19 have been received.');
    await expectNoSpooledFiles();
    expect(await documentsOf(ctx, org.id, request.id)).toHaveLength(19);
  });

  it('when a type arrives between the page being read and the files being stored (two posts at once), the later post is refused under the row lock', async () => {
    const { org, request, token } = await setup();
    const service = testServices(ctx.database, { jobs: ctx.app.deps.jobs }).documentRequests;
    expect((await upload(ctx, token, [['CERTIFICATE_OF_REGISTRATION', PDF, 'c.pdf']])).statusCode).toBe(303);
    // What a post that passed the intake before the first was stored hands over: a file of a type received since.
    const late = {
      field: 'CERTIFICATE_OF_REGISTRATION',
      fileName: 'late.pdf',
      size: PDF.length,
      sha256: 'a'.repeat(64),
      mediaType: 'application/pdf' as const,
      path: '/nonexistent',
    };
    await expect(service.receive(token, [late], { maxDocuments: 20 })).rejects.toMatchObject({
      status: 422,
      details: { issues: { CERTIFICATE_OF_REGISTRATION: [expect.stringContaining('has been received already')] } },
    });
    expect(await documentsOf(ctx, org.id, request.id)).toHaveLength(1);
  });

  it('when the allowance has one file left, a form with one file and an input left empty is taken', async () => {
    const { org, request, token } = await setup();
    const nineteen = Array.from(
      { length: 19 },
      (_, index) => ['CERTIFICATE_OF_REGISTRATION', PDF, `p-${index}.pdf`] as [string, Buffer, string],
    );
    expect((await upload(ctx, token, nineteen)).statusCode).toBe(303);
    const response = await upload(ctx, token, [
      ['ID_OF_OFFICEHOLDER', PDF, 'front.pdf'],
      ['ID_OF_OFFICEHOLDER', Buffer.alloc(0), ''],
    ]);
    expect(response.statusCode, response.body).toBe(303);
    expect(await documentsOf(ctx, org.id, request.id)).toHaveLength(20);
    expect((await requestRow(ctx, request.id)).status).toBe('FULFILLED');
  });
});

describe('rate limits', () => {
  function expectRateLimitedPage(response: { statusCode: number; headers: Record<string, unknown>; body: string }) {
    expect(response.statusCode).toBe(429);
    expect(response.headers['content-type']).toBe('text/html; charset=utf-8');
    expectPageHeaders(response);
    const retryAfter = Number(response.headers['retry-after']);
    expect(
      Number.isInteger(retryAfter) && retryAfter >= 1 && retryAfter <= 60,
      `Retry-After: ${String(response.headers['retry-after'])}`,
    ).toBe(true);
    expect(response.body).toContain('Too many requests for this page');
  }

  it('when one link is asked for more often than its limit in a minute, it answers a 429 page with Retry-After, for the form and an upload alike; another link is still served', async () => {
    const limited = await ctx.buildInstance({ uploadPageRateLimit: { perIp: 1_000, perLink: 3 } });
    const { org, token } = await setup();
    const other = await setup();
    for (let index = 0; index < 3; index += 1)
      expect((await limited.inject({ method: 'GET', url: `/documents/${token}` })).statusCode).toBe(200);
    expectRateLimitedPage(await limited.inject({ method: 'GET', url: `/documents/${token}` }));
    const { body, contentType } = multipart([['CERTIFICATE_OF_REGISTRATION', PDF, 'c.pdf']]);
    expectRateLimitedPage(
      await limited.inject({ method: 'POST', url: `/documents/${token}`, headers: { 'content-type': contentType }, payload: body }),
    );
    expect(await documentsOf(ctx, org.id)).toEqual([]);
    expect((await limited.inject({ method: 'GET', url: `/documents/${other.token}` })).statusCode).toBe(200);
  });

  it('when one address asks for more than its limit in a minute, whatever the links, it answers a 429 page; another address is still served', async () => {
    const limited = await ctx.buildInstance({ uploadPageRateLimit: { perIp: 3, perLink: 1_000 } });
    const tokens = await Promise.all([setup(), setup(), setup(), setup()]).then((all) => all.map((one) => one.token));
    const from = (remoteAddress: string, url: string) => limited.inject({ method: 'GET', url, remoteAddress });
    expect((await from('203.0.113.7', `/documents/${tokens[0]}`)).statusCode).toBe(200);
    expect((await from('203.0.113.7', `/documents/${tokens[1]}`)).statusCode).toBe(200);
    expect((await from('203.0.113.7', '/documents/received')).statusCode).toBe(200);
    expectRateLimitedPage(await from('203.0.113.7', `/documents/${tokens[2]}`));
    expectRateLimitedPage(await from('203.0.113.7', `/documents/${'x'.repeat(43)}`));
    expect((await from('203.0.113.8', `/documents/${tokens[3]}`)).statusCode).toBe(200);
  });
});

describe('the link token in logs', () => {
  it('when /documents/<token> is logged as a URL, the token is redacted', () => {
    const token = 'Q'.repeat(43);
    expect(redactUrl(`/documents/${token}`)).toBe('/documents/[redacted]');
    expect(redactUrl(`/documents/${token}?x=1`)).toBe('/documents/[redacted]?x=1');
    expect(redactUrl('/v1/customers/abc')).toBe('/v1/customers/abc');
  });

  it('when the page is opened, uploaded to (successfully and not) and refused, no log line holds the token', async () => {
    const lines: string[] = [];
    const sink = new Writable({
      write(chunk, _encoding, callback) {
        lines.push(String(chunk));
        callback();
      },
    });
    const app = await buildApp({
      config: ctx.config,
      database: ctx.database,
      logger: { ...loggerOptions({ logLevel: 'debug' }), stream: collectInto({ write: (line: string) => sink.write(line) }) },
    });
    await app.ready();
    try {
      const { token } = await setup();
      const send = async (parts: Array<[string, Buffer, string]>) => {
        const { body, contentType } = multipart(parts);
        return app.inject({ method: 'POST', url: `/documents/${token}`, headers: { 'content-type': contentType }, payload: body });
      };
      expect((await app.inject({ method: 'GET', url: `/documents/${token}` })).statusCode).toBe(200);
      expect((await send([['CERTIFICATE_OF_REGISTRATION', Buffer.from('not a document'), 'x.pdf']])).statusCode).toBe(415);
      expect((await send([['COMPANY_EXTRACT', PDF, 'x.pdf']])).statusCode).toBe(422);
      expect(
        (await app.inject({ method: 'POST', url: `/documents/${token}`, headers: { 'content-type': 'text/csv' }, payload: 'a,b' }))
          .statusCode,
      ).toBe(415);
      expect((await send([['CERTIFICATE_OF_REGISTRATION', PDF, 'c.pdf']])).statusCode).toBe(303);
      expect((await send([['ID_OF_OFFICEHOLDER', PDF, 'i.pdf']])).statusCode).toBe(303);
      expect((await app.inject({ method: 'GET', url: `/documents/${token}` })).statusCode).toBe(404);
      expect((await app.inject({ method: 'GET', url: `/documents/${token}/extra` })).statusCode).toBe(404);
    } finally {
      await app.close();
    }
    expect(lines.length).toBeGreaterThan(5);
    const { rows } = await ctx.database.pool.query<{ link: string }>('SELECT link FROM emails ORDER BY created_at DESC LIMIT 1');
    const token = testLinkSealer().open(rows[0]!.link).split('/').pop()!;
    for (const line of lines) expect(line).not.toContain(token);
    // The request lines name the route pattern.
    expect(lines.some((line) => line.includes('"route":"/documents/:token"'))).toBe(true);
  });
});
