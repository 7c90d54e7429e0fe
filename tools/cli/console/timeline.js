// turnwatch console: a turn's timeline as SVG, from /api/turns/ID. One time axis from the turn's submit to its
// end (or the database's "now" while it runs): its phases from the history, its steps, one lane per tool call
// (queued, waiting for a limit, running, settled, its deadline and warning time), warnings, forced ends and the watchdog's actions
// from the history, attempt boundaries, retries and deadlines as vertical lines. Every element is made with
// createElementNS and every text is set with textContent: nothing from the data is ever parsed as markup.
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const TERMINAL = new Set(["done", "failed", "timeout", "cancelled"]);
  // History reasons that are a watchdog's or a policy's doing rather than the turn's own progress.
  const WATCHDOG = /reclaim|retry|timeout|reaped|watchdog|deadline|queue|heartbeat|force|gone|replay|cancel/i;

  function node(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== undefined && v !== null) e.setAttribute(k, String(v));
    }
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function titled(e, text) {
    e.appendChild(node("title", {}, text));
    return e;
  }

  function ms(s) {
    if (!s) return null;
    const v = Date.parse(s);
    return Number.isNaN(v) ? null : v;
  }

  // "1.25 s", "3 min 4 s", "2 h 5 min".
  function span(d) {
    if (d < 0) d = 0;
    if (d < 1000) return `${Math.round(d)} ms`;
    if (d < 60000) return `${(d / 1000).toFixed(d < 10000 ? 2 : 1)} s`;
    if (d < 3600000) return `${Math.floor(d / 60000)} min ${Math.round((d % 60000) / 1000)} s`;
    return `${Math.floor(d / 3600000)} h ${Math.round((d % 3600000) / 60000)} min`;
  }

  // A tick step of 1, 2 or 5 times a power of ten (in ms) giving about n ticks over d.
  function tickStep(d, n) {
    const raw = d / n;
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 5, 10]) if (m * p >= raw) return m * p;
    return 10 * p;
  }

  function axisLabel(v) {
    if (v === 0) return "0";
    if (v < 1000) return `+${v} ms`;
    if (v < 60000) return `+${+(v / 1000).toFixed(2)} s`;
    if (v < 3600000) return `+${+(v / 60000).toFixed(1)} min`;
    return `+${+(v / 3600000).toFixed(1)} h`;
  }

  function clip(s, n) {
    s = String(s);
    return s.length > n ? s.slice(0, n - 1) + "…" : s;
  }

  function render(turn, width) {
    const W = Math.max(720, Math.floor(width || 1000));
    const labelW = 190;
    const plotW = W - labelW - 24;
    const rowH = 24;
    const t0 = ms(turn.created_at);
    const now = ms(turn.now) || Date.now();
    const ended = ms(turn.ended_at);
    const tEnd = ended !== null ? ended : now;
    const dur = Math.max(tEnd - t0, 50) * 1.04;
    const x = (t) => labelW + (Math.min(Math.max(t, t0), t0 + dur) - t0) / dur * plotW;
    const inRange = (t) => t !== null && t >= t0 && t <= t0 + dur;

    const calls = turn.tool_calls || [];
    const steps = turn.steps || [];
    const transitions = turn.transitions || [];
    const rows = ["turn", "steps", ...calls.map((c) => c.tool_call_id), "marks"];
    const top = 34;
    const H = top + rows.length * rowH + 3 * 14 + 30;
    const svg = node("svg", {
      xmlns: SVG, width: W, height: H, viewBox: `0 0 ${W} ${H}`, class: "timeline", role: "img",
      "aria-label": `timeline of turn ${turn.turn_id}`,
    });
    const rowY = (i) => top + i * rowH;
    const lanes = node("g", { class: "lanes" });
    const overlay = node("g", { class: "overlay" });
    svg.append(lanes, overlay);

    // Lane backgrounds and labels.
    rows.forEach((r, i) => {
      lanes.appendChild(node("rect", { x: 0, y: rowY(i), width: W, height: rowH, class: i % 2 ? "lane odd" : "lane" }));
    });
    const label = (i, text, full, href) => {
      const g = node(href ? "a" : "g", { href });
      g.appendChild(node("text", { x: 8, y: rowY(i) + rowH / 2 + 4, class: "lane-label" }, clip(text, 26)));
      lanes.appendChild(titled(g, full || text));
    };
    label(0, "turn", "the turn's status over time (history)");
    label(1, "steps", "each step of the agent program: taken by a worker until its reply was applied");
    calls.forEach((c, k) => {
      const name = `${c.tool_call_id} · ${c.tool}`;
      label(2 + k, name, `tool call ${c.tool_call_id} of tool ${c.tool}, step ${c.step}`,
        c.child_turn_id ? `#/turn/${c.child_turn_id}` : null);
    });
    label(rows.length - 1, "marks", "warnings, forced ends and the watchdog's actions");

    // Axis.
    const axis = node("g", { class: "axis" });
    axis.appendChild(node("line", { x1: labelW, y1: top - 4, x2: labelW + plotW, y2: top - 4 }));
    const step = tickStep(dur, Math.max(2, Math.floor(plotW / 110)));
    for (let v = 0; v <= dur; v += step) {
      const xx = x(t0 + v);
      axis.appendChild(node("line", { x1: xx, y1: top - 8, x2: xx, y2: H - 24, class: "tick" }));
      axis.appendChild(node("text", { x: xx, y: top - 12, class: "tick-label" }, axisLabel(v)));
    }
    svg.insertBefore(axis, overlay);

    // text: inside the bar when it fits, else beside it (never for the turn's phases: the legend names them).
    const bar = (i, a, b, cls, text, title, beside = true) => {
      const x1 = x(a);
      const x2 = Math.max(x(b), x1 + 2);
      const g = node("g", { class: "bar" });
      g.appendChild(node("rect", { x: x1, y: rowY(i) + 4, width: x2 - x1, height: rowH - 8, rx: 3, class: cls }));
      const w = text ? text.length * 6.5 + 6 : 0;
      const inside = x2 - x1 > w;
      if (text && (inside || beside)) {
        // Outside: after the bar, or before it when that would run past the right edge.
        const before = !inside && x2 + w > W;
        g.appendChild(node("text", {
          x: inside ? x1 + 4 : before ? x1 - 4 : x2 + 4, y: rowY(i) + rowH / 2 + 4,
          class: inside ? "bar-text" : before ? "bar-text outside end" : "bar-text outside",
        }, text));
      }
      if (title) titled(g, title);
      lanes.appendChild(g);
      return g;
    };

    // The turn's phases (a wait for limits is a row of the history too, drawn below).
    const phases = transitions.filter((tr) => !tr.waited_from);
    phases.forEach((tr, k) => {
      const a = ms(tr.at);
      if (a === null) return;
      const next = phases[k + 1] ? ms(phases[k + 1].at) : null;
      if (TERMINAL.has(tr.to)) {
        const g = node("g", { class: `end-mark st-${tr.to}` });
        g.appendChild(node("circle", { cx: x(a), cy: rowY(0) + rowH / 2, r: 6 }));
        g.appendChild(node("text", { x: x(a) - 8, y: rowY(0) + rowH / 2 + 4, class: "end-text" }, tr.to));
        titled(g, `${tr.to} at ${tr.at}: ${tr.reason || ""}`);
        lanes.appendChild(g);
        return;
      }
      const b = next !== null ? next : tEnd;
      bar(0, a, b, `ph ph-${tr.to}`, tr.to,
        `${tr.to} from ${tr.at} for ${span(b - a)} (attempt ${tr.attempt}, epoch ${tr.turn_epoch ?? "-"}; ${tr.actor}: ${tr.reason || ""})`,
        false);
    });

    // Steps.
    steps.forEach((s) => {
      const ready = ms(s.ready_at);
      const start = ms(s.started_at);
      let end = ms(s.ended_at);
      const name = `step ${s.step}`;
      const who = s.worker ? ` by ${s.worker}` : "";
      if (start === null) {
        const at = ready !== null ? ready : t0;
        const g = node("g", { class: "step-wait" });
        g.appendChild(node("rect", { x: x(at), y: rowY(1) + 8, width: Math.max(x(end ?? tEnd) - x(at), 2), height: rowH - 16, class: "queued" }));
        g.appendChild(node("text", { x: x(at) + 4, y: rowY(1) + rowH / 2 + 4, class: "bar-text outside" },
          `${name} (${s.outcome || s.status})`));
        titled(g, `${name}: ready at ${s.ready_at}, ${s.status}${s.outcome ? ", " + s.outcome : ""}`);
        lanes.appendChild(g);
        return;
      }
      if (ready !== null && ready < start) {
        lanes.appendChild(titled(node("rect", { x: x(ready), y: rowY(1) + 10, width: Math.max(x(start) - x(ready), 1), height: rowH - 20, class: "queued" }),
          `${name} waited ${span(start - ready)} for a worker`));
      }
      if (end === null) end = tEnd;
      const cls = s.outcome === "stale" ? "step stale" : s.status === "processing" || s.status === "pending" ? "step running" : "step";
      bar(1, start, end, cls, name,
        `${name}: ${s.started_at} → ${s.ended_at || "running"} (${span(end - start)})${who}; ${s.status}${s.outcome ? " (" + s.outcome + ")" : ""}, try ${s.attempts}`);
    });

    // Tool calls.
    calls.forEach((c, k) => {
      const i = 2 + k;
      const issued = ms(c.created_at);
      const started = ms(c.started_at);
      const settled = ms(c.settled_at);
      const deadline = ms(c.deadline_at);
      const warn = ms(c.warn_at);
      const end = settled !== null ? settled : tEnd;
      const state = c.result_status || c.status;
      if (issued === null) return;
      if (started !== null && started > issued) {
        lanes.appendChild(titled(node("rect", { x: x(issued), y: rowY(i) + 10, width: Math.max(x(started) - x(issued), 1), height: rowH - 20, class: "queued" }),
          `${c.tool_call_id} waited ${span(started - issued)} for a tool worker`));
      }
      const from = started !== null ? started : issued;
      const text = `${c.tool}: ${state}${c.child_turn_id ? " (child " + (c.child_status || "?") + ")" : c.external ? " (external)" : ""}`;
      const err = c.error && c.error.code ? `, error ${c.error.code}: ${c.error.message || ""}` : "";
      bar(i, from, end, `call call-${state}`, text,
        `tool call ${c.tool_call_id} (${c.tool}, step ${c.step}): issued ${c.created_at}, ` +
        `${c.started_at ? "started " + c.started_at + ", " : ""}${c.settled_at ? "settled " + c.settled_at + " after " + span(settled - issued) : "not settled"}` +
        `; ${state}${err}; timeout ${c.timeout_seconds} s (${c.timeout_source || "-"}), deadline ${c.deadline_at}`);
      const tick = (t, cls, what) => {
        const xx = inRange(t) ? x(t) : labelW + plotW + 6;
        const g = node("g", { class: cls });
        g.appendChild(node("line", { x1: xx, y1: rowY(i) + 2, x2: xx, y2: rowY(i) + rowH - 2 }));
        g.appendChild(node("path", { d: `M${xx - 4},${rowY(i) + 2} L${xx + 4},${rowY(i) + 2} L${xx},${rowY(i) + 7} Z` }));
        titled(g, what);
        lanes.appendChild(g);
      };
      // A deadline past the axis is drawn at its right edge (the title says when it was).
      if (deadline !== null) {
        tick(deadline, inRange(deadline) ? "deadline-tick" : "deadline-tick beyond",
          `deadline of call ${c.tool_call_id}: ${c.deadline_at} (+${span(deadline - issued)} after it was issued)`);
      }
      if (warn !== null && inRange(warn)) tick(warn, "warn-tick", `warning time of call ${c.tool_call_id}: ${c.warn_at}`);
      // An MCP tool's last progress (docs/mcp.md): a tick when it came, its numbers and message in the title.
      const p = c.progress;
      const pAt = p ? ms(p.at) : null;
      if (pAt !== null && inRange(pAt)) {
        tick(pAt, "progress-tick", `progress of call ${c.tool_call_id} at ${p.at}: ${p.progress}` +
          `${p.total !== undefined ? " of " + p.total : ""}${p.message ? " (" + p.message + ")" : ""}`);
      }
    });

    // Waits for limits (flow control): the turn's own in its lane, a call's in the call's; those that ended
    // from the history, those still waiting from limit_waits.
    const waitLane = (id, since) => {
      if (!id) return 0;
      let best = -1;
      calls.forEach((c, k) => {
        if (c.tool_call_id === id && (best < 0 || ms(c.created_at) <= since)) best = k;
      });
      return best < 0 ? null : 2 + best;
    };
    const waits = transitions.filter((tr) => tr.waited_from)
      .map((tr) => ({ id: tr.tool_call_id, from: tr.waited_from, to: tr.at, limit: tr.limit, why: tr.reason }))
      .concat((turn.limit_waits || []).map((w) => ({ id: w.tool_call_id, from: w.since, to: null, limit: w.limit,
        why: "still waiting" })));
    waits.forEach((w) => {
      const a = ms(w.from);
      const b = w.to ? ms(w.to) : tEnd;
      const i = waitLane(w.id, a);
      if (a === null || b === null || i === null) return;
      const g = bar(i, a, b, "limit-wait", `waiting_limit: ${w.limit}`,
        `${w.id ? "tool call " + w.id : "the turn"} waited for limit ${w.limit} from ${w.from} to ${w.to || "now"} (${span(b - a)}): ${w.why || ""}`,
        false);
      g.setAttribute("class", "bar wait");
    });

    // Vertical lines: attempts, retries, deadlines, now.
    let nv = 0;
    const vline = (t, cls, text, title) => {
      if (t === null) return;
      const ty = H - 10 - (nv++ % 2) * 12; // two levels, so that lines close together keep their labels apart
      const beyond = !inRange(t);
      const xx = beyond ? labelW + plotW + 2 : x(t);
      const g = node("g", { class: `vline ${cls}${beyond ? " beyond" : ""}` });
      g.appendChild(node("line", { x1: xx, y1: top - 4, x2: xx, y2: H - 24 }));
      const label = beyond ? `${text} → +${span(t - t0)}` : text;
      g.appendChild(node("text", { x: beyond ? xx - 4 : xx + 3, y: ty, class: beyond ? "vline-text end" : "vline-text" }, label));
      titled(g, title);
      overlay.appendChild(g);
    };
    let attempt = null;
    transitions.forEach((tr) => {
      if (attempt !== null && tr.attempt !== attempt) {
        vline(ms(tr.at), "attempt", `attempt ${tr.attempt}`, `attempt ${tr.attempt} starts at ${tr.at}: ${tr.reason || ""}`);
      }
      attempt = tr.attempt;
    });
    if (turn.retry_at && !TERMINAL.has(turn.status)) vline(ms(turn.retry_at), "retry", "retry at", `the next attempt may start at ${turn.retry_at}`);
    if (turn.not_before) vline(ms(turn.not_before), "later", "runs at", `a turn that runs later: not before ${turn.not_before}`);
    if (turn.deadline_at) vline(ms(turn.deadline_at), "deadline", "turn deadline", `turn deadline (submit --timeout ${turn.timeout_seconds} s): ${turn.deadline_at}`);
    if (turn.deadline_warn_at) vline(ms(turn.deadline_warn_at), "warn", "deadline warning", `warning before the turn deadline: ${turn.deadline_warn_at}`);
    if (turn.queue_deadline_at) vline(ms(turn.queue_deadline_at), "queue", "queue deadline", `queue budget ends: ${turn.queue_deadline_at}`);
    if (turn.resume_deadline && turn.status === "suspended") vline(ms(turn.resume_deadline), "resume", "resume deadline", `the wait for tool results ends: ${turn.resume_deadline}`);
    if (ended === null) vline(now, "now", "now", `now (database clock): ${turn.now}`);

    // Marks: warnings, forced ends, watchdog actions from the history.
    const marks = [];
    (turn.warnings || []).forEach((w) => marks.push({
      t: ms(w.at), cls: "mark-warning", shape: "warn", text: `warning: ${w.kind}`,
      title: `warning ${w.kind}${w.tool_call_id ? " (call " + w.tool_call_id + ")" : ""} at ${w.at}: ${w.elapsed_seconds} s of ${w.limit_seconds} s`,
    }));
    (turn.force_terminations || []).forEach((f) => marks.push({
      t: ms(f.at), cls: "mark-force", shape: "x", text: `forced: ${f.reason}`, title: `forced end at ${f.at}: ${f.reason} (epoch ${f.turn_epoch ?? "-"})`,
    }));
    transitions.forEach((tr) => {
      const r = tr.reason || "";
      if (tr.from !== null && !tr.waited_from && (WATCHDOG.test(r) || (tr.from === tr.to))) {
        marks.push({ t: ms(tr.at), cls: "mark-watchdog", shape: "diamond", text: clip(r.split(":")[0], 40), title: `${tr.at} ${tr.actor}: ${r}` });
      }
    });
    const mi = rows.length - 1;
    marks.filter((m) => m.t !== null).sort((a, b) => a.t - b.t).forEach((m, k) => {
      const xx = x(m.t);
      const level = k % 3;
      const y = rowY(mi) + rowH / 2;
      const g = node("g", { class: `mark ${m.cls}` });
      if (m.shape === "x") {
        g.appendChild(node("path", { d: `M${xx - 5},${y - 5} L${xx + 5},${y + 5} M${xx - 5},${y + 5} L${xx + 5},${y - 5}`, class: "x" }));
      } else if (m.shape === "warn") {
        g.appendChild(node("path", { d: `M${xx},${y - 6} L${xx + 6},${y + 5} L${xx - 6},${y + 5} Z` }));
      } else {
        g.appendChild(node("path", { d: `M${xx},${y - 6} L${xx + 6},${y} L${xx},${y + 6} L${xx - 6},${y} Z` }));
      }
      const tx = xx + 8 > labelW + plotW - 120 ? xx - 8 : xx + 8;
      g.appendChild(node("text", { x: tx, y: rowY(mi) + rowH + 12 + level * 14, class: tx < xx ? "mark-text end" : "mark-text" }, m.text));
      titled(g, m.title);
      overlay.appendChild(g);
    });
    return svg;
  }

  function legend() {
    const items = [
      ["ph ph-pending", "pending"], ["ph ph-dispatched", "dispatched"], ["ph ph-running", "running"],
      ["ph ph-suspended", "suspended (waiting for tools)"], ["step", "step"], ["queued", "waiting for a worker"],
      ["call call-ok", "call ok"], ["call call-error", "call error"], ["call call-timeout", "call timeout"],
      ["call call-waiting", "call waiting"], ["call call-cancelled", "call cancelled"],
      ["limit-wait", "waiting for a limit"],
    ];
    const svg = node("svg", { xmlns: SVG, class: "legend", "aria-hidden": "true" });
    let xx = 4;
    for (const [cls, text] of items) {
      svg.appendChild(node("rect", { x: xx, y: 5, width: 14, height: 12, rx: 2, class: cls }));
      svg.appendChild(node("text", { x: xx + 18, y: 15, class: "legend-text" }, text));
      xx += 26 + text.length * 6.2;
    }
    svg.setAttribute("width", String(Math.ceil(xx)));
    svg.setAttribute("height", "22");
    return svg;
  }

  window.TwTimeline = { render, legend, span };
})();
