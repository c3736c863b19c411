"""One speculative run, loop by loop, for the page that replays it (page.py): every draft's p(x~) and q(x~), the r
drawn, min(1, q/p) and the verdict (block verification: b_t, h_t, eta_t and the drafts kept), the bars of p, q and
(q - p)+ at a rejection, the bonus token, the KV caches and the time of every call.

The decoder (sampling.speculative_sampling, or verifiers/block.py's) runs as it is, on models that keep what each
call read and returned (calls.TracingModel) and a Generator that keeps each uniform number it draws
(`RecordingRng`). Both draw their uniforms in a fixed order: one per drafted token, then the verifier's (Algorithm 2:
one r per judged draft; block verification: all K eta), then one for the corrected or bonus token. `replay_loops`
walks the recordings in that order and decides each loop again with the decoder's own functions (sampling.py's
`accepts`, `max_fn` and `sample`; block.py's `block_weights` and `verify_block`); every token it decides must be the
run's (`TraceMismatch` otherwise), so the page shows the run that happened, not a re-enactment of it.
"""

import numpy as np

import sampling
from classroom.calls import RecordingModel, TracingModel
from speedup.stats import SpeculativeStats
from verifiers import block

TOP = 6  # bars per distribution: the page shows the head of p, q and the residual, never whole rows


class TraceMismatch(AssertionError):
    """The recordings decide a token other than the one the run wrote: they are not of this run."""


class RecordingRng:
    """A source of uniforms (a numpy Generator, or the replay's) whose uniforms are kept in the order drawn."""

    def __init__(self, source):
        self.source, self.uniforms = source, []

    def random(self, size=None):
        value = self.source.random() if size is None else self.source.random(size)
        self.uniforms.extend(np.ravel(value).tolist())
        return value


class ReplayedRng:
    """What the replay draws from: the run's uniforms again, in the order the run drew them."""

    def __init__(self, uniforms):
        self.uniforms = iter(uniforms)

    def random(self):
        return next(self.uniforms)

    def exhausted(self):
        return next(self.uniforms, None) is None


def record_run(prompt_ids, draft, target, N, K, settings, seed, verifier="token"):
    """One speculative run (Algorithm 2, or block verification) on traced models, then Algorithm 1 on the recorded
    target, each from empty caches and the seed:
    -> {"x", "calls", "inputs", "uniforms", "origins", "autoregressive_calls"}."""
    calls, inputs, keywords = [], [], {"temperature": settings.temperature, "top_k": settings.top_k,
                                       "top_p": settings.top_p}
    traced_draft, traced_target = TracingModel(draft, "draft", calls, inputs), TracingModel(target, "target", calls,
                                                                                             inputs)
    traced_draft.reset(), traced_target.reset()
    rng, stats = RecordingRng(np.random.default_rng(seed)), SpeculativeStats()
    decoder = block.block_speculative_sampling if verifier == "block" else sampling.speculative_sampling
    x = decoder(prompt_ids, traced_draft, traced_target, N, K, rng=rng, stats=stats, **keywords)
    autoregressive_calls = []
    recorded_target = RecordingModel(target, "target", autoregressive_calls)
    recorded_target.reset()
    sampling.autoregressive_sampling(prompt_ids, recorded_target, N, rng=seed, **keywords)
    return {"x": x, "calls": calls, "inputs": inputs, "uniforms": rng.uniforms, "origins": stats.origins,
            "autoregressive_calls": autoregressive_calls}


def replay_loops(recording, n_prompt, settings, text_of, verifier="token"):
    """The recorded run, loop by loop, each decided again from its recordings by the verifier's rule ("token" or
    "block"): -> a list of the page's loops. text_of(token) names a token on the page."""
    rng, loops, n, draft_steps = ReplayedRng(recording["uniforms"]), [], n_prompt, []
    for call, (x, logits) in zip(recording["calls"], recording["inputs"]):
        if call.role == "draft":
            draft_steps.append((call, logits))
            continue
        loop = replay_loop(draft_steps, call, x, logits, rng, settings, text_of, VERIFY[verifier])
        kept = recording["x"][n:n + len(loop["tokens"])].tolist()
        if [token["id"] for token in loop["tokens"]] != kept:
            raise TraceMismatch(f"loop {len(loops) + 1} decides {loop['tokens']} where the run wrote {kept}")
        loops.append(loop)
        n, draft_steps = n + len(kept), []
    if n != len(recording["x"]) or not rng.exhausted():
        raise TraceMismatch("the recordings end before or after the run")
    return loops


def replay_loop(draft_steps, target_call, x_draft, target_logits, rng, settings, text_of, verify):
    """One loop: K drafts drawn from p, one target call giving q, the drafts judged by verify, which returns each
    draft's numbers and the loop's last token with its bars."""
    p = [sampling.logits_to_probs(logits, settings)[0] for _, logits in draft_steps]
    q = sampling.logits_to_probs(target_logits, settings)
    drafts = x_draft[len(x_draft) - len(draft_steps):].tolist()
    for t, token in enumerate(drafts):  # each draft was drawn from its p with one uniform
        if sampling.sample(p[t], rng) != token:
            raise TraceMismatch(f"draft {t + 1} is not the token its p and uniform give")
    judged, kept, ending = verify(drafts, p, q, rng, text_of)
    tokens = [{"id": token, "origin": "accepted"} for token in drafts[:kept]]
    tokens.append({"id": ending["token"], "origin": ending["kind"]})
    return {"drafts": [{"token": token, "text": text_of(token), "p": float(p[t][token]), "q": float(q[t][token]),
                        **judged[t]} for t, token in enumerate(drafts)],
            "ending": ending, "tokens": tokens,
            "cache": cache_lengths([call for call, _ in draft_steps], target_call),
            "times": {"draft": [[call.start, call.end] for call, _ in draft_steps],
                      "target": [target_call.start, target_call.end]}}


def verify_tokens(drafts, p, q, rng, text_of):
    """Algorithm 2's rule, with sampling.py's accepts, max_fn and sample: each draft in turn kept if r < min(1, q/p),
    up to the first rejection, whose place a token drawn from (q - p)+ takes; after K kept drafts, a bonus token
    from q. -> (each draft's r, min(1, q/p) and verdict, or judged False; the drafts kept; the ending)."""
    judged = []
    for t, token in enumerate(drafts):
        r = rng.random()
        accepted = sampling.accepts(r, q[t], p[t], token)
        judged.append({"r": r, "ratio": min(1.0, float(q[t][token]) / float(p[t][token])), "accepted": accepted})
        if not accepted:
            residual = sampling.max_fn(q[t] - p[t], fallback=q[t])
            judged += [{"judged": False}] * (len(drafts) - t - 1)
            return judged, t, ending("corrected", t, sampling.sample(residual, rng), text_of, p=p[t], q=q[t],
                                     residual=residual)
    kind = "bonus" if drafts else "target"  # with no drafts, the target's own step
    return judged, len(drafts), ending(kind, len(drafts), sampling.sample(q[len(drafts)], rng), text_of,
                                       q=q[len(drafts)])


def verify_block(drafts, p, q, rng, text_of):
    """Block verification's rule, with verifiers/block.py's own functions: every draft's weight b_t and stopping
    chance h_t, the uniforms eta_t all drawn, tau the last t with eta_t < h_t; the drafts up to tau kept, then a token
    drawn from norm((b_tau q_tau - p_tau)+) (its bars: p_tau, q_tau and that residual), or a bonus token from q after
    all K. -> as verify_tokens'."""
    b, h = block.block_weights(drafts, p, q)
    watched = RecordingRng(rng)  # verify_block draws eta_1..eta_K: the page shows them
    tau, next_token_probs = block.verify_block(drafts, p, q, watched)
    judged = [{"eta": watched.uniforms[t - 1], "h": h[t], "b": b[t], "accepted": t <= tau}
              for t in range(1, len(drafts) + 1)]
    token = sampling.sample(next_token_probs, rng)
    if tau == len(drafts):
        return judged, tau, ending("bonus" if drafts else "target", tau, token, text_of, q=next_token_probs)
    return judged, tau, ending("corrected", tau, token, text_of, p=p[tau], q=q[tau], residual=next_token_probs)


VERIFY = {"token": verify_tokens, "block": verify_block}


def ending(kind, at, token, text_of, **rows):
    """A loop's last token: corrected, bonus or target, after `at` drafts, with the bars of what it was drawn from."""
    return {"kind": kind, "at": at, "token": token, "text": text_of(token), "bars": bars(text_of, token, **rows)}


def bars(text_of, drawn, **rows):
    """The head of each distribution given: the TOP likeliest tokens of any of them and the token drawn, likeliest
    first in the first, with every distribution's probability of each."""
    tokens = [drawn]
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
