// The page's behaviour, in plain JavaScript with no library: the replay of the run loop by loop (section 1), the
// calls on one time axis (section 2) and the formula explorer (section 3). Its one input is the run that
// classroom/page.py embedded as JSON: the loops that classroom/trace.py decided again from the run's recordings.
"use strict";

const TRACE = JSON.parse(document.getElementById("trace").textContent);
// block verification (verifiers/block.py) judges a loop's drafts as one block; token verification one by one
const BLOCK = TRACE.verifier === "block";
const SVG = "http://www.w3.org/2000/svg";

// ---- the formula, as speedup/stats.py and speedup/costs.py write it ------------------------------------------------

// Tokens a loop yields when each draft is accepted with probability a: 1 + a + ... + a^K (Leviathan et al., Eq. 1).
function expectedTokensPerLoop(a, K) {
  return a === 1 ? K + 1 : (1 - a ** (K + 1)) / (1 - a);
}

// A loop costs K draft steps of c and one target call of v decode steps; autoregressive decoding pays one per token.
function expectedSpeedup(a, c, K, v) {
  return expectedTokensPerLoop(a, K) / (K * c + v);
}

// MeasuredCosts.expected_speedup: K = 0 is autoregressive decoding itself.
function speedupAtK(a, c, K, v) {
  return K === 0 ? 1 : expectedSpeedup(a, c, K, v);
}

// MeasuredCosts.best_K: the K in 0 .. KMax with the highest expected speedup, the smallest on ties.
function bestK(a, c, v, KMax) {
  let best = 0;
  for (let K = 1; K <= KMax; K++) {
    if (speedupAtK(a, c, K, v) > speedupAtK(a, c, best, v)) best = K;
  }
  return best;
}

// MeasuredCosts.break_even_alpha: where K drafts start to pay, by bisection (the speedup grows with alpha);
// null when even alpha = 1 loses.
function breakEvenAlpha(c, K, v) {
  if (speedupAtK(1, c, K, v) <= 1) return null;
  let low = 0, high = 1;
  for (let i = 0; i < 50; i++) {
    const middle = (low + high) / 2;
    if (speedupAtK(middle, c, K, v) <= 1) low = middle; else high = middle;
  }
  return high;
}

// ---- small helpers -------------------------------------------------------------------------------------------------

function element(tag, className, text) {
  const made = document.createElement(tag);
  if (className) made.className = className;
  if (text !== undefined) made.textContent = text;
  return made;
}

function svgElement(tag, attributes, text) {
  const made = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) made.setAttribute(name, value);
  if (text !== undefined) made.textContent = text;
  return made;
}

// A token's text where spaces and newlines must be seen: in tables and bar labels.
function visible(text) {
  return text.replace(/ /g, "\u2423").replace(/\n/g, "\u21b5");
}

function fixed(value, digits) {
  return value === null || value === undefined ? "\u2013" : value.toFixed(digits);
}

// ---- section 1: the replay -----------------------------------------------------------------------------------------

// The steps of the replay: the start, then for each loop its K drafts, the target's call, each judged draft (block
// verification: the block judged at once), and the loop's last token (the correction drawn from (q - p)+, or the
// bonus token drawn from q).
function buildSteps(loops) {
  const steps = [{ loop: -1, phase: "start" }];
  loops.forEach((loop, i) => {
    steps.push({ loop: i, phase: "draft" }, { loop: i, phase: "verify" });
    if (BLOCK && loop.drafts.length) steps.push({ loop: i, phase: "block" });
    loop.drafts.forEach((draft, t) => {
      if (!BLOCK && draft.judged !== false) steps.push({ loop: i, phase: "judge", t: t });
    });
    steps.push({ loop: i, phase: "end" });
  });
  return steps;
}

const STEPS = buildSteps(TRACE.loops);
// the index in TRACE.tokens of each loop's first token
const LOOP_STARTS = TRACE.loops.reduce((starts, loop) => [...starts, starts[starts.length - 1] + loop.tokens.length],
  [0]);
const replay = { position: 0, timer: null };

// How many of the loop's drafts have been judged at this step (all of those judged, at its end).
function judgedSoFar(step) {
  const loop = TRACE.loops[step.loop];
  if (step.phase === "judge") return step.t + 1;
  if (step.phase === "block") return loop.drafts.length;
  if (step.phase === "end") return loop.drafts.filter((draft) => draft.judged !== false).length;
  return 0;
}

// The tokens kept so far: every earlier loop's, this loop's accepted drafts judged so far, its last token at its end.
function tokensKept(step) {
  if (step.loop < 0) return 0;
  const loop = TRACE.loops[step.loop];
  if (step.phase === "end") return LOOP_STARTS[step.loop] + loop.tokens.length;
  const accepted = loop.drafts.slice(0, judgedSoFar(step)).filter((draft) => draft.accepted).length;
  return LOOP_STARTS[step.loop] + accepted;
}

function showText(step) {
  const generated = document.getElementById("generated");
  const pending = document.getElementById("pending");
  generated.replaceChildren(...TRACE.tokens.slice(0, tokensKept(step)).map(
    (token) => element("span", "token " + token.origin, token.piece)));
  pending.replaceChildren();
  if (step.loop < 0 || step.phase === "end") return;
  // the drafts not yet kept, from the one being judged (struck through once refused) or the next to be
  const loop = TRACE.loops[step.loop];
  if (step.phase === "block") {  // the drafts after tau, all dropped
    loop.drafts.filter((draft) => !draft.accepted).forEach((draft) => {
      pending.append(element("span", "token refused", draft.text));
    });
    return;
  }
  const refused = step.phase === "judge" && !loop.drafts[step.t].accepted;
  const first = step.phase !== "judge" ? 0 : refused ? step.t : step.t + 1;
  loop.drafts.slice(first).forEach((draft, i) => {
    pending.append(element("span", "token " + (refused && i === 0 ? "refused" : "draft"), draft.text));
  });
}

function stepWords(step) {
  if (step.phase === "start") {
    return `${TRACE.loops.length} loops wrote ${TRACE.tokens.length} tokens after the prompt. Step through them: ` +
      "each loop drafts, verifies in one target call, judges each draft and ends with one token of the target's.";
  }
  const loop = TRACE.loops[step.loop];
  const n = LOOP_STARTS[step.loop];
  const K = loop.drafts.length;
  const ending = loop.ending;
  switch (step.phase) {
    case "draft":
      return K ? `Loop ${step.loop + 1} (${n} tokens so far): the draft proposes K = ${K} tokens, each x\u0303_t drawn ` +
        "from p(x | x_1..x_n, x\u0303_1..x\u0303_{t-1}), one draft step each."
        : `Loop ${step.loop + 1}: one token is left to write, so nothing is drafted: the target takes a plain step.`;
    case "verify":
      return K ? `One target call scores the ${K + 1} positions at once: q(x | x_1..x_n) up to ` +
        "q(x | x_1..x_n, x\u0303_1..x\u0303_K). Now every draft has its p(x\u0303) and q(x\u0303)."
        : "One target call gives q(x | x_1..x_n), as a step of autoregressive decoding would.";
    case "judge": {
      const draft = loop.drafts[step.t];
      return `Draft ${step.t + 1}, "${visible(draft.text)}": r = ${fixed(draft.r, 3)} drawn from U[0, 1]; ` +
        `min(1, q/p) = ${fixed(draft.ratio, 3)}. ` + (draft.accepted ? "r is below it: accepted, x_{n+1} \u2190 x\u0303_t."
        : "r is not below it: rejected; the drafts after it are never judged.");
    }
    case "block": {
      const tau = loop.drafts.filter((draft) => draft.accepted).length;
      return `Block verification draws all ${K} uniforms \u03b7_t at once and keeps the drafts up to \u03c4, the last t ` +
        "with \u03b7_t < h_t, where b_t = min(1, b_{t-1} q/p) is the weight the block has left and h_t the chance " +
        `to stop at t. Here \u03c4 = ${tau}: ` + (tau === K ? "the whole block is kept." : `${K - tau} draft(s) dropped` +
        (loop.drafts.slice(0, tau).some((draft) => draft.eta >= draft.h)
          ? "; a draft that failed its own test is kept, as token verification never would." : "."));
    }
    default:
      return ending.kind === "corrected" && BLOCK
        ? `After the ${ending.at} kept drafts, "${visible(ending.text)}" is drawn from (b_\u03c4 q \u2212 p)+, ` +
          "normalised: the mass the target gives beyond the draft's, once the block's weight is spent."
        : ending.kind === "corrected"
        ? `The rejected draft's place goes to "${visible(ending.text)}", drawn from (q \u2212 p)+: the mass the target ` +
          "gives beyond the draft's. This is what makes every token distributed exactly as the target's."
        : ending.kind === "bonus"
          ? `All ${K} drafts accepted: the target's call already gave q after the last one, so a bonus token ` +
            `"${visible(ending.text)}" is drawn from it for free.`
          : `The target's own step: "${visible(ending.text)}" drawn from q.`;
  }
}

// The table's columns: token verification's r and min(1, q/p), or block verification's b_t, h_t and eta_t.
const DRAFT_COLUMNS = BLOCK
  ? ["t", "x\u0303<sub>t</sub>", "p(x\u0303<sub>t</sub>)", "q(x\u0303<sub>t</sub>)", "b<sub>t</sub>", "h<sub>t</sub>",
    "\u03b7<sub>t</sub>", "verdict"]
  : ["t", "x\u0303<sub>t</sub>", "p(x\u0303<sub>t</sub>)", "q(x\u0303<sub>t</sub>)", "r", "min(1, q/p)", "verdict"];

function blockRow(draft, t, step) {  // block verification's cells, and its verdict once the block is judged
  const judged = step.phase === "block" || step.phase === "end";
  const verdict = judged ? (draft.accepted ? "kept" : "dropped") : "";
  return [[String(t + 1), ""], [visible(draft.text), "tok"], [fixed(draft.p, 4), "p"],
    [step.phase === "draft" ? "" : fixed(draft.q, 4), "q"], [judged ? fixed(draft.b, 4) : "", "b"],
    [judged ? fixed(draft.h, 3) : "", "h"], [judged ? fixed(draft.eta, 3) : "", "eta"],
    [verdict, "verdict " + (draft.accepted ? "verdict-yes" : "verdict-no")]];
}

function showDrafts(step) {
  const body = document.querySelector("#drafts tbody");
  body.replaceChildren();
  if (step.loop < 0) return;
  const loop = TRACE.loops[step.loop];
  const judged = judgedSoFar(step);
  if (BLOCK) {
    loop.drafts.forEach((draft, t) => {
      const row = element("tr");
      blockRow(draft, t, step).forEach(([text, className]) => row.append(element("td", className, text)));
      body.append(row);
    });
    return;
  }
  loop.drafts.forEach((draft, t) => {
    const row = element("tr");
    row.dataset.t = t;
    if (step.phase === "judge" && step.t === t) row.className = "now";
    const isJudged = t < judged;
    const verdict = draft.judged === false ? (step.phase === "end" ? "never judged" : "")
      : isJudged ? (draft.accepted ? "accepted" : "rejected") : "";
    const cells = [String(t + 1), visible(draft.text), fixed(draft.p, 4),
      step.phase === "draft" ? "" : fixed(draft.q, 4), isJudged ? fixed(draft.r, 3) : "",
      isJudged ? fixed(draft.ratio, 3) : "", verdict];
    const classes = ["", "tok", "p", "q", "r", "ratio", "verdict " +
      (verdict === "accepted" ? "verdict-yes" : verdict === "rejected" ? "verdict-no" : "")];
    cells.forEach((text, i) => row.append(element("td", classes[i], text)));
    body.append(row);
  });
}

// At a loop's end: the head of p, q and (q - p)+ at a rejection, or of q for a bonus token, and the token drawn.
function showBars(step) {
  const box = document.getElementById("bars");
  box.replaceChildren();
  if (step.phase !== "end") return;
  const ending = TRACE.loops[step.loop].ending;
  const rows = ending.kind === "corrected" ? [["p", "p"], ["q", "q"], ["residual", "(q \u2212 p)+"]]
    : [["q", "q"]];
  const heading = ending.kind === "corrected" ? `At the rejected draft t = ${ending.at + 1}: the likeliest tokens`
    : "q after the last draft: the likeliest tokens";
  box.append(element("h3", "", heading));
  const key = element("p", "bars-key");
  rows.forEach(([name, label]) => {
    key.append(element("span", "bar " + (ending.kind === "corrected" ? name : "bonus")), label);
  });
  box.append(key);
  for (const bar of ending.bars) {
    const row = element("div", "bar-row" + (bar.token === ending.token ? " drawn" : ""));
    row.append(element("span", "label", visible(bar.text) + (bar.token === ending.token ? " \u2190" : "")));
    const bars = element("div");
    rows.forEach(([name, label]) => {
      const line = element("div", "bar " + (ending.kind === "corrected" ? name : "bonus"));
      line.style.width = (100 * bar[name]).toFixed(1) + "%";
      line.title = `${label} = ${bar[name].toFixed(4)}`;
      bars.append(line);
    });
    row.append(bars);
    box.append(row);
  }
}

// The KV caches: what each held before the loop, the prefix it kept (its rollback) and what it holds after.
function showCaches(step) {
  const box = document.getElementById("caches");
  box.replaceChildren();
  if (step.loop < 0) return;
  const cache = TRACE.loops[step.loop].cache;
  const words = (name, lengths) => {
    if (!lengths) return `${name}: no draft steps this loop.`;
    const rollback = lengths.before === 0 ? "started empty" : lengths.kept < lengths.before
      ? `rolled back from ${lengths.before} tokens to the first ${lengths.kept}, the text it still agrees with`
      : `kept all ${lengths.before} tokens`;
    return `${name}'s KV cache: ${rollback}, then ${lengths.after} after its call${name === "the draft" ? "s" : ""}.`;
  };
  box.append(element("p", "", words("the draft", cache.draft)));
  if (step.phase !== "draft") box.append(element("p", "", words("the target", cache.target)));
}

// sampling.py's speculative_sampling, with the lines of this step highlighted.
function buildSource() {
  const source = document.getElementById("source");
  TRACE.source.lines.forEach((text, i) => {
    const line = element("span", "line");
    line.dataset.index = i;
    line.append(element("span", "number", String(TRACE.source.first_line + i)), text);
    source.append(line);
  });
}

function sourceMarks(step) {
  const loop = TRACE.loops[step.loop];
  switch (step.phase) {
    case "draft": return loop.drafts.length ? ["draft"] : [];
    case "verify": return ["verify"];
    case "judge": return ["r", "test", ...(loop.drafts[step.t].accepted ? ["accept"] : [])];
    case "block": return ["weights", "eta", "tau"];
    case "end": return [loop.ending.kind === "corrected" ? "reject" : "bonus", ...(BLOCK ? ["sample"] : [])];
    default: return [];
  }
}

function showSource(step) {
  const lines = document.querySelectorAll("#source .line");
  lines.forEach((line) => line.classList.remove("now"));
  const marked = sourceMarks(step).map((name) => lines[TRACE.source.marks[name]]);
  marked.forEach((line) => line.classList.add("now"));
  if (marked.length) {
    const box = document.getElementById("source");
    box.scrollTop = Math.max(0, marked[0].offsetTop - box.clientHeight / 3);
  }
}

function show(position) {
  replay.position = Math.max(0, Math.min(STEPS.length - 1, position));
  const step = STEPS[replay.position];
  document.getElementById("step-words").textContent = stepWords(step);
  showText(step);
  showDrafts(step);
  showBars(step);
  showCaches(step);
  showSource(step);
  const loopNumber = Math.max(1, step.loop + 1);
  document.getElementById("loop").value = loopNumber;
  document.getElementById("loop-number").textContent =
    `${step.loop < 0 ? 0 : loopNumber} of ${TRACE.loops.length} (step ${replay.position} of ${STEPS.length - 1})`;
  highlightLoopOnTimeline(step.loop);
  if (replay.position === STEPS.length - 1) pause();
}

function play() {
  if (replay.position === STEPS.length - 1) show(0);
  const stepsPerSecond = Number(document.getElementById("speed").value);
  replay.timer = setInterval(() => show(replay.position + 1), 1000 / stepsPerSecond);
  document.getElementById("play").textContent = "pause";
}

function pause() {
  clearInterval(replay.timer);
  replay.timer = null;
  document.getElementById("play").textContent = "play";
}

function changeSpeed(by) {  // by: +1 or -1 options; a playing replay goes on at the new speed
  const speed = document.getElementById("speed");
  speed.selectedIndex = Math.max(0, Math.min(speed.options.length - 1, speed.selectedIndex + by));
  if (replay.timer) { pause(); play(); }
}

// the last step of a loop (numbered from 1)
function endOfLoop(number) {
  return STEPS.findIndex((step) => step.loop === number - 1 && step.phase === "end");
}

function setUpReplay() {
  document.getElementById("prompt-text").textContent = TRACE.prompt;
  document.getElementById("source-title").textContent = TRACE.source.title;
  // the column names are the page's own text, never the run's
  document.querySelector("#drafts thead tr").innerHTML = DRAFT_COLUMNS.map((name) => `<th>${name}</th>`).join("");
  buildSource();
  const loop = document.getElementById("loop");
  loop.max = TRACE.loops.length;
  document.getElementById("first").onclick = () => show(0);
  document.getElementById("back").onclick = () => show(replay.position - 1);
  document.getElementById("forward").onclick = () => show(replay.position + 1);
  document.getElementById("last").onclick = () => show(STEPS.length - 1);
  document.getElementById("play").onclick = () => (replay.timer ? pause() : play());
  document.getElementById("speed").onchange = () => changeSpeed(0);
  loop.oninput = () => show(endOfLoop(Number(loop.value)));
  document.addEventListener("keydown", (event) => {
    if (event.target.tagName === "INPUT" || event.target.tagName === "SELECT") return;
    const actions = { ArrowRight: () => show(replay.position + 1), n: () => show(replay.position + 1),
      ArrowLeft: () => show(replay.position - 1), p: () => show(replay.position - 1),
      " ": () => (replay.timer ? pause() : play()), "+": () => changeSpeed(1), "=": () => changeSpeed(1),
      "-": () => changeSpeed(-1), Home: () => show(0), End: () => show(STEPS.length - 1) };
    if (actions[event.key]) {
      event.preventDefault();
      actions[event.key]();
    }
  });
}

// ---- section 2: the calls on one wall-clock axis -------------------------------------------------------------------

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

function niceTicks(end, count) {
  const raw = end / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * power).find((candidate) => candidate >= raw);
  const ticks = [];
  for (let ms = 0; ms <= end; ms += step) ticks.push(Number(ms.toPrecision(6)));
  return ticks;
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

// ---- section 3: the formula explorer -------------------------------------------------------------------------------

const CHART = { width: 600, height: 380, left: 48, right: 16, top: 14, bottom: 40, curves: [1, 2, 4, 8] };
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
  document.querySelectorAll("[data-preset]").forEach((button) => {
    button.onclick = () => applyPreset(button.dataset.preset);
  });
  applyPreset("run");
}

document.getElementById("run").textContent = TRACE.run;
drawTimeline();
setUpReplay();
setUpExplorer();
show(0);
// for the tests and the curious: the formula's functions, as the explorer computes them
window.formula = { expectedTokensPerLoop, expectedSpeedup, bestK, breakEvenAlpha };
