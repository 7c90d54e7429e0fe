import type { Json } from "./agent.js";

export declare const TERMINAL_STATUSES: readonly ["done", "failed", "timeout", "cancelled"];
export declare const NOTIFY_CHANNEL: "tw_turn_end";

/** A connected pg client (pg.Client or a pool's client) of the caller's: the call runs in its transaction. */
export interface Queryable {
  query(config: { text: string; values?: unknown[]; rowMode?: "array" }): Promise<{ rows: any[] }>;
}

export interface WithClient {
  client?: Queryable;
}

export declare class Outcome {
  private constructor(d: Record<string, Json>);
  readonly turnId: string;
  readonly agent: string;
  readonly profile: string;
  readonly status: string;
  readonly error: string | null;
  readonly errorMessage: string | null;
  readonly output: Json;
  readonly deliverable: Record<string, Json> | null;
  readonly epoch: number | null;
  readonly attempt: number;
  readonly createdAt: Date | null;
  readonly endedAt: Date | null;
  readonly terminal: boolean;
  readonly ok: boolean;
}

export interface SubmitOptions extends WithClient {
  timeoutSeconds?: number;
  idempotencyKey?: string;
  profile?: string;
  box?: string;
  limitKey?: string;
  /** 0 to 9 */
  priority?: number;
  /** The turn runs from then on (p_not_before). */
  notBefore?: Date | string;
}

export interface ScheduleOptions extends WithClient {
  timezone?: string;
  channel?: string;
  input?: Json;
  timeoutSeconds?: number;
  limitKey?: string;
  overlap?: string;
  catchup?: string | boolean;
  catchupWindowSeconds?: number;
}

export interface LimitOptions extends WithClient {
  rate?: [number, number];
  burst?: number;
  perKey?: boolean;
  maxWaitSeconds?: number;
}

export declare class Client {
  constructor(dsn: string);
  connection(): Promise<Queryable>;
  close(): Promise<void>;
  submit(agent: string, channel: string, input: Json, options?: SubmitOptions): Promise<string>;
  outcome(turn: string): Promise<Outcome>;
  wait(turn: string, timeoutMs?: number | null, options?: { pollMs?: number }): Promise<Outcome>;
  cancel(turn: string, options?: WithClient): Promise<"cancelled" | "already_ended" | "unknown_turn" | string>;
  postToolResult(turn: string, call: string, status?: "ok" | "error", output?: Json, options?: WithClient):
    Promise<string>;
  turn(turn: string): Promise<Record<string, Json>>;
  history(turn: string): Promise<Array<Record<string, Json>>>;
  tree(turn: string): Promise<Record<string, Json>>;
  addAgent(agent: string, profile: string, metadata?: Record<string, Json> | null, options?: WithClient):
    Promise<boolean>;
  retireAgent(agent: string, options?: WithClient): Promise<boolean>;
  setLimit(name: string, maxConcurrent?: number, options?: LimitOptions): Promise<Record<string, Json>>;
  removeLimit(name: string, options?: WithClient): Promise<boolean>;
  limits(): Promise<Array<Record<string, Json>>>;
  addSchedule(name: string, agent: string, cron: string, options?: ScheduleOptions): Promise<Json>;
}
