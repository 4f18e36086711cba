export type ErrorCode =
  | 'unauthorized'
  | 'insufficient_credits'
  | 'forbidden_scope'
  | 'feature_disabled'
  | 'not_found'
  | 'conflict'
  | 'idempotency_conflict'
  | 'validation_failed'
  | 'rate_limited'
  | 'payload_too_large'
  | 'unsupported_media_type'
  | 'invalid_json'
  | 'bad_request'
  | 'request_timeout'
  | 'headers_too_large'
  | 'expectation_failed'
  | 'service_unavailable'
  | 'database_unavailable'
  | 'record_locked'
  | 'internal';

/** The one error type of the service; the error handler renders it as the spec's envelope. */
export class AppError extends Error {
  constructor(
    readonly code: ErrorCode,
    readonly status: number,
    message: string,
    readonly details?: Record<string, unknown>,
  ) {
    super(message);
    this.name = 'AppError';
  }

  static notFound(what = 'Resource'): AppError {
    return new AppError('not_found', 404, `${what} not found.`);
  }

  static conflict(message: string, details?: Record<string, unknown>): AppError {
    return new AppError('conflict', 409, message, details);
  }

  /** A 422 whose `details.issues` maps each field path to its messages. */
  static validation(issues: Record<string, string[]>, message = 'The request is invalid.'): AppError {
    return new AppError('validation_failed', 422, message, { issues });
  }

  static field(path: string, message: string): AppError {
    return AppError.validation({ [path]: [message] });
  }

  static featureDisabled(feature: string): AppError {
    return new AppError('feature_disabled', 403, `The ${feature} feature is not enabled for this organisation.`, {
      feature,
    });
  }
}

export function isAppError(error: unknown): error is AppError {
  return error instanceof AppError;
}
