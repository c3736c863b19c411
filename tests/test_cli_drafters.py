"""main.py --draft_model_size eagle, medusa, kangaroo: the drafters made from the bundled target with the heads
tools/train_heads.py trained (models/teach-eagle, teach-medusa, teach-kangaroo), through the command line, and
eagle's and medusa's own tree (--verifier tree --tree_drafts dynamic). The heads' quality is not tested here, only
that at temperature 0 every run writes the autoregressive tokens and reports its costs, and that bad flags are
refused in one line."""

import shutil

import pytest

import main
from drafters.load import DEFAULT_N_NODES, HEAD_FOLDERS
from helpers import assert_short_error, run_main

PROMPT = "def add(a, b):"
# (main's keywords, the tree's budget it runs with)
CONFIGURATIONS = [
    ({"draft_model_size": "eagle"}, None),
    ({"draft_model_size": "medusa"}, None),
    ({"draft_model_size": "kangaroo"}, None),
    ({"draft_model_size": "eagle", "verifier": "tree", "tree_drafts": "dynamic"}, DEFAULT_N_NODES),
    ({"draft_model_size": "medusa", "verifier": "tree", "tree_drafts": "dynamic", "tree_nodes": 5}, 5),
]
IDS = ["eagle", "medusa", "kangaroo", "eagle-tree", "medusa-tree"]


@pytest.mark.parametrize("keywords, tree_nodes", CONFIGURATIONS, ids=IDS)
def test_each_drafter_writes_the_autoregressive_tokens_and_reports_its_costs(capsys, keywords, tree_nodes):
    result = main.main(prompt=PROMPT, n_tokens_to_generate=8, K=3, temperature=0, repeats=1, color=False, **keywords)
    out = capsys.readouterr().out
    speculative = result["speculative"]
    assert speculative["new_tokens"] == result["autoregressive"]["new_tokens"] and len(speculative["new_tokens"]) == 8
    assert "the same tokens as autoregressive decoding (at temperature 0 they must be)" in out
    assert result["draft"] == keywords["draft_model_size"] and result["tree_nodes"] == tree_nodes
    assert result["exit_layer"] is None  # early-exit's alone; kangaroo's comes from its head
    assert result["confidence_threshold"] == (0.6 if keywords["draft_model_size"] == "kangaroo" else None)
    # c, alpha and tokens per target call, from the drafter's own recorded time and the run's counts
    assert speculative["drafted"] > 0 and speculative["draft_seconds"] > 0 and speculative["cost_ratio"] > 0
    assert speculative["acceptance_rate"] is not None and f"alpha {speculative['acceptance_rate']:.3f}" in out
    assert speculative["tokens_per_target_call"] == 8 / speculative["target_calls"]
    assert result["costs"]["draft_step_seconds"] > 0  # a head's step is timed before the runs, not taken as free
    if tree_nodes is None:  # the formula models token verification
        assert speculative["expected_speedup"] > 0 and "the formula expects" in out
    else:
        assert speculative["expected_speedup"] is None and "formula models token verification, not" in out
        assert f"a token tree of {tree_nodes} nodes grown by {keywords['draft_model_size']}" in out


@pytest.mark.parametrize("name", ["eagle", "medusa"])
def test_eagle_and_medusa_read_the_jax_targets_features(capsys, name):
    result = main.main(prompt=PROMPT, n_tokens_to_generate=8, K=3, temperature=0, repeats=1, color=False,
                       draft_model_size=name, backend="jax")
    assert result["speculative"]["new_tokens"] == result["autoregressive"]["new_tokens"]
    assert result["speculative"]["acceptance_rate"] > 0  # the drafts read real features, not zeros


@pytest.mark.parametrize("keywords, message", [
    (dict(draft_model_size="kangaroo", backend="jax"), "--draft_model_size kangaroo shares the NumPy target's KV "
                                                       "cache: it needs --backend numpy"),
    (dict(draft_model_size="early-exit", backend="jax"), "needs --backend numpy"),
    (dict(draft_model_size="kangaroo", exit_layer=2), "--exit_layer applies to --draft_model_size early-exit, not "
                                                      "kangaroo"),
    (dict(draft_model_size="eagle", confidence_threshold=0.5), "^--confidence_threshold applies to --draft_model_size "
                                                               "kangaroo, not eagle$"),
    (dict(confidence_threshold=0.5), "^--confidence_threshold applies to --draft_model_size kangaroo, not "
                                     "teach-draft$"),
    (dict(draft_model_size="kangaroo", confidence_threshold=1.5),
     r"^--confidence_threshold must be a number in \[0, 1\], got 1.5$"),
    (dict(draft_model_size="kangaroo", confidence_threshold="high"), r"must be a number in \[0, 1\], got 'high'$"),
    (dict(draft_model_size="eagle", tree_nodes=4), "--tree_nodes applies to the tree eagle or medusa grow"),
    (dict(draft_model_size="medusa", verifier="tree", tree_nodes=4), "--tree_nodes applies to the tree"),
    (dict(draft_model_size="early-exit", verifier="tree", tree_drafts="top_k", tree_nodes=4), "--tree_nodes applies"),
    (dict(draft_model_size="eagle", verifier="tree", tree_drafts="dynamic", tree_nodes=0),
     "--tree_nodes must be an integer >= 1, got 0"),
    (dict(draft_model_size="kangaroo", verifier="tree", tree_drafts="dynamic"), "needs a drafter that grows its own"),
    (dict(draft_model_size="medusa", batch_size=2), "nor eagle, medusa or kangaroo"),
])
def test_flags_that_do_not_go_with_a_drafter_are_refused_before_loading(keywords, message):
    with pytest.raises(ValueError, match=message):
        main.main(prompt="the", n_tokens_to_generate=4, **keywords)


def test_a_bad_confidence_threshold_gets_a_one_line_error():
    result = run_main("--draft_model_size", "kangaroo", "--confidence_threshold", "1.5")
    assert_short_error(result, "--confidence_threshold must be a number in [0, 1], got 1.5")


@pytest.mark.parametrize("name", sorted(HEAD_FOLDERS))
def test_a_missing_head_names_the_tool_that_trains_it(tmp_path, name):
    result = run_main("--draft_model_size", name, "--target_model_size", "teach-target", models_dir=tmp_path)
    assert_short_error(result, f"--draft_model_size {name} reads its trained head from {tmp_path / HEAD_FOLDERS[name]}"
                               f", which is missing: train it with python tools/train_heads.py --drafter {name}")


def test_a_head_trained_on_another_target_is_refused_before_loading(tmp_path, models_dir):
    shutil.copytree(models_dir / "target", tmp_path / "target")  # conftest's tiny target, not the bundled one
    shutil.copytree(main.flags.BUNDLED_MODELS_DIR + "/teach-eagle", tmp_path / "teach-eagle")
    result = run_main("--draft_model_size", "eagle", "--target_model_size", "target", "--prompt", "the",
                      "--n_tokens_to_generate", "4", models_dir=tmp_path)
    assert_short_error(result, f"--draft_model_size eagle: its head ({tmp_path / 'teach-eagle'}) was trained on a "
                               "target of {'n_vocab': 4096")
