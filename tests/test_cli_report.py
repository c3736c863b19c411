"""main.py's report leads with the answer in a few short lines, prints a text once where the decoders wrote the
same tokens, keeps its costs and engine for --verbose, and says what is about to run before any model loads;
--json's vocabulary stays what it was."""

import io
import json

import pytest

import main
from cli import report
from helpers import MODELS, run_main

# what --json carried before the report was reshaped (cli/report.py): its vocabulary must not change
RESULT_KEYS = {"prompt", "draft", "target", "K", "temperature", "top_k", "top_p", "seed", "n_tokens", "repeats",
               "backend", "dtype", "verifier", "n_drafts", "replacement", "tree_drafts", "exit_layer", "tree_nodes",
               "confidence_threshold", "costs", "autoregressive", "speculative", "assisted", "speedup", "engine"}
SPECULATIVE_KEYS = {"tokens", "new_tokens", "text", "seconds", "seconds_per_run", "target_calls",
                    "tokens_per_target_call", "acceptance_rate", "accepted", "accepted_per_loop", "bonus",
                    "copied_fraction", "corrected", "cost_ratio", "decode_step_seconds", "draft_calls", "draft_seconds",
                    "draft_step_seconds", "draft_steps_per_token", "drafted", "expected_speedup",
                    "expected_speedup_one_step", "loops", "plain_steps", "rejected", "same_text_as_autoregressive",
                    "speedup", "speedup_range", "target_seconds", "verify_seconds", "verify_steps"}
AUTOREGRESSIVE_KEYS = {"tokens", "new_tokens", "text", "seconds", "seconds_per_run", "target_calls",
                       "tokens_per_target_call"}
COSTS_KEYS = {"decode_step_seconds", "draft_step_seconds", "cost_ratio", "verify_steps", "break_even_alpha",
              "break_even_K"}
ENGINE_KEYS = {"threads", "target_layouts", "peak_memory_bytes"}
BATCH_KEYS = RESULT_KEYS - {"costs", "assisted"} | {"batch_size"}
BATCH_SPECULATIVE_KEYS = {"seconds", "seconds_per_run", "tokens_per_second", "target_calls", "rows", "loops", "speedup",
                          "speedup_range",
                          "draft_calls", "acceptance_rate", "tokens_per_target_call", "drafted", "accepted", "rejected"}
BATCH_ROW_KEYS = {"tokens", "new_tokens", "text", "loops", "target_calls", "draft_calls", "drafted", "accepted",
                  "rejected", "acceptance_rate", "tokens_per_target_call", "corrected", "bonus"}
COST_WORDS = ["this run's costs: a target decode step", "measured before the runs (costs.py", "engine: ",
              "drafted: ", "if a verification cost one decode step"]


def report_of(capsys, **keywords):
    """main.main on the bundled pair, greedy, 16 tokens, one timed run: -> (its report, its result)."""
    result = main.main(K=4, temperature=0, n_tokens_to_generate=16, repeats=1, **keywords)
    return capsys.readouterr().out, result


def the_kits_lines(out, result):
    """The report's lines but the text's own (the prompt and the generated tokens, printed as they are)."""
    text = result["prompt"] + result["speculative"]["text"]
    assert out.count(text) == 1  # the same tokens from both decoders: the text once
    return out.replace(text, "").splitlines()


def test_the_default_report_leads_with_the_answer_in_short_lines(capsys):
    out, result = report_of(capsys)
    lines = out.splitlines()
    assert result["speculative"]["new_tokens"] == result["autoregressive"]["new_tokens"]
    assert len(lines) <= 25, out
    assert all(len(line) <= report.WIDTH for line in the_kits_lines(out, result)), out
    assert lines[0].startswith("teach-draft drafting for teach-target, K 4, temperature 0, seed 123, 16 tokens")
    assert lines[1].startswith("speculative: speedup ") and "(median of 1 paired runs" in lines[1]
    assert lines[2].strip() == "the same tokens as autoregressive decoding (at temperature 0 they must be)"
    alpha = result["speculative"]["acceptance_rate"]
    assert lines[3].strip() == (f"acceptance rate alpha {alpha:.3f} = accepted / (accepted + rejected); "
                                f"{result['speculative']['tokens_per_target_call']:.2f} tokens per target call")
    assert lines[4].strip().startswith(f"the formula expects {result['speculative']['expected_speedup']:.2f}x at "
                                       "this run's alpha and costs, ")
    assert "at those measured before" in lines[4] and "the loop's own work" in lines[5]
    for words in COST_WORDS:
        assert words not in out, words


def test_verbose_adds_the_counts_costs_and_engine_in_short_lines(capsys):
    out, result = report_of(capsys, verbose=True)
    for words in COST_WORDS:
        assert words in out, words
    assert all(len(line) <= report.WIDTH for line in the_kits_lines(out, result)), out


def test_the_texts_are_both_printed_where_they_differ(models_dir, capsys):
    result = main.main(prompt="the", draft_model_size="draft", target_model_size="target", models_dir=str(models_dir),
                       n_tokens_to_generate=12, temperature=1.0, seed=3, repeats=1, decoder="speculative,autoregressive")
    out = capsys.readouterr().out
    texts = {name: result["prompt"] + result[name]["text"] for name in ("autoregressive", "speculative")}
    if result["speculative"]["new_tokens"] == result["autoregressive"]["new_tokens"]:
        pytest.skip("this seed sampled the same tokens twice")
    assert all(out.count(text) == 1 for text in texts.values())
    assert "other tokens than autoregressive decoding" in out


def test_the_json_vocabulary_is_unchanged(models_dir, capsys):
    common = dict(draft_model_size="draft", target_model_size="target", models_dir=str(models_dir),
                  n_tokens_to_generate=6, repeats=1, json=True)
    result = main.main(prompt="the cat", decoder="autoregressive,speculative,assisted", temperature=0, **common)
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == json.loads(json.dumps(result)) and set(result) == RESULT_KEYS
    assert set(result["speculative"]) == set(result["assisted"]) == SPECULATIVE_KEYS
    assert set(result["autoregressive"]) == AUTOREGRESSIVE_KEYS
    assert set(result["costs"]) == COSTS_KEYS and set(result["engine"]) == ENGINE_KEYS
    batch = main.main(prompt=["the cat", "a"], **common)
    capsys.readouterr()
    assert set(batch) == BATCH_KEYS and set(batch["engine"]) == ENGINE_KEYS
    assert set(batch["speculative"]) == BATCH_SPECULATIVE_KEYS and set(batch["speculative"]["rows"][0]) == BATCH_ROW_KEYS
    assert set(batch["autoregressive"]) == {"seconds", "seconds_per_run", "tokens_per_second", "target_calls", "rows"}
    assert set(batch["autoregressive"]["rows"][0]) == {"tokens", "new_tokens", "text", "target_calls"}


def test_the_batch_report_is_short_too(models_dir):
    result = run_main(*MODELS, "--prompt", "the cat", "--prompt", "a", "--n_tokens_to_generate", "6", "--repeats", "1",
                      "--temperature", "0", models_dir=models_dir)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("a batch of 2 rows: draft drafting for target") and "seeds 123..124" in lines[0]
    assert lines[1].startswith("speedup ") and "alpha" in lines[1]
    assert all(len(line) <= report.WIDTH for line in lines if not line.startswith(("the cat", "a")))
    verbose = run_main(*MODELS, "--prompt", "the cat", "--prompt", "a", "--n_tokens_to_generate", "6", "--repeats",
                       "1", "--temperature", "0", "--verbose", models_dir=models_dir)
    assert "the rows alone: " in verbose.stdout and "engine: " in verbose.stdout
    assert "engine: " not in result.stdout


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_terminal_is_told_what_runs_before_any_model_loads(models_dir, monkeypatch):
    keywords = dict(prompt="the", draft_model_size="draft", target_model_size="corrupt", models_dir=str(models_dir),
                    n_tokens_to_generate=3, K=2, repeats=2)
    for stderr, announced in [(Terminal(), "Decoding 3 tokens with draft drafting for corrupt, K 2, temperature 0.0; "
                                           "3 runs of each decoder ...\n"),
                              (io.StringIO(), "")]:  # not a terminal: stderr keeps only errors
        monkeypatch.setattr("sys.stderr", stderr)
        with pytest.raises((ValueError, OSError), match="corrupt"):  # the checkpoint fails to load, after the line
            main.main(**keywords)
        assert stderr.getvalue() == announced


@pytest.mark.parametrize("tree_drafts, words", [
    (None, "12 drafted tokens (up to 3 drafts per loop"),  # multi
    ("sampled", "12 drafted tokens (up to 3 drafts per loop"),
    ("top_k", "12 tree nodes drafted (up to 3 children a node"),
    ("dynamic", "12 tree nodes drafted (up to 3 children a node"),
    ("lookup", "12 tree nodes drafted (up to 3 prompt-lookup matches per loop"),
])
def test_verbose_counts_a_trees_nodes_in_the_trees_own_unit(tree_drafts, words):
    assert report.drafted_words(12, 3, tree_drafts) == words
