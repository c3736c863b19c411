"""Shared test setup. Under CI=true a skipped test fails: parity tests must run there."""

import os
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# the scripts the tests run (bench/, tools/, main.py) import the kit from this clone, installed or not
os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])


def give_each_xdist_worker_its_own_cores():
    """pytest.ini runs the tests on two pytest-xdist workers. Each worker's BLAS, JAX and torch would start a
    thread per core, and two workers' threads on the same two cores spent more time switching than working
    (21 minutes against 27 alone): each worker keeps its share of the cores, and what it starts inherits it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ...
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= workers:
        os.sched_setaffinity(0, cores[int(worker.removeprefix("gw")) % workers::workers])


give_each_xdist_worker_its_own_cores()  # before NumPy, JAX or torch start their threads
# measured layout plans go to a folder of this test run, never to the user's cache (engine/plan_cache.py)
os.environ["SPECULATIVE_KIT_CACHE"] = tempfile.mkdtemp(prefix="speculative-kit-cache-")

# The slow tier: what executes notebooks, runs a benchmark or a training tool end to end, compiles JAX's device
# loops, or checks the documents. Everything else is the quick tier (`python -m pytest -m quick`): the model against
# its references, the decoders, the exact oracle and the checker, the command line's checks and errors.
SLOW_FILES = {"test_notebooks.py", "test_bench.py", "test_gpu_bench.py", "test_verifier_gains.py",
              "test_text_quality.py", "test_readme.py", "test_commands.py", "test_pack_corpus.py", "test_distill_draft.py",
              "test_unlikelihood_target.py", "test_train_bpe.py", "test_corpus_packages.py", "test_device_loop.py",
              "test_jax_backend.py", "test_train_heads.py", "test_page_browser.py"}


def pytest_cmdline_main(config):
    """Two pytest-xdist workers, one a core, where pytest-xdist is installed and no -n was given; plain pytest
    (and `-n 0`, or `-p no:xdist`) runs the tests in one process. A notebook's tests share a worker (loadgroup)."""
    if (config.pluginmanager.hasplugin("xdist") and config.getoption("numprocesses", None) is None
            and not os.environ.get("PYTEST_XDIST_WORKER")):
        config.option.numprocesses, config.option.dist, config.option.tx = 2, "loadgroup", ["popen"] * 2


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.quick)
# OpenAI's GPT-2 vocabulary, committed with its licence: the tests need nothing outside the repository
GPT2_VOCAB_DIR = REPO / "tests" / "fixtures" / "gpt2-vocab"


def bundled_pair_after(text):  # -> (text's tokens, the draft, the target), the pair in the plain layout
    """The bundled pair (models/teach-*) in the plain layout, which repeats a run bit for bit, and a prompt."""
    import gpt2
    import utils

    encoder, target_hparams, target_params = utils.load_encoder_hparams_and_params("teach-target", REPO / "models")
    _, draft_hparams, draft_params = utils.load_encoder_hparams_and_params("teach-draft", REPO / "models")
    return (encoder.encode(text), gpt2.GPT2Model(draft_params, draft_hparams),
            gpt2.GPT2Model(target_params, target_hparams))


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    """Tiny model folders for main.py (tests/helpers.write_models_dir): target, draft, other-vocabulary, broken."""
    import helpers  # here, not above: NumPy must start after the cores are shared out

    return helpers.write_models_dir(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """A corpus of two splits packed with the bundled vocabulary: (corpus_dir, pack_dir, record)."""
    import helpers

    return helpers.pack_sample_corpus(tmp_path_factory.mktemp("pack"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") == "true" and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, where every test must run: {report.longrepr}"
