"""Model files: find or download a GPT-2, read its checkpoint, build its encoder.

`load_encoder_hparams_and_params(model_size, models_dir)` -> (encoder, hparams, params), the seed
reference's entry point. `model_size` names a folder under models_dir holding either

- OpenAI's release files: hparams.json, encoder.json, vocab.bpe, checkpoint, model.ckpt.index and
  model.ckpt.data-00000-of-00001 (model.ckpt.meta, a TensorFlow graph, is not needed), or
- a Hugging Face GPT-2: model.safetensors and config.json, with encoder.json and vocab.bpe beside them.

OpenAI's four sizes (124M, 355M, 774M, 1558M) are downloaded from OPENAI_BASE_URL when missing.
Checkpoints are read without TensorFlow or torch (checkpoints/tf_checkpoint.py, and the safetensors reader
below); `params` nests like the checkpoint (gpt2.py's layout), float32, conv1d weights 2-D.

Errors, all with a message fit to show a user as it is (the CLI prints it and exits):
    CheckpointError(ValueError)           a checkpoint, hparams or config file is corrupt, truncated,
                                          inconsistent or in an unsupported form (names the file)
    ModelNameError(ValueError)            a model name that is not a plain folder name, or names no
                                          model present or downloadable (lists the ones that are)
    MissingModelFileError(FileNotFoundError)  a model folder lacks a file (names it)
    DownloadError(OSError)                a download failed (names the URL and how to place the
                                          files by hand); nothing is left under the final file name
"""

import http.client
import json
import os
import re
import urllib.error
import urllib.request

import numpy as np
from tqdm import tqdm

from encoder import get_encoder_from_dir
from checkpoints.atomic import replace_when_done
from checkpoints.safetensors_file import SafetensorsFile
from checkpoints.tf_checkpoint import CheckpointError, TFCheckpoint, write_tf_checkpoint

OPENAI_MODEL_SIZES = ("124M", "355M", "774M", "1558M")
OPENAI_BASE_URL = "https://openaipublic.blob.core.windows.net/gpt-2/models"
OPENAI_FILES = ("checkpoint", "encoder.json", "hparams.json", "model.ckpt.data-00000-of-00001", "model.ckpt.index",
                "model.ckpt.meta", "vocab.bpe")
OPENAI_NEEDED = tuple(name for name in OPENAI_FILES if name != "model.ckpt.meta")  # the graph is not needed
TF_MODEL_FILES = ("hparams.json", "encoder.json", "vocab.bpe", "checkpoint")  # + the checkpoint it names
HF_MODEL_FILES = ("config.json", "model.safetensors", "encoder.json", "vocab.bpe")
HPARAM_NAMES = ("n_vocab", "n_ctx", "n_embd", "n_head", "n_layer")
DOWNLOAD_CHUNK = 1 << 20
DOWNLOAD_TIMEOUT_S = 60  # per socket operation, not for the whole file


class ModelNameError(ValueError):
    """A model name that is not a plain folder name, or that names no model present or downloadable."""


class MissingModelFileError(FileNotFoundError):
    """A model folder lacks a file the model needs."""


class DownloadError(OSError):
    """A download failed; the message names the URL and how to place the files by hand."""


# ---------------------------------------------------------------- finding a model


def load_encoder_hparams_and_params(model_size, models_dir="models"):
    """(encoder, hparams, params) of the model in the folder models_dir/model_size."""
    model_dir = model_directory(model_size, models_dir)
    if os.path.isfile(os.path.join(model_dir, "model.safetensors")):
        require_files(model_dir, HF_MODEL_FILES)
        hparams = hparams_from_hf_config(os.path.join(model_dir, "config.json"))
        params = load_gpt2_params(SafetensorsFile(os.path.join(model_dir, "model.safetensors")), hparams)
    else:
        if model_size in OPENAI_MODEL_SIZES and missing_files(model_dir, OPENAI_NEEDED):
            download_gpt2_files(model_size, model_dir)
        require_files(model_dir, TF_MODEL_FILES)
        hparams = load_hparams(os.path.join(model_dir, "hparams.json"))
        prefix = checkpoint_prefix(model_dir)
        require_files(model_dir, [prefix + ".index"])  # a missing data file is reported when it is read
        params = load_gpt2_params(TFCheckpoint(os.path.join(model_dir, prefix)), hparams)
    encoder = get_encoder_from_dir(model_dir)
    return encoder, hparams, params


def model_directory(model_size, models_dir):
    """models_dir/model_size, after checking the name is one folder name that stays inside models_dir."""
    name = str(model_size)
    if name in ("", ".", "..") or any(char in name for char in "/\\\0"):  # no separator of any OS, no NUL
        raise ModelNameError(f"model name {name!r} must be the name of a folder in {models_dir} "
                             "(no path separators, no '..')")
    model_dir = os.path.join(models_dir, name)
    if not os.path.isdir(model_dir) and name not in OPENAI_MODEL_SIZES:
        present = ", ".join(available_models(models_dir)) or "none"
        raise ModelNameError(f"no model {name!r} in {models_dir}; present: {present}; "
                             f"downloadable: {', '.join(OPENAI_MODEL_SIZES)}")
    return model_dir


def available_models(models_dir):
    """Folders in models_dir that hold a model's hparams.json or config.json."""
    if not os.path.isdir(models_dir):
        return []
    return sorted(name for name in os.listdir(models_dir)
                  if any(os.path.isfile(os.path.join(models_dir, name, f)) for f in ("hparams.json", "config.json")))


def missing_files(model_dir, names):
    return [name for name in names if not os.path.isfile(os.path.join(model_dir, name))]


def require_files(model_dir, names):
    missing = missing_files(model_dir, names)
    if missing:
        raise MissingModelFileError(f"{model_dir} is missing {', '.join(missing)} (a model folder holds OpenAI's "
                                    f"{', '.join(OPENAI_NEEDED)}; or {', '.join(HF_MODEL_FILES)})")


def checkpoint_prefix(model_dir):
    """The checkpoint prefix the `checkpoint` text file names (OpenAI's: "model.ckpt"), relative to model_dir."""
    path = os.path.join(model_dir, "checkpoint")
    with open(path, encoding="utf-8") as f:
        match = re.search(r'^model_checkpoint_path:\s*"([^"]+)"\s*$', f.read(), re.MULTILINE)
    if not match:
        raise CheckpointError(f'{path}: no line model_checkpoint_path: "..."')
    relative = match.group(1)
    if os.path.isabs(relative) or ".." in re.split(r"[/\\]", relative):
        raise CheckpointError(f"{path}: model_checkpoint_path {relative!r} points outside {model_dir}; "
                              'expected a name in the folder such as "model.ckpt"')
    return relative


# ---------------------------------------------------------------- downloading OpenAI's release


def download_gpt2_files(model_size, model_dir, base_url=None):
    """Download whichever of OpenAI's seven files for model_size are missing from model_dir."""
    base_url = base_url or OPENAI_BASE_URL
    created = not os.path.isdir(model_dir)
    os.makedirs(model_dir, exist_ok=True)
    try:
        for filename in missing_files(model_dir, OPENAI_FILES):
            download_file(f"{base_url}/{model_size}/{filename}", os.path.join(model_dir, filename))
    except DownloadError:
        if created and not os.listdir(model_dir):
            os.rmdir(model_dir)  # leave no empty folder that would look like a model
        raise


def download_file(url, path):
    """Stream url into a temporary file beside path, renamed to path once complete (Content-Length checked)."""
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response, replace_when_done(path) as f:
            announced = response.headers.get("Content-Length")
            total = int(announced) if announced is not None else None
            received = 0
            with tqdm(total=total, unit="B", unit_scale=True, desc=os.path.basename(path), disable=None) as bar:
                while chunk := response.read(DOWNLOAD_CHUNK):
                    f.write(chunk)
                    received += len(chunk)
                    bar.update(len(chunk))
            if total is not None and received != total:
                raise DownloadError(f"the connection closed after {received} of {total} bytes")
    except (OSError, http.client.HTTPException, ValueError) as error:  # URLError, HTTPError, timeouts, ...
        reason = error if isinstance(error, urllib.error.HTTPError) else getattr(error, "reason", error)
        folder = os.path.dirname(path) or "."
        raise DownloadError(f"could not download {url}: {reason}. Without network access, fetch OpenAI's files "
                            f"({', '.join(OPENAI_FILES)}) elsewhere and put them in {folder}") from None


# ---------------------------------------------------------------- hparams


def load_hparams(path):
    """OpenAI's hparams.json: n_vocab, n_ctx, n_embd, n_head, n_layer."""
    return check_hparams(read_json(path), path)


def hparams_from_hf_config(path):
    """A Hugging Face GPT-2 config.json as OpenAI's hparams, after checking its architecture is ours."""
    config = read_json(path)
    expected = {"activation_function": ("gelu_new", "gelu_pytorch_tanh"), "layer_norm_epsilon": (1e-5,),
                "scale_attn_weights": (True,), "scale_attn_by_inverse_layer_idx": (False,),
                "tie_word_embeddings": (True,)}  # gpt2.py's output projection is wte.T
    for key, allowed in expected.items():
        if config.get(key, allowed[0]) not in allowed:
            raise CheckpointError(f"{path}: {key} is {config[key]!r}; this GPT-2 implementation needs {allowed[0]!r}")
    if config.get("n_inner") not in (None, 4 * config.get("n_embd", 0)):
        raise CheckpointError(f"{path}: n_inner {config['n_inner']!r} is not 4 * n_embd")
    renamed = {"n_vocab": "vocab_size", "n_ctx": "n_positions", "n_embd": "n_embd", "n_head": "n_head",
               "n_layer": "n_layer"}
    return check_hparams({ours: config.get(theirs) for ours, theirs in renamed.items()}, path)


def read_json(path):
    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as error:
            raise CheckpointError(f"{path}: not valid JSON ({error})") from None


def check_hparams(hparams, path):
    if not isinstance(hparams, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    for name in HPARAM_NAMES:
        value = hparams.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(f"{path}: {name} must be a positive integer, got {value!r}")
    if hparams["n_embd"] % hparams["n_head"]:
        raise CheckpointError(f"{path}: n_embd {hparams['n_embd']} is not a multiple of n_head {hparams['n_head']}")
    return {name: hparams[name] for name in HPARAM_NAMES}


# ---------------------------------------------------------------- checkpoint names -> nested params

TOP_LEAVES = (("wte",), ("wpe",), ("ln_f", "g"), ("ln_f", "b"))
BLOCK_LEAVES = (("ln_1", "g"), ("ln_1", "b"), ("attn", "c_attn", "w"), ("attn", "c_attn", "b"),
                ("attn", "c_proj", "w"), ("attn", "c_proj", "b"), ("ln_2", "g"), ("ln_2", "b"),
                ("mlp", "c_fc", "w"), ("mlp", "c_fc", "b"), ("mlp", "c_proj", "w"), ("mlp", "c_proj", "b"))
LINEAR_SIZES = {"attn/c_attn": (1, 3), "attn/c_proj": (1, 1), "mlp/c_fc": (1, 4), "mlp/c_proj": (4, 1)}  # x n_embd
HF_LEAF_NAMES = {"g": "weight", "b": "bias", "w": "weight"}


def param_leaves(n_layer):
    """(path in the nested params, e.g. ("blocks", 0, "attn", "c_attn", "w"), leaf) of every parameter."""
    leaves = [(leaf, leaf) for leaf in TOP_LEAVES]
    leaves += [(("blocks", i, *leaf), leaf) for i in range(n_layer) for leaf in BLOCK_LEAVES]
    return leaves


def leaf_at(params, path):  # the array at a param_leaves path of the nested params
    for key in path:
        params = params[key]
    return params


def openai_name(path):  # ("blocks", 0, "attn", "c_attn", "w") -> "model/h0/attn/c_attn/w"
    return "model/" + "/".join(f"h{part}" if isinstance(part, int) else part for part in path if part != "blocks")


def hf_name(path):  # ("blocks", 0, "attn", "c_attn", "w") -> "h.0.attn.c_attn.weight"; ("wte",) -> "wte.weight"
    parts = ["h" if part == "blocks" else str(part) for part in path]
    return ".".join(parts[:-1] + [HF_LEAF_NAMES.get(parts[-1], parts[-1])]) + (".weight" if len(path) == 1 else "")


def expected_shape(leaf, hparams):
    n_embd = hparams["n_embd"]
    if leaf == ("wte",):
        return (hparams["n_vocab"], n_embd)
    if leaf == ("wpe",):
        return (hparams["n_ctx"], n_embd)
    if leaf[0].startswith("ln"):
        return (n_embd,)
    n_in, n_out = LINEAR_SIZES["/".join(leaf[:2])]
    return (n_in * n_embd, n_out * n_embd) if leaf[-1] == "w" else (n_out * n_embd,)


def load_gpt2_params(checkpoint, hparams):
    """Nested float32 params from a TFCheckpoint (OpenAI's names) or a SafetensorsFile (Hugging Face's)."""
    is_tf = isinstance(checkpoint, TFCheckpoint)
    prefix = "" if is_tf or "wte.weight" in checkpoint.shapes else "transformer."
    params = {"blocks": [{} for _ in range(hparams["n_layer"])]}
    for path, leaf in param_leaves(hparams["n_layer"]):
        name = openai_name(path) if is_tf else prefix + hf_name(path)
        if name not in checkpoint.shapes:
            raise CheckpointError(f"{checkpoint.path}: no tensor {name!r} (is this a GPT-2 checkpoint with "
                                  f"n_layer={hparams['n_layer']}?)")
        shape = expected_shape(leaf, hparams)
        stored_shape = (1, *shape) if is_tf and leaf[-1] == "w" else shape  # OpenAI's conv1d: [1, n_in, n_out]
        if tuple(checkpoint.shapes[name]) != stored_shape:
            raise CheckpointError(f"{checkpoint.path}: {name!r} has shape {list(checkpoint.shapes[name])}, "
                                  f"the hparams call for {list(stored_shape)}")
        nest(params, path, checkpoint.read(name).astype(np.float32, copy=False).reshape(shape))
    return params


def nest(params, path, value):
    *parents, last = path
    for key in parents:
        params = params[key] if isinstance(key, int) else params.setdefault(key, {})
    params[last] = value


def save_gpt2_checkpoint(params, hparams, model_dir, dtype=np.float32):
    """Write params as OpenAI's release does: model.ckpt.* with OpenAI's names, checkpoint, hparams.json.

    encoder.json and vocab.bpe are the caller's to place. Every file is written under a temporary
    name and renamed when complete.
    """
    os.makedirs(model_dir, exist_ok=True)
    tensors = {}
    for path, leaf in param_leaves(hparams["n_layer"]):
        value = leaf_at(params, path)
        stored_shape = (1, *value.shape) if leaf[-1] == "w" else value.shape  # OpenAI's conv1d: [1, n_in, n_out]
        tensors[openai_name(path)] = np.asarray(value, dtype).reshape(stored_shape)
    write_tf_checkpoint(os.path.join(model_dir, "model.ckpt"), tensors)
    with replace_when_done(os.path.join(model_dir, "checkpoint")) as f:
        f.write(b'model_checkpoint_path: "model.ckpt"\nall_model_checkpoint_paths: "model.ckpt"\n')
    with replace_when_done(os.path.join(model_dir, "hparams.json")) as f:
        f.write(json.dumps(check_hparams(hparams, "hparams"), indent=2).encode() + b"\n")
