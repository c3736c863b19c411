"""One speculative run, loop by loop, for the page that replays it (page.py): every draft's p(x~) and q(x~), the r
drawn, min(1, q/p) and the verdict, the bars of p, q and (q - p)+ at a rejection, the bonus token, the KV caches and
the time of every call.

sampling.speculative_sampling runs as it is, on models that keep what each call read and returned
(calls.TracingModel) and a Generator that keeps each uniform number it draws (`RecordingRng`). sampling.py draws
exactly one uniform per decision: one per drafted token, then one r per judged draft, then one for the corrected or
bonus token. `replay_loops` walks the recordings in that order and decides each loop again with sampling.py's own
`accepts`, `max_fn` and `sample`; every token it decides must be the run's (`TraceMismatch` otherwise), so the page
shows the run that happened, not a re-enactment of it.
"""

import numpy as np

import sampling
from classroom.calls import RecordingModel, TracingModel
from speedup.stats import SpeculativeStats

TOP = 6  # bars per distribution: the page shows the head of p, q and the residual, never whole rows


class TraceMismatch(AssertionError):
    """The recordings decide a token other than the one the run wrote: they are not of this run."""


class RecordingRng:
    """A numpy Generator of the seed whose uniforms are kept in the order they were drawn."""

    def __init__(self, seed):
        self.generator, self.uniforms = np.random.default_rng(seed), []

    def random(self, size=None):
        value = self.generator.random(size)
        self.uniforms.extend(np.ravel(value).tolist())
        return value


class OneUniform:
    """What sampling.sample draws from: the uniform the run drew for that decision."""

    def __init__(self, u):
        self.u = u

    def random(self):
        return self.u


def record_run(prompt_ids, draft, target, N, K, settings, seed):
    """Algorithm 2 on traced models, then Algorithm 1 on the recorded target, each from empty caches and the seed:
    -> {"x", "calls", "inputs", "uniforms", "origins", "autoregressive_calls"}."""
    calls, inputs, keywords = [], [], {"temperature": settings.temperature, "top_k": settings.top_k,
                                       "top_p": settings.top_p}
    traced_draft, traced_target = TracingModel(draft, "draft", calls, inputs), TracingModel(target, "target", calls,
                                                                                             inputs)
    traced_draft.reset(), traced_target.reset()
    rng, stats = RecordingRng(seed), SpeculativeStats()
    x = sampling.speculative_sampling(prompt_ids, traced_draft, traced_target, N, K, rng=rng, stats=stats, **keywords)
    autoregressive_calls = []
    recorded_target = RecordingModel(target, "target", autoregressive_calls)
    recorded_target.reset()
    sampling.autoregressive_sampling(prompt_ids, recorded_target, N, rng=seed, **keywords)
    return {"x": x, "calls": calls, "inputs": inputs, "uniforms": rng.uniforms, "origins": stats.origins,
            "autoregressive_calls": autoregressive_calls}


def replay_loops(recording, n_prompt, settings, text_of):
    """The recorded run, loop by loop, each decided again from its recordings: -> a list of the page's loops.
    text_of(token) names a token on the page."""
    uniforms, loops, n = iter(recording["uniforms"]), [], n_prompt
    steps = list(zip(recording["calls"], recording["inputs"]))
    draft_steps = []
    for call, (x, logits) in steps:
        if call.role == "draft":
            draft_steps.append((call, logits))
            continue
        loop = replay_loop(draft_steps, call, x, logits, uniforms, settings, text_of)
        kept = recording["x"][n:n + len(loop["tokens"])].tolist()
        if [token["id"] for token in loop["tokens"]] != kept:
            raise TraceMismatch(f"loop {len(loops) + 1} decides {loop['tokens']} where the run wrote {kept}")
        loops.append(loop)
        n, draft_steps = n + len(kept), []
    if n != len(recording["x"]) or next(uniforms, None) is not None:
        raise TraceMismatch("the recordings end before or after the run")
    return loops


def replay_loop(draft_steps, target_call, x_draft, target_logits, uniforms, settings, text_of):
    """One loop: K drafts drawn from p, one target call giving q, the drafts judged until one is rejected, then the
    corrected token drawn from (q - p)+ or the bonus token from q."""
    p = [sampling.logits_to_probs(logits, settings)[0] for _, logits in draft_steps]
    q = sampling.logits_to_probs(target_logits, settings)
    K_n = len(draft_steps)
    drafts = x_draft[len(x_draft) - K_n:].tolist()
    for t, token in enumerate(drafts):  # each draft was drawn from its p with one uniform
        if sampling.sample(p[t], OneUniform(next(uniforms))) != token:
            raise TraceMismatch(f"draft {t + 1} is not the token its p and uniform give")
    judged, tokens = [], []
    for t, token in enumerate(drafts):
        r = next(uniforms)
        ratio = min(1.0, float(q[t][token]) / float(p[t][token]))
        accepted = sampling.accepts(r, q[t], p[t], token)
        judged.append({"r": r, "ratio": ratio, "accepted": accepted})
        if not accepted:
            residual = sampling.max_fn(q[t] - p[t], fallback=q[t])
            corrected = sampling.sample(residual, OneUniform(next(uniforms)))
            tokens.append({"id": corrected, "origin": "corrected"})
            ending = {"kind": "corrected", "at": t, "token": corrected, "text": text_of(corrected),
                      "bars": bars(text_of, p=p[t], q=q[t], residual=residual)}
            break
        tokens.append({"id": token, "origin": "accepted"})
    else:
        extra = sampling.sample(q[K_n], OneUniform(next(uniforms)))
        tokens.append({"id": extra, "origin": "bonus" if K_n else "target"})
        ending = {"kind": tokens[-1]["origin"], "at": K_n, "token": extra, "text": text_of(extra),
                  "bars": bars(text_of, q=q[K_n])}
    return {"drafts": [{"token": token, "text": text_of(token), "p": float(p[t][token]), "q": float(q[t][token]),
                        **(judged[t] if t < len(judged) else {"judged": False})} for t, token in enumerate(drafts)],
            "ending": ending, "tokens": tokens,
            "cache": cache_lengths([call for call, _ in draft_steps], target_call),
            "times": {"draft": [[call.start, call.end] for call, _ in draft_steps],
                      "target": [target_call.start, target_call.end]}}


def bars(text_of, **rows):
    """The head of each distribution given: the TOP likeliest tokens of any of them, likeliest first in the first,
    with every distribution's probability of each."""
    tokens = []
    for row in rows.values():
        for token in np.argsort(-row, kind="stable")[:TOP].tolist():
            if row[token] > 0 and token not in tokens:
                tokens.append(token)
    first = next(iter(rows.values()))
    tokens.sort(key=lambda token: -float(first[token]))
    return [{"token": token, "text": text_of(token), **{name: float(row[token]) for name, row in rows.items()}}
            for token in tokens]


def cache_lengths(draft_calls, target_call):
    """Each model's KV cache in one loop: the tokens it held before, the prefix it kept (its rollback point) and
    what it held after (the draft's over its K steps; None for a loop without draft steps)."""
    draft = ({"before": draft_calls[0].cached_before, "kept": draft_calls[0].kept,
              "after": draft_calls[-1].kept + draft_calls[-1].fed} if draft_calls else None)
    return {"draft": draft, "target": {"before": target_call.cached_before, "kept": target_call.kept,
                                       "after": target_call.kept + target_call.fed}}
