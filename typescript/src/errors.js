// TurnwatchError: what the client throws for every failure (docs/typescript.md). Apart from the client so that
// agent and tool programs, which need no `pg`, can import it too.

/** SQLSTATE of bad input (invalid_parameter_value), from the SQL API and from the client's own checks alike. */
export const BAD_INPUT = "22023";

/** A failure of a turnwatch call: `sqlstate` (null when there is none, e.g. no connection), `reason` in words. */
export class TurnwatchError extends Error {
  constructor(reason, sqlstate = null, { detail = null, hint = null, cause } = {}) {
    super(sqlstate ? `${reason} (SQLSTATE ${sqlstate})` : reason, cause === undefined ? undefined : { cause });
    this.name = "TurnwatchError";
    this.reason = reason;
    this.sqlstate = sqlstate;
    this.detail = detail;
    this.hint = hint;
  }

  /** An error for an argument the client refuses before it reaches the database (SQLSTATE 22023). */
  static badInput(reason) {
    return new TurnwatchError(reason, BAD_INPUT);
  }
}

/** wait() when the turn has not ended within its time. */
export class TimeoutError extends Error {
  constructor(message) {
    super(message);
    this.name = "TimeoutError";
  }
}
