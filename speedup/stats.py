"""What a decoder did, and what the formula expects of it: `SpeculativeStats` counts model calls, their time,
drafts and where every new token came from; `expected_speedup` is Leviathan et al.'s expected speedup, with
the verification's real cost. sampling.py's decoders fill a SpeculativeStats; costs.py measures the costs the
formula takes. This module imports nothing of the kit, so sampling.py can import it.
"""

from dataclasses import dataclass, field


def expected_tokens_per_loop(a, K):
    """Tokens a loop yields when each draft is accepted with probability a: 1 + a + ... + a^K
    = (1 - a^(K+1)) / (1 - a), Leviathan et al.'s Equation 1."""
    return K + 1 if a == 1 else (1 - a ** (K + 1)) / (1 - a)


def expected_speedup(a, c, K, v=1.0):
    """Leviathan et al.'s expected speedup over autoregressive decoding (their Equation 1 for the tokens per loop,
    Theorem 3.8 for the speedup), with the verification's real cost.

    a: acceptance rate; c: a draft step's cost in target *decode steps* (one token after a cached prefix);
    K: drafts per loop; v: v(K + 1), what the target's call scoring the K + 1 positions costs, in decode
    steps (costs.py's v(m) at m = K + 1).
    A loop costs K c + v decode steps and yields expected_tokens_per_loop(a, K) tokens, where
    autoregressive decoding yields one token per step. v = 1 is Leviathan et al.'s idealisation (verification
    as cheap as one step: about one decode step on an accelerator at small batch, for large models, as Chen et
    al. report); on the CPUs we measured it is often 1.2 to 3 (costs.py measures it).
    """
    if not 0 <= a <= 1 or c < 0 or K < 0 or v <= 0:
        raise ValueError(f"expected_speedup needs 0 <= a <= 1, c >= 0, K >= 0, v > 0; got a={a}, c={c}, K={K}, v={v}")
    return expected_tokens_per_loop(a, K) / (K * c + v)


@dataclass
class SpeculativeStats:
    """What a decoder did: model calls, their time, drafts, and where every new token came from.

    A decoder adds to the counters, so one object can also sum several runs.
    """

    loops: int = 0
    target_calls: int = 0
    draft_calls: int = 0  # forward steps of the draft model, one per drafted token
    drafted: int = 0
    accepted: int = 0
    target_seconds: float = 0.0
    draft_seconds: float = 0.0
    # the target's decode step (one token after a cached prefix), measured apart from this run by whoever
    # knows it (costs.measure_costs, or an autoregressive run): the unit of the cost ratio and of verify_steps
    decode_step_seconds: float = None
    # per new token: "target" (autoregressive), "accepted" (a draft), "corrected" (resampled after a
    # rejection) or "bonus" (the extra token after all K drafts were accepted)
    origins: list = field(default_factory=list)

    def __repr__(self):  # the counters and alpha; origins, one entry per token, would bury them
        counters = ", ".join(f"{name}={getattr(self, name)}" for name in
                             ["loops", "target_calls", "draft_calls", "drafted", "accepted", "rejected", "generated"])
        alpha = "None" if self.acceptance_rate is None else f"{self.acceptance_rate:.3f}"
        return (f"SpeculativeStats({counters}, acceptance_rate={alpha}, target_seconds={self.target_seconds:.3f}, "
                f"draft_seconds={self.draft_seconds:.3f})")

    def record_call(self, role, seconds, steps=1):
        if role == "draft":
            self.draft_calls += steps  # a fused call drafting K tokens counts as K calls
            self.draft_seconds += seconds
        else:
            self.target_calls += 1
            self.target_seconds += seconds

    def record_tokens(self, origin, count=1):
        self.origins.extend([origin] * count)
        if origin == "accepted":
            self.accepted += count

    @property
    def generated(self):
        return len(self.origins)

    @property
    def rejected(self):  # drafts the target judged and refused; the drafts after them are never judged
        return self.origins.count("corrected")

    @property
    def acceptance_rate(self):  # None when nothing was judged
        """Leviathan et al.'s alpha: the chance that a draft the target judges is accepted.

        A loop stops at its first rejection and discards the rest of its drafts unjudged, so
        accepted / drafted would understate alpha (and more so the larger K is); accepted /
        (accepted + rejected) is its maximum-likelihood estimate, the a of expected_speedup.
        """
        judged = self.accepted + self.rejected
        return self.accepted / judged if judged else None

    @property
    def accepted_per_loop(self):  # drafts accepted per loop, without the loop's final token (tokens_per_target_call)
        return self.accepted / self.loops if self.loops else None

    @property
    def tokens_per_target_call(self):
        return self.generated / self.target_calls if self.target_calls else None

    @property
    def draft_step_seconds(self):  # a draft step in this run (a lookup, for a draft that is not a model)
        return self.draft_seconds / self.draft_calls if self.draft_calls else None

    @property
    def verify_seconds(self):  # a target call in this run: in a speculative run, the scoring of K + 1 positions
        return self.target_seconds / self.target_calls if self.target_calls else None

    @property
    def cost_ratio(self):  # Leviathan et al.'s c: a draft step / a target decode step
        if self.draft_step_seconds is None or not self.decode_step_seconds:
            return None
        return self.draft_step_seconds / self.decode_step_seconds

    @property
    def verify_steps(self):  # v: a target call of this run, in decode steps (about v(K + 1) of costs.py)
        if self.verify_seconds is None or not self.decode_step_seconds:
            return None
        return self.verify_seconds / self.decode_step_seconds

    @property
    def expected_speedup(self):
        """The formula's speedup from this run's alpha, drafts per loop, c and measured verification cost."""
        if self.acceptance_rate is None or self.cost_ratio is None:
            return None
        return expected_speedup(self.acceptance_rate, self.cost_ratio, self.drafted / self.loops, self.verify_steps)

    @property
    def expected_speedup_one_step(self):
        """The same with verification at one decode step's price (v = 1), Leviathan et al.'s idealisation."""
        if self.acceptance_rate is None or self.cost_ratio is None:
            return None
        return expected_speedup(self.acceptance_rate, self.cost_ratio, self.drafted / self.loops)

    def as_dict(self):
        names = ["loops", "target_calls", "draft_calls", "drafted", "accepted", "rejected", "target_seconds",
                 "draft_seconds", "generated", "acceptance_rate", "accepted_per_loop", "tokens_per_target_call",
                 "decode_step_seconds", "draft_step_seconds", "verify_seconds", "cost_ratio", "verify_steps",
                 "expected_speedup", "expected_speedup_one_step"]
        return {name: getattr(self, name) for name in names}
