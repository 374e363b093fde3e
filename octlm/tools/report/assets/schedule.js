// The learning-rate schedule, a twin of octlm/train/schedule.py's `learning_rate`: the same
// arithmetic in the same order, so both give the same doubles. A browser script (globals) and a
// CommonJS module (node's tests `require` it).
"use strict";

function learningRate(step, cfg) {
  const peak = cfg.lr;
  if (step < cfg.warmup) return (peak * (step + 1)) / cfg.warmup; // step 0 trains at peak/warmup
  const floor = peak * cfg.min_lr_ratio;
  // max(1, ...): warmup == steps must not divide by zero; progress clamps at 1 past the end.
  const progress = Math.min(1.0, (step - cfg.warmup) / Math.max(1, cfg.steps - cfg.warmup));
  return floor + 0.5 * (peak - floor) * (1.0 + Math.cos(Math.PI * progress));
}

// The rate at every step 0..steps-1 (what a run of `cfg.steps` steps trains with).
function scheduleCurve(cfg) {
  const rates = new Array(cfg.steps);
  for (let s = 0; s < cfg.steps; s++) rates[s] = learningRate(s, cfg);
  return rates;
}

if (typeof module !== "undefined" && module.exports) {
  module.exports = { learningRate, scheduleCurve };
}
