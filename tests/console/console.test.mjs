// tests/console/console.test.mjs — the turnwatch console in a real browser: Debian's chromium, headless, driven by
// puppeteer-core. Run by tests/test_console.c, which starts PostgreSQL, nats-server, both daemons and
// `turnwatch console`, submits the turns named below and passes everything in the environment:
//   CONSOLE_URL   the console's origin, http://127.0.0.1:PORT
//   TW_CLI        the turnwatch binary, TW_CONFIG its configuration (to post the external tool's result)
//   TURN_DONE     an echo turn that ended done
//   TURN_TOOLS    a tester turn with two rounds of tool calls (search, fetch, parse), ended; its sleep calls
//                 hold [limit.cw], a cap of 1, so one of each round waited for it
//   TURN_TREE     a fanout turn that delegated to three child turns (tool delegate), ended done
//   TURN_EXT      a tester turn suspended on the external tool call "ask" (and two others)
//   TURN_FORCED   a tester turn cancelled while it was pending: a forced end without an epoch
//   TURN_LATER    an echo turn submitted to run in an hour: pending, reason scheduled
//   SHOT_PATH     where to save the PNG of TURN_TOOLS's timeline
//   CHROMIUM      the browser (default /usr/bin/chromium)
// Prints one "ok N - what" line per check; the first failure prints "not ok" with the reason and exits 1.
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import puppeteer from "puppeteer-core";

const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`environment variable ${k} is not set`);
  return v;
};
const origin = env("CONSOLE_URL").replace(/\/$/, "");
const turns = { done: env("TURN_DONE"), tools: env("TURN_TOOLS"), tree: env("TURN_TREE"), ext: env("TURN_EXT"),
  forced: env("TURN_FORCED"), later: env("TURN_LATER") };
const WAIT = 15000; // generous: each wait normally ends in milliseconds

let n = 0;
function ok(what) {
  console.log(`ok ${++n} - ${what}`);
}
function check(cond, what, detail) {
  if (!cond) throw new Error(`${what}${detail ? ": " + detail : ""}`);
  ok(what);
}

const requests = [];
const foreign = [];
const pageErrors = [];
const userDataDir = mkdtempSync(join(tmpdir(), "tw-console-chromium-"));
let browser;

async function svgTexts(page) {
  return page.$$eval("#timeline svg text", (ts) => ts.map((t) => t.textContent));
}

async function openTurn(page, id) {
  await page.goto(`${origin}/#/turn/${id}`, { waitUntil: "domcontentloaded" });
  await page.waitForFunction((want) => {
    const s = document.querySelector("#turn-status");
    return document.querySelector("#turn-id")?.textContent === want && s && s.dataset.status &&
      document.querySelector("#timeline svg text") && document.querySelector("#history table tbody tr");
  }, { timeout: WAIT }, id);
}

async function main() {
  browser = await puppeteer.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    userDataDir,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"],
  });
  const page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 900 });
  // Every request the page makes is seen here: those for another origin are refused and remembered.
  await page.setRequestInterception(true);
  page.on("request", (req) => {
    const url = req.url();
    requests.push(url);
    if (url === origin || url.startsWith(origin + "/")) req.continue();
    else {
      foreign.push(url);
      req.abort();
    }
  });
  page.on("pageerror", (e) => pageErrors.push(`page error: ${e.message}`));
  page.on("console", (m) => {
    // A CSP violation or a failed load is reported on the console.
    if (m.type() === "error") pageErrors.push(`console error: ${m.text()}`);
  });

  // The turns list shows the submitted turn, newest first, and filters by agent.
  await page.goto(`${origin}/`, { waitUntil: "domcontentloaded" });
  await page.waitForSelector(`#turns tr[data-turn="${turns.done}"]`, { timeout: WAIT });
  const row = await page.$eval(`#turns tr[data-turn="${turns.done}"]`, (tr) => tr.textContent);
  check(row.includes("echo") && row.includes("done"), "the turns list shows the echo turn as done", row);
  const order = await page.$$eval("#turns tbody tr", (trs) => trs.map((tr) => tr.dataset.turn));
  check(order.indexOf(turns.ext) < order.indexOf(turns.done), "newest first: the last submitted turn is above the first", order.join(" "));
  await page.goto(`${origin}/#/?agent=fanout`, { waitUntil: "domcontentloaded" });
  await page.waitForSelector(`#turns tr[data-turn="${turns.tree}"]`, { timeout: WAIT });
  const agents = await page.$$eval("#turns tbody tr td:nth-child(2)", (tds) => tds.map((td) => td.textContent));
  check(agents.length > 0 && agents.every((a) => a === "fanout"), "the agent filter shows only fanout's turns", agents.join(","));

  // A turn with two rounds of tool calls: its timeline names every step and every call.
  await openTurn(page, turns.tools);
  let texts = await svgTexts(page);
  for (const want of ["step 0", "step 1", "step 2"]) check(texts.includes(want), `the timeline draws ${want}`, texts.join("|"));
  for (const call of ["search · sleep", "fetch · sleep", "parse · fail", "search-2 · sleep", "parse-2 · fail"]) {
    check(texts.includes(call), `the timeline names tool call ${call}`, texts.join("|"));
  }
  check(texts.some((t) => t.startsWith("fail: error")) && texts.some((t) => t.startsWith("sleep: ok")),
    "tool calls are drawn with how they settled (ok, error)", texts.join("|"));
  // Its sleep calls hold [limit.cw] (a cap of 1): the one that waited is drawn waiting, the limit named.
  const waits = await page.$$eval("#timeline svg .bar.wait title", (ts) => ts.map((t) => t.textContent));
  check(waits.length >= 1 && waits.every((w) => w.includes("waited for limit cw from")),
    "a call's wait for its limit is drawn, the limit named", `${waits.length} waits: ${waits.join(" | ")}`);
  const deadlineTicks = await page.$$eval("#timeline svg .deadline-tick", (g) => g.length);
  check(deadlineTicks >= 6, "each tool call's deadline is marked", `${deadlineTicks} marks`);
  const hist = await page.$$eval("#history tbody tr", (trs) => trs.map((tr) => tr.textContent));
  check(hist.length >= 6 && hist.some((h) => h.includes("waiting for tool calls")) && hist.some((h) => h.includes("completed")),
    "the history table lists the turn's transitions", hist.join(" / "));
  const deliverable = await page.$eval("#deliverable", (p) => p.textContent);
  check(JSON.parse(deliverable).output !== undefined, "the deliverable is shown as JSON", deliverable.slice(0, 80));
  // The picture for README: the turn's header and its timeline.
  const box = await page.evaluate(() => {
    const a = document.querySelector("h1").getBoundingClientRect();
    const b = document.querySelector("#timeline").getBoundingClientRect();
    return { x: 0, y: Math.max(0, a.top + window.scrollY - 8), width: document.documentElement.clientWidth, height: b.bottom - a.top + 16 };
  });
  await page.screenshot({ path: env("SHOT_PATH"), clip: box });
  ok(`the timeline's screenshot is in ${env("SHOT_PATH")}`);

  // A delegating turn: its tree shows its three children, each a link to its page.
  await openTurn(page, turns.tree);
  await page.waitForFunction(() => document.querySelectorAll("#tree ul.tree li li").length === 3, { timeout: WAIT });
  const kids = await page.$$eval("#tree ul.tree li li", (lis) => lis.map((li) => ({
    href: li.querySelector("a").getAttribute("href"), text: li.textContent })));
  check(kids.every((k) => /^#\/turn\/[0-9a-f-]{36}$/.test(k.href) && k.text.includes("done")),
    "the delegation tree shows the three children, done, with links", JSON.stringify(kids));
  texts = await svgTexts(page);
  check(["f0 · delegate", "f1 · delegate", "f2 · delegate"].every((t) => texts.includes(t)),
    "the delegating calls are on the timeline", texts.join("|"));
  const childCells = await page.$$eval("#calls tbody tr td:nth-child(9) a", (as) => as.length);
  check(childCells === 3, "the tool calls table links each child turn", `${childCells} links`);
  await page.click("#tree ul.tree li li a");
  await page.waitForFunction((parent) => document.querySelector("#turn-id")?.textContent !== parent &&
    document.querySelector("#turn-head a[href]") && [...document.querySelectorAll("#turn-head a")].some((a) => a.getAttribute("href") === `#/turn/${parent}`),
  { timeout: WAIT }, turns.tree);
  ok("a child's page links back to its parent");

  // A turn waiting for an external tool: it ends while its page is open, and the page shows it without a reload.
  await openTurn(page, turns.ext);
  const before = await page.$eval("#turn-status", (s) => s.dataset.status);
  check(before === "suspended", "the external tool's turn shows as suspended", before);
  texts = await svgTexts(page);
  check(texts.some((t) => t.startsWith("ext: waiting (external)")), "the waiting external call is drawn as waiting", texts.join("|"));
  await page.evaluate(() => { window.__noReload = 42; });
  execFileSync(env("TW_CLI"), ["-c", env("TW_CONFIG"), "tool-result", "--turn", turns.ext, "--call", "ask", "--output", '{"answer":42}']);
  const posted = Date.now();
  await page.waitForSelector('#turn-status[data-status="done"]', { timeout: 5000 });
  const took = Date.now() - posted;
  const kept = await page.evaluate(() => window.__noReload);
  check(kept === 42, `the page showed the turn done ${took} ms after the result was posted, without a reload`);
  texts = await svgTexts(page);
  check(texts.some((t) => t.startsWith("ext: ok (external)")) && texts.includes("step 1"),
    "its timeline now shows the external call ok and the step it resumed", texts.join("|"));

  // A turn cancelled before it was dispatched: its forced end has no epoch, drawn as "–" (not "null").
  await page.goto(`${origin}/#/turn/${turns.forced}`, { waitUntil: "domcontentloaded" });
  await page.waitForFunction((want) => document.querySelector("#turn-id")?.textContent === want &&
    document.querySelector("#extras table tbody tr td:nth-child(3)"), { timeout: WAIT }, turns.forced);
  const forcedRow = await page.$$eval("#extras table tbody tr td", (tds) => tds.map((td) => td.textContent));
  check(forcedRow[2] === "–" && forcedRow[1] !== "", "a forced end without an epoch shows '–' for it", forcedRow.join(" | "));

  // A turn that runs later: when and why it waits, and its time on the timeline.
  await openTurn(page, turns.later);
  const laterStatus = await page.$eval("#turn-status", (s) => s.dataset.status);
  check(laterStatus === "pending", "a turn that runs later is pending", laterStatus);
  const laterFields = await page.$eval("dl.fields", (dl) => dl.textContent);
  check(laterFields.includes("runs at") && laterFields.includes("pending because") && laterFields.includes("it runs later"),
    "a turn that runs later shows when it runs and why it is pending", laterFields);
  texts = await svgTexts(page);
  check(texts.some((t) => t.startsWith("runs at")), "its timeline marks the time it runs", texts.join("|"));

  // The other views.
  await page.goto(`${origin}/#/daemons`, { waitUntil: "domcontentloaded" });
  await page.waitForFunction(() => [...document.querySelectorAll("#daemons tbody tr")].filter((tr) => tr.textContent.includes("alive")).length >= 2, { timeout: WAIT });
  ok("the daemons page lists the PMO and the worker alive");
  await page.goto(`${origin}/#/dead-letters`, { waitUntil: "domcontentloaded" });
  await page.waitForSelector("#dead-letters table", { timeout: WAIT });
  ok("the dead letters page answers");

  check(pageErrors.length === 0, "no page error, no console error (no CSP violation)", pageErrors.join("; "));
  check(foreign.length === 0, "no request left for another host", foreign.join(" "));
  check(requests.length > 0 && requests.every((u) => u.startsWith(origin + "/")),
    `every one of the page's ${requests.length} requests went to ${origin}`);
  check(requests.some((u) => u.includes("/api/turns/")) && requests.every((u) => !u.includes("/api/") || u.startsWith(origin + "/api/")),
    "the page reads its data from /api/");
}

try {
  await main();
  console.log(`1..${n}`);
  console.log(`console browser test: ${n} checks passed`);
} catch (e) {
  console.log(`not ok ${++n} - ${e.message}`);
  process.exitCode = 1;
} finally {
  if (browser) await browser.close().catch(() => {});
  rmSync(userDataDir, { recursive: true, force: true });
}
