// toolrl view: the page. Plain JavaScript over the JSON API of toolrl_viewer.server; plots by plotly.js
// (served from the plotly package on 127.0.0.1, loaded async: everything but the charts works before it
// has arrived). window.viewer exposes state the browser tests read.
//
// The address bar follows what is shown (a hash route, so a trajectory can be sent to a colleague and
// back/forward work): #/ the metrics, #/compare, #/run/<run>/step/<step> a step's trajectories,
// #/run/<run>/step/<step>/t/<trajectory key> one trajectory opened (<run>: the run's directory name,
// or its index when two runs share a name).
"use strict";

const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
// Shown first, in this order, then a curriculum's figures (curriculum/...: what it drew and why); every
// other numeric figure follows alphabetically.
const PREFERRED = ["reward_mean", "reward_std", "tool_call_rate", "tool_success_count", "parse_error_count",
  "response_length", "loss", "grad_norm", "kl", "lp_mismatch", "staleness_mean", "prefix_share",
  "tokens_per_s", "trainer_tokens_per_s", "clip_frac", "advantage_abs_mean", "turns_mean", "errors",
  "infra_failures"];
const POLL_MS = 2000;

const viewer = window.viewer = {runs: [], rows: {}, last: {}, charts: {}, firstContent: null, firstChart: null,
  openedAt: null, opening: 0, tableFor: null, marks: {}, route: null, openKey: null};
const $ = (id) => document.getElementById(id);
const el = (tag, attrs = {}, ...children) => {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v; else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return node;
};
const api = async (path) => {
  const r = await fetch(path);
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
};
const fmt = (v) => v === null || v === undefined ? "–" : typeof v === "number"
  ? (Number.isInteger(v) ? String(v) : v.toPrecision(4)) : typeof v === "object" ? JSON.stringify(v) : String(v);
const color = (i) => COLORS[i % COLORS.length];
// performance.now() once the frame holding what was just rendered has been painted: a task queued from
// its animation frame runs after the paint.
const painted = () => new Promise((resolve) => requestAnimationFrame(() => setTimeout(() => resolve(performance.now()), 0)));

// Settles once plotly.js has run (the async script in index.html may finish before or after this one).
const plotly = new Promise((resolve, reject) => {
  const failed = () => reject(new Error("plotly.min.js did not load"));
  if (window.Plotly) resolve();
  else if (window.plotlyFailed) failed();
  else { $("plotly").addEventListener("load", () => resolve()); $("plotly").addEventListener("error", failed); }
});
let chartNote = "loading charts…";  // what a chart shows until it is drawn
plotly.then(() => { viewer.marks.plotly = performance.now(); }, (e) => {
  chartNote = `charts unavailable: ${e.message}`;
  for (const p of document.querySelectorAll("#charts .placeholder")) p.textContent = chartNote;
});

// -- tabs --------------------------------------------------------------------------------------------
function showTab(name) {
  for (const b of document.querySelectorAll(".tab")) b.classList.toggle("active", b.dataset.tab === name);
  for (const p of document.querySelectorAll(".pane")) p.classList.toggle("hidden", p.id !== name);
  // Charts exist only once plotly.js has run.
  if (name === "metrics") for (const key of Object.keys(viewer.charts)) Plotly.Plots.resize(viewer.charts[key]);
  // A step's table is first read when the tab is opened: indexing it must not delay the first charts.
  if (name === "traces" && viewer.tableFor === null) loadTraces();
}
for (const b of document.querySelectorAll(".tab")) b.addEventListener("click", () => {
  showTab(b.dataset.tab);
  setRoute(b.dataset.tab === "metrics" ? "#/" : b.dataset.tab === "compare" ? "#/compare" : stepRoute(viewer.openKey));
});

// -- the address: a hash route -------------------------------------------------------------------------
// A run in the address: its name, or its index where another run shares the name.
function runRef(index) {
  const run = viewer.runs.find((r) => String(r.index) === String(index));
  if (!run) return String(index);
  return viewer.runs.filter((r) => r.name === run.name).length === 1 ? run.name : String(run.index);
}
function runOf(ref) {
  const named = viewer.runs.filter((r) => r.name === ref);
  return named.length === 1 ? named[0] : viewer.runs.find((r) => String(r.index) === ref);
}
function stepRoute(key = null) {
  if ($("t-source").value === "") return "#/";
  const base = `#/run/${encodeURIComponent(runRef($("t-run").value))}/step/${encodeURIComponent($("t-source").value)}`;
  return key === null ? base : `${base}/t/${encodeURIComponent(key)}`;
}
// A new history entry for ``hash`` (the page already shows it); replace: the current entry changed instead.
function setRoute(hash, replace = false) {
  viewer.route = hash;
  if (location.hash === hash || (!location.hash && hash === "#/")) return;
  if (replace) history.replaceState(null, "", hash); else history.pushState(null, "", hash);
}
// Show what ``hash`` names: back, forward, an address typed or sent by a colleague.
async function applyRoute(hash) {
  viewer.route = hash;
  const parts = hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  if (parts[0] === "compare" && !$("tab-compare").classList.contains("hidden")) {
    showTab("compare");
    return loadCompare();
  }
  if (parts[0] !== "run" || parts[2] !== "step" || parts.length < 4) return showTab("metrics");
  const run = runOf(parts[1]);
  const key = parts[4] === "t" && parts.length > 5 ? parts.slice(5).join("/") : null;
  if (!run || !run.sources.includes(parts[3])) {
    showTab("traces");
    $("trajectory").replaceChildren(el("div", {class: "legend bad"},
      run ? `${run.name} has no step ${parts[3]}` : `no run ${parts[1]} among ${viewer.runs.map((r) => r.name).join(", ")}`));
    return;
  }
  const other = $("t-run").value !== String(run.index) || $("t-source").value !== parts[3];
  if (other) {
    $("t-run").value = run.index;
    fillSources();
    $("t-source").value = parts[3];
    query.offset = 0;
  }
  const listed = viewer.tableFor !== null;
  showTab("traces");  // lists the step when no step has been listed yet
  if (other && listed) loadTraces();
  if (key === null) {
    viewer.openKey = null;
    viewer.opening++;  // a trajectory still loading is not shown
    $("trajectory").replaceChildren();
    for (const other of $("t-table").querySelectorAll("tr.selected")) other.classList.remove("selected");
  } else if (key !== viewer.openKey) {
    await openTrajectory(key, null, false);
  }
}
addEventListener("popstate", () => { if (location.hash !== viewer.route) applyRoute(location.hash); });
addEventListener("hashchange", () => { if (location.hash !== viewer.route) applyRoute(location.hash); });

// -- metrics -----------------------------------------------------------------------------------------
function metricKeys() {
  const keys = new Set();
  for (const rows of Object.values(viewer.rows)) for (const r of rows) for (const k of Object.keys(r)) keys.add(k);
  keys.delete("step");
  const first = PREFERRED.filter((k) => keys.has(k)).concat([...keys].filter((k) => k.startsWith("curriculum/")).sort());
  return first.concat([...keys].filter((k) => !first.includes(k)).sort());
}
const chartId = (key) => "chart-" + key.replace(/[^A-Za-z0-9_-]/g, "_");

function traces(key) {
  return viewer.runs.filter((r) => !r.eval || (viewer.rows[r.index] || []).length).map((run) => {
    const rows = (viewer.rows[run.index] || []).filter((r) => r[key] !== undefined);
    return {x: rows.map((r) => r.step), y: rows.map((r) => r[key]), name: run.name, type: "scatter",
      mode: "lines+markers", line: {color: color(run.index)}, marker: {size: 6}, customdata: rows.map(() => run.index)};
  });
}
function layout(key) {
  let maxStep = 0;
  for (const rows of Object.values(viewer.rows)) for (const r of rows) maxStep = Math.max(maxStep, r.step);
  return {title: {text: key, font: {size: 13}, x: 0.01, xanchor: "left"}, margin: {l: 50, r: 10, t: 30, b: 35}, hovermode: "x unified",
    showlegend: viewer.runs.length > 1, legend: {orientation: "h", y: -0.25},
    xaxis: {title: {text: "step"}, tickformat: "d", dtick: maxStep <= 12 ? 1 : undefined}};
}
function drawChart(div) {
  const key = div.dataset.key;
  const first = !viewer.charts[key];
  if (first) div.replaceChildren();  // the "loading charts…" placeholder
  const done = Plotly.react(div, traces(key), layout(key), {displaylogo: false, responsive: true});
  if (first) {
    viewer.charts[key] = div;
    div.on("plotly_click", (ev) => {
      const p = ev.points[0];
      openStep(p.customdata, String(p.x));
    });
    if (viewer.firstChart === null && viewer.marks.drawn === undefined) viewer.marks.drawn = performance.now();
    done.then(painted).then((t) => { if (viewer.firstChart === null) viewer.firstChart = t; });
  }
}
// Charts scrolled into view are drawn one per frame, so the first shows before the others are built, and
// only once plotly.js has run.
const pending = [];
function drawNext() {
  const div = pending.shift();
  if (div && !viewer.charts[div.dataset.key] && div.isConnected) drawChart(div);
  if (pending.length) requestAnimationFrame(() => setTimeout(drawNext, 0));  // a paint between two charts
}
const observer = new IntersectionObserver((entries) => {
  const idle = !pending.length;
  for (const e of entries) if (e.isIntersecting && !viewer.charts[e.target.dataset.key]) pending.push(e.target);
  if (idle && pending.length) plotly.then(() => requestAnimationFrame(drawNext), () => {});
}, {rootMargin: "200px"});

function renderCharts() {
  const box = $("charts");
  const filter = $("metric-filter").value.trim().toLowerCase();
  const keys = metricKeys().filter((k) => !filter || k.toLowerCase().includes(filter));
  const wanted = new Set(keys.map(chartId));
  for (const div of [...box.children]) if (!wanted.has(div.id)) { box.removeChild(div); delete viewer.charts[div.dataset.key]; }
  keys.forEach((key, i) => {
    let div = $(chartId(key));
    if (!div) {
      div = el("div", {id: chartId(key), class: "chart"}, el("div", {class: "placeholder"}, chartNote));
      div.dataset.key = key;
      observer.observe(div);
    }
    if (box.children[i] !== div) box.insertBefore(div, box.children[i] || null);
    if (viewer.charts[key]) drawChart(div);
  });
  $("metric-count").textContent = `${keys.length} metrics`;
}
$("metric-filter").addEventListener("input", renderCharts);

async function pollMetrics() {
  let changed = false;
  for (const run of viewer.runs) {
    const rows = await api(`/api/metrics?run=${run.index}&since=${viewer.last[run.index] || 0}`);
    if (rows.length) {
      viewer.rows[run.index] = (viewer.rows[run.index] || []).concat(rows);
      viewer.last[run.index] = rows[rows.length - 1].step;
      changed = true;
    }
  }
  if (changed) renderCharts();
}

// -- runs ---------------------------------------------------------------------------------------------
async function loadRuns() {
  viewer.runs = await api("/api/runs");
  $("runs").replaceChildren(...viewer.runs.map((r) => el("span", {style: `color:${color(r.index)}`, title: r.path},
    r.name + (r.eval ? " (eval)" : ""))));
  const keep = $("t-run").value;
  $("t-run").replaceChildren(...viewer.runs.filter((r) => r.sources.length).map((r) =>
    el("option", {value: r.index}, r.name)));
  if (keep) $("t-run").value = keep;
  fillSources();
  const evals = viewer.runs.filter((r) => r.eval);
  for (const [id, pick] of [["c-a", 0], ["c-b", 1]]) {
    const old = $(id).value;
    $(id).replaceChildren(...evals.map((r) => el("option", {value: r.index}, r.name)));
    $(id).value = old || (evals[pick] ? evals[pick].index : "");
  }
  $("tab-compare").classList.toggle("hidden", evals.length < 2);
}
function fillSources() {
  const run = viewer.runs.find((r) => String(r.index) === $("t-run").value);
  const keep = $("t-source").value;
  $("t-source").replaceChildren(...(run ? run.sources : []).map((s) => el("option", {value: s}, s)));
  if (keep && run && run.sources.includes(keep)) $("t-source").value = keep;
}

// -- trajectories -------------------------------------------------------------------------------------
const query = {offset: 0, seq: 0};  // seq: a reply to an older request is dropped
function openStep(run, source) {
  $("t-run").value = run;
  fillSources();
  $("t-source").value = source;
  query.offset = 0;
  showTab("traces");
  setRoute(stepRoute());
  loadTraces();
}
async function loadTraces() {
  const params = new URLSearchParams({run: $("t-run").value, source: $("t-source").value, offset: query.offset,
    limit: 50, sort: $("t-sort").value, desc: $("t-desc").checked, env: $("t-env").value,
    min_reward: $("t-min").value, max_reward: $("t-max").value});
  for (const f of ["errors", "infra_failures", "tool_failures", "truncated", "forked"]) params.set(f, $("t-" + f).checked);
  if (!$("t-source").value) return;
  const seq = ++query.seq;
  // Another step's rows are cleared while this one's are read: a click on one would open its key in this step.
  if (viewer.tableFor !== null && viewer.tableFor !== `${params.get("run")}:${params.get("source")}`) {
    viewer.tableFor = "";
    $("t-table").tBodies[0].replaceChildren();
    $("t-count").textContent = "reading the step…";
  }
  const page = await api("/api/traces?" + params);
  if (seq !== query.seq) return;
  viewer.tableFor = `${params.get("run")}:${params.get("source")}`;
  const envKeep = $("t-env").value;
  $("t-env").replaceChildren(el("option", {value: ""}, "any environment"),
    ...page.envs.map((e) => el("option", {value: e}, e)));
  $("t-env").value = envKeep;
  const end = Math.min(page.offset + page.rows.length, page.matched);
  $("t-count").textContent = `${page.matched} of ${page.total} trajectories` +
    (page.matched ? ` (showing ${page.offset + 1}–${end})` : "") +
    (page.pieces > page.total ? `; ${page.pieces} segments in all` : "");
  $("t-prev").disabled = page.offset === 0;
  $("t-next").disabled = end >= page.matched;
  $("t-table").tBodies[0].replaceChildren(...page.rows.map((r) => {
    // An infrastructure failure is not the model's: shown apart from its errors, as not trained.
    // One row per trajectory: a trajectory in pieces (context edits, forks, fold branches) is one row,
    // its figures those of the whole (toolrl_viewer.traces.whole).
    const tr = el("tr", {class: (r.infra_failure ? "infra" : r.error || r.tool_failures ? "bad" : "") +
      (r.trajectory_id === viewer.openKey ? " selected" : ""), "data-row": r.row, "data-key": r.trajectory_id},
      el("td", {title: r.segments > 1 ? `its segments' rows: ${r.rows.join(", ")}` : ""}, r.row), el("td", {}, r.trajectory_id),
      el("td", {}, r.segments), el("td", {}, r.group), el("td", {}, r.env),
      el("td", {}, fmt(r.reward)), el("td", {}, fmt(r.advantage)), el("td", {}, r.turns),
      el("td", {}, r.tool_calls), el("td", {class: r.tool_failures ? "bad" : ""}, r.tool_failures),
      el("td", {title: r.infra_failure ? "the infrastructure failed: not trained" : ""},
        r.infra_failure ? "infra_error (not trained)" : r.termination), el("td", {}, r.response_tokens));
    tr.addEventListener("click", () => openTrajectory(r.trajectory_id, tr));
    return tr;
  }));
}
for (const id of ["t-min", "t-max", "t-errors", "t-infra_failures", "t-tool_failures", "t-truncated", "t-forked", "t-env", "t-sort",
  "t-desc", "t-source"]) $(id).addEventListener("change", () => { query.offset = 0; loadTraces(); });
$("t-run").addEventListener("change", () => { fillSources(); query.offset = 0; setRoute(stepRoute()); loadTraces(); });
$("t-source").addEventListener("change", () => setRoute(stepRoute()));
$("t-prev").addEventListener("click", () => { query.offset = Math.max(0, query.offset - 50); loadTraces(); });
$("t-next").addEventListener("click", () => { query.offset += 50; loadTraces(); });

const DIFF_FLOOR = 0.1;  // nats: the |trainer − engine| that full colour means at least (fp32 agrees to ~1e-6)
function heat(tok, mode, scale, diffScale) {
  if (mode === "diff" && typeof tok.dlp === "number") {
    const d = Math.min(1, Math.abs(tok.dlp) / diffScale);  // blue: the trainer finds the token likelier
    return tok.dlp >= 0 ? `rgba(30, 90, 230, ${(0.65 * d).toFixed(3)})` : `rgba(220, 30, 50, ${(0.65 * d).toFixed(3)})`;
  }
  if (mode === "logprob" && typeof tok.lp === "number") {
    const surprise = 1 - Math.exp(tok.lp);  // 0: the engine was sure of this token
    return `rgba(255, 110, 0, ${(0.65 * surprise).toFixed(3)})`;
  }
  if (mode === "advantage" && typeof tok.adv === "number" && scale > 0) {
    const a = Math.min(1, Math.abs(tok.adv) / scale);
    return tok.adv >= 0 ? `rgba(20, 160, 60, ${(0.6 * a).toFixed(3)})` : `rgba(220, 30, 50, ${(0.6 * a).toFixed(3)})`;
  }
  return "transparent";
}
function message(role, text, extra = "") {
  if (role === "system" && text.length > 300) {  // tool schemas: folded, one click away
    return el("details", {class: `msg ${role} ${extra}`}, el("summary", {class: "role"}, `${role} (${text.length} characters)`),
      el("pre", {}, text));
  }
  return el("div", {class: `msg ${role} ${extra}`}, el("div", {class: "role"}, role), el("pre", {}, text));
}
function renderTrajectory(t) {
  const box = $("trajectory");
  const mode = $("heat") ? $("heat").value : "logprob";
  const m = t.meta;
  const meta = el("div", {class: "meta"});
  const advantage = (a) => a && a.per_token ? `per token (mean ${fmt(a.mean)})` : a;
  const shown = {...m, advantage: advantage(t.advantage)};
  for (const [k, v] of Object.entries(shown)) {
    if (v === null || v === undefined || (typeof v === "object" && !Object.keys(v).length)) continue;
    meta.append(el("span", {}, el("b", {}, k), el("span", {class: k === "error" || k === "reward_errors" ? "bad" : ""}, fmt(v))));
  }
  let scale = 0, diffScale = DIFF_FLOOR;
  for (const piece of t.pieces) for (const s of piece.segments) for (const tok of s.tokens || []) {
    if (typeof tok.adv === "number") scale = Math.max(scale, Math.abs(tok.adv));
    if (typeof tok.dlp === "number") diffScale = Math.max(diffScale, Math.abs(tok.dlp));
  }
  const heatSel = el("select", {id: "heat"}, el("option", {value: "logprob"}, "colour: engine surprise (1 − p)"),
    ...(t.trainer_logprobs ? [el("option", {value: "diff"}, "colour: trainer − engine log-prob")] : []),
    ...(scale > 0 ? [el("option", {value: "advantage"}, "colour: advantage per token")] : []),
    el("option", {value: "none"}, "no colour"));
  heatSel.value = [...heatSel.options].some((o) => o.value === mode) ? mode : "logprob";
  heatSel.addEventListener("change", () => renderTrajectory(t));
  const link = el("a", {href: stepRoute(t.trajectory_id), class: "permalink", title: "copy to send this trajectory to a colleague"}, "link to this trajectory");
  const parts = [el("h3", {}, `trajectory ${t.trajectory_id ?? ""}`), el("div", {class: "legend"}, link,
    t.pieces.length > 1 ? ` · in ${t.pieces.length} segments (trace rows ${t.pieces.map((p) => p.row).join(", ")}): ` +
      "turns, tool calls and tokens are summed over them; reward and termination are the last segment's" : ""), meta,
    el("div", {class: "bar legend"}, heatSel, "Underlined: trained tokens (response_mask 1). " + (t.trainer_logprobs
      ? "Hover a token for its id, the engine's and the trainer's log-probs (weights the step started from) and " +
        `trainer − engine; blue: the trainer finds it likelier, red: less likely, full colour at ${fmt(diffScale)} nats.`
      : "Hover a token for its id and engine log-prob. " +
        "This run's trace rows record the engine's log-probs only: the engine–trainer difference is the step's lp_mismatch."))];
  if (t.tokens_note) parts.push(el("div", {class: "legend"}, `Whole texts shown: ${t.tokens_note}`));
  const several = t.pieces.length > 1;
  if (several) {  // a trajectory in segments: a list of them, each a click away, then each in order
    const list = el("ol", {class: "segments"});
    t.pieces.forEach((piece, i) => {
      const item = el("li", {}, el("a", {href: "#"}, `${piece.label} · ${piece.response_tokens} response tokens · ${piece.termination}`));
      item.firstChild.addEventListener("click", (e) => { e.preventDefault(); $(`segment-${i}`).scrollIntoView(); });
      list.append(item);
    });
    parts.push(el("h4", {}, `segments of this trajectory (${t.pieces.length})`), list);
  }
  t.pieces.forEach((piece, i) => {
    const out = several ? el("section", {class: "segment", id: `segment-${i}`, "data-piece": piece.piece}) : null;
    const add = (...nodes) => (out ? out.append(...nodes) : parts.push(...nodes));
    if (several) {
      out.append(el("h4", {class: "segment-label"}, piece.label), el("div", {class: "meta"},
        ...[["piece", piece.piece], ["row", piece.row], ["turns", piece.turns], ["tool calls", piece.tool_calls],
          ["response tokens", piece.response_tokens], ["termination", piece.termination],
          ["advantage", advantage(piece.advantage)], ["policy_version", piece.meta.policy_version]]
          .filter(([, v]) => v !== null && v !== undefined)
          .map(([k, v]) => el("span", {}, el("b", {}, k), fmt(v)))));
    }
    if (piece.images.length) add(el("div", {class: "images"}, ...piece.images.map((png) => el("img", {src: "data:image/png;base64," + png}))));
    const prompt = piece.prompt.map((msg) => message(msg.role, msg.text));
    if (i === 0) add(...prompt);
    else add(el("details", {class: "msg"}, el("summary", {class: "role"},
      `this segment's prompt: the context ${piece.edit ? "after the edit" : "re-rendered"} (${piece.prompt.length} messages)`), ...prompt));
    for (const s of piece.segments) {
      if (s.trained === true) {
        const line = el("div", {class: "tokens"});
        for (const tok of s.tokens) {
          const span = el("span", {class: "tok trained", title: `id ${tok.id}  log p ${fmt(tok.lp)}` +
            (typeof tok.tlp === "number" ? `  trainer ${fmt(tok.tlp)}  trainer − engine ${fmt(tok.dlp)}` : "") +
            (typeof tok.adv === "number" ? `  advantage ${fmt(tok.adv)}` : "")}, tok.t);
          span.style.background = heat(tok, heatSel.value, scale, diffScale);
          line.append(span);
        }
        add(el("div", {class: "msg generated"}, el("div", {class: "role"}, "assistant · generated, trained"), line));
      } else if (s.trained === false) {
        for (const msg of s.messages) if (msg.text.trim()) add(message(msg.role, msg.text, s.error ? "error" : ""));
      } else {
        add(message("response", s.text));
      }
    }
    // A piece's tool calls as its row holds them: the main line's on its last segment, a branch's on its own.
    if (piece.tool_results.length) add(el("h4", {}, several ? "tool calls recorded on this segment" : "tool calls"));
    for (const r of piece.tool_results) {
      add(el("div", {class: `tool ${r.status !== "ok" ? "error" : ""}`},
        el("div", {}, el("b", {}, `${r.name}(${JSON.stringify(r.arguments)})`), " → ",
          el("span", {class: "status"}, r.status), ` ${fmt(r.latency_s)} s`),
        el("pre", {}, r.text)));
    }
    for (const e of piece.meta.parse_errors || []) add(el("div", {class: "tool error"}, el("span", {class: "status"}, "malformed call"), el("pre", {}, e.message)));
    if (out) parts.push(out);
  });
  box.replaceChildren(...parts);
}
// Open trajectory ``key`` of the step shown; ``push``: a new address for it (false: the address named it).
async function openTrajectory(key, tr, push = true) {
  const started = performance.now();
  const seq = ++viewer.opening;
  viewer.openKey = key;
  for (const other of $("t-table").querySelectorAll("tr.selected")) other.classList.remove("selected");
  if (tr) tr.classList.add("selected");
  else for (const row of $("t-table").tBodies[0].rows) if (row.dataset.key === key) row.classList.add("selected");
  if (push) setRoute(stepRoute(key));
  let t;
  try {
    t = await api(`/api/trajectory?run=${$("t-run").value}&source=${encodeURIComponent($("t-source").value)}&t=${encodeURIComponent(key)}`);
  } catch (e) {
    if (seq === viewer.opening) $("trajectory").replaceChildren(el("div", {class: "legend bad"}, e.message));
    return;
  }
  if (seq !== viewer.opening) return;
  renderTrajectory(t);
  viewer.openedAt = {row: t.row, key, ms: performance.now() - started};
}

// -- compare -------------------------------------------------------------------------------------------
async function loadCompare() {
  if ($("c-a").value === "" || $("c-b").value === "") return;
  const c = await api(`/api/compare?a=${$("c-a").value}&b=${$("c-b").value}`);
  const diffCell = (d) => el("td", {class: d > 0 ? "up" : d < 0 ? "down" : ""}, d === null ? "" : (d > 0 ? "+" : "") + fmt(d));
  const summary = el("table", {class: "grid", id: "c-summary"}, el("thead", {}, el("tr", {},
    el("th", {}, "figure"), el("th", {}, `A: ${c.a}`), el("th", {}, `B: ${c.b}`), el("th", {}, "B − A"))),
  el("tbody", {}, ...c.summary.map((s) => el("tr", {}, el("td", {}, s.key), el("td", {}, fmt(s.a)), el("td", {}, fmt(s.b)), diffCell(s.diff)))));
  const side = (x) => x ? `${x.successes}/${x.n}` : "–";
  const rows = c.problems.filter((p) => !$("c-changed").checked || p.diff);
  const problems = el("table", {class: "grid", id: "c-problems"}, el("thead", {}, el("tr", {},
    el("th", {}, "problem"), el("th", {}, "A right"), el("th", {}, "B right"), el("th", {}, "A reward"),
    el("th", {}, "B reward"), el("th", {}, "B − A (right)"))),
  el("tbody", {}, ...rows.map((p) => el("tr", {}, el("td", {}, p.problem), el("td", {}, side(p.a)), el("td", {}, side(p.b)),
    el("td", {}, fmt(p.a && p.a.reward)), el("td", {}, fmt(p.b && p.b.reward)), diffCell(p.diff)))));
  $("c-out").replaceChildren(el("h3", {}, "summary"), summary, el("h3", {}, `problems (${rows.length})`), problems);
}
for (const id of ["c-a", "c-b", "c-changed"]) $(id).addEventListener("change", loadCompare);
$("tab-compare").addEventListener("click", loadCompare);

// -- live ----------------------------------------------------------------------------------------------
async function tick() {
  if ($("live").checked) {
    try {
      await pollMetrics();
      await loadRuns();
    } catch (e) { console.error(e); }
  }
  setTimeout(tick, POLL_MS);
}

(async () => {
  viewer.marks.start = performance.now();
  await loadRuns();
  viewer.marks.runs = performance.now();
  await pollMetrics();
  viewer.marks.metrics = performance.now();
  renderCharts();
  if ($("t-source").options.length) $("t-source").value = $("t-source").options[$("t-source").options.length - 1].value;
  // An address sent by a colleague: its trajectory opens (not awaited: the tokenizer may still be loading).
  if (location.hash && location.hash !== "#/") applyRoute(location.hash);
  else viewer.route = location.hash;
  painted().then((t) => { viewer.firstContent = t; });
  setTimeout(tick, POLL_MS);
})();
