"""Shared test setup. Under CI=true a skipped test fails: parity tests must run there."""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# OpenAI's GPT-2 vocabulary, committed with its licence: the tests need nothing outside the repository
GPT2_VOCAB_DIR = REPO / "tests" / "fixtures" / "gpt2-vocab"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") == "true" and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, where every test must run: {report.longrepr}"
