export declare const BAD_INPUT: "22023";

/** A failure of a turnwatch call. */
export declare class TurnwatchError extends Error {
  constructor(reason: string, sqlstate?: string | null,
    options?: { detail?: string | null; hint?: string | null; cause?: unknown });
  /** The five-character SQLSTATE, or null (e.g. a connection that could not be made). */
  readonly sqlstate: string | null;
  /** The reason in words (PostgreSQL's primary message). */
  readonly reason: string;
  readonly detail: string | null;
  readonly hint: string | null;
  static badInput(reason: string): TurnwatchError;
}

/** wait() when the turn has not ended within its time. */
export declare class TimeoutError extends Error {
  constructor(message: string);
}
