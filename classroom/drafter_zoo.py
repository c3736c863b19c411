"""Bugs of the drafters made from the target (drafters/), as bug_zoo's small patches: one that breaks the output law,
and seven that keep it exact and can only change acceptance (four in EAGLE's and Medusa's wiring, three in EAGLE-3's:
the maps its head.json gives beside the arrays, and its norm).

Drafters plug into Algorithm 2 through `propose` (drafts and the p they were drawn from), so no drafter, however
wired, can move the output law: every draft is judged by q/p and the residual. What can move it is the verification
a drafter's paper ships with. RESIDUAL_AT_REJECTED_TOKEN is the one EAGLE's own verification had (SafeAILab/EAGLE#20):
after a rejection the token comes from q with only the rejected token's entry lowered to max(0, q(t) - p(t)), where
the rule takes max(0, q - p) over the whole vocabulary. Here it is planted in sampling.speculative_sampling's
correction, the verification every chain drafter plugs into; exact_law.check_exact fails it on its own tables and on
a tiny GPT-2 driving an EAGLE head (tests/test_drafter_zoo.py measures both total variations, which its effect text
quotes), and lossless.check_lossless fails it too.

The wiring bugs (BUGS) are patches of a drafter's methods (bug_zoo.Patch naming "Class.method"); `patched_drafter`
compiles them from today's source into a subclass of the drafter, so the zoo always tests today's drafter with one
mistake in it. They keep the output exact, which the exact oracle confirms (tests/test_drafter_zoo.py), and change
the drafts: what they cost shows only in acceptance, as a review of vLLM's EAGLE worried (vllm-project/vllm PR
#6830: rejection sampling keeps the target's law, so a wrong hidden state may not be caught until much later), and
only with trained heads, since a random head accepts next to nothing either way. `lost_acceptance` measures alpha
and tokens per target call with and without a bug at temperature 0; bench/drafter_zoo.py runs it on the bundled
target with its trained heads (models/teach-eagle, models/teach-medusa, models/teach-eagle3).
"""

import functools
import textwrap
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

import sampling
from classroom.bug_zoo import CORRECTION, Patch, Variant
from drafters import eagle, eagle3, medusa
from drafters.eagle import EagleDraft
from drafters.eagle3 import Eagle3Draft
from drafters.medusa import MedusaDraft
from speedup.stats import SpeculativeStats
from verifiers.tree import DEFAULT_N_NODES

RESIDUAL_AT_REJECTED_TOKEN = Variant(
    "residual_at_rejected_token", "the residual taken at the rejected token only", "SafeAILab/EAGLE#20",
    "after a rejection the token is drawn from q with the rejected token's entry lowered to max(0, q(t) - p(t)) "
    "and the rest left as q, renormalised, where the rule subtracts p from q over the whole vocabulary: every "
    "token the draft also favours is over-weighted (total variation 0.145 on check_exact's tables, 0.064 on a tiny "
    "GPT-2 driving an EAGLE head). At temperature 0 p is one-hot and both residuals are q without the rejected "
    "token, which is why EAGLE's greedy results were not affected",
    (Patch(sampling, "speculative_sampling", CORRECTION, """
        residual = q[t].copy()  # (bug) only the rejected token's entry is lowered
        residual[token] = max(0.0, float(q[t][token]) - float(p[t][token]))
        x = np.append(x, sample(residual / residual.sum(), rng))
        """),))
# the largest total variation check_exact measures: on its default problems ("tables"), and on a tiny random GPT-2
# driving a random EAGLE head at temperature 1 ("eagle", tests/test_drafter_zoo.py's problem)
RESIDUAL_EXACT_TV = {"tables": 0.1448, "eagle": 0.0639}


class Eagle3Head(NamedTuple):
    """What Eagle3Draft reads beside the target: the head's arrays and the maps its head.json gives with them."""

    arrays: dict
    d2t: list  # each draft id's offset to its target id
    layers: tuple  # the blocks whose streams fc fuses


@dataclass(frozen=True)
class DrafterBug:
    """A wiring mistake in a drafter: variant's patches name methods of `drafter`, `kind` the trained head it reads
    (drafters/load.py's name: "eagle", "eagle3" or "medusa")."""

    variant: Variant
    drafter: type
    kind: str

    def patched_drafter(self):
        """A subclass of the drafter whose patched methods are compiled from today's source (bug_zoo.StalePatch if
        a line they replace is gone); it is built as the drafter is (`build`)."""
        return patched_class(self)


def build(drafter_class, target, head):  # -> the drafter (or its patched subclass) on target
    """head: the head's arrays, or an Eagle3Head (EAGLE-3 drafts its chain here: the tree's budget is unused)."""
    if isinstance(head, Eagle3Head):
        return drafter_class(target, head.arrays, DEFAULT_N_NODES, head.d2t, head.layers)
    return drafter_class(target, head)


@functools.cache
def patched_class(bug):
    methods = {}
    for module, functions in bug.variant.patched_functions().items():
        for name, source in functions.items():
            owner, _, method = name.rpartition(".")
            if owner != bug.drafter.__name__:
                raise ValueError(f"bug {bug.variant.name!r} patches {name}, not a method of {bug.drafter.__name__}")
            defined = {}  # the method is defined here, its globals the drafter's module: no module is changed
            exec(compile(textwrap.dedent(source), f"<{bug.variant.name}: {module.__name__}.{name}>", "exec"),
                 vars(module), defined)
            methods[method] = defined[method]
    patched = type(f"{bug.drafter.__name__}_{bug.variant.name}", (bug.drafter,), methods)
    patched.__doc__ = f"{bug.drafter.__name__} with a bug: {bug.variant.title} ({bug.variant.source})."
    return patched


EAGLE_STEP = "features, tokens = features[-1:], np.array([drafted], dtype=np.int64)"

BUGS = [
    DrafterBug(Variant(
        "feature_off_by_one", "EAGLE's feature paired with its own token, not the next one",
        "no public report found (EAGLE's pairing, Li et al. 2024: f_i beside x_{i+1}; vllm-project/vllm#15901 notes "
        "that EAGLE's i-th KV cache is coupled with the i+1-th token ID)",
        "the head reads f_i beside x_i, the token the target had already seen when it computed f_i, instead of "
        "x_{i+1}, the one it sampled from f_i: a head trained on the right pairs is fed pairs it never saw, and "
        "its drafts are accepted less often",
        (Patch(eagle, "EagleDraft.paired_tokens", "return x[1:]",
               "return x[:-1]  # (bug) f_j beside x_j"),)), EagleDraft, "eagle"),
    DrafterBug(Variant(
        "feature_normed_twice", "ln_f applied again to the predicted feature before the unembedding",
        "sgl-project/SpecForge PR #879 and sgl-project/sglang PR #32334 (features normed where they must not be, "
        "or not normed where they must)",
        "the head predicts f_{i+1} after ln_f, as the unembedding reads it; normalising it once more rescales it "
        "and adds ln_f's bias, so the drafts' logits are not the ones the head was trained to give",
        (Patch(eagle, "EagleDraft.readout", "return predicted @ self.unembedding", """
            normed = gpt2.layer_norm(predicted, **self.target.params["ln_f"])  # (bug) it is post-norm already
            return normed @ self.unembedding
            """),)), EagleDraft, "eagle"),
    DrafterBug(Variant(
        "one_shared_medusa_block", "every Medusa head reading head 1's block",
        "a kin of FasterDecoding/Medusa PR #133 and linkedin/Liger-Kernel PR #269 (there one ResBlock object was shared "
        "by the layers of each head; here one head's block is read by every head)",
        "there the shared block made every head one head in training; here the heads were trained apart and are "
        "read as one: head k should predict the token k + 1 after its feature, and with head 1's arrays it "
        "predicts the next token again, so the drafts after the first guess the wrong position",
        (Patch(medusa, "MedusaDraft.logits_after",
               'return head_logits(feature, {"heads": self.heads["heads"][:depth]}, self.unembedding)',
               'return head_logits(feature, {"heads": [self.heads["heads"][0]] * depth}, self.unembedding)  # (bug)'),
         )), MedusaDraft, "medusa"),
    DrafterBug(Variant(
        "draft_cache_not_rebuilt", "EAGLE's cache keeping its own drafted pairs after a verification",
        "vllm-project/vllm#14649 (EAGLE / MTP doesn't overwrite approximated hidden states / KV cache)",
        "the head's slots of accepted drafts keep the pairs it drafted with, its own predicted feature in place of "
        "the target's true one, so the next proposal reads approximations the verification had replaced",
        (Patch(eagle, "EagleDraft.chain_logits", EAGLE_STEP, f"""
            {EAGLE_STEP}
            self.fed = np.append(self.fed, drafted)  # (bug) the drafted pair kept as if it were true
            """),)), EagleDraft, "eagle"),
]

EAGLE3_READOUT = "return spread_logits(draft_logits(predicted, self.eagle3), self.vocabulary, self.n_vocab)"

BUGS += [
    DrafterBug(Variant(
        "d2t_dropped", "EAGLE-3's draft ids read as target ids, its d2t map dropped",
        "sgl-project/SpecForge#18 and PR #25 (the d2t and t2d maps computed, saved and loaded with the draft)",
        "the head reads out over its draft vocabulary, the training tokens' most frequent ids, whose draft id i is "
        "target id i + d2t[i]; without the map its i-th logit is put on target id i, so it proposes ids 0 to "
        "size - 1 in place of its vocabulary's, and wherever the two differ it drafts a token it did not mean",
        (Patch(eagle3, "Eagle3Draft.readout", EAGLE3_READOUT,
               "return spread_logits(draft_logits(predicted, self.eagle3), np.arange(len(self.vocabulary)), "
               "self.n_vocab)  # (bug) draft id i read as target id i"),)), Eagle3Draft, "eagle3"),
    DrafterBug(Variant(
        "wrong_layers_fused", "EAGLE-3's fc fed the target's last blocks, not the ones the head was trained on",
        "lightseekorg/tokenspeed PR #526 (capture layers fixed at [2, n/2, n-3] whatever the draft's config said: "
        "acceptance 0 for a draft trained on others) and sgl-project/sglang PR #25454 (layer ids off by one)",
        "fc was trained on the streams after a low, a middle and a high block (head.json's layers); fed the "
        "streams after the last blocks, in the same slots, it projects features from another basis, and the "
        "draft reads a g it never saw in training",
        (Patch(eagle3, "Eagle3Draft.tap_streams", """
            tap_also(self.target, self.layers)
            """, """
            n_layer = self.target.hparams["n_layer"]  # (bug) the last blocks, whatever the head was trained on
            self.layers = tuple(range(n_layer - len(self.layers) + 1, n_layer + 1))
            tap_also(self.target, self.layers)
            """),)), Eagle3Draft, "eagle3"),
    DrafterBug(Variant(
        "readout_normed_twice", "EAGLE-3's norm applied to its output twice before lm_head",
        "sgl-project/SpecForge PR #879 and ROCm/ATOM PR #882 (EAGLE-3's norm applied where it must not be: to the "
        "state the next draft step reads, or again in the readout)",
        "the draft's state h is normed once, by its own norm, on the way to lm_head; normed again it is "
        "rescaled and shifted by the norm's trained gain and bias twice, so the logits are not the ones the head "
        "was trained to give",
        (Patch(eagle3, "Eagle3Draft.readout", EAGLE3_READOUT, """
            normed = gpt2.layer_norm(predicted, **self.eagle3["norm"])  # (bug) draft_logits norms it again
            return spread_logits(draft_logits(normed, self.eagle3), self.vocabulary, self.n_vocab)
            """),)), Eagle3Draft, "eagle3"),
]

ZOO = {bug.variant.name: bug for bug in BUGS}


def lost_acceptance(bug, target, head, prompts, N=32, K=4):  # -> {"right": {...}, "with_bug": {...}}
    """Greedy speculative sampling (sampling.speculative_sampling, temperature 0) of N tokens after each prompt with
    the drafter wired right and with `bug`, on `target` (a gpt2.GPT2Model) and the head's arrays `head` (an
    Eagle3Head for EAGLE-3's bugs): alpha and tokens per target call of each, over all prompts. Both must give the
    same tokens (each bug keeps the output exact); an AssertionError says where they do not."""
    if bug not in BUGS:
        raise ValueError(f"unknown drafter bug {bug!r}: choose one of {', '.join(ZOO)}")
    rows = {}
    for label, drafter_class in (("right", bug.drafter), ("with_bug", bug.patched_drafter())):
        stats, outputs = SpeculativeStats(), []
        for prompt in prompts:
            target.reset()
            drafter = build(drafter_class, target, head)
            outputs.append(sampling.speculative_sampling(np.asarray(prompt), drafter, target, N, K, 0,
                                                         temperature=0, stats=stats))
        rows[label] = {"alpha": stats.acceptance_rate, "tokens_per_target_call": stats.tokens_per_target_call,
                       "outputs": outputs}
    for i, (right, wrong) in enumerate(zip(rows["right"].pop("outputs"), rows["with_bug"].pop("outputs"))):
        if not np.array_equal(right, wrong):
            raise AssertionError(f"{bug.variant.name}: prompt {i} decodes differently with the bug: it is not exact")
    return rows
