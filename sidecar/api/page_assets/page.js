// The gatherwise live page: polls the sidecar's own API once a second and draws what it says.
// Every value that comes from the engine or the API goes into the page as text (textContent, text nodes,
// attribute values): never as markup. The token stays in this tab (sessionStorage) and goes only to this origin.
"use strict";

const POLL_MS = 1000;
const TIMEOUT_MS = 4000;  // a poll that takes longer is abandoned: a slow sidecar never wedges the page
const HISTORY_POINTS = 120;
const DECISIONS = 30;
const MODES = ["all_gather", "gather", "sharded"];
const SVG = "http://www.w3.org/2000/svg";
const TOKEN_KEY = "gatherwise-token";

// -- DOM helpers: text only ---------------------------------------------------------------------------------
// Bidirectional controls in a string (an engine's, a notice's) would reorder what the page shows around them
// (U+202E turns "gather" into "rehtag" and can make one value read as another): each is shown as its code instead.
const BIDI_CONTROLS = /[\u061C\u200E\u200F\u202A-\u202E\u2066-\u2069]/g;
function shown(value) {
  return String(value).replace(BIDI_CONTROLS, c => `⟨U+${c.charCodeAt(0).toString(16).toUpperCase().padStart(4, "0")}⟩`);
}
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(shown(c)));
  return node;
}
function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  return node;
}
function text(node, value) { node.textContent = value == null ? "" : shown(value); }
function fill(parent, children) { parent.replaceChildren(...children); }
function $(id) { return document.getElementById(id); }
function ms(seconds) { return seconds == null ? "–" : (seconds * 1e3).toFixed(seconds < 1e-3 ? 3 : 2); }
function pct(x) { return x == null ? "–" : (100 * x).toFixed(1) + " %"; }
function pairs(dl, entries) { fill(dl, entries.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)])); }

// -- the API ----------------------------------------------------------------------------------------------
async function api(path, options) {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), TIMEOUT_MS);
  try {
    const r = await fetch(path, { ...options, signal: ctl.signal, cache: "no-store" });
    const body = await r.json().catch(() => ({}));
    return { status: r.status, body };
  } finally {
    clearTimeout(timer);
  }
}
function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

// -- panels -----------------------------------------------------------------------------------------------
function showBanners(live, error) {
  const banners = [];
  if (error) banners.push(el("div", { class: "banner bad", id: "banner-sidecar" }, `sidecar not answering: ${error}`));
  const eng = live && live.engine;
  if (live && !eng) banners.push(el("div", { class: "banner", id: "banner-engine" }, "no engine attached" +
                                      (live.mode_error ? `: ${live.mode_error}` : "")));
  else if (eng && eng.stopped) banners.push(el("div", { class: "banner bad", id: "banner-engine" },
                                                `engine ${eng.engine} is not running: ${eng.stopped}`));
  else if (eng && !eng.up) banners.push(el("div", { class: "banner bad", id: "banner-engine" },
                                            `engine ${eng.engine}: no call for a while (heartbeat stale)`));
  banners.push(...hooksOffBanners((live && live.hooks_off) || []));
  fill($("banners"), banners);
}

// One banner per (engine, reason), however many processes say it: a few hundred notices (every worker of a big
// engine) must not push the page thousands of pixels down. A group names its first processes and its first
// detail; GET /v1/engine lists every notice.
const GROUP_PIDS = 8;
function hooksOffBanners(notices) {
  const groups = new Map();
  for (const n of notices) {
    const key = `${n.engine}\u0000${n.reason}`;
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(n);
  }
  return [...groups.values()].map(group => {
    const n = group[0];
    if (group.length === 1) {
      return el("div", { class: "banner hooks-off" }, `gatherwise hooks are off in ${n.engine} process ${n.pid}` +
                (n.tp_rank == null ? "" : ` (TP rank ${n.tp_rank})`) + ` — ${n.reason}: ${n.detail}`);
    }
    const pids = group.slice(0, GROUP_PIDS).map(g => g.pid).join(", ") + (group.length > GROUP_PIDS ? ", …" : "");
    const others = new Set(group.map(g => g.detail)).size - 1;
    return el("div", { class: "banner hooks-off", "data-count": group.length },
              `gatherwise hooks are off in ${group.length} ${n.engine} processes (pids ${pids}) — ${n.reason}: ` +
              `${n.detail}` + (others ? ` (and ${others} other detail${others > 1 ? "s" : ""}: GET /v1/engine)` : ""));
  });
}

function showStatus(live, error) {
  const pill = $("status");
  const eng = live && live.engine;
  pill.className = "pill " + (eng && eng.up && !eng.stopped ? "up" : "down");
  text(pill, error ? "sidecar unreachable" : !eng ? "no engine" : eng.stopped ? "engine stopped" :
                     eng.up ? "engine up" : "engine idle");
  text($("updated"), error ? "" : `updated ${new Date().toLocaleTimeString()}`);
}

function role(mode) {
  if (!mode) return "no control block (telemetry only)";
  return mode.read_only ? "observer: another sidecar controls this engine" : "controller (this sidecar)";
}

function showEngine(live) {
  const eng = live.engine;
  if (!eng) { pairs($("engine"), [["engine", "none attached"]]); fill($("ranks").tBodies[0], []); return; }
  pairs($("engine"), [
    ["engine id", eng.engine], ["kind", eng.kind ?? "unknown"], ["version", eng.version ?? "unknown"],
    ["model", eng.model ?? "unknown"],
    ["TP ranks", eng.tp_size], ["logits", `${eng.dtype}, vocab ${eng.vocab}`], ["role", role(live.mode)],
    ["calls", MODES.filter(m => live.calls[m]).map(m => `${m} ${live.calls[m]}`).join(", ") || "none yet"],
  ]);
  // which runner and logits route each rank runs, and what its fingerprints matched ("" where it does not tell)
  const route = r => r.route || {};
  fill($("ranks").tBodies[0], eng.ranks.map(r => el("tr", {}, el("td", {}, r.rank), el("td", {}, r.node),
                                                  el("td", {}, r.pid),
                                                  el("td", { class: "runner" }, route(r).runner || "—"),
                                                  el("td", { class: "route" }, route(r).route || "—"),
                                                  el("td", { class: "fingerprint" }, route(r).fingerprint || "—"))));
  const sampler = (eng.ranks[0] && eng.ranks[0].sampler) || {};
  pairs($("sampler"), Object.entries(sampler));
}

let pending = null;  // the bucket whose switch is on its way
function showModes(live) {
  const mode = live.mode;
  const body = $("modes").tBodies[0];
  if (!mode) { text($("mode-summary"), live.mode_error || "no mode table"); fill(body, []); return; }
  text($("mode-summary"), `policy ${mode.policy}, epoch ${mode.epoch}, rank 0 at call ${mode.call_index}` +
                          (mode.pending ? " — a command is on its way" : ""));
  const canWrite = !!token() && !mode.read_only;
  if (pending !== null) return;  // keep the row the operator is using as it is until the switch lands
  fill(body, Object.keys(mode.active).map(bucket => {
    const pinned = mode.pinned[bucket];
    const select = el("select", { "data-bucket": bucket, "aria-label": `mode for bucket ${bucket}` },
                      ...[...MODES, "auto"].map(m => el("option", { value: m }, m)));
    select.value = pinned ?? "auto";
    const apply = el("button", { "data-bucket": bucket, class: "apply" }, "apply");
    apply.disabled = !canWrite;
    apply.addEventListener("click", () => switchBucket(Number(bucket), select.value));
    return el("tr", { "data-bucket": bucket },
              el("td", {}, bucket), el("td", { class: "active" }, mode.active[bucket]),
              el("td", {}, mode.requested[bucket]),
              el("td", { class: pinned ? "pinned" : "" }, pinned ? "pinned" : "auto"),
              el("td", { class: "change" }, select, " ", apply));
  }));
}

async function switchBucket(bucket, mode) {
  pending = bucket;
  text($("switch-result"), `bucket ${bucket} → ${mode}: sent, waiting for every rank…`);
  try {
    const r = await api("/v1/mode?wait=10", {
      method: "PUT", body: JSON.stringify({ mode, buckets: [bucket] }),
      headers: { "Content-Type": "application/json", "Authorization": `Bearer ${token()}` },
    });
    const b = r.body || {};
    if (r.status === 200) {
      text($("switch-result"), `bucket ${bucket} → ${mode}: applied from call ${b.apply_call} on ` +
                               `(command ${b.seq}, decision ${b.decision}); active now ${b.state.active[bucket]}`);
    } else if (r.status === 202) {
      text($("switch-result"), `bucket ${bucket} → ${mode}: written (command ${b.seq}), not applied yet`);
    } else {
      text($("switch-result"), `bucket ${bucket} → ${mode}: refused (${r.status}): ${b.detail ?? ""}`);
    }
  } catch (e) {
    text($("switch-result"), `bucket ${bucket} → ${mode}: no answer (${e})`);
  } finally {
    pending = null;
  }
}

// -- plots ------------------------------------------------------------------------------------------------
const W = 340, H = 150, PAD = 30;
function plot(points, series, yMax, label, id, format) {
  const box = svg("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, class: "plot", id,
                           "data-points": points.length });
  const n = Math.max(points.length - 1, 1);
  const x = i => PAD + (W - PAD - 6) * i / n;
  const y = v => H - 16 - (H - 30) * Math.min(v / yMax, 1);
  box.append(svg("line", { x1: PAD, y1: H - 16, x2: W - 6, y2: H - 16, stroke: "#d0d7de" }));
  for (const s of series) {  // one polyline per run of points: an interval without calls leaves a gap
    let run = [];
    const flush = () => {
      // a run of one point (a mode that ran within one interval: every probe) is a marker, since a polyline of
      // one point draws nothing
      if (run.length === 1) box.append(svg("circle", { cx: run[0][0], cy: run[0][1], r: 2.5,
                                                       class: `${s.cls} marker`, "data-series": s.name }));
      else if (run.length) box.append(svg("polyline", { points: run.map(([px, py]) => `${px},${py}`).join(" "),
                                                        class: s.cls, "data-series": s.name }));
      run = [];
    };
    points.forEach((p, i) => {
      const v = s.value(p);
      if (v == null) flush(); else run.push([x(i).toFixed(1), y(v).toFixed(1)]);
    });
    flush();
  }
  const t = (tx, ty, value, anchor) => {
    const node = svg("text", { x: tx, y: ty, "text-anchor": anchor || "start" });
    node.textContent = shown(value);
    box.append(node);
  };
  t(2, 12, label);
  t(W - 6, 12, `top ${format(yMax)}`, "end");
  if (points.length > 1) t(PAD, H - 3, `${Math.round(points[points.length - 1].time - points[0].time)} s`);
  t(W - 6, H - 3, "now", "end");
  return box;
}

function showPlots(live) {
  const history = live.history || [];
  const buckets = new Map();  // bucket label -> modes seen
  for (const p of history) for (const q of p.paths) {
    if (!buckets.has(q.bucket)) buckets.set(q.bucket, new Set());
    buckets.get(q.bucket).add(q.mode);
  }
  const sorted = [...buckets.keys()].sort((a, b) => Number(a) - Number(b));
  fill($("plots"), sorted.map(bucket => {
    const modes = MODES.filter(m => buckets.get(bucket).has(m));
    const at = (p, m) => p.paths.find(q => q.bucket === bucket && q.mode === m);
    const series = modes.flatMap(m => [
      { name: `${m} p50`, cls: `${m} p50`, value: p => at(p, m)?.p50_seconds },
      { name: `${m} p99`, cls: `${m} p99`, value: p => at(p, m)?.p99_seconds },
    ]);
    const yMax = Math.max(1e-6, ...history.flatMap(p => p.paths.filter(q => q.bucket === bucket).map(q => q.p99_seconds)));
    return plot(history, series, yMax * 1.1, `bucket ≤ ${bucket} rows`, `plot-bucket-${bucket}`, v => `${ms(v)} ms`);
  }));
  if (!sorted.length) $("plots").append(el("p", { class: "muted" }, "no calls yet"));
  fill($("legend"), MODES.map(m => el("span", {}, el("i", { class: m }), m)));
  fill($("share-plot"), [plot(history, [{ name: "share", cls: "share", value: p => p.path_share }], 1.0,
                              `now ${pct(history.length ? history[history.length - 1].path_share : null)}`, "plot-share", pct)]);
}

function ago(seconds) {
  if (seconds == null) return "–";
  const s = Math.round(seconds);
  return s < 120 ? `${s} s ago` : s < 7200 ? `${Math.round(s / 60)} min ago` : `${Math.round(s / 3600)} h ago`;
}

// The engine's newest finished request, beside its logits path: its own text, shown as text.
function showSample(live) {
  const s = live.sample;
  if (!s) {
    fill($("sample"), [el("p", { class: "muted" }, "none: this engine writes no sample (the reference engine's demo load does)")]);
    return;
  }
  fill($("sample"), [el("dl", {}, el("dt", {}, "prompt"), el("dd", { class: "prompt" }, s.prompt),
                             el("dt", {}, "output"), el("dd", { class: "output" }, s.text),
                             el("dt", {}, "tokens"), el("dd", { class: "tokens" }, s.tokens),
                             el("dt", {}, "finished"), el("dd", { class: "age" }, ago(s.age_seconds)))]);
}

function showCosts(live) {
  const modes = Object.keys(live.op_seconds_per_call || {});
  const ops = [...new Set(modes.flatMap(m => Object.keys(live.op_seconds_per_call[m])))];
  fill($("costs").tHead, [el("tr", {}, el("th", {}, "ms per call"), ...modes.map(m => el("th", {}, m)))]);
  fill($("costs").tBodies[0], ops.map(op => el("tr", { "data-op": op }, el("td", {}, op),
                                              ...modes.map(m => el("td", {}, ms(live.op_seconds_per_call[m][op]))))));
  const drops = live.dropped || {};
  pairs($("drops"), ["overwritten", "torn", "invalid", "timing_backlog", "timing_at_close"]
    .map(r => [r, drops[r] ?? 0]));
}

function showStats(stats) {
  fill($("stats").tBodies[0], (stats.stats || []).map(s => el("tr", {}, el("td", {}, s.bucket), el("td", {}, s.mode),
    el("td", {}, s.samples), el("td", {}, ms(s.p50_seconds)), el("td", {}, ms(s.p90_seconds)))));
}

function evidenceText(d) {
  const e = d.evidence || {};
  const parts = [];
  if (e.phase) parts.push(`probe ${e.phase}` + (e.probe_calls != null ? `, probe_calls ${e.probe_calls}` : ""));
  for (const [mode, p] of Object.entries(e.paired || {})) {
    const kinds = Object.entries(p.kinds || {}).map(([k, v]) => `${k} ${Number(v.ratio).toFixed(3)}×${v.probes}`);
    parts.push(`${mode}/running ${Number(p.ratio).toFixed(3)} (${p.probes} probes, coverage ${pct(p.coverage)}` +
               (kinds.length ? `; ${kinds.join(", ")}` : "") + ")");
  }
  if (e.mix && Object.keys(e.mix).length) parts.push("mix " + Object.entries(e.mix).map(([k, v]) => `${k} ${pct(v)}`).join(", "));
  if (e.probe_cost_share != null) parts.push(`probe cost ${pct(e.probe_cost_share)}`);
  if (e.pins) parts.push(`pins ${JSON.stringify(e.pins)}`);
  return parts.join(" · ");
}

function showDecisions(decisions, stats, policy) {
  const budget = policy && policy.params ? policy.params.probe_budget : null;
  text($("probe-budget"), `probe budget spent: ${pct(stats.probe_cost_share)} of ${pct(budget)} ` +
                          `(${stats.probe_calls ?? 0} probe calls of ${stats.calls_observed ?? 0})`);
  const list = (decisions.decisions || []).slice().reverse();
  fill($("decisions"), list.map(d => drawn(() => decisionItem(d),
    e => el("li", { class: "unreadable", "data-decision": String(d && d.id) }, `decision ${d && d.id}: unreadable (${e})`))));
}

function decisionItem(d) {
  return el("li", { class: d.reason, "data-decision": d.id },
    el("div", {}, `${new Date(d.time * 1000).toLocaleTimeString()} #${d.id} ${d.reason}: ` +
                  `bucket ${d.buckets.join(", ")} → ${d.mode}` +
                  (Object.keys(d.previous).length ? ` (was ${Object.entries(d.previous).map(([b, m]) => `${b}:${m}`).join(", ")})` : "") +
                  (d.command_seq != null ? `, command ${d.command_seq}` : "")),
    el("div", { class: "evidence" }, drawn(() => evidenceText(d), e => `evidence unreadable (${e})`)));
}

// One item or panel that cannot be drawn (a value of a shape this page does not expect) says so in its place;
// the rest of the page is drawn as usual.
function drawn(draw, instead) {
  try {
    return draw();
  } catch (e) {
    return instead(e && e.message ? e.message : String(e));
  }
}

// -- the poll loop ----------------------------------------------------------------------------------------
async function poll() {
  try {
    const [live, stats, decisions, policy] = await Promise.all([
      api(`/v1/live?points=${HISTORY_POINTS}`), api("/v1/stats"), api(`/v1/decisions?limit=${DECISIONS}`),
      api("/v1/policy")]);
    if (live.status !== 200) throw new Error(`GET /v1/live answered ${live.status}`);
    showStatus(live.body, null);
    const panels = [
      ["banners", () => showBanners(live.body, null)], ["engine", () => showEngine(live.body)],
      ["modes", () => showModes(live.body)], ["plots", () => showPlots(live.body)],
      ["sample", () => showSample(live.body)],
      ["costs", () => showCosts(live.body)], ["stats", () => showStats(stats.body)],
      ["decisions", () => showDecisions(decisions.body, stats.body, policy.body)]];
    const failed = panels.flatMap(([name, show]) => drawn(() => { show(); return []; }, e => [`${name}: ${e}`]));
    fill($("page-errors"), failed.map(f => el("div", { class: "banner bad" }, `not drawn: ${f}`)));
    document.body.dataset.polls = String(Number(document.body.dataset.polls || 0) + 1);
  } catch (e) {
    showStatus(null, String(e));
    showBanners(null, e.name === "AbortError" ? "timed out" : String(e.message || e));
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

function showToken() {
  text($("token-state"), token() ? "token set: pin and release enabled" : "read-only");
}

document.addEventListener("DOMContentLoaded", () => {
  $("token-form").addEventListener("submit", ev => {
    ev.preventDefault();
    const value = $("token").value.trim();
    if (value) sessionStorage.setItem(TOKEN_KEY, value);
    $("token").value = "";
    showToken();
  });
  $("token-clear").addEventListener("click", () => { sessionStorage.removeItem(TOKEN_KEY); showToken(); });
  showToken();
  poll();
});
