// Section 1: the run replayed step by step, with buttons, keys and a speed control (common.js comes first).

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
  const rows = ending.kind === "corrected"
    ? [["p", "p"], ["q", "q"], ["residual", BLOCK ? "(b\u03c4 q \u2212 p)+, normalised" : "(q \u2212 p)+"]]
    : [["q", "q"]];
  const heading = ending.kind !== "corrected" ? "q after the drafts kept: the likeliest tokens"
    : BLOCK ? `After the ${ending.at} drafts kept, at position \u03c4 + 1: the likeliest tokens`
      : `At the rejected draft t = ${ending.at + 1}: the likeliest tokens`;
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
    if (event.target.tagName === "INPUT" || event.target.tagName === "SELECT") return;  // their own keys
    if (event.target.tagName === "BUTTON" && (event.key === " " || event.key === "Enter")) return;  // a click
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
