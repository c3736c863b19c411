"""The flags of a drafter made from the target (drafters/, built by drafters.load.load_drafter), checked before any
model loads: --draft_model_size early-exit, eagle, eagle3, medusa or kangaroo, with early-exit's --exit_layer and the
tree's --tree_nodes (eagle, eagle3 and medusa growing their own tree, --verifier tree --tree_drafts dynamic) and
kangaroo's --confidence_threshold.

early-exit and kangaroo run the target's first layers on the NumPy target's own KV cache, so they need --backend
numpy; eagle, eagle3 and medusa read only the target's features (and eagle3 its tapped streams), which the JAX model
keeps too. eagle, eagle3, medusa and kangaroo read their trained head from the folder drafters.load.HEAD_FOLDERS names
in --models_dir.
"""

import os

import sampling
import utils
from drafters import heads
from drafters.early_exit import EARLY_EXIT, default_exit_layer
from drafters.kangaroo import CONFIDENCE_THRESHOLD, is_confidence_threshold
from drafters.load import DEFAULT_N_NODES, DRAFTERS, HEAD_FOLDERS
from speedup import drafts

TREE_GROWING_DRAFTERS = ("eagle", "eagle3", "medusa")  # the drafters with draft_tree (--tree_drafts dynamic)
TREE_GROWERS = f"{', '.join(TREE_GROWING_DRAFTERS[:-1])} or {TREE_GROWING_DRAFTERS[-1]}"  # as the errors list them
WITHOUT_A_MODEL = (drafts.PROMPT_LOOKUP, *DRAFTERS)  # drafts with no model folder of their own
SHARING_THE_CACHE = (EARLY_EXIT, "kangaroo")  # the drafters that run the NumPy target's first layers on its cache


def check_drafter(draft_model_size, target_model_size, models_dir, backend, exit_layer, tree_nodes, tree_drafts):
    """-> (exit_layer, tree_nodes), each None where it does not apply: --exit_layer for early-exit (a quarter of the
    target's layers when not given), --tree_nodes for a dynamic tree (drafters.load.DEFAULT_N_NODES when not given);
    a head that is missing, or trained on a target of another shape, is refused here, before the target loads."""
    if draft_model_size in SHARING_THE_CACHE and backend != "numpy":
        raise ValueError(f"--draft_model_size {draft_model_size} shares the NumPy target's KV cache: it needs "
                         "--backend numpy")
    if draft_model_size in HEAD_FOLDERS:
        check_head_folder(draft_model_size, target_model_size, models_dir)
    tree_nodes = check_tree_nodes(tree_nodes, tree_drafts)
    return check_exit_layer(exit_layer, draft_model_size, target_model_size, models_dir), tree_nodes


def check_head_folder(name, target_model_size, models_dir):
    """The head's folder must be there, its head.json readable (drafters.heads.read_head_info), and trained on a
    target of this one's shape where its hparams.json is here (a folder still to be downloaded is checked when the
    drafter is built: drafters.load.load_drafter)."""
    folder = os.path.join(models_dir, HEAD_FOLDERS[name])
    if not all(os.path.isfile(os.path.join(folder, file)) for file in ("head.safetensors", "head.json")):
        raise ValueError(f"--draft_model_size {name} reads its trained head from {folder}, which is missing: train it "
                         f"with python tools/train_heads.py --drafter {name}")
    info = heads.read_head_info(folder, drafter=name)
    trained_on = heads.trained_on(folder, info)
    if name == "kangaroo":  # the adapter reads the target after its exit layer
        heads.exit_layer_of(folder, info, trained_on.get("n_layer"))
    if name == "eagle3":  # the draft vocabulary and the blocks fused, which the arrays alone do not say
        heads.draft_vocabulary_of(folder, info, trained_on.get("n_vocab"))
        heads.fused_layers_of(folder, info, trained_on.get("n_layer"))
    path = os.path.join(utils.model_directory(target_model_size, models_dir), "hparams.json")
    if not os.path.isfile(path):
        return
    if trained_on != utils.load_hparams(path):
        raise ValueError(f"--draft_model_size {name}: its head ({folder}) was trained on a target of {trained_on}, not "
                         f"--target_model_size {target_model_size}'s {utils.load_hparams(path)}")


def check_tree_nodes(tree_nodes, tree_drafts):
    """--tree_nodes, the budget of nodes in the tree eagle, eagle3 or medusa grows (--tree_drafts dynamic) -> it, or
    None."""
    if tree_drafts != "dynamic":  # check_verifier has refused dynamic for a drafter without draft_tree
        if tree_nodes is not None:
            raise ValueError(f"--tree_nodes applies to the tree {TREE_GROWERS} grow: --draft_model_size "
                             f"{TREE_GROWERS} with --verifier tree --tree_drafts dynamic")
        return None
    if tree_nodes is None:
        return DEFAULT_N_NODES
    if not sampling.is_integer(tree_nodes) or tree_nodes < 1:
        raise ValueError(f"--tree_nodes must be an integer >= 1, got {tree_nodes!r}")
    return int(tree_nodes)


def check_exit_layer(exit_layer, draft_model_size, target_model_size, models_dir):
    """--exit_layer, for --draft_model_size early-exit only: -> the layer, None for other drafts. Not given, it is a
    quarter of the target's layers (docs/DRAFTERS.md says why), read from its hparams.json before the checkpoint
    loads; a folder still to be downloaded is checked when its model is built (drafters.early_exit.EarlyExit)."""
    if draft_model_size != EARLY_EXIT:
        if exit_layer is not None:
            theirs = " (kangaroo reads its own from its head)" if draft_model_size == "kangaroo" else ""
            raise ValueError(f"--exit_layer applies to --draft_model_size early-exit, not {draft_model_size}{theirs}")
        return None
    path = os.path.join(utils.model_directory(target_model_size, models_dir), "hparams.json")
    n_layer = utils.load_hparams(path)["n_layer"] if os.path.isfile(path) else None
    if exit_layer is None:
        return None if n_layer is None else default_exit_layer(n_layer)
    if not sampling.is_integer(exit_layer) or exit_layer < 1 or (n_layer is not None and exit_layer >= n_layer):
        within = "[1, n_layer - 1]" if n_layer is None else f"[1, {n_layer - 1}] (the target has {n_layer} layers)"
        raise ValueError(f"--exit_layer must be an integer in {within}, got {exit_layer!r}")
    return exit_layer


def check_confidence_threshold(confidence_threshold, draft_model_size):
    """--confidence_threshold, Kangaroo's early stop of the chain, for --draft_model_size kangaroo only: -> it
    (drafters.kangaroo.CONFIDENCE_THRESHOLD when not given), None for other drafts."""
    if draft_model_size != "kangaroo":
        if confidence_threshold is not None:
            raise ValueError(f"--confidence_threshold applies to --draft_model_size kangaroo, not {draft_model_size}")
        return None
    if confidence_threshold is None:
        return CONFIDENCE_THRESHOLD
    if not is_confidence_threshold(confidence_threshold):
        raise ValueError(f"--confidence_threshold must be a number in [0, 1], got {confidence_threshold!r}")
    return float(confidence_threshold)


def check_draft_name(draft_model_size, models_dir):
    """--draft_model_size names a model folder or a drafter that needs none; a name that is neither is refused with
    both lists, the folders (utils.model_directory's) and the drafters."""
    if draft_model_size in WITHOUT_A_MODEL:
        return
    try:
        utils.model_directory(draft_model_size, models_dir)
    except utils.ModelNameError as error:
        raise utils.ModelNameError(f"--draft_model_size: {error}; or a drafter without a folder of its own: "
                                   f"{', '.join(WITHOUT_A_MODEL)}") from None
