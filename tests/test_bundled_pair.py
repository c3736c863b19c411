"""The committed teaching pair: it loads through the OpenAI-format path, it still models held-out text as
well as when it was committed, and it reproduces a recorded greedy continuation exactly."""

import json

import numpy as np
import pytest

import gpt2
import main
import sampling
import utils
from bench.text_quality import perplexity
from conftest import REPO
from speedup.stats import SpeculativeStats

MODELS = REPO / "models"
HELD_OUT = REPO / "tests" / "fixtures" / "heldout_sample.txt"  # two held-out documents (PSF licence)
# Recorded when the pair was committed (models/README.md); a regression in loading or in the forward
# pass moves these numbers.
TARGET_PERPLEXITY_AT_MOST = 10.8  # measured 10.64
DRAFT_PERPLEXITY_AT_MOST = 15.2  # measured 14.80
PROMPT = main.DEFAULT_PROMPT
GREEDY_CONTINUATION = [294, 381, 690, 7, 2114, 8, 427, 198, 613, 434, 69, 891, 664, 7, 69, 363, 294, 503, 1482, 262, 690,
                       331, 1997, 295, 301, 3123, 2927, 437, 294, 381, 3046, 7]


@pytest.fixture(scope="module")
def pair():
    encoder, target_hparams, target_params = utils.load_encoder_hparams_and_params("teach-target", MODELS)
    draft_encoder, draft_hparams, draft_params = utils.load_encoder_hparams_and_params("teach-draft", MODELS)
    assert draft_encoder.encoder == encoder.encoder  # one vocabulary for both
    return encoder, (target_hparams, target_params), (draft_hparams, draft_params)


def test_the_pair_is_stored_as_openai_releases_gpt2():
    for name in ["teach-target", "teach-draft"]:
        files = {path.name for path in (MODELS / name).iterdir()}
        assert {"checkpoint", "hparams.json", "encoder.json", "vocab.bpe", "model.ckpt.index",
                "model.ckpt.data-00000-of-00001"} <= files
    tracked_bytes = sum(path.stat().st_size for path in MODELS.rglob("*") if path.is_file()
                        and path.parent.name in ("teach-target", "teach-draft"))
    assert tracked_bytes < 40e6  # the drafters' heads beside it: tests/test_drafter_heads.py keeps models/ within 50 MB


def test_the_pair_loads_as_float32_with_the_documented_shapes(pair):
    _, (target_hparams, target_params), (draft_hparams, draft_params) = pair
    card = json.loads((MODELS / "training_log.json").read_text())
    assert target_hparams == card["recipe"]["hparams"]["target"]
    assert draft_hparams == card["draft_distillation"]["recipe"]["draft_hparams"]
    assert target_params["wte"].dtype == np.float32 and draft_params["blocks"][0]["attn"]["c_attn"]["w"].dtype == np.float32
    assert target_params["blocks"][0]["mlp"]["c_fc"]["w"].shape == (target_hparams["n_embd"], 4 * target_hparams["n_embd"])


def test_held_out_perplexity_stays_at_the_recorded_value(pair):
    encoder, (target_hparams, target_params), (draft_hparams, draft_params) = pair
    tokens = np.asarray(encoder.encode(HELD_OUT.read_text(encoding="utf-8")))
    target_ppl = perplexity(tokens, target_params, target_hparams)
    draft_ppl = perplexity(tokens, draft_params, draft_hparams)
    assert target_ppl <= TARGET_PERPLEXITY_AT_MOST
    assert draft_ppl <= DRAFT_PERPLEXITY_AT_MOST
    assert target_ppl < draft_ppl  # the target is the better model
    assert target_ppl < encoder.n_vocab / 10  # far better than guessing


def test_a_greedy_continuation_is_reproduced_exactly(pair):
    encoder, (target_hparams, target_params), (draft_hparams, draft_params) = pair
    prompt = encoder.encode(PROMPT)
    target = gpt2.GPT2Model(target_params, target_hparams)
    out = sampling.autoregressive_sampling(prompt, target, len(GREEDY_CONTINUATION), temperature=0)
    assert out[len(prompt):].tolist() == GREEDY_CONTINUATION
    draft = gpt2.GPT2Model(draft_params, draft_hparams)
    target.reset()
    stats = SpeculativeStats()
    out = sampling.speculative_sampling(prompt, draft, target, len(GREEDY_CONTINUATION), K=4, temperature=0,
                                        rng=np.random.default_rng(0), stats=stats)
    assert out[len(prompt):].tolist() == GREEDY_CONTINUATION
    assert stats.accepted > 0
