"""Each rule lives once (the simpler-core issue): the zoos' patches follow the code, not its comments; a drafter's
reported p is checked where it plugs in; prompt lookup's two uses share one matcher; every decoder beyond
Algorithm 2 takes speculative_sampling's positional arguments and the rest by keyword."""

import inspect
import io
import textwrap
import tokenize

import numpy as np
import pytest

import sampling
from classroom import bug_zoo, lossless, verifier_zoo
from speedup.drafts import PromptLookup
from verifiers import block_speculative_sampling, multi_draft_speculative_sampling, tree_speculative_sampling
from verifiers.tree import lookup_continuations

TARGET = lossless.random_context_table(4, 1)
VARIANTS = [*bug_zoo.ZOO.values(), *(bug.variant for bug in verifier_zoo.ZOO.values())]


def reworded(source, comment):  # -> source with every comment replaced by `comment`, or (None) removed with its line
    starts = {token.start[0] - 1: token.start[1] for token in tokenize.generate_tokens(io.StringIO(source).readline)
              if token.type == tokenize.COMMENT}
    lines = []
    for i, line in enumerate(source.splitlines(keepends=True)):
        if i not in starts:
            lines.append(line)
        elif comment is not None:
            lines.append(line[:starts[i]] + comment + "\n")
        elif line[:starts[i]].strip():  # code before the comment stays
            lines.append(line[:starts[i]].rstrip() + "\n")
    return "".join(lines)


@pytest.mark.parametrize("comment", [None, "# reworded", "# x = np.append(x, sample(q[K_n], rng))"])
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda variant: variant.name)
def test_every_zoo_patch_applies_whatever_the_comments_say(variant, comment, monkeypatch):
    getsource = inspect.getsource
    monkeypatch.setattr(inspect, "getsource", lambda thing: reworded(getsource(thing), comment))
    patched = variant.patched_functions()  # raises StalePatch where an anchor is gone
    for module, functions in patched.items():
        for name, source in functions.items():
            assert source != reworded(getsource(getattr(module, name)), comment)
            compile(source, name, "exec")


def test_a_patch_anchor_holds_no_comment():
    for variant in VARIANTS:
        for patch in variant.patches:
            tokens = tokenize.generate_tokens(io.StringIO(textwrap.dedent(patch.old).strip()).readline)
            assert not [token for token in tokens if token.type == tokenize.COMMENT], (variant.name, patch.old)


def test_a_patch_matches_code_lines_across_comment_lines():
    source = "def f(x):\n    y = x  # one\n    # a comment between\n\n    return y\n"
    patch = bug_zoo.Patch(sampling, "f", "y = x\nreturn y", "return x + 1")
    assert patch.apply(source, "demo") == "def f(x):\n    return x + 1\n"
    with pytest.raises(bug_zoo.StalePatch, match="no longer contains"):
        bug_zoo.Patch(sampling, "f", "y = x + 1", "").apply(source, "demo")
    with pytest.raises(bug_zoo.StalePatch, match="no longer contains"):  # comment text is not code
        bug_zoo.Patch(sampling, "f", "a comment between", "").apply(source, "demo")


class Reported:
    """A drafter (speedup/drafts.py's contract) proposing token 1 with the p it reports for it."""

    def __init__(self, p_token):
        self.p_token = p_token

    def propose(self, x, K, settings, rng, stats):
        p = np.full((K, 4), 0.25, dtype=np.float32)
        p[:, 1] = self.p_token
        return np.ones(K, dtype=np.int64), p


DECODERS = [sampling.speculative_sampling, block_speculative_sampling, multi_draft_speculative_sampling,
            tree_speculative_sampling]


@pytest.mark.parametrize("decoder", DECODERS, ids=lambda decoder: decoder.__name__)
@pytest.mark.parametrize("p_token", [0.0, 1.5, float("nan"), float("inf"), -0.25])
def test_a_drafted_token_with_an_impossible_p_raises_value_error(decoder, p_token):
    with pytest.raises(ValueError, match=r"a draft's p must be finite and in \(0, 1\]"):
        decoder([2, 0], Reported(p_token), lossless.TableCallable(TARGET), 4, 2, 0)


@pytest.mark.parametrize("p_token", [0.0, 2.0, float("nan")])
def test_a_fused_drafts_p_is_checked_too(p_token):
    with pytest.raises(ValueError, match="a draft's p must be"):
        sampling.speculative_sampling([2, 0], FusedDraft(p_token), lossless.TableCallable(TARGET), 4, 2, 0)


class FusedDraft:
    def __init__(self, p_token):
        self.reported = Reported(p_token)

    def draft(self, x, K, uniforms, temperature, top_k, top_p):
        return self.reported.propose(x, K, None, None, None)


@pytest.mark.parametrize("decoder", DECODERS, ids=lambda decoder: decoder.__name__)
@pytest.mark.parametrize("p_token", [1e-30, 0.25, 1.0, 1 + 2**-23])  # float32 rounding above 1 is no error
def test_a_drafted_token_with_a_possible_p_decodes(decoder, p_token):
    out = decoder([2, 0], Reported(p_token), lossless.TableCallable(TARGET), 4, 2, 0)
    assert len(out) == 6


def test_prompt_lookup_and_the_tree_share_one_matcher():
    rng = np.random.default_rng(0)
    for _ in range(300):
        x = rng.integers(0, 3, size=rng.integers(1, 14))
        K, m = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        latest = PromptLookup(3).lookup(x, K).tolist()
        continuations = lookup_continuations(x, K, m)
        assert latest == (list(continuations[0]) if continuations else [])
        assert len(continuations) <= m and len(set(continuations)) == len(continuations)


@pytest.mark.parametrize("decoder", DECODERS, ids=lambda decoder: decoder.__name__)
def test_every_decoder_takes_speculative_samplings_positional_arguments(decoder):
    parameters = inspect.signature(decoder).parameters
    positional = [name for name, parameter in parameters.items() if parameter.kind == parameter.POSITIONAL_OR_KEYWORD]
    assert positional == ["x", "draft_model", "target_model", "N", "K", "rng"]
    assert parameters["rng"].default is None
    if "n_drafts" in parameters:
        assert parameters["n_drafts"].kind == parameters["n_drafts"].KEYWORD_ONLY
