import { createRequire } from 'node:module';
import pg from 'pg';
import { shareParsersOf } from './pg-array-rows.js';

const require = createRequire(import.meta.url);
const { prepareValue } = require('pg/lib/utils.js') as { prepareValue(value: unknown): unknown };
/** pg's own message serializer, as pg resolves it (the pg-protocol that pg's Connection writes with). */
const { serialize } = createRequire(require.resolve('pg'))('pg-protocol') as {
  serialize: {
    parse(message: { text: string; name?: string; types?: unknown }): Buffer;
    bind(message: { statement?: string; values: unknown[]; binary?: boolean }): Buffer;
    describe(message: { type: 'P'; name: string }): Buffer;
    execute(message: { portal: string }): Buffer;
    sync(): Buffer;
  };
};
const DESCRIBE_PORTAL = serialize.describe({ type: 'P', name: '' });
const EXECUTE_PORTAL = serialize.execute({ portal: '' });
const SYNC = serialize.sync();

type QueryConfig = string | pg.QueryConfig;
export type StatementCallback = (error: Error | undefined, result: pg.QueryResult) => void;
export type BatchedStatement = { config: QueryConfig; values: unknown[] | undefined; callback: StatementCallback };

/** pg's wire connection, as a batch writes on it (pg's `Connection`; not in pg's types). */
type WireConnection = {
  stream: { writable: boolean; write(bytes: Buffer): boolean };
  parsedStatements: Record<string, string | undefined>;
  submittedNamedStatements: Record<string, string | undefined>;
};

/** What a pg `Query` keeps and does with its answers; the batch hands each statement its own. */
type StatementQuery = {
  text: string;
  name?: string;
  values?: unknown[];
  types?: unknown;
  binary?: boolean;
  _result: { _types?: unknown };
  handleRowDescription(message: unknown): void;
  handleDataRow(message: unknown): void;
  handleCommandComplete(message: unknown, connection: WireConnection): void;
  handleEmptyQuery(connection: WireConnection): void;
  handleError(error: Error, connection: WireConnection | undefined): void;
  handleReadyForQuery(connection: WireConnection): void;
};
type QueryConstructor = new (config: QueryConfig, values: unknown[] | undefined, callback: StatementCallback) => StatementQuery;

/** The error of a statement PostgreSQL skipped because one ahead of it in its batch failed. */
export class StatementNotRun extends Error {
  constructor(cause: Error) {
    super(`Not run: a statement ahead of it in its batch failed (${cause.message})`, { cause });
    this.name = 'StatementNotRun';
  }
}

/** The text a named statement was parsed (or sent to be parsed) with on this connection, if any. */
const knownText = (connection: WireConnection, name: string) => connection.parsedStatements[name] ?? connection.submittedNamedStatements[name];

const TRANSACTION_CONTROL = /^\s*(?:begin|commit|rollback)\s*;?\s*$/i;

/** A RowDescription as pg parsed it (its `fields` are what a result reads). */
type RowDescription = { fields: unknown[] };
/**
 * How each named statement's results look on a connection, learnt from its first run there: its
 * RowDescription, or null for a statement that returns no rows. A named statement's result shape
 * cannot change on its connection (PostgreSQL refuses to run it if its tables changed shape), so its
 * later runs skip the Describe: PostgreSQL does not build the description again, nor pg parse it (for
 * the upsert's 45-column locking read, the largest single item of the server's profile).
 */
const describedStatements = new WeakMap<WireConnection, Map<string, RowDescription | null>>();

function descriptionsOf(connection: WireConnection): Map<string, RowDescription | null> {
  let descriptions = describedStatements.get(connection);
  if (descriptions === undefined) {
    descriptions = new Map();
    describedStatements.set(connection, descriptions);
  }
  return descriptions;
}

/**
 * Statements sent with one Sync instead of one each: PostgreSQL answers them all in one flush, and
 * the client reads them as one reply instead of a ReadyForQuery (a wake-up, a callback) per
 * statement. A bare server running the upsert's statements gained ~10% upserts/s from it; the
 * project, 0–3% (docs/decisions.md). Each statement still gets its own result, parsed by its own pg
 * `Query`, and its own callback.
 *
 * The catch is the protocol's: after a statement fails, PostgreSQL skips everything up to the Sync,
 * so the statements behind it fail with `StatementNotRun`. That is only safe where their failure is
 * what would have happened anyway: inside a transaction (an aborted transaction runs nothing), which
 * is where PipelinedConnection uses it. A batch leaves the connection in the transaction state its
 * last statement that ran left it in.
 *
 * A pg `Query` itself, because pg refuses any other submittable on a pipelined client.
 */
export class StatementBatch extends (pg.Query as unknown as new (config: QueryConfig) => object) {
  private readonly statements: StatementQuery[];
  /** The statement whose answers are being read: answers come in the order the statements were sent. */
  private answering = 0;
  /** Statements whose text this batch parsed under a name: PostgreSQL knows them only if it got that far. */
  private readonly parsedHere = new Set<number>();
  /** Per statement: the description it was sent without (known from an earlier run), or undefined when it was described. */
  private readonly knownDescriptions: Array<RowDescription | null | undefined> = [];
  /** The statement being answered has been given its description (by PostgreSQL or from knownDescriptions). */
  private describing = false;
  private descriptions: Map<string, RowDescription | null> | undefined;

  constructor(statements: BatchedStatement[], clientTypes?: unknown) {
    super({ text: '' });
    const Query = pg.Query as unknown as QueryConstructor;
    this.statements = statements.map(({ config, values, callback }) => {
      const query = new Query(config, values, callback);
      if (clientTypes !== undefined && query._result._types === undefined) query._result._types = clientTypes;
      return query;
    });
  }

  /**
   * pg reads `name` and `text` of the query being answered: on ParseComplete it records a named
   * statement as parsed, on an error it forgets it. Here they are those of the statement being
   * answered. (pg's constructor assigns both: the setters ignore it.)
   */
  get name(): string | undefined {
    return this.statements?.[this.answering]?.name;
  }

  set name(_ignored: string | undefined) {}

  get text(): string | undefined {
    return this.statements?.[this.answering]?.text;
  }

  set text(_ignored: string | undefined) {}

  /** The statements' texts, in the order they are sent. */
  get statementTexts(): string[] {
    return this.statements.map((statement) => statement.text);
  }

  /** Called by pg; an error returned here fails every statement before anything of the batch is written. */
  submit(connection: WireConnection): Error | null {
    // Every value is encoded before a byte leaves: one that cannot be sent fails the batch whole.
    let bound: unknown[][];
    try {
      bound = this.statements.map((statement) => (statement.values ?? []).map((value) => prepareValue(value)));
    } catch (error) {
      return error as Error;
    }
    for (const { name, text } of this.statements) {
      const previous = name === undefined ? undefined : knownText(connection, name);
      if (previous !== undefined && previous !== text) return new Error(`Prepared statements must be unique - '${name}' was used for a different statement`);
    }
    const descriptions = (this.descriptions = descriptionsOf(connection));
    // Every message of the batch in one buffer and one write (pg's Connection would write each on its own).
    const messages: Buffer[] = [];
    this.statements.forEach((statement, index) => {
      const { name } = statement;
      // A transaction's BEGIN, COMMIT or ROLLBACK never returns rows: no Describe, from the first.
      let known: RowDescription | null | undefined = TRANSACTION_CONTROL.test(statement.text) ? null : undefined;
      if (!name || knownText(connection, name) === undefined) {
        messages.push(serialize.parse({ text: statement.text, name, types: statement.types }));
        if (name) {
          connection.submittedNamedStatements[name] = statement.text;
          descriptions.delete(name);
          this.parsedHere.add(index);
        }
      } else if (known === undefined) {
        known = descriptions.get(name);
      }
      this.knownDescriptions[index] = known;
      messages.push(serialize.bind({ statement: name, values: bound[index]!, binary: statement.binary }));
      if (known === undefined) messages.push(DESCRIBE_PORTAL);
      messages.push(EXECUTE_PORTAL);
    });
    messages.push(SYNC);
    if (connection.stream.writable) connection.stream.write(Buffer.concat(messages));
    return null;
  }

  handleRowDescription(message: RowDescription): void {
    const statement = this.statements[this.answering];
    if (!statement) return;
    this.describing = true;
    if (statement.name && this.descriptions) {
      this.descriptions.set(statement.name, message);
      shareParsersOf(message.fields as Parameters<typeof shareParsersOf>[0]);
    }
    statement.handleRowDescription(message);
  }

  handleDataRow(message: unknown): void {
    const statement = this.statements[this.answering];
    if (!statement) return;
    if (!this.describing) this.describeFromKnown(statement);
    statement.handleDataRow(message);
  }

  handleCommandComplete(message: unknown, connection: WireConnection): void {
    const statement = this.statements[this.answering];
    if (!statement) return;
    if (!this.describing) this.describeFromKnown(statement);
    statement.handleCommandComplete(message, connection);
    this.answered(statement, connection);
  }

  /**
   * The statement was sent without a Describe: it gets the description learnt from its earlier run.
   * One that was described and answered NoData (no RowDescription came) returns no rows: that is learnt here.
   */
  private describeFromKnown(statement: StatementQuery): void {
    this.describing = true;
    const known = this.knownDescriptions[this.answering];
    if (known) statement.handleRowDescription(known);
    else if (known === undefined && statement.name) this.descriptions?.set(statement.name, null);
  }

  handleEmptyQuery(connection: WireConnection): void {
    const statement = this.statements[this.answering];
    if (!statement) return;
    statement.handleEmptyQuery(connection);
    this.answered(statement, connection);
  }

  /** The statement being answered failed (or, before any answer, the connection or the batch did). */
  handleError(error: Error, connection: WireConnection | undefined): void {
    const failed = this.answering;
    this.answering = this.statements.length;
    const failedName = this.statements[failed]?.name;
    // Learnt again on its next run: what failed may have been the statement itself.
    if (failedName) this.descriptions?.delete(failedName);
    this.statements[failed]?.handleError(error, connection);
    for (let index = failed + 1; index < this.statements.length; index += 1) {
      const skipped = this.statements[index]!;
      // PostgreSQL never got to this Parse: the name must be parsed again next time.
      if (this.parsedHere.has(index) && connection && skipped.name) delete connection.submittedNamedStatements[skipped.name];
      skipped.handleError(new StatementNotRun(error), connection);
    }
  }

  handleReadyForQuery(connection: WireConnection): void {
    const last = this.statements[this.statements.length - 1]!;
    if (this.answering === this.statements.length) return last.handleReadyForQuery(connection);
    // Every statement has normally been answered by now; one that was not can only have been lost.
    this.handleError(new Error('The batch ended before every statement was answered'), connection);
  }

  /**
   * Hands the statement its result (pg's Query delivers at ReadyForQuery, which a batch gets once)
   * and moves on. The last one's waits for the ReadyForQuery, as pg's own Query does: whoever gets
   * it (a COMMIT's caller releasing the connection) sees the connection's transaction status as it is.
   */
  private answered(statement: StatementQuery, connection: WireConnection): void {
    this.answering += 1;
    this.describing = false;
    if (this.answering < this.statements.length) statement.handleReadyForQuery(connection);
  }
}
