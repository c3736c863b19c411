"""The benchmarks still run and still measure what they claim, on tiny models (their speed is never tested:
bench/ measures it). bench/decode.py's helpers are imported and checked against transformers;
bench/speculative.py runs end to end on a tiny random pair, bench/pair.py and bench/batch.py on the bundled
pair and the committed prompt splits, bench/gpu.py and bench/batch.py --backend jax in their --small modes on the CPU,
and bench/train_step.py for two one-window steps of the bundled pair.
"""

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import engine
import gpt2
import sampling
from encoder import get_encoder_from_dir
from engine import layouts
from helpers import as_lists, split_prompts
from speedup import costs
from speedup.stats import expected_speedup

REPO = Path(__file__).resolve().parents[1]
TINY = dict(n_vocab=97, n_ctx=64, n_embd=32, n_head=4, n_layer=2)


def load_bench(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_decode_bench_times_the_same_greedy_tokens_as_transformers():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    decode = load_bench("decode")
    params = gpt2.init_params(TINY, np.random.default_rng(0))
    params["wte"] *= 50  # GPT-2's std 0.02 leaves near-ties between logits; make the argmax clear
    prompt = [5, 17, 3]
    model = gpt2.GPT2Model(params, TINY)

    tokens, step_seconds = decode.greedy_decode(model, prompt, 12)
    hf_tokens, hf_step_seconds = decode.hf_greedy_decode(decode.hf_model(params, TINY), prompt, 12)
    assert tokens == hf_tokens and len(tokens) == 12
    assert len(step_seconds) == len(hf_step_seconds) == 11  # decode steps only: the prompt is not timed
    assert min(step_seconds) > 0 and min(hf_step_seconds) > 0

    plain = gpt2.GPT2Model(params, TINY)
    costs, one_token_ms = decode.verify_costs({"panels": engine.fast_model(params, TINY, layout="panels"), "plain": plain},
                                              prompt + tokens, repeats=3, block_lengths=[2, 5])
    assert set(costs) == set(one_token_ms) == {"panels", "plain"}
    assert all(sorted(curve) == [1, 2, 5] for curve in costs.values()) and min(one_token_ms.values()) > 0
    assert costs["panels"][1] == costs["plain"][1] == 1.0 and min(costs["panels"].values()) > 0
    products = decode.ProductsTime(model)
    products.measure(3)
    assert len(products.samples) == 3 and products.median_ms() > 0


def gpt2_parameter_count(n_vocab, n_ctx, n_embd, n_layer, **_):
    per_block = 12 * n_embd**2 + 13 * n_embd  # c_attn, c_proj, c_fc, c_proj with biases, two layer norms
    return (n_vocab + n_ctx) * n_embd + n_layer * per_block + 2 * n_embd


def test_decode_bench_counts_every_weight_once():
    decode = load_bench("decode")
    assert gpt2_parameter_count(**decode.HPARAMS_124M) == 124_439_808  # GPT-2 "124M"
    params = gpt2.init_params(TINY, np.random.default_rng(0))
    assert decode.params_nbytes(params) == 4 * gpt2_parameter_count(**TINY)
    assert decode.model_nbytes(gpt2.GPT2Model(params, TINY)) == 4 * gpt2_parameter_count(**TINY)
    # panels: every linear weight is copied into panels (n_out padded to a multiple of 32), and so is wte.T
    panelled = decode.model_nbytes(engine.fast_model(params, TINY, layout="panels"))
    n_embd, n_layer, n_vocab = TINY["n_embd"], TINY["n_layer"], TINY["n_vocab"]
    vocab_panels = -(-n_vocab // 32) * 32 * n_embd
    assert panelled == 4 * (gpt2_parameter_count(**TINY) + vocab_panels)  # TINY's other widths are multiples of 32


def test_decode_bench_reads_bandwidth_in_weight_bytes_per_second():
    decode = load_bench("decode")
    bandwidth = decode.ReadBandwidth(np.random.default_rng(0), k=512, n=256)
    bandwidth.measure(3)
    bandwidth.measure(2)
    assert {name: len(samples) for name, samples in bandwidth.samples.items()} == {layout: 6 for layout in layouts.LAYOUTS}
    best = bandwidth.best_by_layout()  # the warm-up sample is left out
    assert best == {name: round(max(samples[1:]), 2) for name, samples in bandwidth.samples.items()}
    assert bandwidth.best_gbps() == max(max(samples[1:]) for samples in bandwidth.samples.values()) > 0


def test_decode_bench_runs_on_a_model_folder():
    command = [sys.executable, str(REPO / "bench" / "decode.py"), "--model", "teach-draft", "--skip_hf",
               "--repeats", "1", "--n_tokens", "8", "--threads", "1"]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result["threads"] == result["machine"]["numpy_threads"] == 1  # torch gets the same count (set_num_threads)
    assert result["hparams"]["n_layer"] == 2 and sorted(result["verify_cost"], key=int) == [str(n) for n in range(1, 17)]
    assert result["model_bytes"]["plain"] == result["weights_bytes"] < result["model_bytes"]["panels"]


def test_speculative_bench_reproduces_the_autoregressive_tokens():
    command = [sys.executable, str(REPO / "bench" / "speculative.py"), "--draft_shape", "1,32,4", "--target_shape",
               "2,64,4", "--n_vocab", "97", "--n_ctx", "64", "--n_tokens", "12", "--prompt_len", "4", "--K", "1,3"]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    for mode in ("cached", "uncached"):
        runs = result[mode]["speculative"]
        assert [run["K"] for run in runs] == [1, 3]
        assert all(run["same_tokens"] and run["speedup"] > 0 and 0 <= run["acceptance_rate"] <= 1 for run in runs)


def test_gpu_bench_smoke_run_on_the_cpu(tmp_path):
    """bench/gpu.py is for a lent GPU, whose minutes are few: it must not reach one broken."""
    pytest.importorskip("jax")
    out = tmp_path / "gpu.json"
    command = [sys.executable, str(REPO / "bench" / "gpu.py"), "--small", "--n_tokens", "8", "--repeats", "2",
               "--loops", "2", "--budget_s", "3600", "--out", str(out)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert json.loads(out.read_text()) == result  # --out holds the final result too
    assert result["small"] and result["bandwidth"]["copy"]["GBps"] > 0 and result["seconds"] > 0
    assert set(result["decode"]) == {f"{size}_{dtype}" for size in ("124M", "1558M") for dtype in ("float32", "bfloat16")}
    assert all(entry["ms_per_token"] > 0 and entry["roofline_ms"] > 0 for entry in result["decode"].values())
    assert all(entry["ratio_5_to_1"] > 0 and entry["ratio_8_to_1"] > 0 and entry["device_ratio_8_to_1"] > 0
               for entry in result["verify"].values())
    assert [row["K"] for row in result["loop"]["124M_to_1558M_float32"]["by_K"]] == [1, 2, 4]  # --small's Ks
    # the device loops (sampling_jax): decode against the roofline, the speculative loop against K, the pair
    assert all(entry["device_loop_ms_per_token"] > 0 and entry["roofline_fraction_device_loop"] > 0
               for entry in result["decode"].values())
    device_loop = result["device_loop"]["124M_to_1558M_float32"]
    assert [row["K"] for row in device_loop["by_K"]] == [1, 2, 4]
    assert all(row["loop_ms"] > 0 and row["loops"] >= 1 and 0 < row["speedup_a0.6"] < row["speedup_a0.8"]
               for row in device_loop["by_K"])
    runs = [run for key, run in result["pair"]["bundled"].items() if key.startswith("K")]
    # --small's pair: K 2 at temperatures 0 and 1, with the host's loops and the device loops
    assert len(runs) == 4 and sum(key.endswith("_device_loop") for key in result["pair"]["bundled"]) == 2
    assert all(0 <= run["acceptance_rate"] <= 1 and run["speedup"] > 0 for run in runs)
    trees = result["tree"]["1558M_float32"]["by_n"]  # scored in one call (JaxGPT2Model.tree_logits)
    assert [row["n"] for row in trees] == [4, 8] and all(row["tree_over_chain"]["median"] > 0 for row in trees)
    assert {"device_loop_speedup_a0.8>=1.6", "v5_1558M<=1.15", "roofline_fraction_device_loop>=0.6",
            "bundled_pair_device_loop_best_speedup"} <= set(result["targets"])
    if result["device"]["platform"] == "cpu" and not result["has"]["torch_cuda"]:
        assert "hf" not in result and "CUDA" in result["skipped"]["hf"]  # transformers is timed on a GPU only
    else:
        assert result["skipped"] == {}


@pytest.mark.parametrize("temperature", [0, 1])
def test_pair_bench_runs_on_the_committed_splits(temperature):
    command = [sys.executable, str(REPO / "bench" / "pair.py"), "--n_prompts", "3", "--n_tokens", "16",
               "--K", "1,4,auto", "--perplexity_prompts", "2", "--temperature", str(temperature)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert [row["K"] for row in result["by_K"]] == [1, 4, "auto"] and result["temperature"] == temperature
    for row in result["by_K"]:
        assert 0 <= row["acceptance_rate"] <= 1 and row["median_speedup"] > 0
        low, high = row["speedup_range"]["min"], row["speedup_range"]["max"]
        assert low <= row["median_speedup"] <= high
        assert row["verify_steps"] == pytest.approx(row["verify_ms"] / row["decode_step_ms"])
        assert row["cost_ratio"] == pytest.approx(row["draft_step_ms"] / row["decode_step_ms"])
        assert row["median_measured_over_expected"] > 0
        assert sum(row["accepted_length_counts"]) > 0
    auto = result["by_K"][-1]
    assert sum(auto["K_chosen_counts"].values()) > 0 and all(0 <= int(K) <= 12 for K in auto["K_chosen_counts"])
    # the best K is chosen on the development split (fixed K only), and reported by its row on the test split
    calibration = result["calibration"]
    assert calibration["split"] == "dev" and [row["K"] for row in calibration["by_K"]] == [1, 4]
    assert {row["split"] for row in calibration["by_K"]} == {"dev"} and {row["split"] for row in result["by_K"]} == {
        "test"} == {result["split"]}
    best = max(calibration["by_K"], key=lambda row: row["median_speedup"])
    on_test = next(row for row in result["by_K"] if row["K"] == best["K"])
    assert (result["best_K"], result["best_median_speedup"]) == (best["K"], on_test["median_speedup"])
    assert result["auto_over_best_fixed"] == pytest.approx(auto["median_speedup"] / on_test["median_speedup"])
    assert len(result["costs"]["verify_steps"]) == 16 and result["costs"]["cost_ratio"] > 0
    assert 1 < result["target_perplexity"] < 4096 and 1 < result["draft_perplexity"] < 4096  # below uniform
    assert result["perplexity_prompts"]["split"] == "test" and result["perplexity_prompts"]["prompt_tokens"] == 64
    assert result["machine"]["cpu"] and result["machine"]["blas"]["name"]  # what the speed depends on


def test_pair_bench_chooses_K_on_dev_prompts_and_reports_on_test_prompts(monkeypatch, capsys):
    """Every run reads the split it claims: the calibration's the development split's open prompts, the rows' and
    the costs' what the files hold for their split, the test split's (a bench that read the wrong split fails)."""
    pair, read = load_bench("pair"), []
    measure_K = pair.measure_K
    monkeypatch.setattr(pair, "measure_K", lambda K, prompts, *rest: read.append((K, as_lists(prompts))) or
                        measure_K(K, prompts, *rest))
    pair.main(["--n_prompts", "2", "--n_tokens", "6", "--K", "2,auto", "--perplexity_prompts", "1"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    dev, test = split_prompts("dev", 2, 32), split_prompts("test", 2, 32)
    assert dev != test and read == [(2, dev), (2, test), ("auto", test)]
    assert result["prompts"]["dev"]["ids"] == result["prompts"]["test"]["ids"] == ["open-00", "open-32"]
    for split in ("dev", "test"):
        committed = (REPO / "bench" / "prompts" / f"{split}.json").read_bytes()
        assert result["prompts"][split]["sha256"] == hashlib.sha256(committed).hexdigest()


@pytest.mark.parametrize("bench", ["pair", "verifier_gains", "drafter_zoo", "early_exit", "frspec_vocabulary"])
def test_a_bench_on_the_splits_says_how_to_cut_them_when_a_file_is_missing(bench, tmp_path):
    (tmp_path / "dev.json").write_text((REPO / "bench" / "prompts" / "dev.json").read_text())
    command = [sys.executable, str(REPO / "bench" / f"{bench}.py"), "--prompts_dir", str(tmp_path)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert completed.returncode == 2 and completed.stdout == "" and "Traceback" not in completed.stderr
    assert completed.stderr.startswith("error: ") and len(completed.stderr.strip().splitlines()) == 1
    assert f"no test prompts at {tmp_path / 'test.json'}" in completed.stderr
    assert "python bench/spec_splits.py" in completed.stderr


@pytest.mark.parametrize("flags, message", [(["--n_prompts", "65"], "the test split holds 64 open prompts: asked for 65"),
                                            (["--prompt_tokens", "0"], "the test prompts hold 64 tokens each: asked for 0")])
def test_a_bench_on_the_splits_refuses_more_prompts_or_tokens_than_a_file_holds(flags, message):
    completed = subprocess.run([sys.executable, str(REPO / "bench" / "drafter_zoo.py"), *flags], capture_output=True,
                               text=True, timeout=60, cwd=REPO)
    assert completed.returncode == 2 and message in completed.stderr and "Traceback" not in completed.stderr


def test_text_quality_says_how_to_build_the_held_out_text_when_it_is_missing(tmp_path):
    command = [sys.executable, str(REPO / "bench" / "text_quality.py"), "--heldout", str(tmp_path / "heldout.txt")]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert completed.returncode == 2 and completed.stdout == ""
    assert completed.stderr.startswith("error: ") and len(completed.stderr.strip().splitlines()) == 1
    assert str(tmp_path / "heldout.txt") in completed.stderr and "python tools/build_corpus.py" in completed.stderr


def test_pair_bench_takes_prompt_lookup_as_the_draft():
    command = [sys.executable, str(REPO / "bench" / "pair.py"), "--draft", "prompt-lookup", "--n_prompts", "2",
               "--n_tokens", "16", "--K", "2,auto", "--perplexity_prompts", "2"]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result["draft"] == "prompt-lookup" and result["draft_perplexity"] is None
    assert result["costs"]["draft_step_seconds"] == 0
    assert all(0 <= row["median_copied_fraction"] <= 1 for row in result["by_K"])


def test_auto_k_bench_replays_settings_on_a_pair_runs_costs(tmp_path):
    pair = subprocess.run([sys.executable, str(REPO / "bench" / "pair.py"), "--n_prompts", "2", "--n_tokens", "12",
                           "--K", "1,3", "--perplexity_prompts", "1"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert pair.returncode == 0, pair.stderr[-2000:]
    (tmp_path / "pair.json").write_text(pair.stdout)
    completed = subprocess.run([sys.executable, str(REPO / "bench" / "auto_k.py"), "--pair", str(tmp_path / "pair.json")],
                               capture_output=True, text=True, timeout=300, cwd=REPO)
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result["split"] == "dev" and result["prompts"] == json.loads(pair.stdout.strip().splitlines()[-1])[
        "prompts"]["dev"]  # it replays the prompts the pair run calibrated on
    assert set(result["fixed_K_temperature_0"]) == {"1", "2", "3", "4", "6", "8"}
    assert result["best_fixed_temperature_0"] == max(result["fixed_K_temperature_0"].values())
    assert len(result["settings"]) == 36 and all(row["temperature_0"] > 0 and row["temperature_1"] > 0
                                                 for row in result["settings"])
    assert result["costs_py_settings"]["memory"] == costs.MEMORY  # costs.py's own setting is among those replayed


def test_lookup_bench_reports_copying_beside_speed():
    command = [sys.executable, str(REPO / "bench" / "lookup.py"), "--n_prompts", "2", "--n_tokens", "12", "--K", "3",
               "--draft", ""]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert list(result["by_draft"]) == ["prompt-lookup"] and result["n_prompts"] == 2
    (row,) = result["by_draft"]["prompt-lookup"]
    assert row["K"] == 3 and row["median_speedup"] > 0 and len(row["accepted_length_counts"]) <= 4
    assert 0 <= row["median_copied_fraction"] <= 1 and 0 <= row["median_function_reproduced"] <= 1
    assert result["sample"]["prompt"].count("def ") >= 2  # the function, then its first lines again


def test_lookup_bench_can_leave_room_for_the_whole_function():  # --n_tokens 0: the copy bar's measure
    command = [sys.executable, str(REPO / "bench" / "lookup.py"), "--n_prompts", "2", "--n_tokens", "0", "--K", "3",
               "--draft", ""]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    (row,) = result["by_draft"]["prompt-lookup"]
    assert result["n_tokens"] == 0 and 0 <= row["prompts_reproducing_half"] <= 2
    where = row["median_speedup_where_reproducing_half"]
    assert (where is None) == (row["prompts_reproducing_half"] == 0) and (where is None or where > 0)
    refused = subprocess.run(command[:2] + ["--n_tokens=-1"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert refused.returncode == 2 and "--n_tokens must be 0" in refused.stderr and "Traceback" not in refused.stderr


def test_machine_names_the_cpu_family(tmp_path):
    """'AMD EPYC' alone is both the Zen 3 and the Zen 5 these figures were taken on: the family tells them apart."""
    machine = load_bench("machine")
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n"
                       "model name\t: AMD EPYC\n\nprocessor\t: 1\ncpu family\t: 25\nmodel\t\t: 1\n")
    assert machine.cpu_model(cpuinfo) == "AMD EPYC (family 25, model 1)"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some ARM core\n")
    assert machine.cpu_model(cpuinfo) == "Some ARM core"
    assert machine.cpu_model(tmp_path / "missing")  # no /proc/cpuinfo: the platform's name, never an error


def test_machine_line_names_the_vector_instructions_the_kernels_and_the_cores(tmp_path):
    """The line every timing notebook prints first: two runs on one machine print the same line."""
    machine = load_bench("machine")
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("cpu family\t: 23\nmodel\t\t: 1\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma\n")
    line = machine.machine_line(cpuinfo)
    assert line.startswith("machine: AMD EPYC (family 23, model 1, AVX2), ") and line.endswith(" cores")
    assert line == machine.machine_line(cpuinfo)
    assert machine.instruction_set({"avx2", "avx512f"}) == "AVX-512" and machine.instruction_set({"asimd"}) == "NEON"


def run_batch_bench(*args):
    completed = subprocess.run([sys.executable, str(REPO / "bench" / "batch.py"), *args], capture_output=True,
                               text=True, timeout=300, cwd=REPO)
    assert completed.returncode == 0, completed.stderr[-2000:]
    lines = completed.stdout.strip().splitlines()
    return json.loads(lines[-1]), lines[:-1]


def test_batch_bench_reports_every_batch_size_on_the_bundled_pair():
    result, progress = run_batch_bench("--batch_sizes", "1,3", "--n_tokens", "8", "--prompt_tokens", "8",
                                       "--repeats", "2", "--K", "3")
    assert result["batch_sizes"] == [1, 3] and len(progress) == 2 * 2  # a line per batch size and repeat
    assert result["split"] == result["prompts"]["split"] == "test"  # row i: the test split's i-th of 3 open prompts
    assert result["prompts"]["ids"] == ["open-00", "open-21", "open-42"] and result["prompts"]["prompt_tokens"] == 8
    rows = result["by_batch_size"]
    for key in ("autoregressive_tokens_per_s", "speculative_tokens_per_s", "speedup"):
        assert result[key] == [row[key]["median"] for row in rows]  # the medians, beside their ranges
        assert all(row[key]["range"][0] <= row[key]["median"] <= row[key]["range"][1] for row in rows)
    assert result["autoregressive_gain_over_first"][0] == 1
    for row in rows:
        assert 0 <= row["acceptance_rate"] <= 1 and row["loops"] >= 8 / 4 and row["row_loops"] >= row["loops"]
        assert row["verify_steps"] == pytest.approx(row["verify_ms"] / row["target_step_ms"])
        assert row["draft_over_target_step"] == pytest.approx(row["draft_step_ms"] / row["target_step_ms"])
        assert row["formula_speedup"] > 0
    assert rows[1]["tokens_per_loop_per_row"] == pytest.approx(3 * 8 / (3 * rows[1]["loops"]))
    assert result["device"]["cpu"] and result["device"]["blas"]["name"]  # what the speed depends on


def test_batch_bench_smoke_run_of_the_device_loops_on_the_cpu():
    """bench/batch.py --backend jax is for a lent GPU: it must not reach one broken."""
    pytest.importorskip("jax")
    result, _ = run_batch_bench("--backend", "jax", "--small", "--batch_sizes", "2", "--n_tokens", "8",
                                "--prompt_tokens", "8", "--repeats", "1")
    assert result["batch_sizes"] == [2] and result["device"]["platform"]
    (row,) = result["by_batch_size"]
    assert min(result["autoregressive_tokens_per_s"] + result["speculative_tokens_per_s"]) > 0
    assert row["loop_steps"] == pytest.approx(row["loop_ms"] / row["step_ms"])
    assert 0 < row["expected_speedup_a0.6"] < row["expected_speedup_a0.8"]


def test_paper_shapes_draws_gpt2s_tree_in_float32_and_prices_every_alpha_and_K():
    paper_shapes = load_bench("paper_shapes")
    hparams = dict(n_vocab=50, n_ctx=16, n_embd=8, n_head=2, n_layer=2)
    params = paper_shapes.random_params(hparams, np.random.default_rng(0))
    reference = gpt2.init_params(hparams, np.random.default_rng(0))
    assert params.keys() == reference.keys() and len(params["blocks"]) == 2
    for block, expected in zip(params["blocks"], reference["blocks"]):
        for group, layer in (("attn", "c_attn"), ("attn", "c_proj"), ("mlp", "c_fc"), ("mlp", "c_proj")):
            w = block[group][layer]["w"]
            assert w.shape == expected[group][layer]["w"].shape and w.dtype == np.float32
            assert 0.015 < float(w.std()) < 0.025 or w.size < 200
    assert params["wte"].dtype == np.float32 and params["wte"].shape == (50, 8)
    assert paper_shapes.hparams_of("1558M") == dict(n_vocab=50257, n_ctx=1024, n_embd=1600, n_head=25, n_layer=48)
    measured = costs.MeasuredCosts(0.1, 0.01, (1.0, 1.05, 1.1, 1.15, 1.2, 1.3, 1.4, 1.5, 1.6))
    grid = paper_shapes.expected_speedups(measured)
    assert list(grid) == ["0.6", "0.7", "0.8", "0.9"] and list(grid["0.8"]) == [str(K) for K in range(1, 9)]
    assert grid["0.8"]["4"] == round(measured.expected_speedup(0.8, 4), 3)


def test_train_step_bench_times_steps_and_counts_page_faults():
    pytest.importorskip("jax")
    command = [sys.executable, str(REPO / "bench" / "train_step.py"), "--steps", "2", "--batch_size", "1"]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO,
                               env={**os.environ, "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"})
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result["steps"] == 2 and result["batch"] == [1, 512]  # the bundled pair's n_ctx
    low, high = result["seconds_range"]
    assert 0 < low <= result["median_seconds"] <= high
    assert result["median_minor_faults"] >= 0 and result["cpu"]
    assert result["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"  # the setting it ran under is reported
    bad = subprocess.run([sys.executable, str(REPO / "bench" / "train_step.py"), "--steps", "0"],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert bad.returncode != 0 and "must be positive" in bad.stderr and "Traceback" not in bad.stderr


def test_lookup_prompts_end_where_the_vocabulary_cuts_the_text():
    lookup = load_bench("lookup")
    encoder = get_encoder_from_dir(REPO / "models" / "teach-target")
    function = 'def f(x):\n    """Twice x: caf\u00e9."""\n    return x * 2\n'
    prompt, rest = lookup.repeat_prompt(encoder, function, 2)
    assert list(prompt) + list(rest) == encoder.encode(function + "\n" + function)  # one encoding, cut once
    text = encoder.decode(list(prompt))
    assert text.startswith(function + "\n" + 'def f(x):\n    """Twice x: caf\u00e9."""\n')  # the restart lines
    assert text.endswith("\n   ") and encoder.decode(list(rest)) == " return x * 2\n"  # the line break and indent
    assert encoder.encode(text)[-1] != encoder.encode("\n")[0]  # not the lone line break that encoding apart ends on


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_features_bench_times_the_kept_features_beside_the_logits_alone(backend):
    command = [sys.executable, str(REPO / "bench" / "features.py"), "--rounds", "2", "--calls", "2", "--prompt_tokens",
               "8", "--backend", backend]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = json.loads(completed.stdout)
    assert result["logits_identical"] and result["backend"] == backend and result["blas_threads"] == 1
    assert "family" in result["machine"]
    for call in ("decode_step", "verify_5"):
        row = result[call]
        assert row["with_features_ms"] > 0 and row["logits_only_ms"] > 0
        assert row["ratio"]["range"][0] <= row["ratio"]["median"] <= row["ratio"]["range"][1]


ROW_KEYS = {"drafter", "category", "temperature", "K", "n_nodes", "c", "alpha", "alpha_per_depth", "tokens_per_call",
            "speedup", "predicted_speedup", "same_tokens_as_autoregressive", "split", "prompts", "rounds",
            "acceptance_by_depth", "accepted_length_counts", "mean_accepted_tokens", "calibration",
            "calibrated_speedup", "calibrated_prediction"}


def run_spec_bench(tmp_path, *flags):  # -> the JSON object of a --quick run (the heads left out: skipped, with why)
    for name in ("teach-target", "teach-draft"):
        (tmp_path / name).symlink_to(REPO / "models" / name)
    command = [sys.executable, "bench/spec_bench.py", "--quick", "--models_dir", str(tmp_path), *flags,
               "--out", str(tmp_path / "drafters.json")]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert json.loads((tmp_path / "drafters.json").read_text()) == result
    return result


def test_drafters_bench_chooses_on_the_development_split_and_times_on_the_test_split(tmp_path):
    result = run_spec_bench(tmp_path, "--drafters", "draft,prompt-lookup,medusa-chain", "--temperatures", "0",
                            "--k4_prompts", "2")
    assert {"machine", "command", "settings", "target_decode_ms", "rows", "skipped"} <= set(result)
    assert result["machine"].startswith("machine: ") and "bench/spec_bench.py --quick" in result["command"]
    assert [(row["drafter"], row["category"]) for row in result["rows"]] == [
        (drafter, category) for category in ("open", "copy", "structured") for drafter in ("draft", "prompt-lookup")]
    for row in result["rows"]:
        assert ROW_KEYS <= set(row) and row["temperature"] == 0 and row["n_nodes"] is None
        assert row["same_tokens_as_autoregressive"] is True  # greedy: every run's tokens are autoregressive decoding's
        assert row["split"] == "test" and row["prompts"] * row["rounds"] == row["runs"] == 1  # --quick: 1 x 1
        speedup = row["speedup"]
        assert speedup["low"] <= speedup["median"] <= speedup["high"] and speedup["std"] == 0
        assert row["c"] >= 0 and row["predicted_speedup"] > 0 and all(0 <= a <= 1 for a in row["alpha_per_depth"])
        # each K calibrated with runs of its own; the K kept is the one of the highest speedup on the dev prompts
        assert [(entry["K"], entry["n_nodes"]) for entry in row["calibration"]] == [(1, None), (2, None), (3, None)]
        kept = max(row["calibration"], key=lambda entry: entry["speedup"])
        assert (row["K"], row["calibrated_speedup"]) == (kept["K"], kept["speedup"])
        assert row["calibrated_prediction"] == kept["predicted_speedup"] > 0
        # alpha per depth is its histogram's ratio; the two conventions of accepted tokens per call
        histogram = row["acceptance_by_depth"]
        assert [entry["depth"] for entry in histogram] == list(range(1, len(histogram) + 1))
        assert row["alpha_per_depth"] == [entry["accepted"] / entry["judged"] for entry in histogram]
        accepted = row["mean_accepted_tokens"]
        assert accepted["spec_bench"] == row["tokens_per_call"] >= 1
        assert accepted["specforge_simulated"] == pytest.approx(
            sum(np.prod(row["alpha_per_depth"][:d]) for d in range(1, len(histogram) + 1)))
        counts = row["accepted_length_counts"]  # loops by drafts accepted, those that drafted none too
        assert sum(n * count for n, count in enumerate(counts)) == sum(entry["accepted"] for entry in histogram)
        assert sum(counts) >= (histogram[0]["judged"] if histogram else 1)
    (skipped,) = result["skipped"]
    assert skipped["drafter"] == "medusa-chain" and "head.json" in skipped["why"]
    files = result["settings"]["prompt_files"]
    for split in ("dev", "test"):
        committed = (REPO / "bench" / "prompts" / f"{split}.json").read_bytes()
        assert files[split]["sha256"] == hashlib.sha256(committed).hexdigest()
        assert files[split]["command"] == "python bench/spec_splits.py"
    assert set(files["dev"]) >= {"calibration"} and "timed" not in files["dev"] and "at_K4" not in files["dev"]
    assert files["dev"]["calibration"] == files["test"]["timed"] == {
        category: [f"{category}-00"] for category in ("open", "copy", "structured")}
    # at_K4 reads the test split, 2 prompts per category here where the timed rows read 1
    assert {row["drafter"] for row in result["at_K4"]} == {"draft"} and {row["split"] for row in result["at_K4"]} == {
        "test"}
    assert [row["prompts"] for row in result["at_K4"]] == [2, 2, 2, 6]
    assert files["test"]["at_K4"] == {category: [f"{category}-00", f"{category}-32"]
                                      for category in ("open", "copy", "structured")}  # spread over the 64


def test_drafters_bench_runs_eagle3_as_a_chain_and_a_tree_beside_the_draft_and_skips_it_without_its_head(tmp_path):
    from helpers import BUNDLED_DRAFT_VOCABULARY, write_eagle3_head

    import utils

    bench = load_bench("spec_bench")
    args = bench.parse_args(["--quick", "--models_dir", str(tmp_path), "--drafters", "eagle3-chain,eagle3-tree"])
    _, hparams, params = utils.load_encoder_hparams_and_params("teach-target", REPO / "models")
    target = gpt2.GPT2Model(params, hparams)
    built, skipped = bench.build_drafters(target, None, args)
    assert built == [] and [row["drafter"] for row in skipped] == ["eagle3-chain", "eagle3-tree"]
    assert all("teach-eagle3 is not a drafter's head: head.safetensors, head.json missing" in row["why"]
               for row in skipped)
    write_eagle3_head(tmp_path / "teach-eagle3", target.hparams, BUNDLED_DRAFT_VOCABULARY[:256])
    result = run_spec_bench(tmp_path, "--drafters", "draft,eagle3-chain,eagle3-tree", "--categories", "open",
                            "--temperatures", "0")
    assert result["skipped"] == [] and all(row["same_tokens_as_autoregressive"] for row in result["rows"])
    assert [(row["drafter"], row["n_nodes"]) for row in result["rows"]] == [
        ("draft", None), ("eagle3-chain", None), ("eagle3-tree", bench.EAGLE_TREES[0][1])]
    assert [(row["drafter"], row["K"], row["n_nodes"]) for row in result["at_K4"] if row["category"] == "all"] == [
        ("draft", 4, None), ("eagle3-chain", 4, None),
        *[("eagle3-tree", 4, n_nodes) for n_nodes in bench.K4_TREE_NODES]]
    measures = {name: margin["measure"] for name, margin in result["at_K4_margins"].items()}
    assert measures == {"eagle3-chain / draft": "alpha",  # a chain in alpha, a tree in tokens per target call
                        **{f"eagle3-tree {n_nodes} / draft": "tokens_per_call" for n_nodes in bench.K4_TREE_NODES}}


def test_drafters_bench_judges_a_recipe_on_the_development_split_alone(tmp_path):
    result = run_spec_bench(tmp_path, "--drafters", "draft", "--categories", "open", "--at_K4_only",
                            "--at_K4_split", "dev")
    assert result["rows"] == [] and list(result["settings"]["prompt_files"]) == ["dev"]
    assert [(row["category"], row["split"], row["prompts"]) for row in result["at_K4"]] == [("open", "dev", 1),
                                                                                            ("all", "dev", 1)]
    assert result["settings"]["prompt_files"]["dev"]["at_K4"] == {"open": ["open-00"]}


@pytest.mark.parametrize("damage", ["vocabulary", "missing", "swapped"])
def test_drafters_bench_refuses_prompt_files_it_cannot_use(damage, tmp_path):
    for split in ("dev", "test"):
        content = json.loads((REPO / "bench" / "prompts" / f"{split}.json").read_text())
        content["settings"]["vocabulary_sha256"] = "0" * 64 if damage == "vocabulary" else \
            content["settings"]["vocabulary_sha256"]
        content["split"] = {"dev": "test", "test": "dev"}[split] if damage == "swapped" else split
        if not (damage == "missing" and split == "test"):
            (tmp_path / f"{split}.json").write_text(json.dumps(content))
    command = [sys.executable, "bench/spec_bench.py", "--quick", "--prompts_dir", str(tmp_path)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert completed.returncode == 2 and completed.stdout == "" and "Traceback" not in completed.stderr
    assert completed.stderr.startswith("error: ") and len(completed.stderr.strip().splitlines()) == 1
    assert {"vocabulary": "another vocabulary", "missing": "python bench/spec_splits.py",
            "swapped": "not 'dev'"}[damage] in completed.stderr


def test_drafters_bench_reports_eagles_tree_one_hot_and_sampled_at_temperature_1(tmp_path):
    """At temperature 1 EAGLE's head drafts two trees, in rows named apart: EAGLE-2's dynamic tree, its chosen nodes
    judged by the one-hot rule, and a sampled tree (three drafts drawn from the head's p, judged against it by recursive
    rejection); at temperature 0 the sampled tree's drafts would be one chain, so it has no row there."""
    (tmp_path / "teach-eagle").symlink_to(REPO / "models" / "teach-eagle")
    result = run_spec_bench(tmp_path, "--drafters", "eagle-tree,eagle-sampled-tree", "--categories", "open")
    rows = {(row["drafter"], row["temperature"]): row for row in result["rows"]}
    assert set(rows) == {("eagle-tree", 0), ("eagle-tree", 1), ("eagle-sampled-tree", 1)} and not result["skipped"]
    assert rows["eagle-tree", 1]["tree_rule"] == "one-hot" and rows["eagle-sampled-tree", 1]["tree_rule"] == "sampled"
    sampled = rows["eagle-sampled-tree", 1]
    assert (sampled["K"], sampled["n_nodes"], sampled["split"]) == (1, None, "test")  # --quick: depth 1 alone
    assert 1 <= sampled["tokens_per_call"] <= 2 and result["settings"]["choices"]["eagle-sampled-tree"] == [[1, None]]


def test_recorded_loops_merge_a_loops_drafts_and_read_acceptance_from_the_decoders_record():
    """The drafts proposed from the same x are one loop's sampled tree (nodes shared where prefixes are); accepted and
    judged come from the decoder's origins, not from matching the tokens against the tree."""
    spec_stats = load_bench("spec_stats")

    class Fixed:  # proposes the given chains in turn, each one-hot
        n_vocab = 5

        def __init__(self, chains):
            self.chains = iter(chains)

        def propose(self, x, K, settings, rng, stats):
            drafts = np.array(next(self.chains), dtype=np.int64)
            return drafts, np.eye(5, dtype=np.float32)[drafts]

    recorded = spec_stats.Recorded(Fixed([[1, 2], [1, 3], [4], [2, 2]]))
    for length in (5, 5, 5, 7):
        recorded.propose(np.zeros(length, dtype=np.int64), 2, sampling.GREEDY, np.random.default_rng(0), None)
    # loop 1: nodes 1, 1-2, 1-3, 4; one accepted, the next judged and refused; loop 2: both accepted, then the bonus
    assert recorded.loops(["accepted", "corrected", "accepted", "accepted", "bonus"]) == [(1, 2, 4), (2, 2, 2)]
    with pytest.raises(AssertionError, match="3 loops decoded, 2 proposed"):
        recorded.loops(["corrected", "corrected", "target"])


def test_drafters_bench_replays_what_each_loop_accepted():
    """The loops the benchmark reads back from a run (its alpha per depth and its formula) hold exactly what the
    decoder counted: as many loops, the same accepted drafts, the same tokens."""
    from drafters.eagle import init_head
    from drafters.eagle2 import EagleTree
    from speedup.drafts import PromptLookup

    bench, stats = load_bench("spec_bench"), load_bench("spec_stats")
    params = gpt2.init_params(TINY, np.random.default_rng(0))
    target = gpt2.GPT2Model(params, TINY)
    prompt = np.array([5, 17, 3, 9, 5, 17, 3, 9, 5, 17], dtype=np.int64)
    head = init_head(TINY, np.random.default_rng(1))
    drafters = [bench.Drafter("prompt-lookup", target, PromptLookup(TINY["n_vocab"]), [(3, None)]),
                bench.Drafter("eagle-tree", target, EagleTree(target, head, 4), [(3, 4)], "dynamic"),
                bench.Drafter("eagle-sampled-tree", target, EagleTree(target, head, 4), [(3, None)], "sampled")]
    for drafter in drafters:
        for temperature in (0.0, 1.0):
            out, seconds, run_stats, loops = bench.run(target, drafter, drafter.choices[0], prompt, 20, temperature, 0)
            assert len(loops) == run_stats.loops and sum(accepted for accepted, _, _ in loops) == run_stats.accepted
            assert sum(1 + accepted for accepted, _, _ in loops) == run_stats.generated == 20 and seconds > 0
            assert sum(judged - accepted for accepted, judged, _ in loops) == run_stats.rejected
            assert all(accepted <= judged <= accepted + 1 for accepted, judged, _ in loops)
            counts = stats.accepted_length_counts(loops)
            assert sum(counts) == len(loops) and sum(n * count for n, count in enumerate(counts)) == run_stats.accepted
            # a loop's drafted: its tree's nodes; a sampled tree merges its 3 drafts of K tokens, sharing prefixes
            most = {None: 3, "dynamic": 4, "sampled": 3 * 3}[drafter.drafts]
            assert all(accepted <= drafted <= most for accepted, _, drafted in loops)
            if drafter.drafts == "sampled":  # three draws from x: more nodes than a chain's where they differ
                assert max(drafted for *_, drafted in loops) > 3 or temperature == 0
    loops = [(2, 3, 4), (0, 1, 4), (4, 4, 4)]
    assert stats.acceptance_by_depth(loops) == [{"depth": 1, "judged": 3, "accepted": 2},
                                                {"depth": 2, "judged": 2, "accepted": 2},
                                                {"depth": 3, "judged": 2, "accepted": 1},
                                                {"depth": 4, "judged": 1, "accepted": 1}]
    assert stats.alpha_per_depth(loops) == [2 / 3, 1, 1 / 2, 1] and stats.accepted_length_counts(loops) == [1, 0, 1, 0, 1]
    # SpecForge's simulated length, a1 + a1 a2 + ...: a chain's mean accepted drafts, here (2 + 0 + 4) / 3
    assert stats.specforge_acceptance_length([2 / 3, 1, 1 / 2, 1]) == pytest.approx(2)
    assert stats.summary([1.0, 3.0, 2.0]) == {"median": 2.0, "low": 1.0, "high": 3.0, "mean": 2.0, "std": 1.0}


def test_held_out_prompts_of_each_kind():
    from bench import heldout

    text = "Some prose.\n\ndef f(a):\n    b = a + 1\n\n    return b\n\n\ndef broken(:\n    x\nmore prose\n"
    assert heldout.held_out_functions(text, min_lines=3) == ["def f(a):\n    b = a + 1\n\n    return b\n"]
    assert heldout.repetition([1, 2, 3, 4, 5, 6]) == 0
    assert heldout.repetition([1, 2, 3, 4] * 3) == 5 / 9  # 9 4-grams, the last 5 seen before
    tokens = np.array(list(range(100, 160)) + [1, 2, 3, 4] * 10 + list(range(200, 260)))
    starts, scores = heldout.structured_starts(tokens, 1, 8, 8)
    assert scores == [9 / 13] and set(tokens[starts[0]:starts[0] + 16].tolist()) <= {1, 2, 3, 4}  # inside the repeats
    assert heldout.open_starts(len(tokens), 4, 8) == [0, 37, 74, 111]  # every (160 - 8 - 1) // 4 tokens
    assert heldout.spread(list(range(10)), 4) == [0, 2, 5, 7] and heldout.spread([1, 2], 5) == [1, 2]


def committed_prompts():
    return {split: json.loads((REPO / "bench" / "prompts" / f"{split}.json").read_text()) for split in ("dev", "test")}


def windows_of(content):  # -> {(document, start or function): tokens} of every prompt in a split's file
    return {(tuple(prompt["documents"]), category, prompt.get("start", prompt.get("function"))): tuple(prompt["tokens"])
            for category, prompts in content["categories"].items() for prompt in prompts}


def runs_of(content, n=32):  # -> every n tokens in a row of a split's prompts
    return {tuple(tokens[i:i + n]) for tokens in windows_of(content).values() for i in range(len(tokens) - n + 1)}


def assert_disjoint_splits(files):
    """No document in both splits, every prompt from its own split's documents, and no prompt in both."""
    from bench import spec_splits

    dev, test = files["dev"], files["test"]
    assert dev["documents"] and test["documents"] and not set(dev["documents"]) & set(test["documents"])
    for split, content in files.items():
        assert all(spec_splits.split_of(name) == split for name in content["documents"])
        for prompts in content["categories"].values():
            assert len({prompt["id"] for prompt in prompts}) == len(prompts)
            assert all(set(prompt["documents"]) <= set(content["documents"]) for prompt in prompts)
    assert not set(windows_of(dev).values()) & set(windows_of(test).values())


def test_committed_prompt_splits_are_disjoint_and_follow_the_rule():
    """bench/prompts/{dev,test}.json: cut from the held-out build models/corpus_manifest.json records, each of its
    documents in the split the rule names, by the vocabulary of the bundled target."""
    from bench import spec_splits

    files, recorded = committed_prompts(), json.loads((REPO / "models" / "corpus_manifest.json").read_text())
    assert_disjoint_splits(files)
    # nor 32 tokens in a row in both (shorter runs are shared: a licence line, a common docstring)
    assert not runs_of(files["dev"]) & runs_of(files["test"])
    counts = f"{len(files['dev']['documents'])} documents dev, {len(files['test']['documents'])} test"
    assert counts in " ".join((REPO / "bench" / "README.md").read_text().split())  # what bench/README.md says
    vocabulary = hashlib.sha256((REPO / "models" / "teach-target" / "encoder.json").read_bytes()).hexdigest()
    for split, content in files.items():
        assert content["heldout"]["sha256"] == recorded["outputs"]["heldout.txt"]["sha256"]
        assert content["documents"] == [name for name in recorded["documents"]["heldout"]
                                        if spec_splits.split_of(name) == split]
        assert content["settings"] == {**spec_splits.CUT, "max_function_tokens": (512 - 48) // 2 - 8,
                                       "vocabulary_sha256": vocabulary}
        assert content["command"] == "python bench/spec_splits.py" and content["rule"] == spec_splits.RULE
        assert {category: len(prompts) for category, prompts in content["categories"].items()} == {
            "open": 64, "copy": 64, "structured": 64}
        assert spec_splits.file_text(content) == (REPO / "bench" / "prompts" / f"{split}.json").read_text()


def test_prompt_splits_regenerate_identically_from_the_held_out_sample(tmp_path):
    """The cut on the committed sample of the held-out text, as four documents: run twice, the same bytes; the splits
    disjoint; every window the tokens of its documents, every copy prompt a function of its document."""
    from bench import heldout, spec_splits

    lines = (REPO / "tests" / "fixtures" / "heldout_sample.txt").read_text().splitlines(keepends=True)
    documents = [(f"heldout_sample.txt:{first + 1}", "".join(lines[first:first + 62])) for first in range(0, 248, 62)]
    assert [spec_splits.split_of(name) for name, _ in documents] == ["test", "test", "dev", "dev"]
    (tmp_path / "heldout.txt").write_text("<|endoftext|>".join(text for _, text in documents))
    (tmp_path / "manifest.json").write_text(json.dumps({"documents": {"heldout": [name for name, _ in documents]}}))
    flags = ["--heldout", str(tmp_path / "heldout.txt"), "--per_category", "2", "--prompt_tokens", "16",
             "--new_tokens", "8"]
    texts = []
    for _ in range(2):  # into the same folder: the command each file records names it
        completed = subprocess.run([sys.executable, "bench/spec_splits.py", *flags, "--out_dir", str(tmp_path / "out")],
                                   capture_output=True, text=True, timeout=120, cwd=REPO)
        assert completed.returncode == 0, completed.stderr[-2000:]
        texts.append({split: (tmp_path / "out" / f"{split}.json").read_text() for split in ("dev", "test")})
    assert texts[0] == texts[1]
    files = {split: json.loads(text) for split, text in texts[0].items()}
    assert_disjoint_splits(files)
    encoder = get_encoder_from_dir(REPO / "models" / "teach-target")
    for split, content in files.items():
        mine = [(name, text) for name, text in documents if name in content["documents"]]
        tokens, _ = spec_splits.document_tokens(encoder, mine)
        functions = [source for _, text in mine for source in heldout.held_out_functions(text)]
        for category, prompts in content["categories"].items():
            assert len(prompts) == (min(2, len(functions)) if category == "copy" else 2), category
            for prompt in prompts:
                if category == "copy":
                    assert encoder.decode(prompt["tokens"]).startswith(functions[prompt["function"]])
                else:
                    assert prompt["tokens"] == tokens[prompt["start"]:prompt["start"] + 16].tolist()


def test_prompt_splits_need_every_document_named(tmp_path):
    (tmp_path / "heldout.txt").write_text("one<|endoftext|>two")
    (tmp_path / "manifest.json").write_text(json.dumps({"documents": {"heldout": ["one"]}}))
    completed = subprocess.run([sys.executable, "bench/spec_splits.py", "--heldout", str(tmp_path / "heldout.txt"),
                                "--out_dir", str(tmp_path)], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert completed.returncode == 2 and "names 1 held-out documents" in completed.stderr
    assert "Traceback" not in completed.stderr and not (tmp_path / "dev.json").exists()


def test_every_bench_script_that_builds_a_drafter_runs_as_a_file():
    """Python puts a script's own folder first on its path: a bench/drafters.py would hide the drafters package from
    every script beside it (hence bench/spec_bench.py)."""
    assert not (REPO / "bench" / "drafters.py").exists()
    for script in ("spec_bench.py", "early_exit.py", "drafter_zoo.py", "frspec_vocabulary.py"):
        completed = subprocess.run([sys.executable, f"bench/{script}", "--help"], capture_output=True, text=True,
                                   timeout=120, cwd=REPO)
        assert completed.returncode == 0, completed.stderr[-1000:]


def test_the_early_exit_bench_times_the_verification_reused_and_recomputed():
    from drafters.early_exit import EarlyExit

    early_exit = load_bench("early_exit")
    target = gpt2.GPT2Model(gpt2.init_params(TINY, np.random.default_rng(0)), TINY)
    seconds = early_exit.time_loop_calls(target, EarlyExit(target, 1), np.array([3, 1, 4, 1, 5]), 3, rounds=2)
    assert set(seconds) == {"draft_step", "reused", "recomputed", "decode_step", "readout"}
    assert min(seconds.values()) > 0
    work = early_exit.verification_work(8, 2, 4, {"reused": 1.0, "recomputed": 2.0, "decode_step": 0.5, "readout": 0.2})
    assert work["decode_steps"] == {"reused": 2.0, "recomputed": 4.0} and work["fall_in_time"] == 0.5
    assert work["readout_decode_steps"] == 0.4 and work["blocks_decode_steps"] == pytest.approx(
        {"reused": 1.6, "recomputed": 3.6})  # the rest of each call: its blocks
    assert work["fall_in_block_time"] == pytest.approx(1 - 1.6 / 3.6)
    assert work["one_block_decode_steps"] == pytest.approx({"reused": 1.6 / 6, "recomputed": 3.6 / 8})
    assert work["block_rows"] == {"reused": 5 * 6, "recomputed": 5 * 8}  # the draft fed all 5 rows through blocks 1-2
    assert work["fall_in_block_rows"] == pytest.approx(work["exit_layer_share"]) == 0.25


def test_the_early_exit_bench_chooses_its_exit_layer_on_dev_prompts_and_reports_on_test_prompts(monkeypatch, capsys):
    """The choice reads the development split's open prompts alone, every reported row the test split's: a bench
    that read the wrong split fails."""
    early_exit, read = load_bench("early_exit"), []
    greedy_acceptance = early_exit.greedy_acceptance
    monkeypatch.setattr(early_exit, "greedy_acceptance", lambda target, draft, prompts, *rest: read.append(
        (rest[-1], as_lists(prompts))) or greedy_acceptance(target, draft, prompts, *rest))
    early_exit.main(["--exit_layers", "1,6", "--n_prompts", "2", "--prompt_tokens", "16", "--n_tokens", "6",
                     "--K", "2", "--rounds", "1"])
    result = json.loads(capsys.readouterr().out)
    dev, test = split_prompts("dev", 2, 16), split_prompts("test", 2, 16)
    assert read == [(f"exit layer {layer}, {split}", prompts) for layer in (1, 6)
                    for split, prompts in (("dev", dev), ("test", test))]
    choice, rows = result["choice"], result["by_exit_layer"]
    assert choice["split"] == "dev" and [row["split"] for row in choice["by_exit_layer"]] == ["dev", "dev"]
    assert result["split"] == "test" and [row["split"] for row in rows] == ["test", "test"]
    assert result["chosen_exit_layer"] == max(choice["by_exit_layer"], key=lambda row: row["expected_speedup"])[
        "exit_layer"]
    assert {split: record["split"] for split, record in result["prompts"].items()} == {"dev": "dev", "test": "test"}
    for row in rows:  # the expected speedup of each split prices its own alpha at the same c and v
        assert row["expected_speedup"] == pytest.approx(expected_speedup(row["alpha"], row["c"], 2, row["v_K_plus_1"]))


def test_the_drafters_bench_builds_kangaroo_at_its_confidence_threshold(capsys):
    import utils

    bench = load_bench("spec_bench")
    assert bench.parse_args([]).confidence_threshold == 0.6  # Kangaroo's code's
    args = bench.parse_args(["--confidence_threshold", "0.25", "--quick"])
    _, hparams, params = utils.load_encoder_hparams_and_params("teach-target", REPO / "models")
    kangaroo = bench.build_drafter("kangaroo", gpt2.GPT2Model(params, hparams), None, args).model
    assert kangaroo.confidence_threshold == 0.25
    with pytest.raises(SystemExit):
        bench.parse_args(["--confidence_threshold", "1.5"])
    assert "--confidence_threshold must be a number in [0, 1], got 1.5" in capsys.readouterr().err


def test_each_drafter_of_the_bench_verifies_with_its_own_target_so_a_heads_taps_leave_the_exits_reuse_alone():
    """EAGLE taps blocks 1..6; on one shared target the early exit (block 2) would find those taps and recompute its
    shallow layers instead of reusing them. Each drafter gets its own view of the same weights."""
    import utils

    bench = load_bench("spec_bench")
    args = bench.parse_args(["--quick", "--drafters", "eagle-chain,early-exit,kangaroo"])
    _, hparams, params = utils.load_encoder_hparams_and_params("teach-target", REPO / "models")
    target = gpt2.GPT2Model(params, hparams)
    built, skipped = bench.build_drafters(target, None, args)
    assert not skipped and [d.name for d in built] == ["eagle-chain", "early-exit", "kangaroo"]
    eagle, exit_draft, kangaroo = built
    assert len({id(d.target) for d in built} | {id(target)}) == 4 and target.taps == ()
    assert eagle.target.taps and exit_draft.target.taps == kangaroo.target.taps == ()
    assert all(d.target.params is target.params for d in built)  # views: no weights copied
    prompt = np.array([464, 1893, 286, 262, 995, 318], dtype=np.int64)
    out, _, stats, _ = bench.run(target, exit_draft, (3, None), prompt, 8, 0.0, 0)
    reference = sampling.autoregressive_sampling(prompt, target, 8, 0, temperature=0.0)
    assert np.array_equal(out, reference)
    exit_draft.target.reset()  # a draft of 3, then the target's call: the drafted positions enter after the exit
    exit_draft.model.propose(prompt, 3, sampling.GREEDY, np.random.default_rng(0), stats)
    assert exit_draft.target.exit_draft.reuse(exit_draft.target.exit_draft.tokens, exit_draft.target.exit_draft.start)


def test_a_paired_margin_is_level_inside_its_interval_and_named_outside_it():
    paired_margin = load_bench("spec_stats").paired_margin
    rng = np.random.default_rng(0)
    judged = rng.integers(20, 40, 64)
    theirs = [[round(0.7 * n), n, 60, 20] for n in judged]  # alpha 0.7, 3 tokens per target call
    same = paired_margin(theirs, theirs, "alpha")
    assert same["margin"] == 0 and same["verdict"] == "level" and same["prompts"] == 64
    better = [[round(0.9 * n), n, 80, 20] for n in judged]
    assert paired_margin(better, theirs, "alpha")["verdict"] == "ahead"
    assert paired_margin(theirs, better, "alpha")["verdict"] == "behind"
    ratio = paired_margin(better, theirs, "tokens_per_call")
    assert ratio["margin"] == pytest.approx(4 / 3) and ratio["interval_95"][0] <= 4 / 3 <= ratio["interval_95"][1]
    noisy = [[a + d, n, 60, 20] for (a, n, *_), d in zip(theirs, rng.integers(-3, 4, 64))]  # a wobble, no margin
    assert paired_margin(noisy, theirs, "alpha")["verdict"] == "level"


def test_at_K4_margins_set_every_other_heads_chain_against_eagles_as_well_as_each_drafter_against_the_draft():
    bench = load_bench("spec_bench")
    rows = {"draft": [[3, 4, 4, 2]] * 8, "eagle-chain": [[2, 4, 3, 2]] * 8, "eagle3-chain": [[4, 4, 5, 2]] * 8,
            "eagle3-tree 16": [[4, 4, 6, 2]] * 8, "kangaroo": [[1, 3, 2, 2]] * 8}
    margins = bench.k4_margins(rows)
    assert {name: margin["measure"] for name, margin in margins.items()} == {
        "eagle-chain / draft": "alpha", "eagle3-chain / draft": "alpha", "eagle3-tree 16 / draft": "tokens_per_call",
        "kangaroo / draft": "alpha", "eagle3-chain / eagle-chain": "alpha", "kangaroo / eagle-chain": "alpha",
        "eagle3-chain / eagle-chain, tokens per call": "tokens_per_call",
        "kangaroo / eagle-chain, tokens per call": "tokens_per_call"}
    assert margins["kangaroo / eagle-chain, tokens per call"]["margin"] == pytest.approx((2 / 2) / (3 / 2))  # a ratio
    assert margins["kangaroo / eagle-chain"]["margin"] == pytest.approx(1 / 3 - 1 / 2)  # 1/3 against 2/4
    assert margins["kangaroo / eagle-chain"]["verdict"] == "behind"
    assert margins["eagle3-chain / eagle-chain"]["margin"] == pytest.approx(0.5)  # 4/4 against 2/4 on every prompt
    assert margins["eagle3-chain / eagle-chain"]["verdict"] == "ahead"
    assert list(bench.k4_margins({"eagle3-chain": rows["eagle3-chain"]})) == []


def test_the_early_exit_page_quotes_the_committed_run():
    """docs/DRAFTERS.md's early-exit table and its falls in time are bench/results/early_exit_cpu_zen4.json's: a figure
    left from an older run fails."""
    result = json.loads((REPO / "bench" / "results" / "early_exit_cpu_zen4.json").read_text())
    page = " ".join((REPO / "docs" / "DRAFTERS.md").read_text().split())
    for row in result["by_exit_layer"]:
        work, layers = row["verification"], row["exit_layer"]
        quoted = (f"{layers} layer{'s' if layers > 1 else ''} {row['alpha']:.2f} {row['tokens_per_target_call']:.2f} "
                  f"{row['c']:.2f} {work['decode_steps']['reused']:.2f} {work['decode_steps']['recomputed']:.2f} "
                  f"{work['block_rows']['reused']} / {work['block_rows']['recomputed']} {row['expected_speedup']:.2f}x")
        assert quoted in page
    percent = {key: [f"{100 * row['verification'][key]:.0f}%" for row in result["by_exit_layer"]]
               for key in ("fall_in_time", "fall_in_block_time")}
    for key, (l1, l2, l4, l6) in percent.items():
        assert f"{l1} and {l2} ({l4} and {l6}" in page, key
    readout = [row["verification"]["readout_decode_steps"] for row in result["by_exit_layer"]]
    assert (f"readout alone too (the same rows entering after the last block): {min(readout):.2f}-"
            f"{max(readout):.2f}") in page
    one_block = {path: [row["verification"]["one_block_decode_steps"][path] for row in result["by_exit_layer"]]
                 for path in ("reused", "recomputed")}
    dearer = [reused / recomputed - 1 for reused, recomputed in zip(*one_block.values())]
    assert (f"costs {100 * min(dearer):.0f}% to {100 * max(dearer):.0f}% more in the reused call "
            f"({min(one_block['reused']):.2f}-{max(one_block['reused']):.2f} of a decode step for 5 rows) than the "
            f"recomputing call's average block ({min(one_block['recomputed']):.2f}-{max(one_block['recomputed']):.2f})"
            ) in page


def quoted_margins(margins, drafter):  # -> "+0.042 (+0.029 to +0.055) 0.996 (0.984 to 1.008)": alpha's, the ratio's
    alpha, ratio = margins[f"{drafter} / eagle-chain"], margins[f"{drafter} / eagle-chain, tokens per call"]
    return (f"{alpha['margin']:+.3f} ({alpha['interval_95'][0]:+.3f} to {alpha['interval_95'][1]:+.3f}) "
            f"{ratio['margin']:.3f} ({ratio['interval_95'][0]:.3f} to {ratio['interval_95'][1]:.3f})")


def test_the_heads_at_one_budget_on_the_page_are_the_committed_runs():
    """docs/DRAFTERS.md's table of the heads at one budget is drafters_equal_budget_at_K4's: alpha, tokens per target
    call, each margin against EAGLE-1's head with its interval, and the judged drafts per call it quotes."""
    result = json.loads((REPO / "bench" / "results" / "drafters_equal_budget_at_K4_cpu_zen4.json").read_text())
    page = " ".join((REPO / "docs" / "DRAFTERS.md").read_text().split())
    overall = {row["drafter"]: row for row in result["at_K4"] if row["category"] == "all"}
    names = {"kangaroo": "Kangaroo's adapter (stop 0.6)", "eagle-chain": "EAGLE-1's head", "eagle3-chain":
             "EAGLE-3's draft", "medusa-chain": "Medusa-1's 4 heads", "draft": "the distilled draft model (2 x 192)"}
    assert set(overall) == set(names) and {row["prompts"] for row in overall.values()} == {192}
    for drafter, name in names.items():
        row = overall[drafter]
        quoted = f"{name} {row['alpha']:.3f} {row['tokens_per_call']:.2f}"
        margin = result["at_K4_margins"].get(f"{drafter} / eagle-chain")
        if margin:
            quoted += " " + quoted_margins(result["at_K4_margins"], drafter)
        assert quoted in page, quoted
    verdicts = {drafter: [result["at_K4_margins"][f"{drafter} / eagle-chain{measure}"]["verdict"]
                          for measure in ("", ", tokens per call")]
                for drafter in ("kangaroo", "eagle3-chain", "medusa-chain")}
    assert verdicts == {"kangaroo": ["ahead", "level"], "eagle3-chain": ["behind"] * 2, "medusa-chain": ["behind"] * 2}
    judged = {drafter: (overall[drafter]["tokens_per_call"] - 1) / overall[drafter]["alpha"]
              for drafter in ("kangaroo", "eagle-chain")}
    assert (f"the target judges {judged['kangaroo']:.2f} of its drafts per call against EAGLE-1's "
            f"{judged['eagle-chain']:.2f}") in page
    distilled_run = json.loads((REPO / "bench" / "results" /
                                "drafters_equal_budget_medusa_distilled_at_K4_cpu_zen4.json").read_text())
    distilled = next(row for row in distilled_run["at_K4"]
                     if row["drafter"] == "medusa-chain" and row["category"] == "all")
    assert (f"the same, the target's labels {distilled['alpha']:.3f} {distilled['tokens_per_call']:.2f} "
            + quoted_margins(distilled_run["at_K4_margins"], "medusa-chain")) in page
    assert distilled_run["settings"]["at_K4_split"] == "test" and distilled["prompts"] == 192
    assert f"they accept {distilled['alpha']:.3f} against {overall['medusa-chain']['alpha']:.3f}" in page
    alpha = {drafter: f"{row['alpha']:.3f}" for drafter, row in overall.items()}
    readme = " ".join((REPO / "README.md").read_text().split())
    assert (f"EAGLE-3's draft (α {alpha['eagle3-chain']} at K 4) and Medusa's heads ({alpha['medusa-chain']}) are "
            f"behind EAGLE's head ({alpha['eagle-chain']}); Kangaroo's adapter has more α ({alpha['kangaroo']}), "
            "level tokens per call") in readme
    card = " ".join((REPO / "models" / "README.md").read_text().split())
    assert (f"Kangaroo's adapter {alpha['kangaroo']}, EAGLE's head {alpha['eagle-chain']}, EAGLE-3's draft "
            f"{alpha['eagle3-chain']}, Medusa's heads {alpha['medusa-chain']}") in card
