"""Every `python main.py ...` command that README.md and docs/*.md show runs as written, with a few tokens: a
newcomer's first commands must not fail. The download command is run offline and must stop with a one-line
error. The prompt-lookup example's target really copies its prompt."""

import json
import os
import re
import socket
import subprocess
import sys

import pytest

import utils
from conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FEW_TOKENS = {"--n_tokens_to_generate": "4", "--repeats": "1"}
# main.py run with OpenAI's download URL replaced, so that a download fails fast and offline
OFFLINE_MAIN = ("import os, runpy, sys, utils; utils.OPENAI_BASE_URL = os.environ['UNREACHABLE_URL']; "
                "sys.argv[0] = 'main.py'; runpy.run_path('main.py', run_name='__main__')")


def shown_commands(text):
    """The `python main.py ...` commands of a document: in inline code, in code blocks and on indented lines."""
    commands = re.findall(r"`(python main\.py[^`]*)`", text)
    fenced = False
    for line in text.splitlines():
        fenced = fenced != line.startswith("```")
        shown = re.search(r"python main\.py[^`]*$", line)
        if shown and (fenced or line.startswith("    ")):
            commands.append(shown[0])
    return [re.sub(r"\s+#\s.*$", "", command).strip() for command in commands]


def all_commands():
    found = {}
    for path in DOCS:
        for command in shown_commands(path.read_text(encoding="utf-8")):
            found.setdefault(command, path.name)
    return sorted(found.items())


def with_few_tokens(command, page_folder=None):
    """The command with --n_tokens_to_generate 4 --repeats 1, replacing any values it gives them; a page it writes
    (--html) goes to page_folder, so that the committed docs/run.html stays the 64-token page it documents."""
    if page_folder is not None:
        command = re.sub(r"--html[ =](\S+)", lambda match: f"--html {page_folder / os.path.basename(match[1])}",
                         command)
    for flag, value in FEW_TOKENS.items():
        command, replaced = re.subn(rf"{flag}[ =]\S+", f"{flag} {value}", command)
        command += "" if replaced else f" {flag} {value}"
    return command


def downloads(command):
    return re.search(rf"--(draft|target)_model_size ({'|'.join(utils.OPENAI_MODEL_SIZES)})\b", command)


def run_shell(line, env=None):
    """A command line in bash, from the repository root, with this interpreter as `python`."""
    line = line.replace("python main.py", '"$KIT_PYTHON" main.py', 1)
    return subprocess.run(["bash", "-c", line], capture_output=True, text=True, cwd=REPO, timeout=600,
                          env={**os.environ, "KIT_PYTHON": sys.executable, "NO_COLOR": "1", **(env or {})})


def closed_port_url():
    with socket.socket() as probe:  # a port nothing listens on: bind one, then free it
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def test_the_docs_show_the_commands_a_newcomer_runs():
    commands = [command for command, _ in all_commands()]
    assert "python main.py --K 4 --temperature 0" in commands  # the first command on a fresh machine
    assert any("prompt-lookup" in command for command in commands) and any(map(downloads, commands))
    assert not any("[" in command for command in commands), "an optional flag in brackets is not a command"


@pytest.mark.slow
@pytest.mark.parametrize("command, document", [pair for pair in all_commands() if not downloads(pair[0])])
def test_every_shown_command_runs(command, document, tmp_path):
    if "--backend jax" in command:
        pytest.importorskip("jax")
    result = run_shell(with_few_tokens(command, tmp_path))
    assert result.returncode == 0, f"{document}: {command}\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr
    assert result.stdout.strip()


@pytest.mark.parametrize("command, document", [pair for pair in all_commands() if downloads(pair[0])])
def test_the_download_command_offline_stops_with_one_line(command, document, tmp_path):
    flags = with_few_tokens(command).removeprefix("python main.py")
    result = run_shell(f'"$KIT_PYTHON" -c "$OFFLINE_MAIN"{flags} --models_dir {tmp_path}',
                       env={"OFFLINE_MAIN": OFFLINE_MAIN, "UNREACHABLE_URL": closed_port_url()})
    assert result.returncode == 2, f"{document}: {command}\n{result.stderr}"
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr and os.listdir(tmp_path) == []


def test_the_prompt_lookup_example_copies_its_prompt():
    """The README's prompt-lookup example gives the target text it copies: most of the continuation's 4-grams
    come from the prompt (drafts.copied_fraction) and nearly every draft is kept. No timing."""
    (command,) = [command for command in shown_commands((REPO / "README.md").read_text(encoding="utf-8"))
                  if "prompt-lookup" in command]
    result = run_shell(f"{command} --repeats 1 --json")
    assert result.returncode == 0, result.stderr
    run = json.loads(result.stdout.strip().splitlines()[-1])
    assert run["draft"] == "prompt-lookup" and run["temperature"] == 0
    speculative = run["speculative"]
    assert speculative["new_tokens"] == run["autoregressive"]["new_tokens"]  # greedy: the same tokens
    assert speculative["copied_fraction"] >= 0.9 and speculative["acceptance_rate"] >= 0.9
    prompt = (REPO / "examples" / "copy_prompt.txt").read_text(encoding="utf-8").rstrip("\n")
    function, restart = prompt.split("\n\n")  # a function, then its first two lines again
    assert function.split("\n")[:2] == restart.split("\n") and len(function.split("\n")) >= 10
    assert run["prompt"] == prompt
