"""Checkpoint files: our TensorFlow reader and writer against real TensorFlow's, safetensors against
transformers, and the model folder rules of load_encoder_hparams_and_params.

The TensorFlow side lives in committed fixtures made by tests/fixtures/make_tf_checkpoint.py (run
with TensorFlow, which the tests never import): tiny GPT-2s saved by TensorFlow's Saver with
OpenAI's names, TensorFlow's own reading of them (tf_arrays.npz), and writer_crosscheck.json.
"""

import copy
import hashlib
import importlib.util
import json
import os
import shutil
import stat

import numpy as np
import pytest

import gpt2
import utils
from conftest import REPO
from checkpoints import tf_checkpoint
from checkpoints.safetensors_file import SafetensorsFile
from checkpoints.tf_checkpoint import CheckpointError, TFCheckpoint, crc32c, masked_crc32c, write_tf_checkpoint

FIXTURES = REPO / "tests" / "fixtures"
TINY = {"float32": FIXTURES / "gpt2-tiny-f32", "float16": FIXTURES / "gpt2-tiny-f16"}
DATA_FILE = "model.ckpt.data-00000-of-00001"

spec = importlib.util.spec_from_file_location("make_tf_checkpoint", FIXTURES / "make_tf_checkpoint.py")
make_tf_checkpoint = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_tf_checkpoint)


def tf_arrays(dtype):
    with np.load(TINY[dtype] / "tf_arrays.npz") as arrays:
        return {name: arrays[name] for name in arrays.files}


def copy_model(dtype, tmp_path, name="tiny"):
    shutil.copytree(TINY[dtype], tmp_path / name)
    return tmp_path / name


# ---------------------------------------------------------------- CRC-32C


def reference_crc32c(data):  # bit by bit, straight from the definition (reflected polynomial 0x82F63B78)
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_crc32c_check_value():
    assert crc32c(b"123456789") == 0xE3069283  # the catalogued check value of CRC-32C
    assert crc32c(b"") == 0


@pytest.mark.parametrize("n_bytes", [1, 3, 16383, 16384, 16389, 65536 + 4099, 3 * 65536 + 77])
def test_crc32c_matches_definition_across_the_parallel_paths(n_bytes):
    data = np.random.default_rng(n_bytes).integers(0, 256, n_bytes, dtype=np.uint8).tobytes()
    assert crc32c(data) == reference_crc32c(data)


def test_masked_crc32c_is_leveldbs_rotation():
    crc = crc32c(b"abc")
    assert masked_crc32c(b"abc") == ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


# ---------------------------------------------------------------- reading what TensorFlow wrote


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_reader_returns_exactly_what_tensorflow_reads(dtype):
    expected = tf_arrays(dtype)
    checkpoint = TFCheckpoint(TINY[dtype] / "model.ckpt")
    assert sorted(checkpoint.shapes) == sorted(expected)
    for name, tf_array in expected.items():
        ours = checkpoint.read(name)
        assert ours.dtype == np.dtype(dtype) == tf_array.dtype
        assert ours.shape == tf_array.shape == checkpoint.shapes[name]
        assert ours.tobytes() == tf_array.tobytes(), name


def test_fixture_has_openais_names_and_shapes():
    hparams = json.loads((TINY["float32"] / "hparams.json").read_text())
    shapes = TFCheckpoint(TINY["float32"] / "model.ckpt").shapes
    n_embd = hparams["n_embd"]
    assert shapes["model/wte"] == (hparams["n_vocab"], n_embd)
    assert shapes["model/wpe"] == (hparams["n_ctx"], n_embd)
    assert shapes["model/h1/attn/c_attn/w"] == (1, n_embd, 3 * n_embd)
    assert shapes["model/h1/mlp/c_proj/w"] == (1, 4 * n_embd, n_embd)
    assert len(shapes) == 4 + 12 * hparams["n_layer"]
    assert (TINY["float32"] / "checkpoint").read_text().startswith('model_checkpoint_path: "model.ckpt"\n')


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_load_encoder_hparams_and_params_on_a_tensorflow_checkpoint(dtype):
    encoder, hparams, params = utils.load_encoder_hparams_and_params(TINY[dtype].name, FIXTURES)
    expected = tf_arrays(dtype)
    assert hparams == {"n_vocab": 260, "n_ctx": 16, "n_embd": 8, "n_head": 2, "n_layer": 2}
    assert sorted(params) == ["blocks", "ln_f", "wpe", "wte"] and len(params["blocks"]) == hparams["n_layer"]
    c_attn = params["blocks"][1]["attn"]["c_attn"]
    assert c_attn["w"].shape == (8, 24) and c_attn["w"].dtype == np.float32
    np.testing.assert_array_equal(c_attn["w"], expected["model/h1/attn/c_attn/w"][0].astype(np.float32))
    np.testing.assert_array_equal(params["blocks"][0]["mlp"]["c_proj"]["b"], expected["model/h0/mlp/c_proj/b"])
    np.testing.assert_array_equal(params["ln_f"]["g"], expected["model/ln_f/g"])
    leaves = [params["wte"], params["wpe"], *params["ln_f"].values()]
    for block in params["blocks"]:
        assert sorted(block) == ["attn", "ln_1", "ln_2", "mlp"]
        leaves += [*block["ln_1"].values(), *block["ln_2"].values()]
        leaves += [array for layer in (*block["attn"].values(), *block["mlp"].values()) for array in layer.values()]
    assert len(leaves) == 4 + 12 * hparams["n_layer"] and all(leaf.dtype == np.float32 for leaf in leaves)

    ids = encoder.encode(" the thin in")
    assert encoder.decode(ids) == " the thin in" and 258 in ids  # the fixture's merges: "Ġthe" is token 258
    logits = gpt2.gpt2(np.array(ids), **params, n_head=hparams["n_head"])
    assert logits.shape == (len(ids), hparams["n_vocab"]) and logits.dtype == np.float32
    assert np.all(np.isfinite(logits))


# ---------------------------------------------------------------- damaged files


def test_truncated_data_file_names_the_file(tmp_path):
    model_dir = copy_model("float32", tmp_path)
    data = model_dir / DATA_FILE
    data.write_bytes(data.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match="truncated") as error:
        utils.load_encoder_hparams_and_params("tiny", tmp_path)
    assert str(data) in str(error.value)


@pytest.mark.parametrize("keep", [10, 100, -1])  # inside the footer, short of it, one byte short
def test_truncated_index_names_the_file(tmp_path, keep):
    index = copy_model("float32", tmp_path) / "model.ckpt.index"
    index.write_bytes(index.read_bytes()[:keep])
    with pytest.raises(CheckpointError) as error:
        utils.load_encoder_hparams_and_params("tiny", tmp_path)
    assert str(index) in str(error.value)


def flip_byte(path, position):
    data = bytearray(path.read_bytes())
    data[position] ^= 0x01
    path.write_bytes(bytes(data))


def test_flipped_byte_in_data_is_a_checksum_mismatch(tmp_path):
    data = copy_model("float16", tmp_path) / DATA_FILE
    flip_byte(data, 1000)
    with pytest.raises(CheckpointError, match="checksum mismatch") as error:
        utils.load_encoder_hparams_and_params("tiny", tmp_path)
    assert str(data) in str(error.value)


def test_flipped_byte_in_index_is_a_checksum_mismatch(tmp_path):
    index = copy_model("float32", tmp_path) / "model.ckpt.index"
    flip_byte(index, 20)  # inside the data block of entries
    with pytest.raises(CheckpointError, match="checksum mismatch") as error:
        TFCheckpoint(tmp_path / "tiny" / "model.ckpt")
    assert str(index) in str(error.value)


def test_compressed_block_is_refused(tmp_path):
    index = copy_model("float32", tmp_path) / "model.ckpt.index"
    table = bytearray(index.read_bytes())
    footer, position = table[-48:], 0
    _, position = tf_checkpoint.read_varint(footer, position, "footer")  # skip the metaindex block's handle
    _, position = tf_checkpoint.read_varint(footer, position, "footer")
    offset, size = tf_checkpoint.decode_handle(footer[position:], "footer")  # the index block
    table[offset + size] = 1  # claim Snappy, with a valid checksum, so only the compression byte is wrong
    checksum = masked_crc32c(bytes(table[offset:offset + size + 1]))
    table[offset + size + 1:offset + size + 5] = checksum.to_bytes(4, "little")
    index.write_bytes(bytes(table))
    with pytest.raises(CheckpointError, match="compressed blocks") as error:
        TFCheckpoint(tmp_path / "tiny" / "model.ckpt")
    assert str(index) in str(error.value)


def test_other_dtypes_are_listed_but_not_read(tmp_path):
    """A checkpoint may hold more than the model (say an int64 global_step): it still loads."""
    index = copy_model("float32", tmp_path) / "model.ckpt.index"
    entries = tf_checkpoint.read_table(index.read_bytes(), str(index))
    int64_entry = tf_checkpoint.encode_field(1, 9) + tf_checkpoint.encode_field(5, 8)  # DT_INT64, shape [], 8 bytes
    index.write_bytes(tf_checkpoint.build_table(sorted(entries + [(b"global_step", int64_entry)])))
    checkpoint = TFCheckpoint(tmp_path / "tiny" / "model.ckpt")
    assert checkpoint.shapes["global_step"] == () and checkpoint.dtype_name("global_step") == "TensorFlow DataType 9"
    with pytest.raises(CheckpointError, match="unsupported type"):
        checkpoint.read("global_step")
    _, _, params = utils.load_encoder_hparams_and_params("tiny", tmp_path)
    np.testing.assert_array_equal(params["wte"], tf_arrays("float32")["model/wte"])


# ---------------------------------------------------------------- our writer, as verified by TensorFlow


def test_writer_output_is_what_tensorflow_verified(tmp_path):
    """Our writer's bytes must equal those TensorFlow read (and SaveV2 wrote) when the fixtures were made;
    any change to the writer fails here until make_tf_checkpoint.py re-verifies it with TensorFlow."""
    record = json.loads(make_tf_checkpoint.CROSSCHECK_JSON.read_text(encoding="utf-8"))
    tensors = make_tf_checkpoint.crosscheck_tensors()
    write_tf_checkpoint(tmp_path / "ours", tensors)
    for suffix, expected in record["files"].items():
        written = (tmp_path / f"ours{suffix}").read_bytes()
        assert (len(written), hashlib.sha256(written).hexdigest()) == (expected["bytes"], expected["sha256"]), suffix
        assert expected["identical_to_tensorflow_savev2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ours.data-00000-of-00001", "ours.index"]  # no temp files
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "ours.index").stat().st_mode) == 0o666 & ~umask  # as open() makes files

    checkpoint = TFCheckpoint(tmp_path / "ours")
    arrays = {name: checkpoint.read(name) for name in checkpoint.shapes}
    dtypes = {name: checkpoint.dtype_name(name) for name in checkpoint.shapes}
    listing = make_tf_checkpoint.tensor_listing(checkpoint.shapes, dtypes, arrays)
    tf_read = record["tensorflow_read"]
    assert len(listing) == tf_read["n_tensors"] == len(tensors)
    assert make_tf_checkpoint.listing_digest(listing) == tf_read["listing_sha256"]
    assert [row for row in listing if not row[0].startswith("many/")] == tf_read["first_tensors"]


def test_crosscheck_index_spans_several_blocks():
    record = json.loads(make_tf_checkpoint.CROSSCHECK_JSON.read_text(encoding="utf-8"))
    assert record["files"][".index"]["bytes"] > tf_checkpoint.BLOCK_SIZE


def test_writer_refuses_other_dtypes_and_leaves_nothing(tmp_path):
    with pytest.raises(ValueError, match="float32 and float16"):
        write_tf_checkpoint(tmp_path / "x", {"a": np.zeros(3, np.float32), "b": np.zeros(3, np.int32)})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_save_gpt2_checkpoint_round_trip(tmp_path, dtype):
    hparams = {"n_vocab": 260, "n_ctx": 16, "n_embd": 8, "n_head": 2, "n_layer": 3}
    params = gpt2.init_params(hparams, np.random.default_rng(0))
    model_dir = tmp_path / "saved"
    utils.save_gpt2_checkpoint(params, hparams, model_dir, dtype=dtype)
    for name in ("encoder.json", "vocab.bpe"):
        shutil.copy(TINY["float32"] / name, model_dir / name)
    _, loaded_hparams, loaded = utils.load_encoder_hparams_and_params("saved", tmp_path)
    assert loaded_hparams == hparams
    saved = TFCheckpoint(model_dir / "model.ckpt")
    assert saved.shapes["model/h2/mlp/c_fc/w"] == (1, 8, 32) and saved.dtype_name("model/wte") == np.dtype(dtype).name
    for path, _ in utils.param_leaves(hparams["n_layer"]):
        ours, theirs = utils.leaf_at(loaded, path), utils.leaf_at(params, path)
        np.testing.assert_array_equal(ours, theirs.astype(dtype).astype(np.float32))
        assert ours.dtype == np.float32


# ---------------------------------------------------------------- model folders and names


@pytest.mark.parametrize("name", ["..", ".", "", "../tiny", "a/b", "/etc", "a\\b", "x\0y"])
def test_path_like_model_names_are_rejected(name):
    with pytest.raises(utils.ModelNameError, match="folder"):
        utils.load_encoder_hparams_and_params(name, FIXTURES)


def test_unknown_model_lists_present_and_downloadable(tmp_path):
    copy_model("float32", tmp_path, "mine")
    with pytest.raises(utils.ModelNameError) as error:
        utils.load_encoder_hparams_and_params("nosuchmodel", tmp_path)
    assert "mine" in str(error.value) and "124M" in str(error.value) and "1558M" in str(error.value)


@pytest.mark.parametrize("name", ["vocab.bpe", "checkpoint", "model.ckpt.index"])
def test_missing_file_is_named(tmp_path, name):
    (copy_model("float32", tmp_path) / name).unlink()
    with pytest.raises(utils.MissingModelFileError, match=name):
        utils.load_encoder_hparams_and_params("tiny", tmp_path)


def test_missing_data_file_is_named(tmp_path):
    data = copy_model("float32", tmp_path) / DATA_FILE
    data.unlink()
    with pytest.raises(CheckpointError, match="No such file") as error:
        utils.load_encoder_hparams_and_params("tiny", tmp_path)
    assert str(data) in str(error.value)


def test_checkpoint_file_names_the_prefix(tmp_path):
    model_dir = copy_model("float32", tmp_path)
    (model_dir / "step-7").mkdir()
    for suffix in (".index", ".data-00000-of-00001"):
        (model_dir / f"model.ckpt{suffix}").rename(model_dir / "step-7" / f"weights{suffix}")
    (model_dir / "checkpoint").write_text('model_checkpoint_path: "step-7/weights"\n')
    _, _, params = utils.load_encoder_hparams_and_params("tiny", tmp_path)
    np.testing.assert_array_equal(params["wte"], tf_arrays("float32")["model/wte"])


@pytest.mark.parametrize("path", ["../tiny2/model.ckpt", "/tmp/model.ckpt"])
def test_checkpoint_file_cannot_point_outside_the_folder(tmp_path, path):
    model_dir = copy_model("float32", tmp_path)
    copy_model("float32", tmp_path, "tiny2")
    (model_dir / "checkpoint").write_text(f'model_checkpoint_path: "{path}"\n')
    with pytest.raises(CheckpointError, match="outside"):
        utils.load_encoder_hparams_and_params("tiny", tmp_path)


def test_hparams_that_disagree_with_the_checkpoint(tmp_path):
    model_dir = copy_model("float32", tmp_path)
    hparams = json.loads((model_dir / "hparams.json").read_text())
    (model_dir / "hparams.json").write_text(json.dumps({**hparams, "n_layer": 3}))
    with pytest.raises(CheckpointError, match="model/h2/ln_1/g"):
        utils.load_encoder_hparams_and_params("tiny", tmp_path)
    (model_dir / "hparams.json").write_text(json.dumps({**hparams, "n_ctx": 32}))
    with pytest.raises(CheckpointError, match="model/wpe"):
        utils.load_encoder_hparams_and_params("tiny", tmp_path)
    (model_dir / "hparams.json").write_text(json.dumps({**hparams, "n_head": 3}))
    with pytest.raises(CheckpointError, match="multiple of n_head"):
        utils.load_encoder_hparams_and_params("tiny", tmp_path)


# ---------------------------------------------------------------- Hugging Face safetensors


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
    """Random tiny transformers GPT-2s saved with save_pretrained: {(class, dtype): (folder, state dict, model)}."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=260, n_positions=16, n_embd=8, n_layer=2, n_head=2,
                                     bos_token_id=0, eos_token_id=0)
    models = {}
    for class_name in ("GPT2LMHeadModel", "GPT2Model"):  # weights named transformer.wte.weight / wte.weight
        torch.manual_seed(0)
        model = getattr(transformers, class_name)(config).eval()
        for dtype in ("float32", "float16", "bfloat16"):
            folder = tmp_path_factory.mktemp(f"{class_name}-{dtype}")
            typed = copy.deepcopy(model).to(getattr(torch, dtype))  # Module.to converts in place
            typed.save_pretrained(folder)
            for name in ("encoder.json", "vocab.bpe"):
                shutil.copy(TINY["float32"] / name, folder / name)
            state = {name: tensor.float().numpy() for name, tensor in typed.state_dict().items()}
            models[class_name, dtype] = folder, state, typed
    return models


@pytest.mark.parametrize("class_name", ["GPT2LMHeadModel", "GPT2Model"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_safetensors_params_equal_the_torch_state_dict(hf_models, class_name, dtype):
    folder, state, _ = hf_models[class_name, dtype]
    prefix = "transformer." if class_name == "GPT2LMHeadModel" else ""
    assert (prefix + "wte.weight") in SafetensorsFile(folder / "model.safetensors").shapes
    _, hparams, params = utils.load_encoder_hparams_and_params(folder.name, folder.parent)
    assert hparams == {"n_vocab": 260, "n_ctx": 16, "n_embd": 8, "n_head": 2, "n_layer": 2}
    n_compared = 0
    for path, _ in utils.param_leaves(hparams["n_layer"]):
        ours = utils.leaf_at(params, path)
        assert ours.dtype == np.float32
        np.testing.assert_array_equal(ours, state[prefix + utils.hf_name(path)])
        n_compared += 1
    assert n_compared == 4 + 12 * 2 and params["blocks"][1]["mlp"]["c_fc"]["w"].shape == (8, 32)


def test_safetensors_logits_match_transformers(hf_models):
    torch = pytest.importorskip("torch")
    folder, _, model = hf_models["GPT2LMHeadModel", "float32"]
    encoder, hparams, params = utils.load_encoder_hparams_and_params(folder.name, folder.parent)
    ids = encoder.encode(" the thin in the")
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0].numpy()
    logits = gpt2.gpt2(np.array(ids), **params, n_head=hparams["n_head"])
    assert logits.dtype == np.float32 and logits.shape == (len(ids), 260)
    np.testing.assert_allclose(logits, expected, atol=1e-5, rtol=1e-5)


def test_safetensors_extra_buffers_are_skipped(tmp_path):
    """Older checkpoints also store attention-mask buffers (other dtypes) and the tied lm_head."""
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    shutil.copytree(TINY["float16"], tmp_path / "hf")
    expected = {}
    for path, leaf in utils.param_leaves(2):
        value = TFCheckpoint(TINY["float16"] / "model.ckpt").read(utils.openai_name(path))
        expected[utils.hf_name(path)] = value[0] if leaf[-1] == "w" else value
    extra = {"h.0.attn.bias": np.tril(np.ones((1, 1, 16, 16), bool)),
             "h.0.attn.masked_bias": np.array(-1e4, np.float32),
             "lm_head.weight": expected["wte.weight"]}
    safetensors_numpy.save_file({**expected, **extra}, str(tmp_path / "hf" / "model.safetensors"))
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"vocab_size": 260, "n_positions": 16, "n_embd": 8,
                                                             "n_head": 2, "n_layer": 2}))
    _, _, params = utils.load_encoder_hparams_and_params("hf", tmp_path)
    np.testing.assert_array_equal(params["blocks"][1]["attn"]["c_proj"]["w"], expected["h.1.attn.c_proj.weight"])
    assert params["wte"].dtype == np.float32


def test_safetensors_damage_and_foreign_configs(hf_models, tmp_path):
    folder, _, _ = hf_models["GPT2Model", "float32"]
    shutil.copytree(folder, tmp_path / "hf")
    weights, config_path = tmp_path / "hf" / "model.safetensors", tmp_path / "hf" / "config.json"
    config = json.loads(config_path.read_text())
    for key, value in (("activation_function", "relu"), ("tie_word_embeddings", False), ("n_inner", 12)):
        config_path.write_text(json.dumps({**config, key: value}))
        with pytest.raises(CheckpointError, match=key):
            utils.load_encoder_hparams_and_params("hf", tmp_path)
    config_path.write_text(json.dumps(config))
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="truncated") as error:
        utils.load_encoder_hparams_and_params("hf", tmp_path)
    assert str(weights) in str(error.value)
    config_path.unlink()
    with pytest.raises(utils.MissingModelFileError, match="config.json"):
        utils.load_encoder_hparams_and_params("hf", tmp_path)
