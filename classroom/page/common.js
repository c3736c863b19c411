// The page's behaviour, in plain JavaScript with no library, in four files that classroom/page.py inlines in this
// order: common.js (the run, the formula, small helpers), replay.js (section 1: the run loop by loop), timeline.js
// (section 2: the calls on one time axis) and explorer.js (section 3: the formula under sliders); page.html starts
// them. Their one input is the run that classroom/page.py embedded as JSON: the loops that classroom/trace.py decided
// again from the run's recordings.
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

// Round axis ticks from 0 to end: about count of them, at steps of 1, 2 or 5 times a power of ten.
function niceTicks(end, count) {
  const raw = end / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * power).find((candidate) => candidate >= raw);
  const ticks = [];
  for (let ms = 0; ms <= end; ms += step) ticks.push(Number(ms.toPrecision(6)));
  return ticks;
}
