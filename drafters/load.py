"""A drafter made from the target, by name: what main.py's --draft_model_size and bench/spec_bench.py build.

early-exit needs nothing but the target; eagle, eagle3 (EAGLE-3's draft), medusa and kangaroo read their trained heads
from the kit's models/ (or another folder given; written by tools/train_heads.py, kept by drafters/heads.py), which
must have been trained on this very target's shape.
"""

from pathlib import Path

import gpt2
from drafters.eagle2 import EagleTree
from drafters.eagle3 import Eagle3Draft
from drafters.early_exit import EARLY_EXIT, EarlyExit
from drafters.heads import draft_vocabulary_of, exit_layer_of, fused_layers_of, load_head, trained_on
from drafters.kangaroo import CONFIDENCE_THRESHOLD, AdaptedEarlyExit
from drafters.medusa import MedusaDraft
from verifiers.tree import DEFAULT_N_NODES

HEAD_FOLDERS = {"eagle": "teach-eagle", "eagle3": "teach-eagle3", "medusa": "teach-medusa",
                "kangaroo": "teach-kangaroo"}
DRAFTERS = (EARLY_EXIT, *HEAD_FOLDERS)
BUNDLED_MODELS_DIR = Path(gpt2.__file__).resolve().parent / "models"  # beside the kit's code, wherever it runs from


def load_drafter(name, target, models_dir=None, exit_layer=None, n_nodes=None, confidence_threshold=None):
    """The drafter `name` (one of DRAFTERS) on `target`, a NumPy gpt2.GPT2Model. models_dir: the folder of the heads'
    folders, None for the kit's bundled models/; exit_layer: early-exit's (kangaroo reads its own from the head);
    n_nodes: the tree's budget for eagle, eagle3 and medusa (--tree_drafts dynamic); confidence_threshold: kangaroo's
    early stop of the chain (None: drafters.kangaroo.CONFIDENCE_THRESHOLD, as in Kangaroo's code; 0 never stops)."""
    if name not in DRAFTERS:
        raise ValueError(f"unknown drafter {name!r}: choose one of {', '.join(DRAFTERS)}")
    if name == EARLY_EXIT:
        return EarlyExit(target, exit_layer)
    folder = Path(BUNDLED_MODELS_DIR if models_dir is None else models_dir) / HEAD_FOLDERS[name]
    head, info = load_head(folder, drafter=name)
    if trained_on(folder, info) != target.hparams:
        raise ValueError(f"the {name} head in {folder} was trained on a target of {info['target_hparams']}, not this "
                         f"one ({target.hparams})")
    n_nodes = DEFAULT_N_NODES if n_nodes is None else n_nodes
    if name == "eagle":
        return EagleTree(target, head, n_nodes)
    if name == "eagle3":
        return eagle3_draft(folder, target, head, info, n_nodes)
    if name == "medusa":
        return MedusaDraft(target, head, accuracies=info.get("accuracies"), n_nodes=n_nodes)
    stop = CONFIDENCE_THRESHOLD if confidence_threshold is None else confidence_threshold
    exit_layer = exit_layer_of(folder, info, target.hparams["n_layer"])
    return AdaptedEarlyExit(target, head, exit_layer=exit_layer, confidence_threshold=stop)


def eagle3_draft(folder, target, head, info, n_nodes):  # -> Eagle3Draft, its head.json's maps checked first
    d2t = draft_vocabulary_of(folder, info, target.n_vocab)
    layers = fused_layers_of(folder, info, target.hparams["n_layer"])
    try:
        return Eagle3Draft(target, head, n_nodes, d2t, layers)
    except ValueError as error:  # arrays that do not fit the maps head.json gives (check_shapes says which)
        raise ValueError(f"the eagle3 head in {folder}: {error}") from None
