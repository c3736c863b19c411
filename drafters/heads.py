"""Trained drafter heads on disk: a folder in models/ beside the pair, loaded offline as the pair is.

head.safetensors holds the head's arrays in float16 (Hugging Face's safetensors format; each array is named by its
path in the nesting, keys joined by "/": fc/w, block/attn/c_attn/w, heads/0/w), read back as float32. head.json
says what the arrays are: the drafter ("drafter": eagle, eagle3, medusa, kangaroo), the target they read ("target":
its folder's name, and its hparams), what the drafter needs beside its arrays (Kangaroo's exit_layer, EAGLE-3's d2t
and layers), and how they were trained.
"""

import json
from pathlib import Path

import numpy as np

from checkpoints.atomic import write_atomically
from checkpoints.safetensors_file import SafetensorsFile, safetensors_bytes

JSON_KINDS = {list: "list", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


def flatten(tree, prefix=""):  # nested dicts and lists of arrays -> {"a/0/b": array}
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    flat = {}
    for key, value in items:
        name = f"{prefix}{key}"
        flat.update(flatten(value, name + "/") if isinstance(value, (dict, list)) else {name: np.asarray(value)})
    return flat


def check_shapes(arrays, expected, what, context):  # expected: {"fc/w": shape, ...}, named as flatten names them
    """A one-line ValueError unless `arrays` (nested dicts and lists) hold every array of `expected` with its shape:
    "<what>: fc.w must be [768, 384] for <context>, got [128, 64]", or "<what>: no fc.w"."""
    flat = flatten(arrays) if isinstance(arrays, (dict, list)) else {}
    for name, shape in expected.items():
        dotted = name.replace("/", ".")
        if name not in flat:
            raise ValueError(f"{what}: no {dotted} (it nests as its init function builds it)")
        if flat[name].shape != tuple(shape):
            raise ValueError(f"{what}: {dotted} must be {list(shape)} for {context}, got {list(flat[name].shape)}")


def unflatten(flat):  # {"a/0/b": array} -> nested dicts, a level whose keys are 0..n-1 a list
    tree = {}
    for name, array in flat.items():
        *parents, leaf = name.split("/")
        node = tree
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = array

    def listify(node):
        if not isinstance(node, dict):
            return node
        node = {key: listify(value) for key, value in node.items()}
        if sorted(node) == [str(i) for i in range(len(node))] and node:
            return [node[str(i)] for i in range(len(node))]
        return node

    return listify(tree)


def save_head(folder, params, info):
    """Write the head's arrays and its description (a JSON-able dict with at least "drafter" and "target"); each
    file appears whole or not at all."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_atomically(folder / "head.safetensors", safetensors_bytes(flatten(params)))
    write_atomically(folder / "head.json", (json.dumps(info, indent=2) + "\n").encode())


def read_head_info(folder, drafter=None):  # -> head.json's object
    """head.json as a dict, or a one-line ValueError naming the file: not JSON (a truncated copy), not a JSON
    object, or a head of another drafter than `drafter` (when given)."""
    path = Path(folder) / "head.json"
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:  # json's errors, and bytes that are not UTF-8
        raise ValueError(f"{path} is not valid JSON ({error}): copy or train the head again") from None
    if not isinstance(info, dict):
        raise ValueError(f"{path} holds a JSON {JSON_KINDS[type(info)]}, not an object with the head's \"drafter\" "
                         "and \"target\"")
    if drafter is not None and "drafter" not in info:
        raise ValueError(f"{path} names no \"drafter\" ({drafter} expected)")
    if drafter is not None and info["drafter"] != drafter:
        raise ValueError(f"{path} holds a {info['drafter']} head, not {drafter}")
    return info


def trained_on(folder, info):  # -> the hparams of the target the head was trained on
    """head.json's "target_hparams", or a one-line ValueError naming the file when it lacks them."""
    hparams = info.get("target_hparams")
    if not isinstance(hparams, dict):
        raise ValueError(f"{Path(folder) / 'head.json'} lacks \"target_hparams\", the shape of the target the head "
                         "was trained on (tools/train_heads.py writes it)")
    return hparams


def is_whole_number(value):  # an int from JSON or NumPy, not a bool
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def exit_layer_of(folder, info, n_layer=None):  # -> a Kangaroo head's exit layer
    """head.json's "exit_layer", the target's layers the adapter reads after: an integer in [1, n_layer - 1] (n_layer
    where known), or a one-line ValueError naming the file."""
    layer = info.get("exit_layer")
    if not is_whole_number(layer) or layer < 1 or (n_layer is not None and layer >= n_layer):
        within = "an integer >= 1" if n_layer is None else f"an integer in [1, {n_layer - 1}]"
        raise ValueError(f"{Path(folder) / 'head.json'} must give the adapter's \"exit_layer\", {within}; "
                         f"got {layer!r}")
    return layer


def increasing_blocks(layers, n_layer=None):  # -> whether EAGLE-3's fused blocks are increasing integers in 1..n_layer
    return (isinstance(layers, (list, tuple)) and len(layers) > 0 and all(map(is_whole_number, layers))
            and list(layers) == sorted(set(layers)) and layers[0] >= 1 and (n_layer is None or layers[-1] <= n_layer))


def increasing_target_ids(d2t, n_vocab=None):  # -> whether d2t maps draft ids to increasing ids in [0, n_vocab)
    target_ids = np.arange(len(d2t)) + np.asarray(d2t, np.int64)  # eagle3.d2t_vocabulary, which imports this file
    in_range = len(target_ids) > 0 and target_ids[0] >= 0 and (n_vocab is None or target_ids[-1] < n_vocab)
    return bool(in_range and np.all(np.diff(target_ids) > 0))


def fused_layers_of(folder, info, n_layer=None):  # -> an EAGLE-3 head's layers, as head.json gives them
    """head.json's "layers", the blocks after which the target's streams are fused: increasing integers in
    [1, n_layer] (n_layer where known), or a one-line ValueError naming the file."""
    layers = info.get("layers")
    if not (isinstance(layers, list) and increasing_blocks(layers, n_layer)):
        within = "1..n_layer" if n_layer is None else f"1..{n_layer}"
        raise ValueError(f"{Path(folder) / 'head.json'} must give the blocks the head fuses, \"layers\", increasing "
                         f"integers in {within}; got {layers!r}")
    return layers


def draft_vocabulary_of(folder, info, n_vocab=None):  # -> an EAGLE-3 head's d2t, as head.json gives it
    """head.json's "d2t", each draft id's offset to its target id: a list of integers mapping the draft ids to
    increasing target ids in [0, n_vocab) (n_vocab where known), or a one-line ValueError naming the file (the
    list itself is not quoted: it holds a thousand ids)."""
    d2t = info.get("d2t")
    path = Path(folder) / "head.json"
    if not (isinstance(d2t, list) and d2t and all(map(is_whole_number, d2t))):
        got = ("nothing" if d2t is None else "an empty list" if d2t == [] else
               f"{next(v for v in d2t if not is_whole_number(v))!r} among its offsets" if isinstance(d2t, list) else
               f"a JSON {JSON_KINDS.get(type(d2t), 'object')}")
        raise ValueError(f"{path} must give the draft vocabulary, \"d2t\", a list of integer offsets from each draft "
                         f"id to its target id (tools/train_heads.py eagle3 writes it); got {got}")
    if not increasing_target_ids(d2t, n_vocab):
        within = "" if n_vocab is None else f" in [0, {n_vocab})"
        raise ValueError(f"{path}: \"d2t\" must map the draft ids to increasing target ids{within}")
    return d2t


def load_head(folder, drafter=None):  # -> (params, info)
    """A head saved by save_head, as float32; drafter: the kind expected (an error names what the folder holds)."""
    folder = Path(folder)
    missing = [name for name in ("head.safetensors", "head.json") if not (folder / name).exists()]
    if missing:
        raise ValueError(f"{folder} is not a drafter's head: {', '.join(missing)} missing (tools/train_heads.py "
                         "writes them)")
    info = read_head_info(folder, drafter)
    tensors = SafetensorsFile(folder / "head.safetensors")
    return unflatten({name: tensors.read(name) for name in tensors.shapes}), info


def training_runs(info):  # head.json's description -> its training runs, the latest first
    run = info.get("training")
    while run:
        yield run
        run = run.get("continued_from")


def training_budget(info):  # -> {"runs", "steps", "tokens", "hours"}: everything the head was trained on, summed
    """A head continued from another (tools/train_heads.py --init_from) records the run before it in continued_from;
    its budget is every run's. A step reads batch_size windows of seq_len tokens, plus `continued` of the target's
    own continuations (prompt_tokens + continued_tokens each) where the run drew them."""
    runs = list(training_runs(info))
    tokens = 0
    for run in runs:
        recipe = run["recipe"]
        continued_row = recipe.get("prompt_tokens", 0) + recipe.get("continued_tokens", 0)
        continuations = recipe.get("continued", 0) * continued_row
        tokens += run["steps_done"] * (recipe["batch_size"] * recipe["seq_len"] + continuations)
    return {"runs": len(runs), "steps": sum(run["steps_done"] for run in runs), "tokens": tokens,
            "hours": sum(run["minutes"] for run in runs) / 60}
