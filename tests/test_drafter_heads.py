"""drafters/heads.py: a head saved and loaded again is the same nesting of float32 arrays (float16 on disk), in a
file that Hugging Face's own safetensors library reads; a folder of another drafter, or half a folder, is a clear
error; drafters/load.py builds each drafter from its folder; the model card holds every committed head's budget and
commands (EAGLE-3's as soon as models/teach-eagle3 is there)."""

import inspect
import json
import re

import numpy as np
import pytest
from safetensors.numpy import load_file

import gpt2
from conftest import REPO
from drafters.heads import flatten, load_head, save_head, training_budget, unflatten
from drafters.eagle import init_head
from drafters.eagle3 import init_head as init_eagle3_head
from drafters.eagle3 import vocabulary_d2t
from drafters.load import HEAD_FOLDERS
from helpers import HPARAMS, TINY, assert_greedy_equals_autoregressive, scaled_params, write_eagle3_head

EAGLE3_TARGET = {**HPARAMS, "n_layer": 8}  # a target deep enough for EAGLE-3's taps after blocks 2, n/2 and n-3


def test_a_saved_head_loads_as_the_same_nesting_in_float32(tmp_path):
    head = init_head(TINY, np.random.default_rng(0))
    head["heads"] = [{"w": np.ones((2, 3), np.float32)}, {"w": np.full((2, 3), 0.5, np.float32)}]
    save_head(tmp_path / "h", head, {"drafter": "eagle", "target": "tiny"})
    loaded, info = load_head(tmp_path / "h", drafter="eagle")
    assert info == {"drafter": "eagle", "target": "tiny"}
    flat, loaded_flat = flatten(head), flatten(loaded)
    assert sorted(flat) == sorted(loaded_flat) and isinstance(loaded["heads"], list)
    for name, array in flat.items():
        assert loaded_flat[name].dtype == np.float32
        np.testing.assert_array_equal(loaded_flat[name], array.astype(np.float16).astype(np.float32))


def test_hugging_faces_safetensors_reads_the_file_we_write(tmp_path):
    head = init_head(TINY, np.random.default_rng(1))
    save_head(tmp_path, head, {"drafter": "eagle", "target": "tiny"})
    theirs = load_file(str(tmp_path / "head.safetensors"))
    assert sorted(theirs) == sorted(flatten(head))
    np.testing.assert_array_equal(theirs["fc/w"], head["fc"]["w"].astype(np.float16))


def test_unflatten_undoes_flatten():
    tree = {"a": [{"b": np.zeros(1)}, {"b": np.ones(1)}], "c": np.zeros(2)}
    assert flatten(unflatten(flatten(tree))).keys() == flatten(tree).keys()


def test_another_drafters_head_or_a_half_written_folder_is_a_clear_error(tmp_path):
    save_head(tmp_path, {"w": np.zeros(2, np.float32)}, {"drafter": "medusa", "target": "tiny"})
    with pytest.raises(ValueError, match="holds a medusa head, not eagle"):
        load_head(tmp_path, drafter="eagle")
    (tmp_path / "head.json").unlink()
    with pytest.raises(ValueError, match="head.json missing"):
        load_head(tmp_path)
    assert not list(tmp_path.glob(".*.tmp"))


BROKEN_HEAD_JSON = [  # (head.json's text, what the error says after naming the file)
    ("[1, 2]", "holds a JSON list, not an object"),
    ('{"drafter": "eagle", "targ', "is not valid JSON (Unterminated string"),
    ("{}", 'names no "drafter" (eagle expected)'),
    ("\xff", "is not valid JSON"),
]


@pytest.mark.parametrize("text, message", BROKEN_HEAD_JSON)
def test_a_broken_head_json_is_a_one_line_error_naming_the_file(tmp_path, text, message):
    save_head(tmp_path, {"w": np.zeros(2, np.float32)}, {"drafter": "eagle", "target": "tiny"})
    (tmp_path / "head.json").write_bytes(text.encode("latin-1"))
    with pytest.raises(ValueError) as error:
        load_head(tmp_path, drafter="eagle")
    assert str(error.value).startswith(f"{tmp_path / 'head.json'} {message}") and "\n" not in str(error.value)


def test_a_head_json_without_the_targets_hparams_is_refused_naming_the_file(tmp_path):
    from drafters.load import load_drafter

    target = gpt2.GPT2Model(gpt2.init_params(TINY, np.random.default_rng(0)), TINY)
    save_head(tmp_path / "teach-eagle", init_head(TINY, np.random.default_rng(1)), {"drafter": "eagle"})
    with pytest.raises(ValueError, match=re.escape(f'{tmp_path / "teach-eagle" / "head.json"} lacks "target_hparams"')):
        load_drafter("eagle", target, tmp_path)


def test_load_drafter_builds_each_drafter_from_its_folder_and_refuses_a_head_of_another_target(tmp_path):
    from drafters import kangaroo, medusa
    from drafters.load import HEAD_FOLDERS, load_drafter

    params = gpt2.init_params(TINY, np.random.default_rng(0))
    target, rng = gpt2.GPT2Model(params, TINY), np.random.default_rng(1)
    heads = {"eagle": init_head(TINY, rng), "eagle3": init_eagle3_head(TINY, rng, 2, n_taps=1),
             "medusa": medusa.init_heads(TINY, 2, rng), "kangaroo": kangaroo.init_adapter(TINY, rng, params["ln_f"])}
    extra = {"eagle": {}, "eagle3": {"d2t": vocabulary_d2t([0, 2]).tolist(), "layers": [2]},
             "medusa": {"accuracies": [[0.5, 0.25], [0.25, 0.125]]}, "kangaroo": {"exit_layer": 1}}
    assert set(heads) == set(HEAD_FOLDERS)
    for name, head in heads.items():
        save_head(tmp_path / HEAD_FOLDERS[name], head, {"drafter": name, "target": "tiny", "target_hparams": TINY,
                                                         **extra[name]})
    built = {name: load_drafter(name, target, tmp_path, n_nodes=3) for name in heads}
    assert [type(drafter).__name__ for drafter in built.values()] == ["EagleTree", "Eagle3Draft", "MedusaDraft",
                                                                      "AdaptedEarlyExit"]
    assert built["eagle"].n_nodes == built["eagle3"].n_nodes == built["medusa"].n_nodes == 3
    assert built["kangaroo"].exit_layer == 1 and built["eagle3"].layers == (2,) == target.taps
    np.testing.assert_array_equal(built["eagle3"].vocabulary, [0, 2])
    np.testing.assert_array_equal(built["medusa"].accuracies, extra["medusa"]["accuracies"])
    other = gpt2.GPT2Model(gpt2.init_params({**TINY, "n_ctx": 16}, rng), {**TINY, "n_ctx": 16})
    with pytest.raises(ValueError, match="was trained on a target of"):
        load_drafter("eagle", other, tmp_path)
    with pytest.raises(ValueError, match="unknown drafter 'lookahead'"):
        load_drafter("lookahead", target, tmp_path)


def committed_heads(models_dir):  # -> {drafter: its head.json} for every head folder models_dir holds
    return {name: load_head(models_dir / folder, drafter=name)[1] for name, folder in HEAD_FOLDERS.items()
            if (models_dir / folder).is_dir()}


def training_commands_missing(name, info, card):  # -> the options of the head's runs that the card does not give
    """Each run that wrote the head, then each it continued from, must stand in the card as its command: the drafter,
    --steps and every option the run gave beside tools/train_heads.py's defaults."""
    from tools.train_heads import main as train_heads_main

    defaults = {name: option.default for name, option in inspect.signature(train_heads_main).parameters.items()
                if option.default is not inspect.Parameter.empty}
    missing, training = [], info["training"]
    while training:  # the run that wrote the head, then each run it continued from
        recipe = training["recipe"]
        if f"python tools/train_heads.py {name} --steps {recipe['steps']}" not in card:
            missing.append(f"{name} --steps {recipe['steps']}")
        for option, value in recipe.items():  # each option the run gave beside its defaults
            if option in defaults and value != defaults[option]:
                value = ",".join(map(str, value)) if isinstance(value, list) else value  # --taps 2,4
                if not re.search(rf"--{option} {re.escape(str(value))}(?![\w.])", card):
                    missing.append(f"--{option} {value}")
        training = training.get("continued_from")
    return missing


def budget_row(name, info):  # -> the model card's row of the head's training budget
    budget = training_budget(info)
    return f"| {name} | {budget['runs']} | {budget['steps']:,} | {budget['tokens'] / 1e6:.1f} M | {budget['hours']:.1f} |"


def test_the_committed_heads_load_for_the_bundled_target_and_models_stays_within_50_mb():
    import utils

    _, hparams, _ = utils.load_encoder_hparams_and_params("teach-target", REPO / "models")
    heads = committed_heads(REPO / "models")
    assert {"eagle", "medusa", "kangaroo"} <= set(heads)  # eagle3 once its head is trained
    card = (REPO / "models" / "README.md").read_text()
    for name, info in heads.items():
        head, _ = load_head(REPO / "models" / HEAD_FOLDERS[name], drafter=name)
        assert info["target_hparams"] == hparams and info["training"]["recipe"]["drafter"] == name
        assert all(array.dtype == np.float32 for array in flatten(head).values())
        assert training_commands_missing(name, info, card) == [], name
    size = sum(path.stat().st_size for path in (REPO / "models").rglob("*") if path.is_file())
    assert size <= 50 * 2**20


def test_a_heads_training_budget_sums_every_run_it_was_continued_from():
    def run(steps, minutes, earlier=None, **recipe):
        return {"recipe": {"batch_size": 2, "seq_len": 8, **recipe}, "steps_done": steps, "minutes": minutes,
                **({"continued_from": earlier} if earlier else {})}
    first = run(10, 30.0)
    second = run(5, 60.0, first, continued=3, prompt_tokens=2, continued_tokens=4)
    assert training_budget({"training": second}) == {"runs": 2, "steps": 15, "tokens": 10 * 16 + 5 * (16 + 18),
                                                     "hours": 1.5}
    assert training_budget({}) == {"runs": 0, "steps": 0, "tokens": 0, "hours": 0}


def test_the_committed_heads_budgets_are_what_the_model_card_says():
    card = (REPO / "models" / "README.md").read_text()
    for name, info in committed_heads(REPO / "models").items():
        assert budget_row(name, info) in card, budget_row(name, info)


def test_an_eagle3_head_in_models_needs_its_budget_row_and_its_command_in_the_card(tmp_path):
    """What the two tests above ask of models/ once tools/train_heads.py eagle3 has written teach-eagle3 there."""
    card = (REPO / "models" / "README.md").read_text()
    _, info = write_eagle3_head(tmp_path / "teach-eagle3", EAGLE3_TARGET, list(range(0, 96, 3)))
    assert list(committed_heads(tmp_path)) == ["eagle3"]
    row = budget_row("eagle3", committed_heads(tmp_path)["eagle3"])
    assert row == "| eagle3 | 1 | 3 | 0.0 M | 0.0 |" and row not in card  # 3 steps of 2 windows of 8 tokens, 0.5 min
    # the card gives --batch_size 2 already, in EAGLE's commands
    assert training_commands_missing("eagle3", info, card) == ["eagle3 --steps 3", "--steps 3", "--seq_len 8"]
    written = f"{card}\n{row}\n`python tools/train_heads.py eagle3 --steps 3 --batch_size 2 --seq_len 8`\n"
    assert budget_row("eagle3", info) in written and training_commands_missing("eagle3", info, written) == []


def test_load_drafter_builds_eagle3_from_its_folder_and_decodes_greedily_as_the_target_does(tmp_path):
    from drafters.load import load_drafter

    target = gpt2.GPT2Model(scaled_params(EAGLE3_TARGET, seed=0), EAGLE3_TARGET)
    write_eagle3_head(tmp_path / "teach-eagle3", EAGLE3_TARGET, list(range(0, 96, 2)), target="tiny")
    drafter = load_drafter("eagle3", target, tmp_path)
    assert drafter.layers == (2, 4, 5) == target.taps and len(drafter.vocabulary) == 48
    assert_greedy_equals_autoregressive(np.array([3, 1, 4, 1, 5]), drafter, target)


@pytest.mark.parametrize("replaced, message", [
    ({"d2t": vocabulary_d2t([0, 2, 4]).tolist()}, "lm_head.w must be [32, 3] for 3 taps of a target of n_embd 32 and 3 "
                                                  "draft ids, got [32, 2]"),
    ({"layers": [2, 4]}, "fc.w must be [64, 32] for 2 taps of a target of n_embd 32 and 2 draft ids, got [96, 32]"),
    ({"layers": [2, 4, 9]}, '"layers", increasing integers in 1..8; got [2, 4, 9]'),
    ({"d2t": [0, 96]}, '"d2t" must map the draft ids to increasing target ids in [0, 96)'),
])
def test_an_eagle3_head_whose_maps_do_not_fit_its_arrays_or_target_is_a_one_line_error_naming_it(tmp_path, replaced,
                                                                                                message):
    from drafters.load import load_drafter

    target = gpt2.GPT2Model(gpt2.init_params(EAGLE3_TARGET, np.random.default_rng(0)), EAGLE3_TARGET)
    write_eagle3_head(tmp_path / "teach-eagle3", EAGLE3_TARGET, [0, 2], target="tiny", **replaced)
    with pytest.raises(ValueError) as error:
        load_drafter("eagle3", target, tmp_path)
    assert str(tmp_path / "teach-eagle3") in str(error.value) and message in str(error.value)
    assert "\n" not in str(error.value)


def test_drafters_built_on_one_target_each_read_the_streams_their_head_fuses():
    """A benchmark builds every drafter on one target before running any: EAGLE-3's taps (2, 4, 5) added after
    EAGLE's (1..6) must leave EAGLE's drafts as they are alone, not feed its fusion three streams for six."""
    import sampling
    from conftest import bundled_pair_after
    from drafters.load import load_drafter
    from speedup.stats import SpeculativeStats

    def proposal(with_eagle3):
        tokens, _, target = bundled_pair_after("def fibonacci(n):\n    ")
        eagle = load_drafter("eagle", target, REPO / "models")
        if with_eagle3:
            load_drafter("eagle3", target, REPO / "models")
            assert target.taps == (1, 2, 3, 4, 5, 6)
        return eagle.propose(np.array(tokens), 4, sampling.SamplingSettings(), np.random.default_rng(0),
                             SpeculativeStats())

    (alone, p_alone), (shared, p_shared) = proposal(False), proposal(True)
    np.testing.assert_array_equal(alone, shared)
    np.testing.assert_allclose(p_alone, p_shared, atol=1e-6)
    assert p_shared.dtype == np.float32
