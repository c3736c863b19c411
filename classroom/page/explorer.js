// Section 3: Leviathan et al.'s formula under sliders, with presets and this run's point (common.js comes first).

const CHART = { width: 600, height: 380, left: 48, right: 22, top: 14, bottom: 40, curves: [1, 2, 4, 8] };
const K_MAX = 12;
const PRESETS = {
  run: () => ({ alpha: TRACE.measured.alpha, K: TRACE.measured.K, c: TRACE.measured.c, v: TRACE.measured.v,
    words: `This run, measured: alpha ${fixed(TRACE.measured.alpha, 3)}, K ${TRACE.measured.K}, c ` +
      `${fixed(TRACE.measured.c, 3)}, v ${fixed(TRACE.measured.v, 2)} (its target call in this machine's decode ` +
      "steps). The dot on the chart is the speedup the timed runs measured." + (BLOCK ? " Block verification's " +
      "alpha counts kept drafts against loops that dropped some: not the per-draft chance the formula assumes, so " +
      "its dot need not sit on a curve." : "") }),
  // Chen et al. 2023: 14.1 ms per token for Chinchilla 70B, 1.8 ms for the 4B draft, K 4; v 1 is the idealisation
  // that scoring K + 1 tokens on the accelerator costs about one step. Alpha is left where it is: find it.
  chen: () => ({ K: 4, c: 1.8 / 14.1, v: 1,
    words: "Chen et al. 2023: Chinchilla 70B at 14.1 ms per token, its 4B draft at 1.8 ms (c = 1.8 / 14.1), K 4, " +
      "verification at about one step (v = 1). Alpha is yours to find." }),
  eagle: () => ({ c: 0.056, v: 1,
    words: "A 7B target with an EAGLE head on an accelerator: one head layer drafts at about 0.056 of a target " +
      "step, and the accelerator scores K + 1 tokens at about one step's price (v = 1)." }),
};

function sliderValues() {
  const read = (id) => Number(document.getElementById(id).value);
  return { alpha: read("alpha"), K: read("K"), c: read("c"), v: read("v") };
}

function applyPreset(name) {
  const preset = PRESETS[name]();
  for (const id of ["alpha", "K", "c", "v"]) {
    if (preset[id] !== undefined && preset[id] !== null) document.getElementById(id).value = preset[id];
  }
  document.getElementById("preset-words").textContent = preset.words;
  updateExplorer();
}

function setOutput(id, value, text) {  // data-value keeps the full number, for the tests
  const output = document.getElementById(id);
  output.textContent = text;
  output.dataset.value = value === null ? "none" : String(value);
}

function updateExplorer() {
  const { alpha, K, c, v } = sliderValues();
  document.getElementById("alpha-value").textContent = alpha.toFixed(2);
  document.getElementById("K-value").textContent = String(K);
  document.getElementById("c-value").textContent = c.toFixed(3);
  document.getElementById("v-value").textContent = v.toFixed(2);
  const tokens = expectedTokensPerLoop(alpha, K);
  const speedup = expectedSpeedup(alpha, c, K, v);
  const breakEven = breakEvenAlpha(c, K, v);
  const best = bestK(alpha, c, v, K_MAX);
  setOutput("out-tokens", tokens, tokens.toFixed(3));
  setOutput("out-speedup", speedup, speedup.toFixed(3) + "x");
  setOutput("out-break-even", breakEven, breakEven === null ? "none: even alpha = 1 loses" : breakEven.toFixed(3));
  setOutput("out-best-K", best, best === 0 ? "0: do not speculate" : String(best));
  drawChart(alpha, K, c, v);
}

function drawChart(alpha, K, c, v) {
  const svg = document.getElementById("chart");
  svg.replaceChildren();
  // the drawing's units are the box's pixels (600 at most), so its text keeps its size on a phone
  CHART.width = Math.max(300, Math.min(600, svg.parentElement.clientWidth || 600));
  CHART.height = Math.round(CHART.width * 0.63);
  svg.setAttribute("viewBox", `0 0 ${CHART.width} ${CHART.height}`);
  const curveKs = [...new Set([...CHART.curves, K])].sort((a, b) => a - b);
  const alphas = Array.from({ length: 101 }, (_, i) => i / 100);
  const measured = TRACE.measured.speedup || 0;
  const top = Math.max(2, measured, ...curveKs.map((k) => expectedSpeedup(1, c, k, v))) * 1.05;
  const x = (a) => CHART.left + (CHART.width - CHART.left - CHART.right) * a;
  const y = (s) => CHART.height - CHART.bottom - (CHART.height - CHART.top - CHART.bottom) * s / top;
  // axes, ticks and the break-even line at 1x
  svg.append(svgElement("line", { x1: x(0), x2: x(1), y1: y(0), y2: y(0), stroke: "#555" }));
  svg.append(svgElement("line", { x1: x(0), x2: x(0), y1: y(0), y2: y(top), stroke: "#555" }));
  for (let a = 0; a <= 1.0001; a += 0.2) {
    svg.append(svgElement("text", { x: x(a), y: y(0) + 16, "font-size": 12, "text-anchor": "middle" }, a.toFixed(1)));
  }
  svg.append(svgElement("text", { x: x(0.5), y: CHART.height - 4, "font-size": 13, "text-anchor": "middle" },
    "\u03b1, the acceptance rate"));
  for (const s of niceTicks(top, 5)) {
    svg.append(svgElement("text", { x: x(0) - 6, y: y(s) + 4, "font-size": 12, "text-anchor": "end" }, `${s}x`));
  }
  svg.append(svgElement("line", { x1: x(0), x2: x(1), y1: y(1), y2: y(1), stroke: "#b3261e",
    "stroke-dasharray": "4 3" }));
  const palette = ["#8cb4e8", "#5b8fd6", "#2f63b5", "#173d7a", "#0b1f40"];
  curveKs.forEach((k, i) => {
    const points = alphas.map((a) => `${x(a).toFixed(1)},${y(expectedSpeedup(a, c, k, v)).toFixed(1)}`).join(" ");
    svg.append(svgElement("polyline", { points: points, fill: "none", stroke: k === K ? "#e0663a" : palette[i % 5],
      "stroke-width": k === K ? 3 : 1.5 }));
    svg.append(svgElement("text", { x: x(1) - 4, y: y(expectedSpeedup(1, c, k, v)) - 4, "font-size": 11,
      "text-anchor": "end" }, `K ${k}`));
  });
  // the sliders' point, and this run's measured speedup at its measured alpha
  svg.append(svgElement("circle", { cx: x(alpha), cy: y(expectedSpeedup(alpha, c, K, v)), r: 6, fill: "none",
    stroke: "#e0663a", "stroke-width": 2 }));
  if (TRACE.measured.alpha !== null && TRACE.measured.speedup) {
    svg.append(svgElement("circle", { id: "measured-point", cx: x(TRACE.measured.alpha),
      cy: y(TRACE.measured.speedup), r: 5, fill: "#0f6b0f" }));
    svg.append(svgElement("text", { x: x(TRACE.measured.alpha) - 8, y: y(TRACE.measured.speedup) + 4,
      "font-size": 12, "text-anchor": "end", fill: "#0f6b0f" }, "this run, measured"));
  }
}

function setUpExplorer() {
  for (const id of ["alpha", "K", "c", "v"]) document.getElementById(id).oninput = updateExplorer;
  window.addEventListener("resize", updateExplorer);
  document.querySelectorAll("[data-preset]").forEach((button) => {
    button.onclick = () => applyPreset(button.dataset.preset);
  });
  applyPreset("run");
}
