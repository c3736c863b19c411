"""main.py --draft_model_size early-exit: the target's first --exit_layer layers draft, through the command line.

A tiny target (test_cli.py's vocabulary, 4 layers) keeps it quick; the bundled target's early exit is checked in
test_drafters_early_exit.py.
"""

import json

import pytest

import main
from helpers import TARGET, assert_short_error, run_main, scaled_params, write_model

FOUR_LAYERS = {**TARGET, "n_layer": 4}


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    write_model(root / "target", FOUR_LAYERS, scaled_params(FOUR_LAYERS, seed=3))
    return root


def test_an_early_exit_run_gives_autoregressive_decodings_tokens_and_reports_its_costs(models_dir):
    result = run_main("--draft_model_size", "early-exit", "--target_model_size", "target", "--prompt", "the cat",
                      "--n_tokens_to_generate", "8", "--repeats", "1", "--temperature", "0", "--json",
                      models_dir=models_dir)
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout.strip().splitlines()[-1])
    assert output["draft"] == "early-exit" and output["exit_layer"] == 1  # a quarter of 4 layers
    speculative = output["speculative"]
    assert speculative["new_tokens"] == output["autoregressive"]["new_tokens"] and len(speculative["new_tokens"]) == 8
    assert speculative["drafted"] > 0 and speculative["tokens_per_target_call"] >= 1
    assert 0 < output["costs"]["cost_ratio"] and speculative["acceptance_rate"] is not None


def test_a_bad_exit_layer_gets_a_one_line_error(models_dir):
    result = run_main("--draft_model_size", "early-exit", "--target_model_size", "target", "--exit_layer", "4",
                      models_dir=models_dir)
    assert_short_error(result, "--exit_layer must be an integer in [1, 3] (the target has 4 layers), got 4")


@pytest.mark.parametrize("keywords, message", [
    (dict(draft_model_size="early-exit", exit_layer=0), r"--exit_layer must be an integer in \[1, 3\]"),
    (dict(draft_model_size="early-exit", exit_layer=2.5), r"--exit_layer must be an integer in \[1, 3\]"),
    (dict(exit_layer=2), "--exit_layer applies to --draft_model_size early-exit, not draft"),
    (dict(draft_model_size="early-exit", backend="jax"), "needs --backend numpy"),
    (dict(draft_model_size="early-exit", batch_size=2), "prompt-lookup or early-exit"),
])
def test_flags_that_do_not_go_with_an_early_exit_are_refused_before_loading(models_dir, keywords, message):
    keywords = {"draft_model_size": "draft", "target_model_size": "target", **keywords}
    with pytest.raises(ValueError, match=message):
        main.main(models_dir=str(models_dir), prompt="the", n_tokens_to_generate=4, **keywords)
