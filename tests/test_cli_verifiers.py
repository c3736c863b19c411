"""main.py --verifier: the verifiers beyond Algorithm 2 (verifiers/) reached from the command line and from
main.main, their flags checked together, their JSON keys and the report's words."""

import json

import numpy as np
import pytest

import gpt2
import main
import utils
from cli import flags, runs
from speedup.stats import SpeculativeStats
from helpers import PAIR, assert_short_error, run_main
from verifiers import block_speculative_sampling, multi_draft_speculative_sampling, tree_speculative_sampling

PROMPT = "the cat, the hat, the cat"
# (main's keywords, the verifier's decoder and the keywords it is called with); main's defaults filled in
CONFIGURATIONS = [
    ({"verifier": "block"}, block_speculative_sampling, {}),
    ({"verifier": "multi"}, multi_draft_speculative_sampling, {"n_drafts": 3, "replacement": False}),
    ({"verifier": "multi", "n_drafts": 2, "replacement": True}, multi_draft_speculative_sampling,
     {"n_drafts": 2, "replacement": True}),
    ({"verifier": "tree"}, tree_speculative_sampling, {"n_drafts": 3, "drafts": "sampled"}),
    ({"verifier": "tree", "tree_drafts": "top_k", "n_drafts": 2}, tree_speculative_sampling,
     {"n_drafts": 2, "drafts": "top_k"}),
    ({"verifier": "tree", "draft_model_size": "prompt-lookup"}, tree_speculative_sampling,
     {"n_drafts": 3, "drafts": "lookup"}),
]
IDS = ["block", "multi", "multi-replacement", "tree", "tree-top_k", "tree-lookup"]


def load_model(name, models_dir):  # -> (its encoder, gpt2.GPT2Model)
    encoder, hparams, params = utils.load_encoder_hparams_and_params(name, str(models_dir))
    return encoder, gpt2.GPT2Model(params, hparams)


def run_quietly(models_dir, capsys, **keywords):
    """main.main on the tiny pair of conftest's models_dir, its JSON swallowed: -> the result dict."""
    keywords = {"prompt": PROMPT, "draft_model_size": "draft", "target_model_size": "target",
                "models_dir": str(models_dir), "repeats": 1, "json": True, **keywords}
    result = main.main(**keywords)
    capsys.readouterr()
    return result


@pytest.mark.parametrize("keywords, decoder, decoder_keywords", CONFIGURATIONS, ids=IDS)
def test_every_verifier_gives_the_autoregressive_tokens_at_temperature_0(models_dir, capsys, keywords, decoder,
                                                                          decoder_keywords):
    result = run_quietly(models_dir, capsys, n_tokens_to_generate=10, K=3, temperature=0, **keywords)
    speculative = result["speculative"]
    assert speculative["new_tokens"] == result["autoregressive"]["new_tokens"]
    assert speculative["same_text_as_autoregressive"] is True
    # the flags as they ran, defaults filled in
    assert result["verifier"] == keywords["verifier"]
    assert result["n_drafts"] == decoder_keywords.get("n_drafts", 1)
    assert result["replacement"] is decoder_keywords.get("replacement", False)
    assert result["tree_drafts"] == decoder_keywords.get("drafts")
    assert speculative["tokens_per_target_call"] == 10 / speculative["target_calls"]
    if "draft_model_size" not in keywords:  # the tiny draft often agrees with its target; lookup finds little here
        assert speculative["tokens_per_target_call"] > 1
    assert 0 <= speculative["acceptance_rate"] <= 1
    assert speculative["draft_steps_per_token"] == speculative["draft_calls"] / 10
    assert speculative["expected_speedup"] is None  # Leviathan et al.'s formula models token verification only
    assert json.loads(json.dumps(result)) == result  # what --json prints


@pytest.mark.parametrize("keywords, decoder, decoder_keywords", CONFIGURATIONS, ids=IDS)
def test_the_speculative_decoder_is_the_verifiers_own(models_dir, capsys, monkeypatch, keywords, decoder,
                                                      decoder_keywords):
    """main calls the verifier's decoder with its keywords, and its tokens and counts at temperature 1 are the
    decoder's own, called directly."""
    calls = []

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return decoder(*args, **kwargs)

    monkeypatch.setattr(runs, decoder.__name__, spy)
    result = run_quietly(models_dir, capsys, n_tokens_to_generate=12, K=3, temperature=1.0, seed=4,
                         decoder="speculative", **keywords)
    assert len(calls) == 2  # the untimed run and one timed run
    assert all(decoder_keywords.items() <= call.items() for call in calls)
    encoder, target = load_model("target", models_dir)
    draft = None if "draft_model_size" in keywords else load_model("draft", models_dir)[1]  # a lookup tree: none
    prompt_ids = encoder.encode(PROMPT)
    stats = SpeculativeStats()
    x = decoder(prompt_ids, draft, target, 12, 3, rng=np.random.default_rng(4), temperature=1.0, stats=stats,
                **decoder_keywords)
    assert result["speculative"]["new_tokens"] == x[len(prompt_ids):].tolist()
    for counter in ("loops", "target_calls", "drafted", "accepted"):
        assert result["speculative"][counter] == getattr(stats, counter), counter


def test_K_auto_with_block_verification(models_dir, capsys):
    """--K auto drafts through sampling.draw_drafts, which block verification uses too."""
    result = run_quietly(models_dir, capsys, n_tokens_to_generate=12, K="auto", temperature=0, verifier="block")
    speculative = result["speculative"]
    assert speculative["new_tokens"] == result["autoregressive"]["new_tokens"]
    assert len(speculative["K_chosen"]) == speculative["loops"]


def test_the_report_names_the_verifier_and_what_its_numbers_mean(models_dir, capsys):
    common = dict(prompt=PROMPT, draft_model_size="draft", target_model_size="target", models_dir=str(models_dir),
                  n_tokens_to_generate=8, K=3, temperature=1.0, repeats=1, color=False, verbose=True)
    main.main(**common, verifier="block")
    out = capsys.readouterr().out
    assert "\nspeculative (block verification, K 3): " in out
    assert "for block verification not Algorithm 2's per-draft acceptance (verifiers/block.py)" in out
    assert "tokens per target call" in out and "Leviathan et al.'s formula models token verification" in out
    main.main(**common, verifier="multi", replacement=True)
    out = capsys.readouterr().out
    assert "\nspeculative (3 drafts by recursive rejection, drawn independently, K 3): " in out
    assert "draft steps per new token" in out and "tokens per target call" in out
    assert "scored one after the other on the CPU (one call in a batched engine)" in out
    main.main(**common, verifier="tree", tree_drafts="top_k", n_drafts=2)
    out = capsys.readouterr().out
    assert "\nspeculative (a token tree of the draft's 2 likeliest tokens per node, K 3): " in out
    assert "one after the other" not in out  # the NumPy model scores a tree in one forward pass
    main.main(**common)
    out = capsys.readouterr().out
    assert "\nspeculative (token verification, Algorithm 2, K 3): " in out and "Leviathan et al.'s alpha" in out


@pytest.mark.parametrize("keywords, message", [
    ({"verifier": "beam"}, "unknown --verifier 'beam': choose one of token, block, multi, tree"),
    ({"verifier": "block", "n_drafts": 3}, "--verifier block verifies one draft per loop: --n_drafts 3 needs"),
    ({"n_drafts": 2}, "--verifier token verifies one draft per loop"),
    ({"verifier": "multi", "n_drafts": 0}, "--n_drafts must be an integer >= 1"),
    ({"verifier": "tree", "n_drafts": 2.5}, "--n_drafts must be an integer >= 1"),
    ({"verifier": "multi", "K": "auto"}, "--K auto chooses one draft's K per loop"),
    ({"verifier": "tree", "K": "auto"}, "--K auto chooses one draft's K per loop"),
    ({"verifier": "block", "batch_size": 2}, "a batch verifies token by token"),
    ({"verifier": "block", "decoder": "autoregressive"}, "applies to the speculative decoder"),
    ({"replacement": True}, "--replacement applies to sampled drafts"),
    ({"verifier": "block", "replacement": True}, "--replacement applies to sampled drafts"),
    ({"verifier": "tree", "tree_drafts": "top_k", "replacement": True}, "--replacement applies to sampled drafts"),
    ({"verifier": "multi", "replacement": "yes"}, "--replacement takes no value"),
    ({"tree_drafts": "top_k"}, "--tree_drafts applies to --verifier tree"),
    ({"verifier": "tree", "tree_drafts": "bushy"}, "unknown --tree_drafts 'bushy'"),
    ({"verifier": "tree", "tree_drafts": "lookup"}, "--tree_drafts lookup needs --draft_model_size prompt-lookup"),
    ({"verifier": "tree", "tree_drafts": "sampled", "draft_model_size": "prompt-lookup"}, "needs a draft model"),
    ({"verifier": "multi", "draft_model_size": "prompt-lookup"}, "--verifier tree takes several matches"),
])
def test_bad_verifier_flags_are_refused_before_loading(keywords, message):
    # models_dir names no folder: a check that let these through would fail on loading instead
    keywords = {"draft_model_size": "draft", "target_model_size": "target", "models_dir": "no-such-folder",
                **keywords}
    with pytest.raises(ValueError) as error:
        main.main(**keywords)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("args, message", [
    (["--verifier", "block", "--n_drafts", "3"], "--verifier block verifies one draft per loop"),
    (["--verifier", "tree", "--K", "auto"], "--K auto chooses one draft's K per loop"),
    (["--verifier", "multi", "--batch_size", "2"], "a batch verifies token by token"),
    (["--replacement"], "--replacement applies to sampled drafts"),
])
def test_bad_verifier_flags_get_a_short_error(models_dir, args, message):
    assert_short_error(run_main(*PAIR, *args, models_dir=models_dir), message)


def test_the_verifier_flags_on_the_command_line(models_dir):
    given = flags.parse_arguments(["--verifier", "tree", "--n_drafts", "2", "--replacement", "--tree_drafts=sampled"])
    assert given == {"verifier": "tree", "n_drafts": "2", "replacement": "true", "tree_drafts": "sampled"}
    assert flags.fire_command(given) == ["--verifier='tree'", "--n_drafts=2", "--replacement", "--tree_drafts='sampled'"]
    assert flags.parse_arguments(["--noreplacement"]) == {"replacement": "false"}
    # fire's one-letter flags keep their meaning: -n and -r are not --n_drafts and --replacement
    assert flags.parse_arguments(["-n", "5", "-r", "2", "-v", "block"]) == {
        "n_tokens_to_generate": "5", "repeats": "2", "verifier": "block"}
    result = run_main(*PAIR, "--verifier", "multi", "--n_drafts", "2", "--replacement", "--temperature", "1",
                      "--n_tokens_to_generate", "6", "--repeats", "1", "--json", models_dir=models_dir)
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout.strip().splitlines()[-1])
    assert (output["verifier"], output["n_drafts"], output["replacement"], output["tree_drafts"]) == ("multi", 2, True,
                                                                                                      None)
    assert {"tokens_per_target_call", "acceptance_rate", "draft_steps_per_token"} <= output["speculative"].keys()
    assert output["autoregressive"]["tokens_per_target_call"] == 1.0


@pytest.mark.slow  # JAX compiles its programs: the slow tier
def test_a_verifier_on_the_jax_backend_runs_the_host_loop_on_jax_models(models_dir, capsys, monkeypatch):
    pytest.importorskip("jax")
    from jax_backend import gpt2_jax

    trees = []  # the target scores each loop's tree in one device call, as GPT2Model does
    tree_logits = gpt2_jax.JaxGPT2Model.tree_logits
    monkeypatch.setattr(gpt2_jax.JaxGPT2Model, "tree_logits",
                        lambda self, *args: trees.append(args) or tree_logits(self, *args))
    result = main.main(prompt=PROMPT, draft_model_size="draft", target_model_size="target", models_dir=str(models_dir),
                       n_tokens_to_generate=6, K=2, temperature=0, repeats=1, json=True, backend="jax",
                       verifier="tree")
    err = capsys.readouterr().err
    assert "note: --verifier tree runs its loop on the host" in err
    assert result["speculative"]["new_tokens"] == result["autoregressive"]["new_tokens"]
    assert trees and len(trees) == result["speculative"]["target_calls"] * 2  # an untimed run, then the timed one
