// The learning-rate schedule, a twin of octlm/train/schedule.py's `learning_rate`: the same
// arithmetic in the same order, so both give the same doubles. A browser script (globals) and a
// CommonJS module (node's tests `require` it). `cfg.schedule` absent means cosine.
"use strict";

function learningRate(step, cfg) {
  const peak = cfg.lr;
  if (step < cfg.warmup) return (peak * (step + 1)) / cfg.warmup; // step 0 trains at peak/warmup
  const floor = peak * cfg.min_lr_ratio;
  if (cfg.schedule === "wsd") return wsdRate(step, peak, floor, cfg);
  // max(1, ...): warmup == steps must not divide by zero; progress clamps at 1 past the end.
  const progress = Math.min(1.0, (step - cfg.warmup) / Math.max(1, cfg.steps - cfg.warmup));
  return floor + 0.5 * (peak - floor) * (1.0 + Math.cos(Math.PI * progress));
}

// Warmup-stable-decay after warmup: the peak until steps - decay_steps, then linear or 1-sqrt
// down to the floor at `steps` (Math.sqrt is correctly rounded, as Python's: exact everywhere).
function wsdRate(step, peak, floor, cfg) {
  const decay = cfg.decay_steps || 1; // the trainer refuses wsd without decay_steps
  const start = cfg.steps - decay;
  if (step < start) return peak;
  const progress = Math.min(1.0, (step - start) / decay);
  if (cfg.decay_shape === "1-sqrt") return floor + (peak - floor) * (1.0 - Math.sqrt(progress));
  return floor + (peak - floor) * (1.0 - progress);
}

// The rate at every step 0..steps-1 (what a run of `cfg.steps` steps trains with).
function scheduleCurve(cfg) {
  const rates = new Array(cfg.steps);
  for (let s = 0; s < cfg.steps; s++) rates[s] = learningRate(s, cfg);
  return rates;
}

if (typeof module !== "undefined" && module.exports) {
  module.exports = { learningRate, wsdRate, scheduleCurve };
}
