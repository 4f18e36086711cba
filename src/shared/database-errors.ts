/**
 * What the service may tell of a database error, shared by `svc` (src/cli/runner.ts), `GET /readyz`
 * (src/modules/health) and the error log serializer (src/shared/logging.ts).
 *
 * A failed statement's message quotes its SQL and bound values (personal data): it is named by its
 * SQLSTATE only. A connection-level error (severity FATAL or PANIC, or SQLSTATE class 08: an unknown
 * database, a failed authentication, a pooler refusing a startup parameter) comes from no statement,
 * and its message is what an operator needs to act on; it is shown as the server wrote it.
 */

const SQLSTATE = /^[0-9A-Z]{5}$/;

type Candidate = { severity?: unknown; code?: unknown; message?: unknown; cause?: unknown; query?: unknown };

/** This error itself (not its causes) was raised by the server outside any statement. */
export function isConnectionLevelError(error: unknown): boolean {
  if (typeof error !== 'object' || error === null) return false;
  const candidate = error as Candidate;
  if (typeof candidate.severity !== 'string' || typeof candidate.message !== 'string') return false;
  const fatal = candidate.severity === 'FATAL' || candidate.severity === 'PANIC';
  const connectionClass = typeof candidate.code === 'string' && candidate.code.startsWith('08');
  return fatal || connectionClass;
}

/** The server's message of an error raised before or outside any statement, looking through the causes (drizzle wraps the driver's error). */
export function connectionLevelMessage(error: unknown): string | undefined {
  for (let current: unknown = error, depth = 0; typeof current === 'object' && current !== null && depth < 5; depth += 1) {
    if (isConnectionLevelError(current)) return (current as { message: string }).message;
    current = (current as Candidate).cause;
  }
  return undefined;
}

/** A failed statement (drizzle's wrapper names its SQL and values) or an error PostgreSQL raised. */
export function isDatabaseError(error: unknown): boolean {
  if (typeof error !== 'object' || error === null) return false;
  const candidate = error as Candidate;
  return (
    typeof candidate.query === 'string' ||
    (typeof candidate.severity === 'string' && typeof candidate.code === 'string' && SQLSTATE.test(candidate.code))
  );
}

/** The SQLSTATE the server sent, looking through the causes; undefined for an error of the client or the network. */
export function sqlStateOf(error: unknown): string | undefined {
  for (let current: unknown = error, depth = 0; typeof current === 'object' && current !== null && depth < 5; depth += 1) {
    const candidate = current as Candidate;
    if (typeof candidate.severity === 'string' && typeof candidate.code === 'string' && SQLSTATE.test(candidate.code))
      return candidate.code;
    current = candidate.cause;
  }
  return undefined;
}
