// suites.js: --eval-tasks' standard suites (core-lite, small-suite, ...): each suite's
// aggregate over the validations (centered accuracy, bits per byte) and a table of every task
// at each run's latest validation, runs side by side. Nothing is shown for runs without them.
"use strict";

const SUITE_DASHES = ["", "6 3", "2 3", "8 3 2 3"];

function suiteNames(runs) {
  const names = [];
  for (const run of runs) for (const s of run.suites || []) if (!names.includes(s.name)) names.push(s.name);
  return names;
}

// One chart of `field` ("suite_centered" or "suite_bpb"): a dashed line per run and suite,
// dotted at each validation; the card stays hidden when no run logs that aggregate.
function drawSuiteChart(runs, xkey, field, id, yLabel) {
  const series = [];
  const names = suiteNames(runs);
  runs.forEach((run, i) => {
    for (const [name, ys] of Object.entries(run[field] || {})) {
      const points = column({ [xkey]: run.val[xkey], y: ys }, xkey, "y");
      const dash = SUITE_DASHES[names.indexOf(name) % SUITE_DASHES.length];
      const label = `${run.name} ${name}`;
      series.push({ name: label, color: runColor(i), kind: "line", dash, width: 1.6, ...points });
      series.push({ name: label, color: runColor(i), kind: "dots", r: 3, hover: false, ...points });
    }
  });
  document.getElementById(`card-${id}`).hidden = series.length === 0;
  if (!series.length) return;
  const common = { xLabel: xkey === "step" ? "step" : "tokens", vlines: eventLines(runs, xkey),
    xInt: xkey === "step" };
  drawChart(document.getElementById(`chart-${id}`), { ...common, yLabel, series });
}

function drawSuiteCharts(runs, xkey) {
  drawSuiteChart(runs, xkey, "suite_centered", "suite-centered", "centered accuracy");
  drawSuiteChart(runs, xkey, "suite_bpb", "suite-bpb", "bits per byte");
}

// The rows of one suite: its tasks (in the order the runs logged them), then the aggregate.
// Format and chance are the task's own (the first run that has them); acc, centered and bpb
// are each run's.
function suiteRows(runs, name) {
  const per = runs.map((r) => (r.suites || []).find((s) => s.name === name) || null);
  const tasks = [];
  for (const s of per) for (const t of (s ? s.tasks : [])) if (!tasks.includes(t.task)) tasks.push(t.task);
  const num = (v) => h("td", { class: "num" }, fmtValue(v));
  const rows = tasks.map((task) => {
    const found = per.map((s) => (s ? s.tasks.find((t) => t.task === task) || null : null));
    const first = found.find((t) => t !== null);
    const chance = found.map((t) => (t ? t.chance : null)).find((c) => c !== null);
    return h("tr", {}, h("td", {}, task), h("td", {}, first.format), num(chance),
      ...found.flatMap((t) => [num(t && t.acc), num(t && t.centered), num(t && t.bpb)]));
  });
  rows.push(h("tr", { class: "agg" }, h("th", {}, `${name} (mean)`), h("td", {}, ""), h("td", {}, ""),
    ...per.flatMap((s) => [h("td", {}, ""), num(s && s.centered), num(s && s.bpb)])));
  return { per, rows };
}

function suiteTable(runs, name) {
  const { per, rows } = suiteRows(runs, name);
  const top = h("tr", {}, h("th", { rowspan: 2 }, "task"), h("th", { rowspan: 2 }, "format"),
    h("th", { rowspan: 2 }, "chance"),
    ...runs.map((run, i) => h("th", { colspan: 3 }, swatch(i), ` ${run.name}`,
      per[i] ? ` · step ${per[i].step}` : " · not scored")));
  const sub = h("tr", {}, ...runs.flatMap(() => ["acc", "centered", "bpb"].map((x) => h("th", {}, x))));
  return h("div", { class: "scroll" }, h("table", { "data-suite": name },
    h("thead", {}, top, sub), h("tbody", {}, ...rows)));
}

function setupSuites(runs) {
  const names = suiteNames(runs);
  document.getElementById("suites-box").hidden = names.length === 0;
  document.getElementById("suites").replaceChildren(...names.flatMap((name) =>
    [h("h3", {}, name), suiteTable(runs, name)]));
  for (const radio of document.querySelectorAll('input[name="xaxis"]')) {
    radio.addEventListener("change", () => drawSuiteCharts(runs, radio.value));
  }
  drawSuiteCharts(runs, "step");
}
