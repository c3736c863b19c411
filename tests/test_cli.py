"""main.py from the command line: a successful --json run on a tiny pair, and every bad input
answered by a one- or two-line error and a nonzero exit status, never a traceback."""

import json
import re
import shutil
import statistics

import pytest

import main
from cli import flags, report, runs
from conftest import REPO
from encoder import get_encoder_from_dir
from cli import backends
from helpers import MODELS, PAIR, TARGET, assert_short_error, run_main, scaled_params


def test_json_run_on_a_tiny_pair(models_dir):
    n_tokens = 20
    result = run_main(*MODELS, "--prompt", "the cat, the hat", "--n_tokens_to_generate", str(n_tokens), "--K", "3",
                      "--temperature", "0", "--decoder", "autoregressive,speculative,assisted", "--repeats", "3",
                      "--json", models_dir=models_dir)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    output = json.loads(result.stdout.strip().splitlines()[-1])
    assert {"prompt", "draft", "target", "K", "temperature", "top_k", "top_p", "seed", "n_tokens", "repeats",
            "autoregressive", "speculative", "speedup"} <= output.keys()
    assert output["repeats"] == 3
    assert output["prompt"] == "the cat, the hat" and output["n_tokens"] == n_tokens and output["K"] == 3
    assert set(output["autoregressive"]) >= {"tokens", "new_tokens", "text", "seconds", "target_calls"}
    assert set(output["speculative"]) >= {"tokens", "new_tokens", "text", "seconds", "target_calls", "draft_calls",
                                          "drafted", "accepted", "rejected", "acceptance_rate", "expected_speedup",
                                          "speedup", "speedup_range", "seconds_per_run"}
    encoder = get_encoder_from_dir(models_dir / "target")
    for name in ["autoregressive", "speculative", "assisted"]:
        tokens = output[name]["new_tokens"]
        assert len(tokens) == n_tokens and all(isinstance(token, int) for token in tokens)
        assert output[name]["tokens"] == encoder.encode("the cat, the hat") + tokens  # as a batch row's
        assert output[name]["text"] == encoder.decode(tokens)
        assert tokens == output["autoregressive"]["new_tokens"]  # greedy: every decoder gives the target's tokens
    assert output["autoregressive"]["target_calls"] == n_tokens
    assert output["speculative"]["target_calls"] < n_tokens
    for name in ["autoregressive", "speculative", "assisted"]:  # the median of the timed runs, one run per repeat
        assert len(output[name]["seconds_per_run"]) == 3
        assert output[name]["seconds"] == statistics.median(output[name]["seconds_per_run"])
    for name in ["speculative", "assisted"]:  # the median of the paired ratios, and their range
        ratios = [ar / seconds for ar, seconds in zip(output["autoregressive"]["seconds_per_run"],
                                                      output[name]["seconds_per_run"])]
        assert output[name]["speedup"] == pytest.approx(statistics.median(ratios))
        assert output[name]["speedup_range"] == pytest.approx([min(ratios), max(ratios)])
    assert output["speedup"] == output["speculative"]["speedup"]
    # the costs: this machine's (costs.py, before the runs) and each run's, in decode steps, with the formula
    measured = output["costs"]
    assert len(measured["verify_steps"]) == 16 and measured["verify_steps"][0] == 1.0
    assert measured["decode_step_seconds"] > 0 and measured["cost_ratio"] > 0
    for name in ["speculative", "assisted"]:
        run = output[name]
        assert run["decode_step_seconds"] == pytest.approx(output["autoregressive"]["seconds"] / n_tokens, rel=0.5)
        assert run["cost_ratio"] == pytest.approx(run["draft_step_seconds"] / run["decode_step_seconds"])
        assert run["verify_steps"] == pytest.approx(run["verify_seconds"] / run["decode_step_seconds"])
        assert run["expected_speedup"] < run["expected_speedup_one_step"] or run["verify_steps"] <= 1
        assert run["same_text_as_autoregressive"] is True
        assert run["accepted"] + run["corrected"] + run["bonus"] + run["plain_steps"] == n_tokens


def test_K_auto_and_prompt_lookup_give_the_autoregressive_tokens(models_dir):
    common = [*MODELS, "--prompt", "the cat, the hat, the cat, the", "--n_tokens_to_generate", "16", "--temperature", "0",
              "--repeats", "1", "--json"]
    auto = run_main(*common, "--K", "auto", models_dir=models_dir)
    assert auto.returncode == 0, auto.stderr
    output = json.loads(auto.stdout.strip().splitlines()[-1])
    assert output["K"] == "auto" and output["speculative"]["same_text_as_autoregressive"]
    chosen = output["speculative"]["K_chosen"]
    assert len(chosen) == output["speculative"]["loops"] and all(0 <= K <= runs.AUTO_K_MAX for K in chosen)
    lookup = run_main(*common[2:], "--target_model_size", "target", "--draft_model_size", "prompt-lookup",
                      "--decoder", "autoregressive,speculative,assisted", models_dir=models_dir)
    assert lookup.returncode == 0, lookup.stderr
    output = json.loads(lookup.stdout.strip().splitlines()[-1])
    assert output["draft"] == "prompt-lookup" and output["costs"]["draft_step_seconds"] == 0
    for name in ["speculative", "assisted"]:
        assert output[name]["new_tokens"] == output["autoregressive"]["new_tokens"]
        assert 0 <= output[name]["copied_fraction"] <= 1


def test_the_report_explains_the_run(models_dir):
    report = run_main(*PAIR, "--n_tokens_to_generate", "16", "--temperature", "0", "--repeats", "1", "--verbose",
                      models_dir=models_dir)
    assert report.returncode == 0, report.stderr
    for words in ["bonus tokens", "this run's costs: a target decode step", "(the autoregressive run's time per token)",
                  "(draft step / decode step in these runs)", "decode steps", "the formula expects",
                  "if a verification cost one decode step", "the same tokens as autoregressive decoding",
                  "measured before the runs (costs.py"]:
        assert words in report.stdout, words
    lookup = run_main("--target_model_size", "target", "--draft_model_size", "prompt-lookup", "--prompt", "the the the",
                      "--n_tokens_to_generate", "8", "--repeats", "1", models_dir=models_dir)
    assert lookup.returncode == 0, lookup.stderr
    assert "of the continuation's 4-grams are copied from the prompt" in lookup.stdout


@pytest.mark.slow  # JAX compiles its programs: the slow tier
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_jax_backend_gives_the_numpy_backends_greedy_tokens(models_dir, dtype):
    args = [*PAIR, "--n_tokens_to_generate", "12", "--K", "3", "--temperature", "0", "--json"]
    jax_run = run_main(*args, "--backend", "jax", "--dtype", dtype, models_dir=models_dir)
    assert jax_run.returncode == 0, jax_run.stderr
    jax_output = json.loads(jax_run.stdout.strip().splitlines()[-1])
    assert jax_output["backend"] == "jax" and jax_output["dtype"] == dtype
    assert jax_output["speculative"]["new_tokens"] == jax_output["autoregressive"]["new_tokens"]
    # one line each, before the wait: the first runs compile; bfloat16 on a CPU is emulated
    import jax

    notes = [line for line in jax_run.stderr.splitlines() if line.startswith("note:")]
    assert notes[0].startswith("note: --backend jax compiles")
    bfloat16_emulated = dtype == "bfloat16" and jax.default_backend() == "cpu"
    assert len(notes) == 1 + bfloat16_emulated
    assert ("bfloat16 is emulated on CPUs" in jax_run.stderr) == bfloat16_emulated
    if dtype == "float32":  # bfloat16 rounds the logits: its greedy tokens may differ from float32's
        numpy_run = run_main(*args, models_dir=models_dir)
        assert numpy_run.returncode == 0, numpy_run.stderr
        numpy_output = json.loads(numpy_run.stdout.strip().splitlines()[-1])
        assert jax_output["autoregressive"]["new_tokens"] == numpy_output["autoregressive"]["new_tokens"]


def test_text_report_colours_only_when_asked(models_dir):
    plain = run_main(*PAIR, "--n_tokens_to_generate", "12", models_dir=models_dir)
    assert plain.returncode == 0, plain.stderr
    assert "\x1b[" not in plain.stdout and "speedup" in plain.stdout and "acceptance rate" in plain.stdout
    coloured = run_main(*PAIR, "--n_tokens_to_generate", "12", "--color", models_dir=models_dir,
                        env={"NO_COLOR": "1"})  # --color overrides NO_COLOR
    assert coloured.returncode == 0, coloured.stderr
    assert "\x1b[32m" in coloured.stdout and "legend" in coloured.stdout


class Terminal:
    def isatty(self):
        return True


@pytest.mark.parametrize("no_color, color, expected", [
    (None, None, True), ("1", None, False), ("", None, True),  # no-color.org: set and not empty disables colour
    ("1", True, True), (None, False, False),  # --color and --nocolor decide whatever NO_COLOR says
])
def test_no_color_turns_colour_off_on_a_terminal_unless_color_is_given(monkeypatch, no_color, color, expected):
    monkeypatch.setattr(report.sys, "stdout", Terminal())
    if no_color is None:
        monkeypatch.delenv("NO_COLOR", raising=False)
    else:
        monkeypatch.setenv("NO_COLOR", no_color)
    assert report.wants_colour(color) is expected


def test_text_report_names_the_rejected_drafts_and_what_alpha_counts(models_dir):
    args = [*PAIR, "--n_tokens_to_generate", "30", "--K", "6", "--temperature", "0", "--repeats", "2"]
    text = run_main(*args, "--verbose", models_dir=models_dir)  # the counts are --verbose's
    output = json.loads(run_main(*args, "--json", models_dir=models_dir).stdout.strip().splitlines()[-1])
    assert text.returncode == 0, text.stderr
    run = output["speculative"]
    counts = re.search(r"(\d+) drafted: (\d+) accepted, (\d+) rejected, (\d+) never judged", text.stdout)
    assert counts, text.stdout
    drafted, accepted, rejected, never_judged = map(int, counts.groups())
    assert (drafted, accepted, rejected) == (run["drafted"], run["accepted"], run["rejected"])
    assert rejected > 0 and never_judged > 0  # this run exercises both kinds of drafts that were not accepted
    assert drafted == accepted + rejected + never_judged
    alpha = float(re.search(r"acceptance rate alpha ([0-9.]+) = accepted / \(accepted \+ rejected\)", text.stdout)[1])
    assert alpha == pytest.approx(accepted / (accepted + rejected), abs=5e-4)
    assert re.search(r"speedup [0-9.]+x measured \(median of 2 paired runs, [0-9.]+-[0-9.]+x\)", text.stdout)


def test_without_the_autoregressive_decoder_the_speedup_is_not_measured(models_dir):
    result = run_main(*PAIR, "--n_tokens_to_generate", "8", "--decoder", "speculative", "--repeats", "1",
                      models_dir=models_dir)
    assert result.returncode == 0, result.stderr
    assert "speedup not measured" in result.stdout and "n/a" not in result.stdout
    output = json.loads(run_main(*PAIR, "--n_tokens_to_generate", "8", "--decoder", "speculative", "--repeats", "1",
                                 "--json", models_dir=models_dir).stdout.strip().splitlines()[-1])
    assert output["speedup"] is None and output["speculative"]["speedup_range"] is None
    assert output["autoregressive"] is None


def test_the_bundled_models_are_found_from_any_directory(tmp_path):
    result = run_main("--n_tokens_to_generate", "4", "--repeats", "1", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout.strip().splitlines()[-1])
    assert output["draft"] == "teach-draft" and len(output["speculative"]["new_tokens"]) == 4


def test_a_given_models_dir_is_relative_to_the_current_directory(models_dir, tmp_path):
    (tmp_path / "here" / "my-models").mkdir(parents=True)
    for name in ("draft", "target"):
        shutil.copytree(models_dir / name, tmp_path / "here" / "my-models" / name)
    args = [*PAIR, "--models_dir", "my-models", "--n_tokens_to_generate", "4", "--repeats", "1", "--json"]
    result = run_main(*args, cwd=tmp_path / "here")
    assert result.returncode == 0, result.stderr
    assert_short_error(run_main(*args, cwd=tmp_path), "no model 'draft' in my-models")


def test_an_empty_prompt_starts_from_endoftext(models_dir):
    result = run_main(*MODELS, "--prompt", "", "--n_tokens_to_generate", "5", "--json", models_dir=models_dir)
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout.strip().splitlines()[-1])
    assert output["prompt"] == "" and len(output["speculative"]["new_tokens"]) == 5


@pytest.mark.parametrize("args, message", [
    (["--K", "0"], "--K must be an integer >= 1"),
    (["--K", "2.5"], "--K must be an integer >= 1"),
    (["--K", "automatic"], "--K must be an integer >= 1, or auto"),
    (["--temperature", "-1"], "temperature must be a number >= 0"),
    (["--top_p", "0"], "top_p must be a number in (0, 1]"),
    (["--top_p", "1.5"], "top_p must be a number in (0, 1]"),
    (["--top_k", "-1"], "top_k must be an integer >= 0"),
    (["--n_tokens_to_generate", "0"], "--n_tokens_to_generate must be an integer >= 1"),
    (["--decoder", "beam"], "unknown decoder beam"),
    (["--decoder", "assisted", "--temperature", "0.5"], "needs --temperature 0"),
    (["--temprature", "0.5"], "unknown flag --temprature"),
    (["--dtype", "bfloat16"], "bfloat16 with --backend jax"),
    (["--dtype", "float64"], "--dtype must be float32"),
    (["--backend", "torch"], "unknown --backend"),
    (["--repeats", "0"], "--repeats must be an integer >= 1"),
    (["--threads", "0"], "--threads must be an integer >= 1"),
    (["--threads", "two"], "--threads must be an integer >= 1"),
    (["--threads", "1000"], "--threads 1000 exceeds the"),  # more than this machine's cores
    # a flag without its value, and stray words, are refused rather than read as True or as positions
    (["hello", "5"], "unexpected argument 'hello'"),
    (["--K", "3", "5"], "unexpected argument '5'"),
    (["--json", "yes"], "unexpected argument 'yes'"),
    (["--prompt"], "--prompt needs a value"),
    (["--prompt", "--K", "3"], "--prompt needs a value"),
    (["--K"], "--K needs a value"),
    (["--temperature", "--json"], "--temperature needs a value"),
    (["--seed="], "--seed needs a value"),
    (["--models_dir"], "--models_dir needs a value"),
    (["--models_dir="], "--models_dir must be a folder's path"),
    (["--decoder"], "--decoder needs a value"),
    (["--json=1"], "--json takes no value"),
    (["--nojson=true"], "unknown flag --nojson"),
    (["--n_tokens_to_generate", "64"], "exceed the models' context of 64"),
    (["--target_model_size", "other-vocabulary", "--n_tokens_to_generate", "8"], "different vocabularies"),
    # a batch: its size, and what has no batched form
    (["--batch_size", "0"], "--batch_size must be an integer >= 1"),
    (["--batch_size", "2.5"], "--batch_size must be an integer >= 1"),
    (["--prompt", "a", "--batch_size", "3"], "--batch_size 3 disagrees with the 2 prompts"),
    (["--batch_size", "2", "--decoder", "assisted", "--temperature", "0"], "no batched form"),
    (["--batch_size", "2", "--K", "auto"], "a fixed --K"),
    (["--prompt", "a", "--prompt", "b " * 70], "exceed the models' context of 64"),
])
def test_bad_flags_get_a_short_error(models_dir, args, message):
    result = run_main(*PAIR, *args, models_dir=models_dir)
    assert_short_error(result, message)


@pytest.mark.parametrize("name, message", [("no-such-model", "no-such-model"), ("../target", "folder"),
                                           ("/etc", "folder"), ("corrupt", "corrupt"), ("no-checkpoint", "missing"),
                                           ("124M", "download")])
def test_bad_models_get_a_short_error(models_dir, name, message):
    # 124M is missing from this models_dir, so it would be downloaded; the proxy refuses the connection
    result = run_main("--draft_model_size", "draft", "--target_model_size", name, "--n_tokens_to_generate", "3",
                      "--prompt", "the", models_dir=models_dir)
    assert_short_error(result, message)
    assert not (models_dir / "124M").exists()  # a failed download leaves nothing behind


def test_a_prompt_longer_than_the_context_is_refused_before_loading_the_checkpoint(models_dir):
    # the corrupt checkpoint would fail to load: the context is checked first, from hparams.json alone
    result = run_main("--draft_model_size", "draft", "--target_model_size", "corrupt", "--prompt", "the " * 70,
                      "--n_tokens_to_generate", "1", models_dir=models_dir)
    assert_short_error(result, "exceed the models' context of 64")


def test_main_is_callable_from_python_and_returns_what_json_prints(models_dir, capsys):
    result = main.main(prompt="the hat", n_tokens_to_generate=8, draft_model_size="draft", target_model_size="target",
                       models_dir=str(models_dir), K=2, temperature=0.8, top_k=20, top_p=0.9, seed=5, json=True)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == json.loads(json.dumps(result))
    assert len(result["speculative"]["new_tokens"]) == len(result["autoregressive"]["new_tokens"]) == 8
    again = main.main(prompt="the hat", n_tokens_to_generate=8, draft_model_size="draft", target_model_size="target",
                      models_dir=str(models_dir), K=2, temperature=0.8, top_k=20, top_p=0.9, seed=5, json=True)
    assert again["speculative"]["new_tokens"] == result["speculative"]["new_tokens"]  # the same seed, the same tokens
    with pytest.raises(ValueError, match="--K must be"):
        main.main(K=0, models_dir=str(models_dir))


def test_threads_one_gives_every_threads_tokens_and_the_json_names_the_engine(models_dir, capsys):
    """--threads 1 splits no product; any thread count gives the same greedy tokens; the JSON and the report
    name the threads, the target's layouts and the peak memory."""
    from engine.threads import THREADS, usable_cores

    runs = {}
    try:
        for threads in (1, min(2, usable_cores()), None):  # --threads above the usable cores is refused
            runs[threads] = main.main(prompt="the cat", n_tokens_to_generate=12, draft_model_size="draft",
                                      target_model_size="target", models_dir=str(models_dir), K=3, temperature=0,
                                      repeats=1, json=True, threads=threads)
        assert runs[1]["engine"]["threads"] == 1 and " on " not in runs[1]["engine"]["target_layouts"]
        assert runs[None]["engine"]["threads"] == usable_cores()
        for result in runs.values():
            assert result["speculative"]["new_tokens"] == runs[1]["autoregressive"]["new_tokens"]
            assert result["engine"]["peak_memory_bytes"] > 10e6
        capsys.readouterr()
        main.main(prompt="the cat", n_tokens_to_generate=6, draft_model_size="draft", target_model_size="target",
                  models_dir=str(models_dir), repeats=1, threads=1, verbose=True)
        assert "engine: 1 thread(s) (engine/threads.py); the target's products: attn.c_attn" in capsys.readouterr().out
    finally:
        THREADS.set(None)


def test_colouring_keeps_a_character_split_between_runs_of_different_origins(models_dir):
    encoder = get_encoder_from_dir(models_dir / "target")
    tokens = encoder.encode("aé b")  # a, the two bytes of é, space, b
    assert len(tokens) == 5
    coloured = report.coloured_text(tokens, ["accepted", "accepted", "corrected", "bonus", "bonus"], encoder.decode)
    assert re.sub(r"\x1b\[[0-9;]*m", "", coloured) == "aé b"
    assert coloured.startswith(report.COLOURS["accepted"] + "a" + report.RESET)  # é waits for its second byte
    assert report.COLOURS["corrected"] + "é" in coloured and report.COLOURS["bonus"] + " b" in coloured


def test_flags_reach_main_as_typed():
    argv = ["-p", "a, b", "--draft_model_size=355", "-n", "5", "--K", "-1", "--nocolor", "--models_dir", "42",
            "--top_p=.5", "--json"]
    given = flags.parse_arguments(argv)
    assert given == {"prompt": "a, b", "draft_model_size": "355", "n_tokens_to_generate": "5", "K": "-1",
                     "color": "false", "models_dir": "42", "top_p": ".5", "json": "true"}
    assert flags.fire_command(given) == ["--prompt='a, b'", "--draft_model_size='355'", "--n_tokens_to_generate=5",
                                        "--K=-1", "--nocolor", "--models_dir='42'", "--top_p=.5", "--json"]
    # a text flag's value may look like a flag, unless it is one of main's; after "=" anything is a value
    assert flags.parse_arguments(["--prompt", "--not-a-flag", "--json=False"]) == {"prompt": "--not-a-flag",
                                                                                   "json": "false"}
    assert flags.parse_arguments(["--prompt=--K", "-K", "2", "--K", "3"]) == {"prompt": "--K", "K": "3"}
    assert flags.parse_arguments(["--prompt="]) == {"prompt": ""}
    # --prompt given several times: the rows of a batch, in order, passed to fire as a list of texts
    given = flags.parse_arguments(["--prompt", "a, b", "--K", "2", "--prompt=42", "-p", "--x"])
    assert given == {"prompt": ["a, b", "42", "--x"], "K": "2"}
    assert flags.fire_command(given)[0] == "--prompt=['a, b', '42', '--x']"
    for bad in (["--tempreature", "1"], ["-z"], ["--no_such"], ["-t", "1"]):  # -t: temperature, top_k or top_p?
        with pytest.raises(ValueError, match="unknown flag"):
            flags.parse_arguments(bad)


def test_a_text_flag_given_anything_but_text_from_python_is_refused():
    for flags in ({"prompt": True}, {"draft_model_size": 124}, {"models_dir": 3}):
        with pytest.raises(ValueError, match="must be"):
            main.main(**flags)


def test_help_prints_every_flag_with_its_default_and_no_pager(tmp_path):
    result = run_main("--help", cwd=tmp_path, env={"PAGER": "false", "TERM": "dumb"})
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.startswith("usage: python main.py") and "INFO" not in result.stdout
    for flag in flags.FLAGS:
        assert f"--{flag}" in result.stdout
    assert "[autoregressive,speculative]" in result.stdout and "--color, --nocolor" in result.stdout
    assert "[models/ beside main.py]" in result.stdout and "NO_COLOR" in result.stdout
    assert run_main("--K", "3", "-h").stdout == result.stdout


def test_the_cli_page_lists_every_flag():
    reference = (REPO / "docs" / "CLI.md").read_text(encoding="utf-8")  # the README links to it
    flag_list = reference[reference.index("Flags: "):]
    flag_list = flag_list[:flag_list.index("\n\n")]
    assert set(flags.FLAGS) <= set(re.findall(r"`--(\w+)`", flag_list))


@pytest.mark.parametrize("coretype, flags, backend, noted", [
    ("Haswell", "fpu avx2 fma avx512f avx512bw", "numpy", True),  # pinned below what the CPU has
    ("SkylakeX", "fpu avx2 fma avx512f avx512bw", "numpy", False),  # AVX-512 kernels already
    (None, "fpu avx2 fma avx512f avx512bw", "numpy", False),  # OpenBLAS chooses for itself
    ("Haswell", "fpu avx2 fma", "numpy", False),  # the CPU has no AVX-512: Haswell is its best
    ("Haswell", "fpu avx2 fma avx512f avx512bw", "jax", False),  # JAX does not use OpenBLAS
])
def test_a_note_when_the_environment_pins_openblas_below_the_cpu(monkeypatch, capsys, tmp_path, coretype, flags,
                                                                  backend, noted):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    if coretype:
        monkeypatch.setenv("OPENBLAS_CORETYPE", coretype)
    runs.explain_blas_kernels(backend, cpuinfo)
    err = capsys.readouterr().err
    assert ("note: OPENBLAS_CORETYPE=Haswell" in err and "env -u OPENBLAS_CORETYPE" in err) is noted
    assert noted or err == ""


# ---- several sequences at once ---------------------------------------------------------------------


def run_in_process(models_dir, capsys, prompt, seed, **flags):
    """main.main on the tiny pair, its JSON swallowed: -> the result dict."""
    result = main.main(prompt=prompt, seed=seed, draft_model_size="draft", target_model_size="target",
                       models_dir=str(models_dir), repeats=1, json=True, **flags)
    capsys.readouterr()
    return result


def test_a_batch_of_prompts_gives_each_row_as_the_one_sequence_run_gives_it(models_dir, capsys):
    prompts = ["the cat", "a hat on the", "the"]
    flags = dict(n_tokens_to_generate=10, K=3, temperature=0.8, top_k=40, top_p=0.95)
    args = [arg for prompt in prompts for arg in ("--prompt", prompt)]
    result = run_main("--draft_model_size", "draft", "--target_model_size", "target", *args, "--seed", "7",
                      "--repeats", "2", "--json", *[f"--{name}={value}" for name, value in flags.items()],
                      models_dir=models_dir)
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout.strip().splitlines()[-1])
    assert output["prompt"] == prompts and output["batch_size"] == 3 and output["seed"] == 7
    encoder = get_encoder_from_dir(models_dir / "target")
    for name in ("autoregressive", "speculative"):
        run = output[name]
        assert len(run["seconds_per_run"]) == 2 and run["tokens_per_second"] == pytest.approx(30 / run["seconds"])
        for row, prompt in zip(run["rows"], prompts):  # the prompt and the new tokens, as the decoders return them
            assert row["tokens"] == encoder.encode(prompt) + row["new_tokens"]
            assert len(row["new_tokens"]) == 10 and row["text"] == encoder.decode(row["new_tokens"])
    ratios = [a / s for a, s in zip(output["autoregressive"]["seconds_per_run"], output["speculative"]["seconds_per_run"])]
    assert output["speedup"] == output["speculative"]["speedup"] == pytest.approx(statistics.median(ratios))
    speculative = output["speculative"]
    assert speculative["target_calls"] == speculative["loops"] == max(row["loops"] for row in speculative["rows"])
    assert speculative["accepted"] == sum(row["accepted"] for row in speculative["rows"])
    for i, prompt in enumerate(prompts):  # row i: the one-sequence run of its prompt with seed 7 + i
        alone = run_in_process(models_dir, capsys, prompt, 7 + i, **flags)
        assert output["autoregressive"]["rows"][i]["new_tokens"] == alone["autoregressive"]["new_tokens"]
        row = speculative["rows"][i]
        assert row["new_tokens"] == alone["speculative"]["new_tokens"]
        for key in ("loops", "target_calls", "draft_calls", "drafted", "accepted", "rejected", "corrected", "bonus"):
            assert row[key] == alone["speculative"][key], (i, key)


def test_batch_size_decodes_copies_of_the_prompt_with_distinct_seeds(models_dir, capsys):
    flags = dict(n_tokens_to_generate=12, K=2, temperature=1.0)
    result = run_in_process(models_dir, capsys, "the", 3, batch_size=4, **flags)
    rows = [row["new_tokens"] for row in result["speculative"]["rows"]]
    assert result["prompt"] == ["the"] * 4 and len(set(map(tuple, rows))) > 1  # distinct seeds: other samples
    assert rows[0] == run_in_process(models_dir, capsys, "the", 3, **flags)["speculative"]["new_tokens"]
    assert rows[3] == run_in_process(models_dir, capsys, "the", 6, **flags)["speculative"]["new_tokens"]
    report = run_main(*PAIR, "--batch_size", "2", "--n_tokens_to_generate", "6", "--repeats", "1",
                      "--temperature", "0", models_dir=models_dir)
    assert report.returncode == 0, report.stderr
    lines = report.stdout.splitlines()
    assert lines[0].startswith("a batch of 2 rows") and "seeds 123..124" in lines[0]
    assert any(line.startswith("speculative: ") and "tokens/s over all rows" in line for line in lines)
    assert sum(line.startswith("row ") and "the same tokens as autoregressive" in line for line in lines) == 2


@pytest.mark.slow  # JAX compiles its programs: the slow tier
def test_a_batch_on_the_jax_backend_gives_the_numpy_backends_rows(models_dir, capsys):
    """main's wiring of the batched device loops (tests/test_batched.py holds them to the NumPy batch)."""
    pytest.importorskip("jax")
    from jax_backend import sampling_jax

    flags = dict(n_tokens_to_generate=8, temperature=0.8, top_k=40, batch_size=2, decoder="autoregressive")
    numpy_run, jax_run = (run_in_process(models_dir, capsys, ["the cat", "a"], 1, backend=backend, **flags)
                          for backend in ("numpy", "jax"))
    assert jax_run["backend"] == "jax" and jax_run["autoregressive"]["rows"] == numpy_run["autoregressive"]["rows"]
    jax_model = backends.make_batched_model(scaled_params(TARGET, seed=0), TARGET, 2, backend="jax")
    decoders = backends.batched_decoders(jax_model)  # the speculative decoder too (its compile is test_batched's)
    assert decoders.speculative_sampling is sampling_jax.batched_speculative_sampling
