// rl.js: `octlm rl` runs: each step's rollout numbers (the mean reward and the share correct,
// the share of replies cut at the length cap, the mean reply length), held-out pass@1 and
// pass@k at each evaluation, and what each RL run is (task, source, P, G) in a table and in the
// settings. Nothing is shown for training runs.
"use strict";

const RL_DASHES = ["", "6 3", "2 3", "8 3 2 3"];

function rlRuns(runs) {
  return runs.filter((run) => run.rl);
}

// `ys` (a column of the run's `part`: "steps" or "val") against `xkey`.
function rlPoints(run, part, xkey, ys) {
  return column({ [xkey]: run[part][xkey], y: ys }, xkey, "y");
}

// One line per RL run and step field: fields are [field, label, dash].
function rlStepSeries(runs, xkey, fields) {
  const series = [];
  runs.forEach((run, i) => {
    if (!run.rl) return;
    for (const [field, label, dash] of fields) {
      series.push({ name: `${run.name} ${label}`, color: runColor(i), kind: "line",
        ...lineStyle(runs, i), dash, ...rlPoints(run, "steps", xkey, run.rl.steps[field]) });
    }
  });
  return series;
}

// pass@1 and pass@k of each held-out evaluation: a line per run and k (dashed past pass@1),
// dotted at each evaluation.
function rlPassSeries(runs, xkey) {
  const series = [];
  runs.forEach((run, i) => {
    if (!run.rl) return;
    Object.keys(run.rl.pass_at).forEach((key, k) => {
      const points = rlPoints(run, "val", xkey, run.rl.pass_at[key]);
      const name = `${run.name} ${key}`;
      series.push({ name, color: runColor(i), kind: "line", dash: RL_DASHES[k % 4], width: 1.6,
        ...points });
      series.push({ name, color: runColor(i), kind: "dots", r: 3, hover: false, ...points });
    });
  });
  return series;
}

// The length caps of the runs (--max-new-tokens), one dashed rule each.
function rlCaps(runs) {
  const caps = [];
  for (const run of rlRuns(runs)) {
    const cap = run.rl.settings.max_new_tokens;
    if (typeof cap === "number" && !caps.some((c) => c.y === cap)) {
      caps.push({ y: cap, color: "#555", label: `cap ${cap}` });
    }
  }
  return caps;
}

function drawRlChart(id, spec) {
  const shown = spec.series.length > 0;
  document.getElementById(`card-${id}`).hidden = !shown;
  if (shown) drawChart(document.getElementById(`chart-${id}`), spec);
}

function drawRlCharts(runs, xkey) {
  const common = { xLabel: xkey === "step" ? "step" : "tokens", vlines: eventLines(runs, xkey),
    xInt: xkey === "step" };
  drawRlChart("rl-reward", { ...common, yLabel: "reward", series: rlStepSeries(runs, xkey,
    [["reward", "reward", ""], ["correct", "correct", "6 3"]]) });
  drawRlChart("rl-pass", { ...common, yLabel: "held-out pass@k", yZero: true,
    series: rlPassSeries(runs, xkey) });
  drawRlChart("rl-cut", { ...common, yLabel: "share cut", yZero: true,
    series: rlStepSeries(runs, xkey, [["cut", "cut", ""]]) });
  drawRlChart("rl-len", { ...common, yLabel: "tokens per reply", yZero: true,
    series: rlStepSeries(runs, xkey, [["reply_len", "reply length", ""]]), hlines: rlCaps(runs) });
}

// The newest finite value of a val column and the step of its record.
function rlLatest(run, ys) {
  for (let k = ys.length - 1; k >= 0; k--) {
    if (ys[k] !== null && Number.isFinite(ys[k])) return { value: ys[k], step: run.val.step[k] };
  }
  return null;
}

function rlPassText(run, key) {
  const got = rlLatest(run, run.rl.pass_at[key] || []);
  return got ? `${fmtValue(got.value)} (step ${got.step})` : "–";
}

function drawRlTable(runs) {
  const rows = [];
  runs.forEach((run, i) => {
    if (!run.rl) return;
    const s = run.rl.settings;
    const src = run.rl.source;
    const passK = Object.keys(run.rl.pass_at).pop() || `pass@${s.pass_k}`;  // K ascending
    const num = (v) => h("td", { class: "num" }, fmtValue(v));
    rows.push(h("tr", {},
      h("td", {}, swatch(i), " ", run.name),
      h("td", { class: "mono" }, s.task),
      h("td", { class: "mono", title: src.weights_sha256 || "" },
        src.path || s.source, src.step === undefined ? "" : ` · step ${src.step}`),
      num(s.prompts), num(s.samples), num(s.max_new_tokens), num(run.rl.world),
      num(lastFinite(run.rl.steps.reward)), num(lastFinite(run.rl.steps.correct)),
      h("td", { class: "num" }, rlPassText(run, "pass@1")),
      h("td", { class: "num" }, `${passK}: ${rlPassText(run, passK)}`)));
  });
  const head = ["run", "task", "source", "P prompts", "G samples", "max new tokens", "processes",
    "last reward", "last correct", "held-out pass@1", "held-out pass@k"];
  document.getElementById("rl-runs").replaceChildren(table(head, rows));
}

// The RL runs' source and optimizer, first in the settings, open (their settings are in the
// sections' tables, beside training's: octlm/config/rl.py).
function addRlSettings(runs) {
  const groups = [
    ["RL source", runs.map((r) => r.rl && r.rl.source)],
    ["RL optimizer (the source run's)", runs.map((r) => r.rl && r.rl.optim)],
  ];
  document.getElementById("settings").prepend(...groups.map(([title, objs], k) =>
    h("details", { open: k < 1 ? "" : null }, h("summary", {}, title),
      h("div", { class: "scroll" }, compareTable(runs, objs)))));
}

function setupRL(runs) {
  const rl = rlRuns(runs);
  document.getElementById("rl-box").hidden = rl.length === 0;
  if (!rl.length) return;
  drawRlTable(runs);
  addRlSettings(runs);
  const note = document.getElementById("loss-note");
  note.textContent = `${rl.map((r) => r.name).join(", ")}: RL, whose loss is the policy-gradient ` +
    "surrogate (it drifts around 0); their reward and held-out charts show what they learn";
  note.hidden = false;
  for (const radio of document.querySelectorAll('input[name="xaxis"]')) {
    radio.addEventListener("change", () => drawRlCharts(runs, radio.value));
  }
  drawRlCharts(runs, "step");
}
