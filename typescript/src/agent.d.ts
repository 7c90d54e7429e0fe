/** Any JSON value (what JSON.parse gives). */
export type Json = any;

export declare const MAX_REPLY_BYTES: number;

/** What an agent's fn returns: made by done(), fail() or call(). */
export declare class Reply {
  private constructor(document: Record<string, Json>);
  readonly document: Record<string, Json>;
  readonly kind: "complete" | "fail" | "tool_calls";
}

/** One tool call of a call() reply. */
export interface Call {
  tool: string;
  args?: Record<string, Json> | null;
  /** 1 to 256 bytes, no control characters; c1, c2, ... by position when left out. */
  id?: string | null;
  /** 1 to 604,800: overrides the tool's timeout for this call. */
  timeoutSeconds?: number | null;
  /** The protocol's own spelling of timeoutSeconds. */
  timeout_seconds?: number | null;
}

export declare function done(output?: Json): Reply;
export declare function fail(code: string, message: string): Reply;
export declare function call(calls: Call[], options?: { wait?: "all" | "any" | number; state?: Json }): Reply;

export declare class ToolError extends Error {
  constructor(code: string, message: string);
  readonly code: string;
  /** The message as answered (message is "code: message"). */
  readonly toolMessage: string;
}

export declare class RateLimited extends ToolError {
  constructor(retryAfter: number, message?: string);
  readonly retryAfter: number;
}

export declare class ToolResult {
  private constructor(d: Json);
  readonly toolCallId: string;
  readonly tool: string;
  readonly status: "ok" | "error" | "timeout" | "cancelled" | string;
  readonly output: Json;
  readonly error: { code?: string; message?: string; [k: string]: Json } | null;
  readonly ok: boolean;
  readonly code: string | null;
  readonly message: string | null;
}

export declare class Step {
  private constructor(doc: Record<string, Json>);
  readonly input: Json;
  readonly state: Json;
  readonly results: readonly ToolResult[];
  readonly turnId: string;
  readonly agent: string;
  readonly profile: string;
  readonly channelId: string | null;
  readonly epoch: number | null;
  readonly step: number;
  readonly attempt: number;
  /** When this step's time limit ends (the database clock), or null when the worker does not say. */
  readonly deadline: Date | null;
  readonly depth: number;
  readonly raw: Record<string, Json>;
  result(toolCallId: string): ToolResult;
}

export declare class ToolCall {
  private constructor(doc: Record<string, Json>);
  readonly toolCallId: string;
  readonly tool: string;
  readonly args: Record<string, Json>;
  readonly turnId: string;
  readonly raw: Record<string, Json>;
}

export type StepFn = (step: Step) => Reply | Promise<Reply>;
export type ToolFn = (call: ToolCall) => Json | Promise<Json>;
export interface RunOptions {
  /** "exec" or "serve"; by default from TURNWATCH_MODE. */
  mode?: "exec" | "serve";
}

export declare function exceptionText(e: unknown): string;
export declare function handleStep(fn: StepFn, data: Uint8Array | string): Promise<string>;
export declare function handleCall(fn: ToolFn, data: Uint8Array | string): Promise<string>;
export declare function run(fn: StepFn, options?: RunOptions): Promise<void>;
export declare function runTool(fn: ToolFn, options?: RunOptions): Promise<void>;
