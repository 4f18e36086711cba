import { LogController, type FastifyReply, type FastifyRequest } from 'fastify';
import { abortedRequestLine, requestLine } from '../shared/logging.js';
import { CLIENT_GONE_CODES } from './errors.plugin.js';
import { timeoutOf } from './request-timeouts.plugin.js';

/**
 * Fastify's own request logging, as one line per request once its response has been sent
 * (Fastify writes two by default: "incoming request" and "request completed"):
 *
 *   {"level":30,…,"reqId":"…","apiKeyId":"…","orgId":"…","method":"GET","route":"/v1/customers/:id","status":200,"durationMs":1.84,"msg":"request"}
 *
 * The line holds no URL, query string, header or body, so it needs no redaction. A route's
 * `logLevel` still applies (healthy probes at `warn` write nothing). The lines Fastify writes on an
 * error it handles itself name the error through the error serializer, never by its raw message.
 * A request whose client goes away first gets its line from logAbortedRequest instead.
 */
export class RequestLogController extends LogController {
  override incomingRequest(): void {}

  override requestCompleted(error: Error | null | undefined, request: FastifyRequest, reply: FastifyReply): void {
    const line = requestLine(request.method, request.routeOptions.url, reply.statusCode, reply.elapsedTime);
    if (!error) reply.log.info(line, 'request');
    // A client that hangs up while its answer is sent is no fault of the service.
    else if (CLIENT_GONE_CODES.has((error as { code?: string }).code ?? ''))
      reply.log.info({ ...line, err: error }, 'client went away while its response was sent');
    else reply.log.warn({ ...line, err: error }, 'request failed while sending its response');
  }

  override defaultErrorLog(error: Error, request: FastifyRequest, reply: FastifyReply): void {
    const where = { method: request.method, route: request.routeOptions.url, status: reply.statusCode };
    if (reply.statusCode >= 500) reply.log.error({ ...where, err: error }, 'request failed');
    else reply.log.debug({ ...where, err: error }, 'request refused');
  }

  override writeHeadError(error: Error, request: FastifyRequest, reply: FastifyReply): void {
    reply.log.warn({ method: request.method, route: request.routeOptions.url, err: error }, 'could not write the response headers');
  }
}

/**
 * onRequestAbort hook: the one line of a request whose connection closed before the answer: the
 * client's doing, or the server's when the request broke a timeout (request-timeouts.plugin.ts).
 */
export function logAbortedRequest(request: FastifyRequest, done: () => void): void {
  const timeout = timeoutOf(request);
  if (timeout) request.log.info({ ...abortedRequestLine(request.method, request.routeOptions.url), timeout }, 'request timed out');
  else request.log.info(abortedRequestLine(request.method, request.routeOptions.url), 'request aborted by the client');
  done();
}
