/** How the service talks to PostgreSQL: pool size, the limits every connection runs under, statement naming. */
export type DatabaseOptions = {
  /** Connections per process. */
  poolSize?: number;
  /** Server-side `statement_timeout` of every connection. */
  statementTimeoutMs?: number;
  /** Server-side `lock_timeout`: a statement waiting this long for a row or table lock fails (55P03). */
  lockTimeoutMs?: number;
  /** Server-side `idle_in_transaction_session_timeout`: a transaction left idle this long is ended by PostgreSQL. */
  idleInTransactionTimeoutMs?: number;
  /**
   * Client-side bound on one statement's answer (pg's `query_timeout`), for when the server cannot
   * enforce its own (a cut network path): the connection is dropped. Longer than the statement timeout.
   */
  queryTimeoutMs?: number;
  /** Bound on opening a connection and on waiting for a pooled one. */
  connectTimeoutMs?: number;
  /**
   * Hot statements are named prepared statements (parsed and planned once per connection). Off for a
   * transaction-mode pooler (pgbouncer), where consecutive statements may reach different servers.
   */
  preparedStatements?: boolean;
  /** `application_name` shown in pg_stat_activity. */
  applicationName?: string;
};

export const DATABASE_DEFAULTS = {
  poolSize: 10,
  statementTimeoutMs: 10_000,
  lockTimeoutMs: 3_000,
  idleInTransactionTimeoutMs: 10_000,
  queryTimeoutMs: 11_000,
  connectTimeoutMs: 3_000,
  preparedStatements: true,
  applicationName: 'verification-api',
} as const satisfies Required<DatabaseOptions>;
