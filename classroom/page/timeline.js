// Section 2: the run's calls on one wall-clock axis, above the autoregressive run's (common.js comes first).

const TIMELINE = { width: 1000, left: 175, lanes: ["speculative: drafts", "speculative: target", "autoregressive"] };

function drawTimeline() {
  const svg = document.getElementById("timeline");
  const speculativeEnd = TRACE.loops[TRACE.loops.length - 1].times.target[1];
  const autoregressiveEnd = TRACE.autoregressive[TRACE.autoregressive.length - 1][1];
  const end = Math.max(speculativeEnd, autoregressiveEnd);
  const x = (ms) => TIMELINE.left + (TIMELINE.width - TIMELINE.left - 10) * ms / end;
  const laneY = (lane) => 20 + 34 * lane;
  svg.setAttribute("viewBox", `0 0 ${TIMELINE.width} ${laneY(3) + 30}`);
  svg.append(svgElement("g", { id: "loop-highlight" }));
  TIMELINE.lanes.forEach((name, lane) => {
    svg.append(svgElement("text", { x: 4, y: laneY(lane) + 17, "font-size": 13 }, name));
  });
  const call = (interval, lane, colour) => svg.append(svgElement("rect", { x: x(interval[0]), y: laneY(lane),
    width: Math.max(0.6, x(interval[1]) - x(interval[0])), height: 24, fill: colour }));
  for (const loop of TRACE.loops) {
    loop.times.draft.forEach((interval) => call(interval, 0, "#999"));
    call(loop.times.target, 1, "#333");
  }
  TRACE.autoregressive.forEach((interval) => call(interval, 2, "#7a5cb0"));
  // the axis, in milliseconds from each run's first call, and where each run ended
  const axisY = laneY(3) + 4;
  svg.append(svgElement("line", { x1: x(0), x2: x(end), y1: axisY, y2: axisY, stroke: "#555" }));
  for (const ms of niceTicks(end, 6)) {
    svg.append(svgElement("line", { x1: x(ms), x2: x(ms), y1: axisY, y2: axisY + 4, stroke: "#555" }));
    svg.append(svgElement("text", { x: x(ms), y: axisY + 17, "font-size": 12, "text-anchor": "middle" }, `${ms} ms`));
  }
  for (const [ms, lane] of [[speculativeEnd, 1], [autoregressiveEnd, 2]]) {
    svg.append(svgElement("line", { x1: x(ms), x2: x(ms), y1: laneY(lane) - 4, y2: laneY(lane) + 28, stroke: "#b3261e",
      "stroke-width": 2 }));
  }
  document.getElementById("time-words").textContent =
    `One more run of each decoder, recorded call by call after the timed runs: the speculative run's ` +
    `${TRACE.loops.reduce((sum, loop) => sum + loop.times.draft.length, 0)} draft steps and ${TRACE.loops.length} ` +
    `target calls ended at ${speculativeEnd.toFixed(1)} ms, the autoregressive run's ${TRACE.autoregressive.length} ` +
    `target steps at ${autoregressiveEnd.toFixed(1)} ms (red marks). The gaps are the loop's own work. ` +
    `The timed runs' median speedup: ${fixed(TRACE.measured.speedup, 2)}x.`;
  document.getElementById("machine").textContent = TRACE.machine;
  TIMELINE.x = x;
  TIMELINE.laneY = laneY;
}

function highlightLoopOnTimeline(index) {
  const group = document.getElementById("loop-highlight");
  if (!group || !TIMELINE.x) return;
  group.replaceChildren();
  if (index < 0) return;
  const times = TRACE.loops[index].times;
  const start = times.draft.length ? times.draft[0][0] : times.target[0];
  group.append(svgElement("rect", { x: TIMELINE.x(start) - 2, y: TIMELINE.laneY(0) - 4,
    width: TIMELINE.x(times.target[1]) - TIMELINE.x(start) + 4, height: 66, fill: "#ffe58a" }));
}
