// turnwatch console: the page. Routes in the URL's fragment (#/, #/turn/ID, #/daemons, #/dead-letters), data
// from /api/ only, refreshed by polling while a view is open. Every element is made with createElement and every
// value from the data is set as textContent or an attribute: no HTML is ever built from strings.
"use strict";

(function () {
  const TERMINAL = new Set(["done", "failed", "timeout", "cancelled"]);
  // A pending turn's reason (tw.pending_reason: sql/fn/later.sql), in words; waiting_limit:NAME names its limit.
  const PENDING = { scheduled: "it runs later", retry: "its next attempt waits for its retry time",
    waiting_limit: "waiting for limit" };
  const pendingText = (reason) => {
    const [why, name] = reason.split(":");
    return (PENDING[why] || why) + (name ? ` ${name}` : "");
  };
  const STATUSES = ["pending", "dispatched", "running", "suspended", "done", "failed", "timeout", "cancelled"];
  const view = document.getElementById("view");
  const problem = document.getElementById("problem");
  const updated = document.getElementById("updated");
  let generation = 0; // bumped on every navigation: answers for an older view are dropped
  let timer = null;

  // el("a", {href: "#/"}, "text", child...): an element with attributes and children (strings become text).
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") e.className = v;
      else if (k === "dataset") Object.assign(e.dataset, v);
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) {
      if (c === undefined || c === null || c === false) continue;
      e.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
    }
    return e;
  }

  async function api(path) {
    const r = await fetch(path, { headers: { Accept: "application/json" }, cache: "no-store", credentials: "same-origin" });
    let body = null;
    try {
      body = await r.json();
    } catch (e) {
      body = null;
    }
    if (!r.ok) throw new Error((body && body.error) || `${r.status} ${r.statusText}`);
    return body;
  }

  function showProblem(err) {
    if (err) {
      problem.textContent = `Could not refresh: ${err.message || err}`;
      problem.hidden = false;
    } else {
      problem.hidden = true;
    }
  }

  function when(s) {
    if (!s) return "–";
    const d = new Date(s);
    return Number.isNaN(d.getTime()) ? s : d.toISOString().replace("T", " ").replace("Z", " UTC");
  }

  function badge(status) {
    return el("span", { class: `badge st-${status}`, dataset: { status } }, status || "–");
  }

  function turnLink(id, text) {
    return el("a", { href: `#/turn/${id}`, class: "turn-link" }, el("code", {}, text || id));
  }

  function duration(a, b) {
    if (!a) return "–";
    const x = Date.parse(a);
    const y = b ? Date.parse(b) : NaN;
    return Number.isNaN(y) ? "–" : window.TwTimeline.span(y - x);
  }

  function table(headers, rows, attrs) {
    return el("table", attrs || {}, el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
      el("tbody", {}, rows.length ? rows : [el("tr", {}, el("td", { colspan: headers.length, class: "muted" }, "nothing to show"))]));
  }

  // Polls fn every ms while the view that started it is open.
  function poll(gen, fn, ms) {
    const run = async () => {
      if (gen !== generation) return;
      let next = ms;
      try {
        next = (await fn()) || ms;
        showProblem(null);
        updated.textContent = `updated ${new Date().toLocaleTimeString()}`;
      } catch (err) {
        if (gen === generation) showProblem(err);
      }
      if (gen === generation) timer = setTimeout(run, next);
    };
    run();
  }

  function parseHash() {
    const h = location.hash.replace(/^#/, "") || "/";
    const [path, query] = h.split("?");
    return { path, params: new URLSearchParams(query || "") };
  }

  function navigate() {
    generation++;
    clearTimeout(timer);
    showProblem(null);
    const { path, params } = parseHash();
    const parts = path.split("/").filter(Boolean);
    document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active",
      a.dataset.nav === (parts[0] === "turn" || !parts[0] ? "turns" : parts[0])));
    if (parts[0] === "turn" && parts[1]) turnView(parts[1]);
    else if (parts[0] === "daemons") daemonsView();
    else if (parts[0] === "dead-letters") deadLettersView(params);
    else turnsView(params);
  }

  // ---- turns ---------------------------------------------------------------------------------------------------

  function toLocalInput(iso) {
    if (!iso) return "";
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return "";
    const off = d.getTimezoneOffset() * 60000;
    return new Date(d.getTime() - off).toISOString().slice(0, 16).replace("T", " ");
  }

  function turnsView(params) {
    const gen = generation;
    const f = {};
    const form = el("form", { class: "filters", id: "filters" },
      el("label", {}, "Agent ", f.agent = el("input", { name: "agent", value: params.get("agent") || "", pattern: "[A-Za-z0-9_\\-]{1,64}", size: 14 })),
      el("label", {}, "Profile ", f.profile = el("input", { name: "profile", value: params.get("profile") || "", pattern: "[A-Za-z0-9_\\-]{1,64}", size: 12 })),
      el("label", {}, "Status ", f.status = el("select", { name: "status" }, el("option", { value: "" }, "any"),
        STATUSES.map((s) => el("option", { value: s, selected: params.get("status") === s }, s)))),
      // Plain text, local time (YYYY-MM-DD HH:MM) or any timestamp Date reads: a datetime-local field would make
      // Chromium load an icon of its own, and every request of this page goes to this server.
      el("label", {}, "From ", f.since = el("input", { name: "since", value: toLocalInput(params.get("since")), placeholder: "YYYY-MM-DD HH:MM", size: 16 })),
      el("label", {}, "To ", f.before = el("input", { name: "before", value: toLocalInput(params.get("before")), placeholder: "YYYY-MM-DD HH:MM", size: 16 })),
      el("button", { type: "button", class: "quick", onclick: () => { f.since.value = toLocalInput(new Date(Date.now() - 3600e3).toISOString()); f.before.value = ""; } }, "last hour"),
      el("button", { type: "button", class: "quick", onclick: () => { f.since.value = toLocalInput(new Date(Date.now() - 86400e3).toISOString()); f.before.value = ""; } }, "last day"),
      el("button", { type: "submit" }, "Show"));
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const q = new URLSearchParams();
      for (const k of ["agent", "profile", "status"]) if (f[k].value) q.set(k, f[k].value);
      for (const k of ["since", "before"]) {
        if (!f[k].value.trim()) continue;
        const d = new Date(f[k].value.trim().replace(" ", "T"));
        if (Number.isNaN(d.getTime())) {
          showProblem(new Error(`${k === "since" ? "From" : "To"}: not a time (YYYY-MM-DD HH:MM)`));
          return;
        }
        q.set(k, d.toISOString());
      }
      location.hash = `#/?${q}`;
    });
    const body = el("div", { id: "turns" });
    const pager = el("div", { class: "pager" });
    view.replaceChildren(el("h1", {}, "Turns"), form, body, pager);
    poll(gen, async () => {
      const q = new URLSearchParams();
      for (const k of ["agent", "profile", "status", "since", "before", "cursor"]) if (params.get(k)) q.set(k, params.get(k));
      q.set("limit", "50");
      const page = await api(`/api/turns?${q}`);
      if (gen !== generation) return;
      const rows = page.turns.map((t) => el("tr", { dataset: { turn: t.turn_id } },
        el("td", {}, turnLink(t.turn_id)),
        el("td", {}, el("a", { href: `#/?agent=${encodeURIComponent(t.agent)}` }, t.agent)),
        el("td", {}, t.profile),
        el("td", {}, badge(t.status)),
        el("td", {}, t.error || ""),
        el("td", { class: "num" }, String(t.attempt)),
        el("td", {}, t.depth ? `child (depth ${t.depth})` : ""),
        el("td", {}, when(t.created_at)),
        el("td", { class: "num" }, duration(t.created_at, t.ended_at || (TERMINAL.has(t.status) ? null : page.now)))));
      body.replaceChildren(table(["Turn", "Agent", "Profile", "Status", "Error", "Attempt", "Delegated", "Submitted", "Duration"], rows, { class: "turns" }));
      const kids = [];
      if (params.get("cursor")) {
        const q2 = new URLSearchParams(params);
        q2.delete("cursor");
        kids.push(el("a", { href: `#/?${q2}` }, "← newest"));
      }
      if (page.next !== null && page.next !== undefined) {
        const q3 = new URLSearchParams(params);
        q3.set("cursor", String(page.next));
        kids.push(el("a", { href: `#/?${q3}`, id: "older" }, "older →"));
      }
      kids.push(el("span", { class: "muted" }, `${page.turns.length} shown, ${page.examined} read`));
      pager.replaceChildren(...kids);
      return 2000;
    }, 2000);
  }

  // ---- one turn ------------------------------------------------------------------------------------------------

  function field(name, value) {
    return [el("dt", {}, name), el("dd", {}, value === undefined || value === null || value === "" ? "–" : value)];
  }

  // The server sends at most 500 turns of a tree (the first, depth first): a turn some of whose children are left
  // out says how many it has.
  function treeList(nodeData, current) {
    const kids = nodeData.children || [];
    const me = nodeData.turn_id === current;
    const more = nodeData.children_total ? nodeData.children_total - kids.length : 0;
    return el("li", { class: me ? "current" : "" },
      turnLink(nodeData.turn_id), " ", el("span", { class: "agent" }, nodeData.agent), " ", badge(nodeData.status),
      nodeData.error ? el("span", { class: "muted" }, ` ${nodeData.error}`) : null,
      nodeData.parent_tool_call_id ? el("span", { class: "muted" }, ` call ${nodeData.parent_tool_call_id}`) : null,
      kids.length || more ? el("ul", {}, kids.map((k) => treeList(k, current)),
        more ? el("li", { class: "muted tree-more" }, `… and ${more} more of its ${nodeData.children_total} children, not drawn`) : null) : null);
  }

  // What the page says above a tree it could not draw whole.
  function treeNote(tr, id) {
    if (!tr.truncated) return null;
    return el("p", { class: "muted", id: "tree-capped" },
      `A large tree: ${tr.tree_turns} turns, of which the first ${countTurns(tr)} are drawn. The whole tree: turnwatch turn tree ${id}`);
  }

  function countTurns(node) {
    return 1 + (node.children || []).reduce((n, k) => n + countTurns(k), 0);
  }

  function turnView(id) {
    const gen = generation;
    if (!/^[0-9a-fA-F-]{36}$/.test(id)) {
      view.replaceChildren(el("h1", {}, "Not a turn id"), el("p", {}, id));
      return;
    }
    const head = el("section", { id: "turn-head" });
    const timeline = el("div", { id: "timeline", class: "timeline-box" });
    const tree = el("section", { id: "tree" });
    const calls = el("section", { id: "calls" });
    const history = el("section", { id: "history" });
    const extras = el("section", { id: "extras" });
    const deliverable = el("section", { id: "deliverable-box" });
    view.replaceChildren(el("h1", {}, "Turn ", el("code", { id: "turn-id" }, id), " ", el("span", { id: "turn-status" }, "…")),
      head, el("h2", {}, "Timeline"), window.TwTimeline.legend(), timeline, el("h2", {}, "Delegation tree"), tree,
      el("h2", {}, "Tool calls"), calls, el("h2", {}, "History"), history, extras, el("h2", {}, "Deliverable"), deliverable);
    let lastDeliverable;
    poll(gen, async () => {
      const [t, hist, tr] = await Promise.all([api(`/api/turns/${id}`), api(`/api/turns/${id}/history`), api(`/api/turns/${id}/tree`)]);
      if (gen !== generation) return;
      const status = document.getElementById("turn-status");
      status.replaceChildren(badge(t.status));
      status.dataset.status = t.status;
      document.title = `${t.status} · turn ${id.slice(0, 8)} · turnwatch`;
      head.replaceChildren(el("dl", { class: "fields" },
        field("agent", el("a", { href: `#/?agent=${encodeURIComponent(t.agent)}` }, t.agent)),
        field("profile", t.profile), field("channel", t.channel_id), field("output box", t.output_box_id),
        field("attempt", `${t.attempt} of ${t.max_attempts}`), field("epoch", t.turn_epoch), field("step", t.step),
        field("error", t.error ? `${t.error}${t.error_message ? ": " + t.error_message : ""}` : null),
        field("submitted", when(t.created_at)), field("started", when(t.started_at)), field("ended", when(t.ended_at)),
        field("duration", duration(t.created_at, t.ended_at || t.now)),
        field("deadline", t.deadline_at ? `${when(t.deadline_at)} (--timeout ${t.timeout_seconds} s)` : null),
        field("queue deadline", t.queue_deadline_at ? when(t.queue_deadline_at) : null),
        field("retry at", t.retry_at && !TERMINAL.has(t.status) ? when(t.retry_at) : null),
        field("runs at", t.not_before ? when(t.not_before) : null),
        field("pending because", t.pending_reason ? pendingText(t.pending_reason) : null),
        field("parent", t.parent_turn_id ? turnLink(t.parent_turn_id) : null),
        field("replay of", t.replay_of ? turnLink(t.replay_of) : null),
        field("timeout", t.timeout ? `${t.timeout.kind}: ${t.timeout.elapsed_seconds} s of ${t.timeout.limit_seconds} s (${t.timeout.policy})` : null)));
      timeline.replaceChildren(window.TwTimeline.render(t, timeline.clientWidth || view.clientWidth - 10));
      tree.replaceChildren(...[treeNote(tr, id), el("ul", { class: "tree" }, treeList(tr, id))].filter(Boolean));
      calls.replaceChildren(table(["Call", "Tool", "Step", "Status", "Result", "Timeout", "Issued", "Settled", "Child turn", "Error"],
        (t.tool_calls || []).map((c) => el("tr", {},
          el("td", {}, el("code", {}, c.tool_call_id)), el("td", {}, c.tool + (c.child_turn_id ? " (delegates)" : c.external ? " (external)" : "")),
          el("td", { class: "num" }, String(c.step)),
          el("td", {}, c.progress ? [badge(c.status), ` ${c.progress.progress}${c.progress.total !== undefined ? "/" + c.progress.total : ""}` +
            `${c.progress.message ? " " + c.progress.message : ""} (${when(c.progress.at)})`] : badge(c.status)),
          el("td", {}, c.result_status || "–"),
          el("td", {}, `${c.timeout_seconds} s (${c.timeout_source || "-"})`), el("td", {}, when(c.created_at)),
          el("td", {}, c.settled_at ? `${when(c.settled_at)} (${duration(c.created_at, c.settled_at)})` : "–"),
          el("td", {}, c.child_turn_id ? [turnLink(c.child_turn_id, c.child_agent || c.child_turn_id), " ", badge(c.child_status)] : "–"),
          el("td", {}, c.error ? `${c.error.code || ""}${c.error.message ? ": " + c.error.message : ""}` : "")))));
      history.replaceChildren(table(["At", "From → to", "Epoch", "Attempt", "Actor", "Reason"],
        hist.map((h) => el("tr", {}, el("td", {}, when(h.at)), el("td", {}, `${h.from || "(new)"} → ${h.to}`),
          el("td", { class: "num" }, h.turn_epoch === null ? "–" : String(h.turn_epoch)), el("td", { class: "num" }, String(h.attempt)),
          el("td", {}, h.actor), el("td", {}, h.reason || ""))), { class: "history" }));
      const ex = [];
      if ((t.warnings || []).length) {
        ex.push(el("h2", {}, "Warnings"), table(["At", "Kind", "Attempt", "Call", "Elapsed", "Limit", "Due"],
          t.warnings.map((w) => el("tr", {}, el("td", {}, when(w.at)), el("td", {}, w.kind), el("td", { class: "num" }, String(w.attempt)),
            el("td", {}, w.tool_call_id || "–"), el("td", { class: "num" }, `${w.elapsed_seconds} s`), el("td", { class: "num" }, `${w.limit_seconds} s`),
            el("td", {}, when(w.due_at))))));
      }
      if ((t.force_terminations || []).length) {
        ex.push(el("h2", {}, "Forced ends"), table(["At", "Reason", "Epoch"],
          t.force_terminations.map((f) => el("tr", {}, el("td", {}, when(f.at)), el("td", {}, f.reason), el("td", { class: "num" }, f.turn_epoch === null || f.turn_epoch === undefined ? "–" : String(f.turn_epoch))))));
      }
      extras.replaceChildren(...ex);
      const text = t.deliverable === null || t.deliverable === undefined ? null : JSON.stringify(t.deliverable, null, 2);
      if (text !== lastDeliverable) {
        lastDeliverable = text;
        deliverable.replaceChildren(text === null ? el("p", { class: "muted" }, "no deliverable yet") : el("pre", { id: "deliverable" }, text));
      }
      return TERMINAL.has(t.status) ? 5000 : 1500;
    }, 1500);
  }

  // ---- daemons and dead letters --------------------------------------------------------------------------------

  function daemonsView() {
    const gen = generation;
    const body = el("div", { id: "daemons" });
    view.replaceChildren(el("h1", {}, "Daemons"), body);
    poll(gen, async () => {
      const list = await api("/api/daemons");
      if (gen !== generation) return;
      body.replaceChildren(table(["Daemon", "Kind", "State", "Steps held", "Tool calls held", "Slots", "Free since", "Started", "Last seen", "Gone"],
        list.map((d) => el("tr", {}, el("td", {}, el("code", {}, d.daemon_id)), el("td", {}, d.kind),
          el("td", {}, badge(d.alive ? "alive" : "gone")), el("td", { class: "num" }, String(d.holds ? d.holds.steps : 0)),
          el("td", { class: "num" }, String(d.holds ? d.holds.tool_calls : 0)), el("td", { class: "num" }, d.slots === null ? "–" : String(d.slots)),
          el("td", {}, when(d.free_since)), el("td", {}, when(d.started_at)), el("td", {}, when(d.last_seen_at)),
          el("td", {}, d.gone_at ? `${when(d.gone_at)} ${d.gone_reason || ""}` : "–")))));
      return 2000;
    }, 2000);
  }

  function deadLettersView(params) {
    const gen = generation;
    const agent = el("input", { name: "agent", value: params.get("agent") || "", pattern: "[A-Za-z0-9_\\-]{1,64}", size: 14 });
    const form = el("form", { class: "filters" }, el("label", {}, "Agent ", agent), el("button", { type: "submit" }, "Show"));
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      location.hash = agent.value ? `#/dead-letters?agent=${encodeURIComponent(agent.value)}` : "#/dead-letters";
    });
    const body = el("div", { id: "dead-letters" });
    view.replaceChildren(el("h1", {}, "Dead letters"), el("p", { class: "muted" }, "Turns whose last attempt ended failed or timeout, newest first (turnwatch dead-letters replay ID submits one again)."), form, body);
    poll(gen, async () => {
      const q = new URLSearchParams({ limit: "100" });
      if (params.get("agent")) q.set("agent", params.get("agent"));
      const list = await api(`/api/dead-letters?${q}`);
      if (gen !== generation) return;
      body.replaceChildren(table(["Turn", "Agent", "Status", "Error", "Attempt", "Replays", "Ended", "Replay of"],
        list.map((d) => el("tr", {}, el("td", {}, turnLink(d.turn_id)), el("td", {}, d.agent), el("td", {}, badge(d.status)),
          el("td", { title: d.error_message || "" }, d.error || ""), el("td", { class: "num" }, `${d.attempt}/${d.max_attempts}`),
          el("td", { class: "num" }, String(d.replays)), el("td", {}, when(d.ended_at)),
          el("td", {}, d.replay_of ? turnLink(d.replay_of) : "–")))));
      return 2000;
    }, 2000);
  }

  window.addEventListener("hashchange", navigate);
  navigate();
})();
