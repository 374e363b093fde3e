// playground.js: the schedule playground (learningRate from schedule.js at every step, presets
// from the project's configs and the reported runs) and the clipping playground.
"use strict";

// Forty steps of a made-up run: norms falling as training settles, a wobble, a spike at 27.
const MADE_UP_NORMS = [
  2.31, 2.05, 1.84, 1.62, 1.49, 1.37, 1.21, 1.16, 1.04, 0.98, 0.93, 0.97, 0.88, 0.84, 0.9,
  0.81, 0.77, 0.83, 0.74, 0.71, 0.76, 0.69, 0.72, 0.66, 0.7, 0.64, 0.68, 4.6, 1.12, 0.79,
  0.67, 0.63, 0.66, 0.61, 0.64, 0.6, 0.62, 0.58, 0.61, 0.57,
];

function setupSchedule(presets) {
  const $ = (id) => document.getElementById(id);
  const select = $("sched-preset");
  const sliders = { lr: $("sched-lr"), floor: $("sched-floor"), warmup: $("sched-warmup"),
    steps: $("sched-steps"), decay: $("sched-decay") };
  const kind = $("sched-kind");
  const shape = $("sched-shape");
  const maxSteps = Math.max(5000, ...presets.map((p) => p.steps));
  sliders.steps.max = String(maxSteps);
  let cfg = { lr: 1e-3, warmup: 0, steps: 100, min_lr_ratio: 0.1, schedule: "cosine",
    decay_steps: null, decay_shape: "linear" };
  // WSD's decay fits after warmup, as the trainer demands; a cosine run keeps none.
  const fitDecay = () => {
    const span = Math.max(1, cfg.steps - cfg.warmup);
    if (cfg.schedule !== "wsd") cfg.decay_steps = null;
    else cfg.decay_steps = Math.min(span, cfg.decay_steps || Math.max(1, Math.round(span / 5)));
  };

  const outputs = () => {
    $("sched-lr-out").textContent = fmtValue(cfg.lr);
    $("sched-floor-out").textContent = fmtValue(cfg.min_lr_ratio);
    $("sched-warmup-out").textContent = String(cfg.warmup);
    $("sched-steps-out").textContent = String(cfg.steps);
    $("sched-decay-out").textContent = cfg.schedule === "wsd" ? String(cfg.decay_steps) : "-";
  };
  // Sliders follow the settings; a preset's exact values stay until a slider is moved.
  const syncSliders = () => {
    sliders.lr.value = String(Math.log10(cfg.lr));
    sliders.floor.value = String(cfg.min_lr_ratio);
    sliders.warmup.max = String(cfg.steps);
    sliders.warmup.value = String(cfg.warmup);
    sliders.steps.value = String(cfg.steps);
    kind.value = cfg.schedule;
    shape.value = cfg.decay_shape;
    sliders.decay.max = String(Math.max(1, cfg.steps - cfg.warmup));
    sliders.decay.value = String(cfg.decay_steps || 1);
    sliders.decay.disabled = shape.disabled = cfg.schedule !== "wsd";
  };
  const draw = () => {
    outputs();
    const rates = scheduleCurve(cfg);
    const xs = rates.map((_, s) => s);
    const last = cfg.steps - 1;
    drawChart($("chart-sched"), {
      xLabel: "step", yLabel: "learning rate", yZero: true, xInt: true, height: 250,
      series: [{ name: "lr", color: "#1f5fbf", kind: "line", width: 2, xs, ys: rates }],
      hlines: [{ y: cfg.lr * cfg.min_lr_ratio, color: "#8a94a6", label: "floor" }],
      vlines: scheduleMarks(cfg),
    });
    const peakStep = cfg.warmup > 0 ? cfg.warmup - 1 : 0;
    $("sched-readout").textContent =
      `step 0: ${fmtValue(learningRate(0, cfg))} · peak ${fmtValue(cfg.lr)} at step ${peakStep}` +
      ` · last step (${last}): ${fmtValue(learningRate(last, cfg))}` +
      ` · floor ${fmtValue(cfg.lr * cfg.min_lr_ratio)} from step ${cfg.steps} on`;
  };
  const choose = (p) => {
    cfg = { lr: p.lr, warmup: p.warmup, steps: p.steps, min_lr_ratio: p.min_lr_ratio,
      schedule: p.schedule || "cosine", decay_steps: p.decay_steps ?? null,
      decay_shape: p.decay_shape || "linear" };
    syncSliders();
    draw();
  };

  select.replaceChildren(...presets.map((p, i) => {
    const o = document.createElement("option");
    o.value = String(i);
    const wsd = p.schedule === "wsd" ? `, wsd decay ${p.decay_steps}` : "";
    o.textContent = `${p.name} (lr ${p.lr}, warmup ${p.warmup}, steps ${p.steps}${wsd})`;
    o.title = p.source;
    return o;
  }));
  select.addEventListener("change", () => choose(presets[Number(select.value)]));
  sliders.lr.addEventListener("input", () => {
    cfg.lr = +Math.pow(10, Number(sliders.lr.value)).toPrecision(3);
    draw();
  });
  sliders.floor.addEventListener("input", () => {
    cfg.min_lr_ratio = Number(sliders.floor.value);
    draw();
  });
  sliders.warmup.addEventListener("input", () => {
    cfg.warmup = Math.min(Number(sliders.warmup.value), cfg.steps);
    fitDecay();
    syncSliders();
    draw();
  });
  sliders.steps.addEventListener("input", () => {
    cfg.steps = Number(sliders.steps.value);
    cfg.warmup = Math.min(cfg.warmup, cfg.steps); // as the trainer demands: warmup <= steps
    fitDecay();
    syncSliders();
    draw();
  });
  kind.addEventListener("change", () => {
    cfg.schedule = kind.value;
    fitDecay();
    syncSliders();
    draw();
  });
  sliders.decay.addEventListener("input", () => {
    cfg.decay_steps = Number(sliders.decay.value);
    draw();
  });
  shape.addEventListener("change", () => {
    cfg.decay_shape = shape.value;
    draw();
  });
  // The reported run's own schedule first, else the tiny config (the one a CPU can run).
  const runIndex = presets.findIndex((p) => p.name.startsWith("run: "));
  const start = runIndex >= 0 ? runIndex : Math.max(0, presets.findIndex((p) => p.name === "tiny"));
  if (presets.length) {
    select.value = String(start);
    choose(presets[start]);
  } else draw();
}

// Where the schedule changes course: the end of warmup, and for WSD the start of the decay.
function scheduleMarks(cfg) {
  const marks = [];
  const wsd = cfg.schedule === "wsd";
  if (cfg.warmup > 0 && cfg.warmup < cfg.steps) {
    marks.push({ x: cfg.warmup, label: wsd ? "stable starts" : "cosine starts" });
  }
  const start = cfg.steps - (cfg.decay_steps || 0);
  if (wsd && start > cfg.warmup) marks.push({ x: start, label: "decay starts" });
  return marks;
}

function setupClipping() {
  const slider = document.getElementById("clip-c");
  const norms = MADE_UP_NORMS;
  const xs = norms.map((_, i) => i);
  const draw = () => {
    const c = Number(slider.value);
    const factor = (n) => (c > 0 ? Math.min(1, c / n) : 1); // 0 means no clipping, as grad_clip
    const after = norms.map((n) => n * factor(n));
    document.getElementById("clip-c-out").textContent = c > 0 ? c.toFixed(2) : "off";
    const tip = (i) => `norm ${norms[i].toFixed(2)} × ${factor(norms[i]).toFixed(3)}` +
      ` = ${after[i].toFixed(2)}`;
    drawChart(document.getElementById("chart-clip"), {
      xLabel: "step", yLabel: "gradient norm", yZero: true, xInt: true, height: 230,
      series: [
        { name: "before", color: "#c9d3e3", kind: "bars", xs, ys: norms, tip },
        { name: "after", color: "#1f5fbf", kind: "bars", xs, ys: after, hover: false },
      ],
      hlines: c > 0 ? [{ y: c, color: "#c62828", label: `threshold ${c.toFixed(2)}` }] : [],
    });
    const clipped = norms.map((n, i) => i).filter((i) => factor(norms[i]) < 1);
    const box = document.getElementById("clip-readout");
    const head = c > 0
      ? `${clipped.length} of ${norms.length} steps shortened (grey: before, blue: after)`
      : "clipping off: every step keeps its full length";
    const lines = clipped.map((i) => `step ${i}: ${norms[i].toFixed(2)} → ${after[i].toFixed(2)}` +
      ` (×${factor(norms[i]).toFixed(3)}, ${(100 * (1 - factor(norms[i]))).toFixed(0)}% shorter)`);
    box.replaceChildren(h("p", {}, head), ...(lines.length ? [h("p", { class: "mono" }, lines.join(" · "))] : []));
  };
  slider.addEventListener("input", draw);
  draw();
}
