// runs.js: the run sections of the report: charts of the logged columns (against step or
// tokens), then tables of the runs, their events, settings and samples. Text from the logs is
// only ever set as text (textContent), never parsed as HTML.
"use strict";

const PALETTE = ["#1f5fbf", "#d9480f", "#2b8a3e", "#862e9c", "#c2255c", "#0b7285", "#5c940d"];
const CLIPPED_COLOR = "#c62828";

function runColor(i) {
  return PALETTE[i % PALETTE.length];
}

// h("td", {class: "num"}, "text", childNode, ...): a DOM element with text or element children.
function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== null && v !== undefined) node.setAttribute(k, String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.appendChild(typeof c === "object" ? c : document.createTextNode(String(c)));
  }
  return node;
}

// Points of one column against `xkey` ("step" or "tokens"), leaving out rows without an x.
function column(table, xkey, field) {
  const xs = [];
  const ys = [];
  for (let i = 0; i < table[field].length; i++) {
    const x = table[xkey][i];
    if (x === null || x === undefined) continue;
    xs.push(x);
    ys.push(table[field][i]);
  }
  return { xs, ys };
}

function lastFinite(ys) {
  for (let i = ys.length - 1; i >= 0; i--) if (ys[i] !== null && Number.isFinite(ys[i])) return ys[i];
  return null;
}

// The tokens logged by step `step` (an RL run's sampled tokens, which vary step to step).
function tokensAt(run, step) {
  const k = run.steps.step.indexOf(step);
  return k < 0 ? null : run.steps.tokens[k];
}

// Resume and stop events as vertical rules; `step` in an event is the number of steps done.
function eventLines(runs, xkey) {
  const lines = [];
  runs.forEach((run, i) => {
    for (const e of run.events) {
      if (e.event !== "resume" && e.event !== "stop") continue;
      const x = xkey === "step" ? e.step : run.rl ? tokensAt(run, e.step)
        : e.step * (run.tokens_per_step || 0);
      const who = runs.length > 1 ? ` (${run.name})` : "";
      lines.push({ x, color: runColor(i), label: e.event + who });
    }
  });
  return lines;
}

// Earlier runs draw wider and paler, underneath: runs that agree (a resumed run and its
// straight twin) show as a thin line inside a wide band instead of one hiding the other.
function lineWidth(runs, i) {
  return 1.5 + 3.5 * Math.min(3, runs.length - 1 - i);
}

function lineStyle(runs, i) {
  return { width: lineWidth(runs, i), opacity: i < runs.length - 1 ? 0.45 : 1 };
}

function drawRunCharts(runs, xkey) {
  const xLabel = xkey === "step" ? "step" : "tokens";
  const vlines = eventLines(runs, xkey);
  const common = { xLabel, vlines, xInt: xkey === "step" };
  const loss = [];
  runs.forEach((run, i) => {
    const c = runColor(i);
    loss.push({ name: `${run.name} train`, color: c, kind: "line", ...lineStyle(runs, i),
      ...column(run.steps, xkey, "loss") });
    loss.push({ name: `${run.name} val`, color: c, kind: "dots", dash: "5 4", width: 1.4,
      r: 1.5 + lineWidth(runs, i) / 2,
      ...column(run.val, xkey, "val_loss") });
  });
  drawChart(document.getElementById("chart-loss"), { ...common, yLabel: "loss", series: loss });

  const perRun = (field, extra) => runs.map((run, i) => ({ name: run.name, color: runColor(i),
    kind: "line", ...lineStyle(runs, i), ...column(run.steps, xkey, field), ...extra }));
  drawChart(document.getElementById("chart-lr"),
    { ...common, yLabel: "learning rate", yZero: true, series: perRun("lr") });

  const grad = perRun("grad_norm");
  const hlines = [];
  const notes = [];
  runs.forEach((run, i) => {
    const c = run.grad_clip;
    if (!(c > 0)) {
      notes.push(`${run.name}: no clipping (grad_clip 0)`);
      return;
    }
    if (!hlines.some((l) => l.y === c)) hlines.push({ y: c, color: "#555", label: `clip ${c}` });
    const all = column(run.steps, xkey, "grad_norm");
    const xs = [];
    const ys = [];
    all.ys.forEach((y, k) => {
      if (y !== null && y > c) {
        xs.push(all.xs[k]);
        ys.push(y);
      }
    });
    grad.push({ name: `${run.name} clipped`, color: CLIPPED_COLOR, kind: "dots", r: 2, xs, ys,
      tip: (k) => `${run.name} clipped: ${fmtValue(ys[k])} → ×${fmtValue(Math.min(1, c / ys[k]))}` });
    const n = countFinite(all.ys);
    notes.push(`${run.name}: ${xs.length} of ${n} steps clipped at ${c}` +
      (n ? ` (${((100 * xs.length) / n).toFixed(1)}%)` : ""));
  });
  drawChart(document.getElementById("chart-grad"),
    { ...common, yLabel: "gradient norm", yZero: true, series: grad, hlines });
  document.getElementById("grad-note").textContent = notes.join(" · ");

  drawChart(document.getElementById("chart-speed"),
    { ...common, yLabel: "tokens/s", yZero: true, series: perRun("tok_per_s") });
  // Named validation series: a mixture's datasets (bits per byte) and --eval-tasks' tasks
  // (acc_norm), one line per run and name, the dash telling the names apart.
  drawNamed(runs, xkey, common, "val_sources", "sources", "val bits per byte");
  drawNamed(runs, xkey, common, "val_tasks", "tasks", "acc_norm");
  const hasMfu = runs.some((r) => countFinite(r.steps.mfu) > 0);
  document.getElementById("card-mfu").hidden = !hasMfu;
  if (hasMfu) {
    const pct = (v) => (v === null ? "–" : `${(100 * v).toFixed(2)}%`);
    drawChart(document.getElementById("chart-mfu"),
      { ...common, yLabel: "MFU", yZero: true, series: perRun("mfu", { fmt: pct }) });
  }
}

function drawNamed(runs, xkey, common, field, id, yLabel) {
  const series = [];
  runs.forEach((run, i) => {
    Object.keys(run[field] || {}).forEach((name, k) => {
      const points = column({ [xkey]: run.val[xkey], y: run[field][name] }, xkey, "y");
      series.push({ name: `${run.name} ${name}`, color: runColor(i), kind: "line",
        dash: ["", "6 3", "2 3", "8 3 2 3"][k % 4], width: 1.6, ...points });
    });
  });
  document.getElementById(`card-${id}`).hidden = series.length === 0;
  if (series.length) {
    drawChart(document.getElementById(`chart-${id}`), { ...common, yLabel, series });
  }
}

function table(head, rows) {
  return h("table", {}, h("thead", {}, h("tr", {}, ...head.map((x) => h("th", {}, x)))),
    h("tbody", {}, ...rows));
}

function swatch(i) {
  return h("span", { class: "swatch", style: `background:${runColor(i)}` });
}

function runStatus(run) {
  const total = run.rl ? run.rl.settings.steps : run.config && run.config.steps;
  if (run.end) return "finished";
  const stop = run.events.filter((e) => e.event === "stop").pop();
  const done = run.steps.step.length;
  return stop ? `stopped at step ${stop.step} of ${total}` : `in progress or cut off (${done} of ${total})`;
}

function drawSummary(runs) {
  const rows = runs.map((run, i) => {
    const end = run.end || {};
    const bestVal = run.val.val_loss.filter((v) => v !== null).reduce((a, b) => Math.min(a, b), Infinity);
    const resumes = run.events.filter((e) => e.event === "resume").length;
    return h("tr", {},
      h("td", {}, swatch(i), " ", run.name, run.rl ? h("span", { class: "muted" }, " (RL)") : null),
      h("td", {}, runStatus(run)),
      h("td", { class: "num" }, fmtValue(run.steps.step.length)),
      h("td", { class: "num" }, fmtValue(lastFinite(run.steps.tokens))),
      h("td", { class: "num" }, fmtValue(lastFinite(run.steps.loss))),
      h("td", { class: "num" }, fmtValue(lastFinite(run.val.val_loss))),
      h("td", { class: "num" }, Number.isFinite(bestVal) ? fmtValue(bestVal) : "–"),
      h("td", { class: "num" }, fmtValue(run.params)),
      h("td", { class: "num" }, fmtValue(resumes)),
      h("td", { class: "mono", title: end.weights_sha256 || "" },
        end.weights_sha256 ? end.weights_sha256.slice(0, 16) + "…" : "–"),
      h("td", { class: "mono" }, run.path, run.bad_lines ? ` (${run.bad_lines} unreadable lines)` : ""));
  });
  const head = ["run", "status", "steps logged", "tokens", "last loss", "last val", "best val",
    "params", "resumes", "end weights_sha256", "folder"];
  document.getElementById("summary").replaceChildren(table(head, rows));
}

function eventDetails(e) {
  const skip = new Set(["event", "step", "time"]);
  const parts = [];
  for (const [k, v] of Object.entries(e)) {
    if (skip.has(k)) continue;
    if (Array.isArray(v) && v.length === 0) continue;
    parts.push(`${k}: ${typeof v === "object" && v !== null ? JSON.stringify(v) : v}`);
  }
  return parts.join("; ");
}

function drawEvents(runs) {
  const rows = [];
  runs.forEach((run, i) => {
    for (const e of run.events) {
      rows.push(h("tr", {}, h("td", {}, swatch(i), " ", run.name), h("td", { class: "num" }, e.step),
        h("td", {}, e.event), h("td", { class: "mono" }, eventDetails(e))));
    }
  });
  const box = document.getElementById("events");
  if (rows.length) box.replaceChildren(table(["run", "step", "event", "details"], rows));
  else box.replaceChildren(h("p", { class: "muted" }, "none: every run went straight through"));
}

function show(v) {
  if (v === undefined) return "";
  return typeof v === "object" && v !== null ? JSON.stringify(v) : String(v);
}

// One row per key, one column per run; rows whose values differ between runs are highlighted.
function compareTable(runs, objects) {
  const keys = [];
  for (const o of objects) for (const k of Object.keys(o || {})) if (!keys.includes(k)) keys.push(k);
  const rows = keys.map((k) => {
    const vals = objects.map((o) => show((o || {})[k]));
    const differ = runs.length > 1 && vals.some((v) => v !== vals[0]);
    return h("tr", { class: differ ? "diff" : null }, h("th", {}, k),
      ...vals.map((v) => h("td", { class: "mono" }, v)));
  });
  return table(["", ...runs.map((r) => r.name)], rows);
}

function drawSettings(runs) {
  const other = runs.map((r) => ({ params: r.params, params_non_embedding: r.params_non_embedding,
    tokens_per_step: r.tokens_per_step, git_commit: r.git_commit, data_dir: r.data_dir,
    started: r.time, argv: (r.argv || []).join(" ") }));
  // The config by section (octlm.config.train.SECTIONS), keys that do not apply to a run left
  // out (Muon's for an AdamW run, the wsd decay's for a cosine one).
  const sections = [];
  for (const r of runs) {
    for (const s of Object.keys(r.config_sections || {})) if (!sections.includes(s)) sections.push(s);
  }
  const groups = [
    ...sections.map((s) => [`Settings: ${s}`, runs.map((r) => (r.config_sections || {})[s])]),
    ["Fingerprints", runs.map((r) => r.fingerprints)],
    ["Build", runs.map((r) => r.build)],
    ["Model", runs.map((r) => r.model_config)],
    ["Run", other],
  ];
  // Packed rows (--packing bos, prompt/completion examples): what the windows say of
  // themselves, e.g. the shares of tokens cropped and padded; only when a run has them.
  const packing = runs.map((r) => (r.packing && r.packing.train) || {});
  if (packing.some((p) => Object.keys(p).length)) {
    groups.splice(sections.length, 0, ["Training rows (packing)", packing]);
  }
  const box = document.getElementById("settings");
  box.replaceChildren(...groups.map(([title, objs], k) => {
    const d = h("details", { open: k <= sections.length ? "" : null }, h("summary", {}, title),
      h("div", { class: "scroll" }, compareTable(runs, objs)));
    return d;
  }));
}

function drawSamples(runs) {
  const blocks = [];
  runs.forEach((run, i) => {
    for (const s of run.samples || []) {
      blocks.push(h("p", {}, swatch(i), ` ${run.name} · ${s.source}`));
      blocks.push(h("pre", { class: "sample" }, s.text));
    }
  });
  document.getElementById("samples-box").hidden = blocks.length === 0;
  document.getElementById("samples").replaceChildren(...blocks);
}

// `octlm merge` folders: which checkpoints, and the merge against the newest of them, scored by
// `octlm merge` on the same validation windows (merge.json's `eval`).
function drawMerges(merges) {
  document.getElementById("merges-box").hidden = merges.length === 0;
  const num = (v, digits) => (typeof v === "number" ? v.toFixed(digits) : "–");
  const rows = merges.map((m) => {
    const e = m.eval || null;
    const delta = e ? e.merged.bpb - e.last.bpb : null;
    const verdict = delta === null ? "not scored: octlm eval shows it" : delta < 0 ? "better" : "not better";
    return h("tr", {},
      h("td", {}, m.name),
      h("td", {}, m.sources.map((s) => `${s.step} (×${s.weight})`).join(", ")),
      h("td", { class: "num" }, e ? num(e.merged.bpb, 4) : "–"),
      h("td", { class: "num" }, e ? `${num(e.last.bpb, 4)} (step ${e.last.step})` : "–"),
      h("td", { class: "num" }, delta === null ? "–" : (delta > 0 ? "+" : "") + delta.toFixed(4)),
      h("td", {}, verdict),
      h("td", { class: "mono", title: m.weights_sha256 || "" }, (m.weights_sha256 || "").slice(0, 16) + "…"),
      h("td", { class: "mono" }, m.path));
  });
  const head = ["merge", "steps (weight)", "val bpb merged", "val bpb last", "merged - last",
    "", "weights_sha256", "folder"];
  document.getElementById("merges").replaceChildren(table(head, rows));
}

function setupRuns(runs) {
  document.getElementById("runs").hidden = false;
  document.getElementById("legend").replaceChildren(
    ...runs.map((run, i) => h("span", { title: run.path }, swatch(i), run.name)));
  let xkey = "step";
  for (const radio of document.querySelectorAll('input[name="xaxis"]')) {
    radio.addEventListener("change", () => {
      xkey = radio.value;
      drawRunCharts(runs, xkey);
    });
  }
  drawRunCharts(runs, xkey);
  drawSummary(runs);
  drawEvents(runs);
  drawSettings(runs);
  drawSamples(runs);
}
