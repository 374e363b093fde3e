// charts.js: small SVG charts drawn by hand (no library): round-number axes, lines with gaps
// for missing values, dots, bars, threshold and event rules, and a hover read-out (.tip).
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";

function svgEl(tag, attrs, parent) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (parent) parent.appendChild(node);
  return node;
}

// Compact numbers for axis ticks: 0.0025, 3e-4, 12.5k, 1.2M.
function fmtTick(v) {
  const a = Math.abs(v);
  if (a === 0) return "0";
  if (a >= 1e9) return +(v / 1e9).toPrecision(3) + "G";
  if (a >= 1e6) return +(v / 1e6).toPrecision(3) + "M";
  if (a >= 1e4) return +(v / 1e3).toPrecision(3) + "k";
  if (a >= 1e-3) return String(+v.toPrecision(3));
  return v.toExponential(2).replace(/\.?0+e/, "e");
}

// Numbers for read-outs: integers with separators, others to 5 significant digits.
function fmtValue(v) {
  if (v === null || v === undefined || !Number.isFinite(v)) return "–";
  if (Number.isInteger(v) && Math.abs(v) >= 1) return v.toLocaleString("en-US");
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(4).replace(/\.?0+e/, "e");
  return String(+v.toPrecision(5));
}

// Tick values covering [lo, hi] in steps of 1, 2, 2.5 or 5 times a power of ten.
function niceTicks(lo, hi, count) {
  const raw = (hi - lo) / Math.max(1, count);
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map((f) => f * mag).find((s) => s >= raw * 0.999);
  const ticks = [];
  const first = Math.ceil(lo / step - 1e-9);
  for (let i = first; i * step <= hi + step * 1e-9; i++) ticks.push(+(i * step).toPrecision(12));
  return ticks;
}

function extent(arrays, extra) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const arr of arrays) {
    for (const v of arr) {
      if (v !== null && Number.isFinite(v)) {
        if (v < lo) lo = v;
        if (v > hi) hi = v;
      }
    }
  }
  for (const v of extra || []) {
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  return [lo, hi];
}

// Index of the x nearest to `x` in an ascending array.
function nearestIndex(xs, x) {
  let lo = 0;
  let hi = xs.length - 1;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (xs[mid] < x) lo = mid;
    else hi = mid;
  }
  return Math.abs(xs[lo] - x) <= Math.abs(xs[hi] - x) ? lo : hi;
}

// An SVG path through the points; a null y lifts the pen. Where points are denser than pixels,
// each pixel column keeps only its lowest and highest point, so spikes survive the thinning.
function linePath(xs, ys, sx, sy) {
  const parts = [];
  let pen = false;
  let col = null;
  let lo = null;
  let hi = null;
  const flush = () => {
    if (col === null) return;
    const pts = lo.i <= hi.i ? [lo, hi] : [hi, lo];
    for (const p of lo === hi ? [lo] : pts) {
      parts.push((pen ? "L" : "M") + p.px.toFixed(1) + " " + p.py.toFixed(1));
      pen = true;
    }
    col = null;
  };
  for (let i = 0; i < xs.length; i++) {
    const y = ys[i];
    if (y === null || !Number.isFinite(y)) {
      flush();
      pen = false;
      continue;
    }
    const p = { i, px: sx(xs[i]), py: sy(y) };
    const c = Math.round(p.px);
    if (c !== col) {
      flush();
      col = c;
      lo = hi = p;
    } else {
      if (p.py > lo.py) lo = p;
      if (p.py < hi.py) hi = p;
    }
  }
  flush();
  return parts.join("");
}

function countFinite(ys) {
  let n = 0;
  for (const y of ys) if (y !== null && Number.isFinite(y)) n++;
  return n;
}

// Draw (or redraw) a chart into `box`. spec: {series: [{name, color, xs, ys, kind: line|dots|
// bars, dash, width, fmt, tip}], xLabel, yLabel, hlines: [{y, color, label}], vlines: [{x,
// label}], yZero, height, xFmt}. The spec is kept on the box so a resize can redraw it.
function drawChart(box, spec) {
  box.__spec = spec;
  box.textContent = "";
  const W = Math.max(300, Math.floor(box.clientWidth || 600));
  const H = spec.height || 240;
  const M = { l: 58, r: 16, t: 12, b: 36 };
  const pw = W - M.l - M.r;
  const ph = H - M.t - M.b;
  const svg = svgEl("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}` }, box);
  const series = spec.series.filter((s) => s.xs.length > 0);
  if (!series.some((s) => countFinite(s.ys) > 0)) {
    svgEl("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" }, svg)
      .textContent = "no data";
    return;
  }
  let [x0, x1] = extent(series.map((s) => s.xs));
  const hys = (spec.hlines || []).map((h) => h.y);
  let [y0, y1] = extent(series.map((s) => s.ys), hys.concat(spec.yZero ? [0] : []));
  if (series.some((s) => s.kind === "bars")) {
    x0 -= 0.5;
    x1 += 0.5;
  }
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) y1 = y0 + (Math.abs(y0) || 1) * 0.1;
  const pad = (y1 - y0) * 0.06;
  y1 += pad;
  if (!(spec.yZero && y0 === 0)) y0 -= pad;
  const sx = (v) => M.l + ((v - x0) / (x1 - x0)) * pw;
  const sy = (v) => M.t + (1 - (v - y0) / (y1 - y0)) * ph;

  const grid = svgEl("g", {}, svg);
  for (const t of niceTicks(y0, y1, Math.max(3, Math.round(ph / 45)))) {
    svgEl("line", { x1: M.l, x2: M.l + pw, y1: sy(t), y2: sy(t), class: "grid-line" }, grid);
    const label = svgEl("text", { x: M.l - 6, y: sy(t) + 4, "text-anchor": "end" }, grid);
    label.textContent = fmtTick(t);
  }
  const xFmt = spec.xFmt || fmtTick;
  for (const t of niceTicks(x0, x1, Math.max(2, Math.round(pw / 90)))) {
    if (spec.xInt && !Number.isInteger(t)) continue;
    svgEl("line", { x1: sx(t), x2: sx(t), y1: M.t + ph, y2: M.t + ph + 4, class: "axis" }, grid);
    const label = svgEl("text", { x: sx(t), y: M.t + ph + 16, "text-anchor": "middle" }, grid);
    label.textContent = xFmt(t);
  }
  svgEl("line", { x1: M.l, x2: M.l + pw, y1: M.t + ph, y2: M.t + ph, class: "axis" }, grid);
  svgEl("line", { x1: M.l, x2: M.l, y1: M.t, y2: M.t + ph, class: "axis" }, grid);
  const xl = svgEl("text", { x: M.l + pw, y: H - 4, "text-anchor": "end" }, grid);
  xl.textContent = spec.xLabel || "";
  const yl = svgEl("text", { x: 12, y: M.t + ph / 2, "text-anchor": "middle",
    transform: `rotate(-90 12 ${M.t + ph / 2})` }, grid);
  yl.textContent = spec.yLabel || "";

  for (const v of spec.vlines || []) {
    if (v.x < x0 || v.x > x1) continue;
    svgEl("line", { x1: sx(v.x), x2: sx(v.x), y1: M.t, y2: M.t + ph, stroke: v.color || "#8a94a6",
      "stroke-dasharray": "4 3", class: "vline" }, svg);
    const t = svgEl("text", { x: sx(v.x) + 4, y: M.t + 10, class: "vline-label" }, svg);
    t.textContent = v.label || "";
  }
  const bars = series.filter((s) => s.kind === "bars");
  const bw = bars.length ? Math.max(2, (pw / (x1 - x0)) * 0.7) : 0;
  for (const s of series) {
    const g = svgEl("g", { "data-series": s.name }, svg);
    if (s.kind === "dots" || s.kind === "bars") {
      for (let i = 0; i < s.xs.length; i++) {
        const y = s.ys[i];
        if (y === null || !Number.isFinite(y)) continue;
        if (s.kind === "dots") {
          svgEl("circle", { cx: sx(s.xs[i]), cy: sy(y), r: s.r || 3, fill: s.color,
            class: "point" }, g);
        } else {
          const top = Math.min(sy(y), sy(0));
          svgEl("rect", { x: sx(s.xs[i]) - bw / 2, y: top, width: bw,
            height: Math.abs(sy(0) - sy(y)), fill: s.color, class: "bar" }, g);
        }
      }
    }
    if (s.kind === "line" || s.kind === "dots") {
      if (s.kind === "dots" && !s.dash) continue;
      svgEl("path", { d: linePath(s.xs, s.ys, sx, sy), stroke: s.color,
        "stroke-width": s.width || 1.6, "stroke-dasharray": s.dash || "none", class: "series",
        "stroke-opacity": s.opacity || 1,
        "data-n": countFinite(s.ys) }, g);
    }
  }
  for (const h of spec.hlines || []) {
    svgEl("line", { x1: M.l, x2: M.l + pw, y1: sy(h.y), y2: sy(h.y), stroke: h.color || "#c62828",
      "stroke-width": 1.3, "stroke-dasharray": "6 4", class: "hline" }, svg);
    const t = svgEl("text", { x: M.l + pw - 4, y: sy(h.y) - 4, "text-anchor": "end" }, svg);
    t.textContent = h.label || "";
  }
  addHover(box, svg, spec, series, { sx, sy, x0, x1, M, pw, ph, W });
}

// Crosshair, dots and a tooltip listing each series' value at the point nearest the pointer.
function addHover(box, svg, spec, series, f) {
  const tip = document.createElement("div");
  tip.className = "tip";
  tip.hidden = true;
  box.appendChild(tip);
  const layer = svgEl("g", { "pointer-events": "none" }, svg);
  const overlay = svgEl("rect", { x: f.M.l, y: f.M.t, width: f.pw, height: f.ph,
    fill: "transparent", class: "overlay" }, svg);
  const xFmt = spec.xFmt ? spec.xFmt : fmtValue;
  const hoverable = series.filter((s) => s.hover !== false);
  overlay.addEventListener("mousemove", (ev) => {
    const rect = svg.getBoundingClientRect();
    const px = ev.clientX - rect.left;
    const x = f.x0 + ((px - f.M.l) / f.pw) * (f.x1 - f.x0);
    layer.textContent = "";
    const lines = [];
    let xAt = null;
    for (const s of hoverable) {
      const i = nearestIndex(s.xs, x);
      const y = s.ys[i];
      // A series speaks only near the pointer: dots (validation, clipped steps) within a few
      // pixels, lines unless the pointer is past their end (a shorter run).
      if (Math.abs(f.sx(s.xs[i]) - px) > (s.kind === "line" ? 24 : 12)) continue;
      if (xAt === null) xAt = s.xs[i];
      if (y !== null && Number.isFinite(y)) {
        svgEl("circle", { cx: f.sx(s.xs[i]), cy: f.sy(y), r: 4, fill: "none", stroke: s.color,
          "stroke-width": 2 }, layer);
      }
      lines.push(s.tip ? s.tip(i) : `${s.name}: ${(s.fmt || fmtValue)(y)}`);
    }
    if (xAt === null) {
      tip.hidden = true;
      return;
    }
    svgEl("line", { x1: f.sx(xAt), x2: f.sx(xAt), y1: f.M.t, y2: f.M.t + f.ph, class: "cross" },
      layer);
    tip.textContent = [`${spec.xLabel} ${xFmt(xAt)}`, ...lines].join("\n");
    tip.hidden = false;
    const left = px + 14 + tip.offsetWidth > f.W ? px - 14 - tip.offsetWidth : px + 14;
    tip.style.left = `${Math.max(0, left)}px`;
    tip.style.top = `${Math.max(0, ev.clientY - rect.top - 10)}px`;
  });
  overlay.addEventListener("mouseleave", () => {
    tip.hidden = true;
    layer.textContent = "";
  });
}

function redrawCharts() {
  for (const box of document.querySelectorAll(".chart")) {
    if (box.__spec && box.offsetParent !== null) drawChart(box, box.__spec);
  }
}
