// main.js: read the embedded data and draw the page; show any script error on the page too.
"use strict";

(function main() {
  window.addEventListener("error", (ev) => {
    const box = document.getElementById("js-error");
    box.textContent = `This page hit a script error: ${ev.message}`;
    box.hidden = false;
  });
  const data = JSON.parse(document.getElementById("octlm-data").textContent);
  const n = data.runs.length;
  document.getElementById("meta").textContent =
    (n ? `${n} run${n > 1 ? "s" : ""} · ` : "") + `generated ${data.generated} by octlm ${data.version}`;
  if (n) {
    setupRuns(data.runs);
    setupSuites(data.runs);
    setupRL(data.runs);
  } else {
    document.getElementById("runs").remove();
  }
  drawMerges(data.merges || []);
  setupSchedule(data.presets);
  setupClipping();
  document.getElementById("footer").textContent =
    "Self-contained page: the data is embedded, nothing is loaded from the network.";
  let timer = null;
  window.addEventListener("resize", () => {
    clearTimeout(timer);
    timer = setTimeout(redrawCharts, 150);
  });
})();
