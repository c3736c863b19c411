"""drafters/heads.py: a head saved and loaded again is the same nesting of float32 arrays (float16 on disk), in a
file that Hugging Face's own safetensors library reads; a folder of another drafter, or half a folder, is a clear
error."""

import inspect
import json
import re

import numpy as np
import pytest
from safetensors.numpy import load_file

from conftest import REPO
from drafters.heads import flatten, load_head, save_head, training_budget, unflatten
from drafters.eagle import init_head
from helpers import TINY


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
    import gpt2
    from drafters.load import load_drafter

    target = gpt2.GPT2Model(gpt2.init_params(TINY, np.random.default_rng(0)), TINY)
    save_head(tmp_path / "teach-eagle", init_head(TINY, np.random.default_rng(1)), {"drafter": "eagle"})
    with pytest.raises(ValueError, match=re.escape(f'{tmp_path / "teach-eagle" / "head.json"} lacks "target_hparams"')):
        load_drafter("eagle", target, tmp_path)


def test_load_drafter_builds_each_drafter_from_its_folder_and_refuses_a_head_of_another_target(tmp_path):
    import gpt2
    from drafters import kangaroo, medusa
    from drafters.load import HEAD_FOLDERS, load_drafter

    params = gpt2.init_params(TINY, np.random.default_rng(0))
    target, rng = gpt2.GPT2Model(params, TINY), np.random.default_rng(1)
    heads = {"eagle": init_head(TINY, rng), "medusa": medusa.init_heads(TINY, 2, rng),
             "kangaroo": kangaroo.init_adapter(TINY, rng, params["ln_f"])}
    extra = {"eagle": {}, "medusa": {"accuracies": [[0.5, 0.25], [0.25, 0.125]]}, "kangaroo": {"exit_layer": 1}}
    for name, head in heads.items():
        save_head(tmp_path / HEAD_FOLDERS[name], head, {"drafter": name, "target": "tiny", "target_hparams": TINY,
                                                         **extra[name]})
    built = {name: load_drafter(name, target, tmp_path, n_nodes=3) for name in heads}
    assert [type(drafter).__name__ for drafter in built.values()] == ["EagleTree", "MedusaDraft", "AdaptedEarlyExit"]
    assert built["eagle"].n_nodes == built["medusa"].n_nodes == 3 and built["kangaroo"].exit_layer == 1
    np.testing.assert_array_equal(built["medusa"].accuracies, extra["medusa"]["accuracies"])
    other = gpt2.GPT2Model(gpt2.init_params({**TINY, "n_ctx": 16}, rng), {**TINY, "n_ctx": 16})
    with pytest.raises(ValueError, match="was trained on a target of"):
        load_drafter("eagle", other, tmp_path)
    with pytest.raises(ValueError, match="unknown drafter 'lookahead'"):
        load_drafter("lookahead", target, tmp_path)


def test_the_committed_heads_load_for_the_bundled_target_and_models_stays_within_50_mb():
    import utils
    from conftest import REPO
    from drafters.load import HEAD_FOLDERS
    from tools.train_heads import main as train_heads_main

    defaults = {name: option.default for name, option in inspect.signature(train_heads_main).parameters.items()
                if option.default is not inspect.Parameter.empty}

    _, hparams, _ = utils.load_encoder_hparams_and_params("teach-target", REPO / "models")
    for name, folder in HEAD_FOLDERS.items():
        head, info = load_head(REPO / "models" / folder, drafter=name)
        assert info["target_hparams"] == hparams and info["training"]["recipe"]["drafter"] == name
        assert all(array.dtype == np.float32 for array in flatten(head).values())
        card, training = (REPO / "models" / "README.md").read_text(), info["training"]
        while training:  # the run that wrote the head, then each run it continued from
            recipe = training["recipe"]
            assert f"python tools/train_heads.py {name} --steps {recipe['steps']}" in card
            for option, value in recipe.items():  # each option the run gave beside its defaults
                if option in defaults and value != defaults[option]:
                    value = ",".join(map(str, value)) if isinstance(value, list) else value  # --taps 2,4
                    assert re.search(rf"--{option} {re.escape(str(value))}(?![\w.])", card), (folder, option)
            training = training.get("continued_from")
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
    budgets = {name: training_budget(load_head(REPO / "models" / f"teach-{name}")[1])
               for name in ("eagle", "medusa", "kangaroo")}
    card = (REPO / "models" / "README.md").read_text()
    for name, budget in budgets.items():
        row = f"| {name} | {budget['runs']} | {budget['steps']:,} | {budget['tokens'] / 1e6:.1f} M | {budget['hours']:.1f} |"
        assert row in card, row
