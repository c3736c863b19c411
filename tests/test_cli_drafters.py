"""main.py --draft_model_size eagle, eagle3, medusa, kangaroo: the drafters made from the bundled target with the heads
tools/train_heads.py trained (models/teach-eagle, teach-medusa, teach-kangaroo; eagle3 with a random head written as
its trainer writes one, until models/ holds a trained one), through the command line, and eagle's, eagle3's and
medusa's own tree (--verifier tree --tree_drafts dynamic). The heads' quality is not tested here, only that at
temperature 0 every run writes the autoregressive tokens and reports its costs, and that bad flags are refused in one
line."""

import inspect
import json
import shutil
from pathlib import Path

import pytest

import main
from conftest import REPO
from encoder import get_encoder
from drafters.eagle2 import EagleTree
from drafters.load import DEFAULT_N_NODES, DRAFTERS, HEAD_FOLDERS
from helpers import BUNDLED_DRAFT_VOCABULARY, assert_short_error, run_main, write_eagle3_head

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


TARGET_HPARAMS = json.loads((REPO / "models" / "teach-target" / "hparams.json").read_text())


@pytest.fixture(scope="module")
def eagle3_models(tmp_path_factory):  # -> a models folder: the bundled one's, with a random EAGLE-3 head
    root = tmp_path_factory.mktemp("eagle3")
    for bundled in (REPO / "models").glob("teach-*"):
        if bundled.is_dir() and bundled.name != HEAD_FOLDERS["eagle3"]:
            (root / bundled.name).symlink_to(bundled)
    write_eagle3_head(root / "teach-eagle3", TARGET_HPARAMS, BUNDLED_DRAFT_VOCABULARY[:256])
    return root


@pytest.mark.parametrize("keywords, tree_nodes", CONFIGURATIONS, ids=IDS)
def test_each_drafter_writes_the_autoregressive_tokens_and_reports_its_costs(capsys, keywords, tree_nodes):
    result = main.main(prompt=PROMPT, n_tokens_to_generate=8, K=3, temperature=0, repeats=1, color=False, **keywords)
    assert_the_drafters_run(result, capsys.readouterr().out, keywords, tree_nodes)


@pytest.mark.parametrize("keywords, tree_nodes", [
    ({"draft_model_size": "eagle3"}, None),
    ({"draft_model_size": "eagle3", "verifier": "tree", "tree_drafts": "dynamic", "tree_nodes": 6}, 6),
], ids=["eagle3", "eagle3-tree"])
def test_eagle3_writes_the_autoregressive_tokens_and_reports_its_costs(capsys, eagle3_models, keywords, tree_nodes):
    result = main.main(prompt=PROMPT, n_tokens_to_generate=8, K=3, temperature=0, repeats=1, color=False,
                       models_dir=str(eagle3_models), **keywords)
    assert_the_drafters_run(result, capsys.readouterr().out, keywords, tree_nodes)


def assert_the_drafters_run(result, out, keywords, tree_nodes):
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
        held = speculative["tree_nodes_per_loop"]
        assert 1 <= held <= tree_nodes
        assert (f"a token tree grown by {keywords['draft_model_size']} within a budget of {tree_nodes} nodes "
                f"({held:.1f} held per loop on average)") in " ".join(out.split())


def test_the_report_says_how_many_nodes_the_tree_held_not_the_budget(capsys, monkeypatch):
    """--tree_nodes is a budget: EAGLE-2's tree at K 3 with 3 children a node holds at most 3 + 2 * 9 = 21 nodes."""
    sizes, draft_tree = [], EagleTree.draft_tree

    def recorded(self, *arguments):
        tree = draft_tree(self, *arguments)
        sizes.append(len(tree.tokens))
        return tree

    monkeypatch.setattr(EagleTree, "draft_tree", recorded)
    result = main.main(prompt=PROMPT, n_tokens_to_generate=8, K=3, temperature=0, repeats=1, color=False,
                       draft_model_size="eagle", verifier="tree", tree_drafts="dynamic", tree_nodes=100000,
                       verbose=True)
    out = " ".join(capsys.readouterr().out.split())
    grown = [size for size in sizes if size]
    held = result["speculative"]["tree_nodes_per_loop"]
    assert held == pytest.approx(sum(grown) / len(grown)) and max(grown) <= 21
    assert f"within a budget of 100000 nodes ({held:.1f} held per loop on average)" in out
    # --verbose counts a tree's nodes and children, not "drafts per loop"
    assert f"{result['speculative']['drafted']} tree nodes drafted (up to 3 children a node," in out
    assert "drafts per loop" not in out


def test_medusas_tree_decodes_up_to_the_end_of_the_context():
    """The last loops' trees are trimmed to the room left in the target's context of 512 tokens, as EAGLE-2's are
    (tests/test_drafters_eagle2.py)."""
    encoder = get_encoder(*(f"{main.flags.BUNDLED_MODELS_DIR}/teach-target/{file}" for file in ("encoder.json",
                                                                                              "vocab.bpe")))
    prompt = encoder.decode(encoder.encode((REPO / "sampling.py").read_text())[:504])
    N = 512 - len(encoder.encode(prompt))
    result = main.main(prompt=prompt, n_tokens_to_generate=N, K=4, temperature=0, repeats=1, json=True,
                       draft_model_size="medusa", verifier="tree", tree_drafts="dynamic")
    assert result["speculative"]["new_tokens"] == result["autoregressive"]["new_tokens"]
    assert len(result["speculative"]["new_tokens"]) == N >= 6


@pytest.mark.parametrize("name", ["eagle", "medusa"])
def test_eagle_and_medusa_read_the_jax_targets_features(capsys, name):
    result = main.main(prompt=PROMPT, n_tokens_to_generate=8, K=3, temperature=0, repeats=1, color=False,
                       draft_model_size=name, backend="jax")
    assert result["speculative"]["new_tokens"] == result["autoregressive"]["new_tokens"]
    assert result["speculative"]["acceptance_rate"] > 0  # the drafts read real features, not zeros


def test_eagle3_reads_the_jax_targets_streams(eagle3_models):
    result = main.main(prompt=PROMPT, n_tokens_to_generate=8, K=3, temperature=0, repeats=1, json=True,
                       draft_model_size="eagle3", backend="jax", models_dir=str(eagle3_models))
    assert result["speculative"]["new_tokens"] == result["autoregressive"]["new_tokens"]
    assert result["speculative"]["drafted"] > 0


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
    (dict(draft_model_size="eagle", tree_nodes=4), "--tree_nodes applies to the tree eagle, eagle3 or medusa grow"),
    (dict(draft_model_size="medusa", verifier="tree", tree_nodes=4), "--tree_nodes applies to the tree"),
    (dict(draft_model_size="early-exit", verifier="tree", tree_drafts="top_k", tree_nodes=4), "--tree_nodes applies"),
    (dict(draft_model_size="eagle", verifier="tree", tree_drafts="dynamic", tree_nodes=0),
     "--tree_nodes must be an integer >= 1, got 0"),
    (dict(draft_model_size="kangaroo", verifier="tree", tree_drafts="dynamic"), "needs a drafter that grows its own"),
    (dict(draft_model_size="medusa", batch_size=2), "nor eagle, eagle3, medusa or kangaroo"),
    (dict(draft_model_size="eagle3", verifier="tree", tree_drafts="top_k"), "eagle3 grows a tree of its own"),
    (dict(draft_model_size="eagle", verifier="tree", tree_drafts="top_k"), "eagle grows a tree of its own: use "
                                                                           "--tree_drafts dynamic"),
    (dict(draft_model_size="medusa", verifier="tree", tree_drafts="top_k", backend="jax"), "use --tree_drafts dynamic"),
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


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_a_top_k_tree_from_eagle_is_refused_in_one_line_naming_the_dynamic_tree(backend):
    result = run_main("--draft_model_size", "eagle", "--verifier", "tree", "--tree_drafts", "top_k", "--backend", backend)
    assert_short_error(result, "error: --tree_drafts top_k ranks a draft model's likeliest tokens at every node, and "
                               "eagle grows a tree of its own: use --tree_drafts dynamic")


@pytest.mark.parametrize("text, message", [
    ("[1, 2]", "head.json holds a JSON list, not an object with the head's \"drafter\" and \"target\""),
    ('{"drafter": "eagle", "targ', "head.json is not valid JSON (Unterminated string starting at"),
    ('{"drafter": "eagle"}', 'head.json lacks "target_hparams", the shape of the target the head was trained on'),
])
def test_a_broken_head_json_is_one_line_naming_the_file_before_loading(tmp_path, text, message):
    (tmp_path / "teach-target").symlink_to(f"{main.flags.BUNDLED_MODELS_DIR}/teach-target")
    (tmp_path / "teach-eagle").mkdir()
    (tmp_path / "teach-eagle" / "head.safetensors").symlink_to(f"{main.flags.BUNDLED_MODELS_DIR}/teach-eagle/"
                                                               "head.safetensors")
    (tmp_path / "teach-eagle" / "head.json").write_text(text)
    result = run_main("--draft_model_size", "eagle", "--n_tokens_to_generate", "4", models_dir=tmp_path)
    assert_short_error(result, f"error: {tmp_path / 'teach-eagle'}/{message}")


@pytest.mark.parametrize("exit_layer", [None, 8, "2"])
def test_a_kangaroo_head_without_a_usable_exit_layer_is_one_line_naming_the_file_before_loading(tmp_path, exit_layer):
    (tmp_path / "teach-target").symlink_to(f"{main.flags.BUNDLED_MODELS_DIR}/teach-target")
    bundled = Path(main.flags.BUNDLED_MODELS_DIR) / "teach-kangaroo"
    (tmp_path / "teach-kangaroo").mkdir()
    (tmp_path / "teach-kangaroo" / "head.safetensors").symlink_to(bundled / "head.safetensors")
    info = {key: value for key, value in json.loads((bundled / "head.json").read_text()).items() if key != "exit_layer"}
    (tmp_path / "teach-kangaroo" / "head.json").write_text(json.dumps(
        info if exit_layer is None else {**info, "exit_layer": exit_layer}))
    result = run_main("--draft_model_size", "kangaroo", "--n_tokens_to_generate", "4", models_dir=tmp_path)
    folder = tmp_path / "teach-kangaroo"
    assert_short_error(result, f"error: {folder}/head.json must give the adapter's \"exit_layer\", an integer in "
                               f"[1, 7]; got {exit_layer!r}")


@pytest.mark.parametrize("replaced, message", [
    ({"d2t": None}, '"d2t", a list of integer offsets from each draft id to its target id (tools/train_heads.py '
                    'eagle3 writes it); got nothing'),
    ({"d2t": [0, 1, "2"]}, "got '2' among its offsets"),
    ({"d2t": [0, 4095]}, '"d2t" must map the draft ids to increasing target ids in [0, 4096)'),
    ({"layers": None}, '"layers", increasing integers in 1..8; got None'),
    ({"layers": [5, 2, 4]}, '"layers", increasing integers in 1..8; got [5, 2, 4]'),
])
def test_an_eagle3_head_json_without_usable_maps_is_one_line_naming_the_file_before_loading(tmp_path, replaced,
                                                                                           message):
    (tmp_path / "teach-target").symlink_to(f"{main.flags.BUNDLED_MODELS_DIR}/teach-target")
    folder = tmp_path / "teach-eagle3"
    _, info = write_eagle3_head(folder, TARGET_HPARAMS, BUNDLED_DRAFT_VOCABULARY[:3])
    for key, value in replaced.items():  # None: the key left out
        info = {name: entry for name, entry in info.items() if name != key} | ({} if value is None else {key: value})
    (folder / "head.json").write_text(json.dumps(info))
    result = run_main("--draft_model_size", "eagle3", "--n_tokens_to_generate", "4", models_dir=tmp_path)
    assert_short_error(result, f"error: {folder}/head.json")
    assert message in result.stderr


def test_an_unknown_draft_lists_the_model_folders_and_the_drafters_without_one():
    result = run_main("--draft_model_size", "bogus")
    assert_short_error(result, f"error: --draft_model_size: no model 'bogus' in {main.flags.BUNDLED_MODELS_DIR}; "
                               "present: teach-draft, teach-target; downloadable: 124M, 355M, 774M, 1558M; or a "
                               "drafter without a folder of its own: prompt-lookup, early-exit, eagle, eagle3, medusa, "
                               "kangaroo")


def test_the_cli_page_names_the_drafters_refused_with_jax_as_the_checks_refuse_them(eagle3_models):
    defaults = {name: flag.default for name, flag in inspect.signature(main.main).parameters.items()}
    defaults["models_dir"] = str(eagle3_models)  # every head there
    refused, running = [], []
    for name in DRAFTERS:
        try:
            main.flags.check_run(**{**defaults, "draft_model_size": name, "backend": "jax"})  # loads no model
            running.append(name)
        except ValueError as error:
            assert "it needs --backend numpy" in str(error)
            refused.append(name)
    page = " ".join((REPO / "docs" / "CLI.md").read_text(encoding="utf-8").split())
    assert (f"{' or '.join(refused)}, which share the NumPy target's cache, with `--backend jax` "
            f"({', '.join(running[:-1])} and {running[-1]} run there)") in page
