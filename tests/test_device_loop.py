"""jax_backend/sampling_jax.py, the decoders whose whole loop runs on the device, held to sampling.py's results.

- The same tokens and statistics as the host's decoders (NumPy models) for the same seed: greedy, at
  temperature 1 and with top-k and top-p, for several K, up to the end of the context.
- Exactness: on the table models of tests/helpers.py, 20,000 device runs (vmapped over their uniforms)
  pass the chi-square test against the target at temperatures 1 and 0.7 with top-k and top-p, and a
  wrong resampling rule fails it; draw for draw they equal sampling.py's runs fed the same Generator.
- main.py --backend jax prints the NumPy backend's statistics on the bundled pair.
"""

import dataclasses

import numpy as np
import pytest

import gpt2
import main
import sampling
from gpt2_cases import random_params
from speedup.stats import SpeculativeStats
from helpers import DRAFT_TABLE, N_TOKENS, PROMPT, TARGET_TABLE, TableModel, assert_follows, \
    chi_square_p_value, exact_joint

jax = pytest.importorskip("jax")
from jax_backend import gpt2_jax, sampling_jax  # noqa: E402

LONG = dict(n_vocab=64, n_ctx=48, n_embd=32, n_head=4, n_layer=2)


@pytest.fixture(scope="module")
def pair():
    """A target and a draft that agrees with it often, not always (its embeddings perturbed)."""
    target = random_params(LONG, seed=20)
    noise = 0.3 * np.random.default_rng(22).standard_normal(target["wte"].shape)
    return {**target, "wte": (target["wte"] + noise).astype(np.float32)}, target


def host_and_device(decoder, params, x, N, seed, **kwargs):
    """The same decoder with NumPy models on the host and with JAX models on the device: -> (x, stats) each."""
    runs = []
    for module, make in ((sampling, gpt2.GPT2Model), (sampling_jax, gpt2_jax.JaxGPT2Model)):
        models = [make(p, LONG) for p in params]
        stats = SpeculativeStats()
        runs.append((getattr(module, decoder)(x, *models, N, **kwargs, rng=np.random.default_rng(seed),
                                              stats=stats), stats))
    return runs


COUNTERS = ("loops", "target_calls", "draft_calls", "drafted", "accepted", "rejected", "generated", "origins")


@pytest.mark.parametrize("settings, K", [(dict(temperature=0.0), 1), (dict(temperature=0.0), 4),
                                         (dict(temperature=0.0), 7), (dict(temperature=1.0), 4), (dict(temperature=0.8, top_k=8, top_p=0.9), 3)],
                         ids=str)
def test_speculative_tokens_and_stats_equal_the_hosts(pair, settings, K):
    """Prompts of 1 and 5 tokens, decoded to the end of the context (the target's block then starts earlier)."""
    judged = {"accepted": 0, "rejected": 0}
    for x, seed in (([5], 0), ([3, 9, 1, 4, 60], 1), ([3, 9, 1, 4, 60], 2)):
        N = LONG["n_ctx"] - len(x)
        (host, host_stats), (device, device_stats) = host_and_device("speculative_sampling", pair, x, N, seed, K=K,
                                                                    **settings)
        assert device.dtype == np.int64 and len(device) == len(x) + N
        np.testing.assert_array_equal(device, host, err_msg=f"K={K}, seed {seed}")
        for name in COUNTERS:
            assert getattr(device_stats, name) == getattr(host_stats, name), name
        judged = {key: value + getattr(device_stats, key) for key, value in judged.items()}
    assert judged["accepted"] > 5 and judged["rejected"] > 5  # both branches ran


@pytest.mark.parametrize("settings", [dict(temperature=0.0), dict(temperature=1.0),
                                      dict(temperature=0.7, top_k=5, top_p=0.9)], ids=str)
def test_autoregressive_tokens_equal_the_hosts(pair, settings):
    for x, seed in (([7], 3), ([3, 9, 1, 4, 60, 2, 2], 4)):
        (host, host_stats), (device, device_stats) = host_and_device("autoregressive_sampling", pair[1:], x,
                                                                    LONG["n_ctx"] - len(x), seed, **settings)
        np.testing.assert_array_equal(device, host)
        assert device_stats.target_calls == host_stats.target_calls and device_stats.origins == host_stats.origins


def test_the_models_caches_serve_the_decoded_sequence_afterwards(pair):
    draft, target = (gpt2_jax.JaxGPT2Model(p, LONG) for p in pair)
    x = sampling_jax.speculative_sampling([1, 2, 3], draft, target, 20, 4, rng=0)
    np.testing.assert_allclose(target.logits(x, n_last=3), gpt2.gpt2(x, **pair[1], n_head=4)[-3:], rtol=1e-4,
                               atol=1e-4)
    np.testing.assert_allclose(draft.logits(x), gpt2.gpt2(x, **pair[0], n_head=4)[-1:], rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="two model objects"):
        sampling_jax.speculative_sampling([1], target, target, 4, 2)
    with pytest.raises(ValueError, match="context"):
        sampling_jax.speculative_sampling([1], draft, target, LONG["n_ctx"], 2)


# --------------------------------------------------------------- exactness, on table models, vmapped


@dataclasses.dataclass(frozen=True)
class TableForward:
    """A device model whose next-token logits depend on the previous token only (helpers.TableModel)."""

    def __call__(self, table, cache, tokens, start):
        return table[tokens], cache


def table_runs(uniforms, settings, K=2, decoder="speculative", counters=False):
    """The device loop run once per row of uniforms (vmapped): -> the generated tokens [n_runs, N_TOKENS].

    counters: also the speculative loop's own loops, drafted and accepted, each [n_runs].
    """
    n, T = len(PROMPT), len(PROMPT) + N_TOKENS
    x = np.zeros(64 + K + 1, np.int32)
    x[:n] = PROMPT
    draft, target = (jax.numpy.asarray(np.asarray(table, np.float32)) for table in (DRAFT_TABLE, TARGET_TABLE))
    static = (settings.temperature, settings.top_k, settings.top_p)
    if decoder == "speculative":  # the un-jitted loop, so that a patched rule is traced afresh
        loop = lambda u: sampling_jax.speculative_loop.__wrapped__(
            TableForward(), draft, (), TableForward(), target, (), x, n, T, u, n_prompt=n, K=K, settings=static)[:5]
    else:
        loop = lambda u: sampling_jax.autoregressive_loop.__wrapped__(TableForward(), target, (), x, n, T, u,
                                                                      n_prompt=n, settings=static)[:1]
    outputs = [np.asarray(output) for output in jax.jit(jax.vmap(loop))(uniforms)]
    return (outputs[0][:, n:T], *outputs[2:]) if counters else outputs[0][:, n:T]


def uniforms(n_runs, K=2, seed=0):
    """Each run's uniforms as sampling_jax.speculative_sampling draws them from a Generator of its own seed."""
    budget = (K + 2) * N_TOKENS + 2 * K + 1
    return np.stack([sampling_jax.uniforms_from(np.random.default_rng([seed, i]), budget) for i in range(n_runs)])


def counts_of(tokens, n_vocab=4):
    return np.bincount(np.ravel_multi_index(tokens.T, (n_vocab,) * N_TOKENS), minlength=n_vocab**N_TOKENS)


EXACTNESS_SETTINGS = {"temperature 1": {}, "temperature 0.7, top-k": dict(temperature=0.7, top_k=3),
                      "temperature 0.7, top-p": dict(temperature=0.7, top_p=0.8),
                      "temperature 1, top-k and top-p": dict(top_k=3, top_p=0.7)}


@pytest.fixture(scope="module")
def many_uniforms():
    return uniforms(20_000)


@pytest.mark.parametrize("name", EXACTNESS_SETTINGS)
def test_device_speculative_sampling_follows_the_target(name, many_uniforms):
    settings = sampling.SamplingSettings(**EXACTNESS_SETTINGS[name])
    assert_follows(counts_of(table_runs(many_uniforms, settings)), exact_joint(TARGET_TABLE, settings))


def test_device_autoregressive_sampling_follows_the_model(many_uniforms):
    settings = sampling.SamplingSettings(temperature=0.7, top_p=0.9)
    tokens = table_runs(many_uniforms, settings, decoder="autoregressive")
    assert_follows(counts_of(tokens), exact_joint(TARGET_TABLE, settings))


def test_resampling_from_q_instead_of_max_fn_is_caught(monkeypatch, many_uniforms):
    monkeypatch.setattr(sampling_jax, "max_fn", lambda x, fallback: fallback)  # the wrong rule: q itself
    settings = sampling.SamplingSettings()
    counts, joint = counts_of(table_runs(many_uniforms, settings)), exact_joint(TARGET_TABLE, settings)
    assert counts[joint == 0].sum() == 0  # still only possible tokens...
    assert chi_square_p_value(counts[joint > 0], joint[joint > 0]) < 1e-9  # ...at the wrong frequencies


@pytest.mark.parametrize("name", ["temperature 1", "temperature 0.7, top-k", "temperature 1, top-k and top-p"])
def test_device_draws_equal_the_hosts_given_the_same_uniforms(name):
    """Run i of the device, fed Generator i's uniforms, generates what sampling.py generates with Generator i."""
    kwargs = EXACTNESS_SETTINGS[name]
    device, loops, drafted, accepted = table_runs(uniforms(300, seed=1), sampling.SamplingSettings(**kwargs),
                                                  counters=True)
    draft, target = TableModel(DRAFT_TABLE), TableModel(TARGET_TABLE)
    host, host_stats = [], []
    for i in range(300):
        host_stats.append(SpeculativeStats())
        host.append(sampling.speculative_sampling(PROMPT, draft, target, N_TOKENS, 2, np.random.default_rng([1, i]),
                                                  **kwargs, stats=host_stats[-1])[len(PROMPT):])
    assert len({tuple(row) for row in host}) >= 8  # varied draws, not one sequence
    np.testing.assert_array_equal(device, np.array(host))
    for name, counts in (("loops", loops), ("drafted", drafted), ("accepted", accepted)):  # the device's counters
        np.testing.assert_array_equal(counts, [getattr(stats, name) for stats in host_stats], err_msg=name)
    assert 0 < accepted.sum() < drafted.sum()


# ------------------------------------------------------------------------------------------ main.py


def test_main_with_the_jax_backend_prints_the_numpy_backends_statistics(capsys):
    reports, results = {}, {}
    for backend in ("numpy", "jax"):
        results[backend] = main.main(n_tokens_to_generate=16, repeats=1, temperature=0.0, backend=backend,
                                     color=False, verbose=True)  # the counts and costs are --verbose's
        reports[backend] = capsys.readouterr().out.splitlines()
    for name in ("autoregressive", "speculative"):
        numpy_run, jax_run = results["numpy"][name], results["jax"][name]
        assert set(jax_run) == set(numpy_run)  # the same JSON keys
        for key in ("tokens", "new_tokens", "text", "target_calls", "loops", "draft_calls", "drafted", "accepted",
                    "rejected", "acceptance_rate", "tokens_per_target_call"):
            assert jax_run.get(key) == numpy_run.get(key), (name, key)
    statistics_lines = lambda lines: [line for line in lines if line.startswith("  ") and  # not the texts' indented lines
                                      ("drafted:" in line or "acceptance rate" in line or "tokens:" in line)]
    assert len(statistics_lines(reports["numpy"])) == 3  # drafted/accepted/rejected, where tokens came from, alpha
    assert statistics_lines(reports["jax"]) == statistics_lines(reports["numpy"])
    assert any(line.startswith("  this run's costs: a target decode step") for line in reports["numpy"])
    timing = [line for line in reports["jax"] if "draft calls;" in line][0]  # the device times the loop as a whole
    assert "not timed apart" in timing
    assert not any("this run's costs: a target decode step" in line for line in reports["jax"])
