// Client: submit turns and follow them through PostgreSQL alone (docs/typescript.md, docs/sql-api.md). Every call
// goes to the SQL API (schema tw); wait() hears a turn's end through LISTEN tw_turn_end (tw.turn_wait registers
// the session as the turn's waiter, and the transaction that ends the turn notifies with its id). `pg` is loaded
// when a Client first connects, so that agent programs need no npm package.

import { BAD_INPUT, TimeoutError, TurnwatchError } from "./errors.js";
import { JsonError, loneSurrogate, show, stringify } from "./json.js";

/** The statuses a turn ends in. */
export const TERMINAL_STATUSES = Object.freeze(["done", "failed", "timeout", "cancelled"]);
/** The channel the database notifies (payload: the turn id) when a turn someone waits for ends. */
export const NOTIFY_CHANNEL = "tw_turn_end";
const SAFETY_POLL_MS = 5000;
const OBSERVER_POLL_MS = 500;
const UUID_RE = /^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$/i;

let pgModule;
async function loadPg() {
  if (!pgModule) {
    try {
      pgModule = (await import("pg")).default;
    } catch (e) {
      throw new TurnwatchError(`the npm package pg cannot be loaded (npm install pg): ${e && e.message}`);
    }
  }
  return pgModule;
}

function dbError(e) {
  if (e instanceof TurnwatchError) return e;
  const sqlstate = typeof e?.code === "string" && /^[0-9A-Z]{5}$/.test(e.code) ? e.code : null;
  const reason = (e && e.message) || String(e);
  return new TurnwatchError(reason, sqlstate, { detail: e?.detail ?? null, hint: e?.hint ?? null, cause: e });
}

function turnId(turn) {
  if (typeof turn === "string" && UUID_RE.test(turn)) {
    const hex = turn.replace(/-/g, "").toLowerCase();
    return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
  }
  throw TurnwatchError.badInput(`${show(turn)} is not a turn id (a UUID)`);
}

/** A text argument as it is, or 22023 for one PostgreSQL cannot take (NUL, lone surrogate) or no text at all. */
function txt(value, what) {
  if (value === undefined || value === null) return null;
  if (typeof value !== "string") throw TurnwatchError.badInput(`${what} must be text, not ${show(value)}`);
  const nul = value.indexOf("\u0000");
  if (nul >= 0)
    throw TurnwatchError.badInput(`${what} contains a NUL character (U+0000) at position ${nul}, which PostgreSQL ` +
      "text cannot hold");
  const lone = loneSurrogate(value);
  if (lone) throw TurnwatchError.badInput(`${what} is not valid Unicode text: a lone surrogate (${lone})`);
  return value;
}

function json(value, what) {
  try {
    return stringify(value);
  } catch (e) {
    if (e instanceof JsonError && e.kind === "nul")
      throw TurnwatchError.badInput(`${what}: ${e.message.replace("neither the worker nor PostgreSQL's jsonb reads",
        "PostgreSQL's jsonb cannot hold")}`);
    if (e instanceof JsonError && e.kind === "surrogate") throw TurnwatchError.badInput(`${what}: ${e.message}`);
    throw TurnwatchError.badInput(`${what} is not JSON-serialisable: ${e && e.message}`);
  }
}

function int(value, what, lo, hi) {
  if (value === undefined || value === null) return null;
  if (!Number.isInteger(value) || value < lo || value > hi)
    throw TurnwatchError.badInput(`${what} must be a whole number from ${lo} to ${hi}, not ${show(value)}`);
  return value;
}

function num(value, what) {
  if (value === undefined || value === null) return null;
  if (typeof value !== "number" || !Number.isFinite(value))
    throw TurnwatchError.badInput(`${what} must be a number, not ${show(value)}`);
  return value;
}

function time(value) {
  return value ? new Date(value) : null;
}

/** Where a turn stands (outcome()), or how it ended (wait()). */
export class Outcome {
  constructor(d) {
    this.turnId = String(d.turn_id);
    this.agent = d.agent ?? "";
    this.profile = d.profile ?? "";
    this.status = d.status;
    this.error = d.error ?? null;
    this.errorMessage = d.error_message ?? null;
    this.output = d.output === undefined ? null : d.output;
    this.deliverable = d.deliverable ?? null;
    this.epoch = d.turn_epoch ?? null;
    this.attempt = d.attempt || 1;
    this.createdAt = time(d.created_at);
    this.endedAt = time(d.ended_at);
    Object.freeze(this);
  }

  /** True once the turn has ended (done, failed, timeout or cancelled). */
  get terminal() {
    return TERMINAL_STATUSES.includes(this.status);
  }

  /** True when the turn ended done. */
  get ok() {
    return this.status === "done";
  }
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/**
 * A connection to turnwatch's database and the calls of its SQL API. dsn: a libpq connection string or URI. The
 * client opens one connection when first needed (each call its own transaction); after a connection failure the
 * next call connects again. The calls that write take {client}: a connected pg client of the caller's, on which
 * the call runs inside the caller's transaction.
 */
export class Client {
  constructor(dsn) {
    if (typeof dsn !== "string") throw new TypeError("Client(dsn): dsn must be a connection string");
    this._dsn = dsn;
    this._conn = null;
    this._connecting = null;
    this._listening = false;
    this._waiters = new Map(); // turn id -> set of callbacks
    this._unregistered = false; // tw.turn_wait refused (an observer's role): no notification will come
    this._closed = false;
  }

  /** The client's own connection, connecting when there is none or the last one broke. */
  async connection() {
    if (this._conn) return this._conn;
    if (!this._connecting) {
      this._connecting = (async () => {
        const pg = await loadPg();
        const c = new pg.Client({ connectionString: this._dsn });
        c.on("error", () => this._drop(c)); // the next call connects again
        c.on("end", () => this._drop(c));
        c.on("notification", (n) => {
          if (n.channel !== NOTIFY_CHANNEL) return;
          for (const cb of this._waiters.get(n.payload) ?? []) cb();
        });
        try {
          await c.connect();
        } catch (e) {
          c.end().catch(() => {});
          throw dbError(e);
        }
        this._conn = c;
        this._listening = false;
        return c;
      })().finally(() => {
        this._connecting = null;
      });
    }
    return this._connecting;
  }

  _drop(c) {
    if (c && this._conn !== c) return;
    const conn = this._conn;
    this._conn = null;
    this._listening = false;
    if (conn) conn.end().catch(() => {});
    for (const cbs of this._waiters.values()) for (const cb of cbs) cb();
  }

  /** Close the connection (a later call opens a new one). */
  async close() {
    const conn = this._conn;
    this._conn = null;
    this._listening = false;
    if (conn) await conn.end().catch(() => {});
  }

  async _value(sql, params, client) {
    let c = client;
    if (c !== undefined && c !== null) {
      if (typeof c.query !== "function") throw new TypeError("client must be a connected pg client (with query())");
    } else c = await this.connection();
    let res;
    try {
      res = await c.query({ text: sql, values: params, rowMode: "array" });
    } catch (e) {
      if (!client && !(typeof e?.code === "string" && /^[0-9A-Z]{5}$/.test(e.code) && !/^(08|57)/.test(e.code)))
        this._drop(c);
      throw dbError(e);
    }
    return res.rows.length ? res.rows[0][0] : null;
  }

  // ---- the SQL API ------------------------------------------------------------------------------------------------

  /**
   * Submit a turn for agent (tw.submit_turn) and resolve to its id. With {client}, inside the caller's transaction.
   */
  async submit(agent, channel, input, opts = {}) {
    const { timeoutSeconds, idempotencyKey, profile, box, limitKey, priority = 0, notBefore, client } = opts;
    const params = [txt(agent, "the agent"), txt(channel, "the channel"), json(input, "the input"),
      int(timeoutSeconds, "timeoutSeconds", -(2 ** 31), 2 ** 31 - 1), txt(idempotencyKey, "the idempotency key"),
      txt(box, "the box"), txt(profile, "the profile"), txt(limitKey, "the limit key"),
      int(priority, "priority", 0, 9)];
    let sql = "SELECT tw.submit_turn(agent => $1::text, channel => $2::text, input => $3::jsonb," +
      " timeout_seconds => $4::integer, idempotency_key => $5::text, box => $6::text, profile => $7::text," +
      " p_limit_key => $8::text, p_priority => $9::integer";
    if (notBefore !== undefined && notBefore !== null) {
      const d = notBefore instanceof Date ? notBefore : new Date(txt(notBefore, "notBefore"));
      if (Number.isNaN(d.getTime()))
        throw TurnwatchError.badInput(`notBefore must be a Date or an ISO 8601 time, not ${show(notBefore)}`);
      params.push(d.toISOString());
      sql += ", p_not_before => $10::timestamptz";
    }
    return String(await this._value(sql + ")", params, client));
  }

  /** Where the turn stands now (tw.turn_outcome); 22023 for an unknown turn. */
  async outcome(turn) {
    const tid = turnId(turn);
    const d = await this._value("SELECT tw.turn_outcome($1::uuid)", [tid]);
    if (d === null) throw TurnwatchError.badInput(`no turn ${tid}`);
    return new Outcome(d);
  }

  async _outcomeWaiting(tid) {
    if (this._unregistered) return this.outcome(tid);
    let d;
    try {
      d = await this._value("SELECT tw.turn_wait($1::uuid)", [tid]);
    } catch (e) {
      if (e.sqlstate !== "42501") throw e;
      this._unregistered = true; // an observer may read but not register: read every OBSERVER_POLL_MS
      return this.outcome(tid);
    }
    if (d === null) throw TurnwatchError.badInput(`no turn ${tid}`);
    return new Outcome(d);
  }

  async _listen() {
    const c = await this.connection();
    if (!this._listening) {
      try {
        await c.query(`LISTEN ${NOTIFY_CHANNEL}`);
      } catch (e) {
        this._drop(c);
        throw dbError(e);
      }
      this._listening = true;
    }
    return c;
  }

  /**
   * Wait until the turn has ended and resolve to its Outcome ({status, error, errorMessage, output, ...}); reject
   * with TimeoutError when it has not after timeoutMs (undefined: as long as it takes), TurnwatchError 22023 for an
   * unknown turn. Listens on tw_turn_end; reads the turn at the start, when its notification comes and every
   * pollMs (a safety net); rides out a lost connection, trying again every second.
   */
  async wait(turn, timeoutMs, { pollMs = SAFETY_POLL_MS } = {}) {
    const tid = turnId(turn);
    const deadline = timeoutMs === undefined || timeoutMs === null ? null : Date.now() + timeoutMs;
    const left = () => (deadline === null ? null : deadline - Date.now());
    let heard = false;
    let wake = null;
    const cb = () => {
      heard = true;
      if (wake) wake();
    };
    if (!this._waiters.has(tid)) this._waiters.set(tid, new Set());
    this._waiters.get(tid).add(cb);
    try {
      for (;;) {
        heard = false;
        let out;
        try {
          await this._listen();
          out = await this._outcomeWaiting(tid);
        } catch (e) {
          if (e.sqlstate && !/^(08|57)/.test(e.sqlstate)) throw e; // a real answer, not an outage
          this._drop(this._conn);
          const l = left();
          if (l !== null && l <= 0) throw e;
          await sleep(Math.min(pollMs, 1000, l ?? Infinity));
          continue;
        }
        if (out.terminal) return out;
        const l = left();
        if (l !== null && l <= 0)
          throw new TimeoutError(`turn ${tid} is still ${out.status} after ${timeoutMs} ms`);
        const every = this._unregistered ? Math.min(pollMs, OBSERVER_POLL_MS) : pollMs;
        if (!heard) {
          await new Promise((resolve) => {
            const timer = setTimeout(resolve, Math.min(every, l ?? Infinity));
            wake = () => {
              clearTimeout(timer);
              resolve();
            };
          });
          wake = null;
        }
      }
    } finally {
      const set = this._waiters.get(tid);
      set.delete(cb);
      if (!set.size) this._waiters.delete(tid);
    }
  }

  /** Cancel a turn that has not ended (tw.cancel_turn): "cancelled", "already_ended" or "unknown_turn". */
  async cancel(turn, { client } = {}) {
    return String(await this._value("SELECT tw.cancel_turn(turn => $1::uuid)", [turnId(turn)], client));
  }

  /**
   * Post the result of an external tool call (tw.post_tool_result): status "ok" with output the tool's output, or
   * "error" with output {code, message}. Resolves to "accepted", or why not.
   */
  async postToolResult(turn, call, status = "ok", output = null, { client } = {}) {
    return String(await this._value(
      "SELECT tw.post_tool_result(turn => $1::uuid, call => $2::text, status => $3::text, output => $4::jsonb)",
      [turnId(turn), txt(call, "the call id"), txt(status, "the status"), json(output, "the output")], client));
  }

  /** The turn as `turnwatch turn show ID --json` gives it (tw.turn_show). */
  async turn(turn) {
    const tid = turnId(turn);
    const d = await this._value("SELECT tw.turn_show($1::uuid)", [tid]);
    if (d === null) throw TurnwatchError.badInput(`no turn ${tid}`);
    return d;
  }

  /** Every transition of the turn in order (tw.turn_history). */
  async history(turn) {
    const tid = turnId(turn);
    const rows = await this._value("SELECT tw.turn_history($1::uuid)", [tid]);
    if (!Array.isArray(rows) || rows.length === 0) throw TurnwatchError.badInput(`no turn ${tid}`);
    return rows;
  }

  /** The delegation tree the turn belongs to, from its root (tw.turn_tree). */
  async tree(turn) {
    const tid = turnId(turn);
    const d = await this._value("SELECT tw.turn_tree($1::uuid)", [tid]);
    if (d === null) throw TurnwatchError.badInput(`no turn ${tid}`);
    return d;
  }

  /** Add an agent to the roster bound to profile (tw.add_agent): true when created, false when it exists so. */
  async addAgent(agent, profile, metadata = null, { client } = {}) {
    return Boolean(await this._value(
      "SELECT tw.add_agent(agent => $1::text, profile => $2::text, metadata => $3::jsonb)",
      [txt(agent, "the agent"), txt(profile, "the profile"),
        metadata === null || metadata === undefined ? null : json(metadata, "the metadata")], client));
  }

  /** Retire an agent (tw.retire_agent): true when it was active until now. */
  async retireAgent(agent, { client } = {}) {
    return Boolean(await this._value("SELECT tw.retire_agent(agent => $1::text)", [txt(agent, "the agent")], client));
  }

  /**
   * Set a limit of flow control at run time (tw.set_limit) and resolve to it as `limits show --json` gives it.
   * rate: [n, seconds]; burst; perKey; maxWaitSeconds (docs/flow-control.md).
   */
  async setLimit(name, maxConcurrent = 0, { rate, burst, perKey = false, maxWaitSeconds = 0, client } = {}) {
    const [n, sec] = rate ?? [null, null];
    const d = await this._value(
      "SELECT tw.set_limit($1::text, $2::integer, $3::integer, $4::numeric, $5::integer, $6::boolean, $7::numeric)",
      [txt(name, "the limit"), int(maxConcurrent, "maxConcurrent", -(2 ** 31), 2 ** 31 - 1),
        int(n, "rate's n", -(2 ** 31), 2 ** 31 - 1), num(sec, "rate's seconds"),
        int(burst, "burst", -(2 ** 31), 2 ** 31 - 1), Boolean(perKey), num(maxWaitSeconds, "maxWaitSeconds")], client);
    return d && typeof d === "object" ? d : {};
  }

  /** Remove a limit (tw.remove_limit): true when there was one. */
  async removeLimit(name, { client } = {}) {
    return Boolean(await this._value("SELECT tw.remove_limit($1::text)", [txt(name, "the limit")], client));
  }

  /** Every limit as `turnwatch limits list --json` gives it. */
  async limits() {
    const d = await this._value("SELECT tw.limits_list()", []);
    return Array.isArray(d) ? d : [];
  }

  /**
   * Add a recurring schedule (tw.add_schedule): a turn of agent at each time of the cron expression. Options left
   * out take the SQL API's defaults.
   */
  async addSchedule(name, agent, cron, opts = {}) {
    const { timezone, channel, input, timeoutSeconds, limitKey, overlap, catchup, catchupWindowSeconds, client } = opts;
    const args = [["p_name", txt(name, "the schedule name")], ["p_agent", txt(agent, "the agent")],
      ["p_cron", txt(cron, "the cron expression")]];
    const more = {
      p_timezone: timezone === undefined ? undefined : txt(timezone, "the timezone"),
      p_channel: channel === undefined ? undefined : txt(channel, "the channel"),
      p_input: input === undefined ? undefined : json(input, "the input"),
      p_timeout_seconds: timeoutSeconds === undefined ? undefined :
        int(timeoutSeconds, "timeoutSeconds", -(2 ** 31), 2 ** 31 - 1),
      p_limit_key: limitKey === undefined ? undefined : txt(limitKey, "the limit key"),
      p_overlap: overlap === undefined ? undefined : txt(overlap, "overlap"),
      p_catchup: catchup === undefined ? undefined : typeof catchup === "boolean" ? catchup : txt(catchup, "catchup"),
      p_catchup_window_seconds: catchupWindowSeconds === undefined ? undefined :
        int(catchupWindowSeconds, "catchupWindowSeconds", -(2 ** 31), 2 ** 31 - 1),
    };
    for (const [k, v] of Object.entries(more)) if (v !== undefined) args.push([k, v]);
    const sql = `SELECT tw.add_schedule(${args.map(([k], i) => `${k} => $${i + 1}`).join(", ")})`;
    return this._value(sql, args.map(([, v]) => v), client);
  }
}

export { BAD_INPUT };
