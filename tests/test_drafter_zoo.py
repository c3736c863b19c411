"""classroom/drafter_zoo.py: the drafters' bugs apply to today's code; the lossless violation is caught, the wiring
bugs are exact and not no-ops.

EAGLE's residual at the rejected token only (SafeAILab/EAGLE#20) moves the law: check_exact fails it on its tables and
on a tiny random GPT-2 driving an EAGLE head at the total variations the zoo quotes, and the chi-square sees it; at
temperature 0 it is exact. Each wiring bug keeps every decoder exact (the oracle passes it) and yet changes the
drafts' p somewhere; what it costs in acceptance needs trained heads (bench/drafter_zoo.py), so here
lost_acceptance is only run, on random heads, for its form and its exactness guard, and the bench on a few tokens of
the committed EAGLE head and random Medusa and EAGLE-3 heads, for its form and its skipping of a head that is not
there.
"""

import importlib.util
import inspect
import json

import numpy as np
import pytest

import gpt2
import sampling
from classroom import drafter_zoo, exact_law, lossless
from conftest import REPO
from drafters import eagle3
from drafters.eagle import EagleDraft, init_head
from drafters.heads import save_head
from drafters.medusa import MedusaDraft, init_heads
from gpt2_cases import random_params
from helpers import (BUNDLED_DRAFT_VOCABULARY, HPARAMS, TINY, GPT2Problem, TinyGPT2Context, as_lists,
                     random_target, split_prompts, write_eagle3_head)
from speedup.stats import SpeculativeStats

NAMES = list(drafter_zoo.ZOO)


def random_head(kind, hparams, seed):  # weights scaled up, so that the head's p is far from uniform
    rng = np.random.default_rng(seed)
    if kind == "eagle":
        return scaled_eagle_head(init_head(hparams, rng))
    if kind == "eagle3":  # one tap, after block 1 of 2; every other id drafted
        vocabulary = np.arange(0, hparams["n_vocab"], 2)
        head = eagle3.init_head(hparams, rng, len(vocabulary), n_taps=1)
        head["midlayer"] = scaled_eagle_head(head["midlayer"])
        head["fc"]["w"], head["lm_head"]["w"] = 10 * head["fc"]["w"], 10 * head["lm_head"]["w"]
        head["norm"] = {"g": (1 + 0.5 * rng.standard_normal(hparams["n_embd"])).astype(np.float32),  # as if trained
                        "b": (0.5 * rng.standard_normal(hparams["n_embd"])).astype(np.float32)}
        return drafter_zoo.Eagle3Head(head, eagle3.vocabulary_d2t(vocabulary).tolist(), (1,))
    heads = init_heads(hparams, 3, rng)  # Medusa's w starts at zero: random, so that the heads disagree
    for head in heads["heads"]:
        head["w"] = (4 * rng.standard_normal(head["w"].shape) / np.sqrt(hparams["n_embd"])).astype(np.float32)
    return heads


def scaled_eagle_head(head):  # EAGLE's head (EAGLE-3's midlayer) with fc and attention that matter
    head["fc"]["w"] = 10 * head["fc"]["w"]
    head["block"]["attn"]["c_attn"]["w"] = 10 * head["block"]["attn"]["c_attn"]["w"]
    return head


def tiny_problems(drafter_class, kind):  # temperature 1, and greedy over two loops (a kept or rebuilt cache)
    head = random_head(kind, TINY, 5)

    def drafter(target):  # the drafter on the oracle's fresh target, for every run
        return drafter_zoo.build(drafter_class, target, head)

    context = TinyGPT2Context(random_params(TINY, 3))
    return [GPT2Problem(f"tiny GPT-2, {kind} head, K=2, N=3", drafter, context, (1, 2), 3, 2,
                        sampling.SamplingSettings(), True, 0),
            GPT2Problem(f"tiny GPT-2, {kind} head, K=3, N=4, greedy", drafter, context, (2, 2), 4, 3, sampling.GREEDY,
                        True, 0, n_joint=4)]


# ---- the lossless violation: EAGLE's residual at the rejected token only ----------------------------------------

RESIDUAL = drafter_zoo.RESIDUAL_AT_REJECTED_TOKEN


def test_the_residual_bug_patches_the_correction_of_algorithm_2():
    diff = RESIDUAL.diff()
    assert "--- a/sampling.py" in diff and "(bug)" in diff and "\n-" in diff
    assert RESIDUAL.decoder() is not sampling.speculative_sampling and "SafeAILab/EAGLE#20" in RESIDUAL.source


@pytest.mark.parametrize("problems", ["tables", "eagle"])
def test_check_exact_fails_the_residual_bug_at_the_total_variation_the_zoo_quotes(problems):
    chosen = None if problems == "tables" else tiny_problems(EagleDraft, "eagle")[:1]
    check = exact_law.check_exact(RESIDUAL.decoder(), problems=chosen)
    assert not check.passed, check.report
    assert check.max_tv == pytest.approx(drafter_zoo.RESIDUAL_EXACT_TV[problems], abs=5e-4), check.report
    assert f"{check.max_tv:.3f}" in RESIDUAL.effect


def test_check_lossless_catches_the_residual_bug():
    result = lossless.check_lossless(RESIDUAL.decoder(), stop_at_failure=True)
    assert not result.passed and result.p_value < 1e-3, result.report


def test_the_residual_bug_is_exact_at_temperature_0_where_p_is_one_hot():
    check = exact_law.check_exact(RESIDUAL.decoder(), problems=tiny_problems(EagleDraft, "eagle")[1:])
    assert check.passed, check.report


# ---- the wiring bugs: exact, and not no-ops ---------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_every_wiring_bug_patches_todays_drafter_in_a_subclass_and_leaves_the_class_alone(name):
    bug = drafter_zoo.ZOO[name]
    patched = bug.patched_drafter()  # raises StalePatch if a line it replaces is gone
    assert issubclass(patched, bug.drafter) and patched is not bug.drafter
    path = bug.drafter.__module__.replace(".", "/") + ".py"
    diff = bug.variant.diff()
    assert f"--- a/{path}" in diff and "(bug)" in diff and "\n+" in diff
    for patch in bug.variant.patches:
        method = patch.function.rpartition(".")[2]
        assert getattr(patched, method) is not getattr(bug.drafter, method)
        assert "(bug)" not in inspect.getsource(getattr(bug.drafter, method))


@pytest.mark.parametrize("name", NAMES)
def test_the_exact_oracle_passes_every_wiring_bug(name):
    bug = drafter_zoo.ZOO[name]
    check = exact_law.check_exact(sampling.speculative_sampling,
                                  problems=tiny_problems(bug.patched_drafter(), bug.kind))
    assert check.passed, check.report
    assert check.results[0].paths > 1  # the draws did branch


def two_proposals(drafter_class, kind, target):  # -> p of a proposal after x, then after a verification kept 2
    drafter = drafter_zoo.build(drafter_class, target, random_head(kind, TINY, 5))
    settings = sampling.SamplingSettings()
    x = np.array([1, 2, 0, 3])
    drafts, first = drafter.propose(x, 3, settings, np.random.default_rng(0), SpeculativeStats())
    after = np.concatenate([x, [1, 0], [2]])  # as if the verification kept two drafts, then corrected the third
    if kind == "eagle":  # EAGLE's chain drafts 3: keep its own first two, so that its drafted pairs are at stake
        after = np.concatenate([x, drafts[:2], [(drafts[2] + 1) % TINY["n_vocab"]]])
    _, second = drafter.propose(after, 3, settings, np.random.default_rng(1), SpeculativeStats())
    return first, second


@pytest.mark.parametrize("name", NAMES)
def test_every_wiring_bug_changes_the_drafts_p_on_a_tiny_gpt2(name):
    bug = drafter_zoo.ZOO[name]
    target = gpt2.GPT2Model(random_params(TINY, 3), TINY)
    right = two_proposals(bug.drafter, bug.kind, target)
    target.reset()
    wrong = two_proposals(bug.patched_drafter(), bug.kind, target)
    differences = [np.abs(a - b).max() for a, b in zip(right, wrong)]
    assert max(differences) > 1e-4, differences  # float32 rounding alone moves p by about 1e-7
    if name == "draft_cache_not_rebuilt":  # only a proposal after a verification reads the kept drafted pairs
        assert differences[0] == 0  # and the same computation agrees to the bit


def test_lost_acceptance_measures_both_wirings_greedily_and_they_decode_alike():
    target, prompts = gpt2.GPT2Model(random_target(), HPARAMS), [[3, 1, 4, 1, 5], [9, 2, 6]]
    for name in NAMES:
        bug = drafter_zoo.ZOO[name]
        rows = drafter_zoo.lost_acceptance(bug, target, random_head(bug.kind, HPARAMS, 0), prompts, N=8, K=3)
        assert set(rows) == {"right", "with_bug"}
        for row in rows.values():
            assert 0 <= row["alpha"] <= 1 and 1 <= row["tokens_per_target_call"] <= 4


def test_lost_acceptance_refuses_an_unknown_bug_and_a_bug_that_changes_the_tokens(monkeypatch):
    target, bug = gpt2.GPT2Model(random_target(), HPARAMS), drafter_zoo.ZOO["one_shared_medusa_block"]
    with pytest.raises(ValueError, match="unknown drafter bug 'nope'"):
        drafter_zoo.lost_acceptance("nope", target, None, [[1, 2]])
    real = sampling.speculative_sampling

    def tokens_by_wiring(x, drafter, *args, **kwargs):  # a decoder whose output would depend on the drafter
        return np.append(real(x, drafter, *args, **kwargs), int(type(drafter) is not MedusaDraft))

    monkeypatch.setattr(sampling, "speculative_sampling", tokens_by_wiring)
    with pytest.raises(AssertionError, match="one_shared_medusa_block: prompt 0 decodes differently"):
        drafter_zoo.lost_acceptance(bug, target, random_head("medusa", HPARAMS, 0), [[1, 2, 3]], N=4, K=2)


# ---- bench/drafter_zoo.py, on the bundled target ----------------------------------------------------------------


def run_bench(capsys, *argv):  # -> the JSON object bench/drafter_zoo.py prints
    spec = importlib.util.spec_from_file_location("bench_drafter_zoo", REPO / "bench" / "drafter_zoo.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.main(["--n_prompts", "1", "--prompt_tokens", "16", "--n_tokens", "6", "--K", "2", *argv])
    return json.loads(capsys.readouterr().out.splitlines()[-1])


def test_the_bench_measures_the_bugs_whose_heads_it_finds_and_skips_the_others(capsys, tmp_path, monkeypatch):
    read, lost_acceptance = [], drafter_zoo.lost_acceptance
    monkeypatch.setattr(drafter_zoo, "lost_acceptance", lambda bug, target, head, prompts, **counts: read.append(
        as_lists(prompts)) or lost_acceptance(bug, target, head, prompts, **counts))
    report = run_bench(capsys, "--bugs", "feature_off_by_one")
    assert read == [split_prompts("test", 1, 16)]  # it chooses nothing: the test split's prompts alone
    assert report["split"] == report["prompts"]["split"] == "test" and report["prompts"]["ids"] == ["open-00"]
    (row,) = report["by_bug"]
    assert report["machine"].startswith("machine: ") and row["bug"] == "feature_off_by_one"
    for wiring in ("right", "with_bug"):
        assert 1 <= row[wiring]["tokens_per_target_call"] <= 3
    assert row["lost_tokens_per_target_call"] == pytest.approx(
        row["right"]["tokens_per_target_call"] - row["with_bug"]["tokens_per_target_call"])
    (tmp_path / "teach-target").symlink_to(REPO / "models" / "teach-target")  # the target, random Medusa and EAGLE-3
    hparams = json.loads((REPO / "models" / "teach-target" / "hparams.json").read_text())
    save_head(tmp_path / "teach-medusa", random_head("medusa", hparams, 0),
              {"drafter": "medusa", "target": "teach-target", "target_hparams": hparams})
    write_eagle3_head(tmp_path / "teach-eagle3", hparams, BUNDLED_DRAFT_VOCABULARY[:256])
    medusa, *eagle3, eagle = run_bench(capsys, "--models_dir", str(tmp_path), "--bugs", "one_shared_medusa_block,"
                                       "d2t_dropped,wrong_layers_fused,readout_normed_twice,draft_cache_not_rebuilt"
                                       )["by_bug"]
    for row in (medusa, *eagle3):
        assert row["with_bug"]["tokens_per_target_call"] >= 1 and "skipped" not in row
    assert [row["drafter"] for row in eagle3] == ["eagle3"] * 3
    assert "head.safetensors, head.json missing" in eagle["skipped"] and "right" not in eagle


def test_the_bench_refuses_an_unknown_bug(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_bench(capsys, "--bugs", "nope")
    assert exit_info.value.code == 2 and "unknown bug 'nope'" in capsys.readouterr().err


def test_the_readme_quotes_the_zoo():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert f"({drafter_zoo.RESIDUAL_EXACT_TV['tables']:.3f} in total variation on the tables)" in text
    assert len(drafter_zoo.BUGS) == 7 and "seven wiring mistakes" in text
