"""Memory as serving guides count it, from a model's hparams alone: the weights at each storage precision and
the KV cache per token and at full context, with the saving of multi-query and grouped-query attention.

A decode step reads every weight and the whole cache once for one token's arithmetic, so these byte counts,
over the memory's bandwidth, bound the step's time from below (notebook 2).
"""

BYTES_PER_VALUE = {"float32": 4, "bfloat16": 2, "int8": 1, "int4": 0.5}
# OpenAI's GPT-2 shapes (n_embd, n_layer, n_head): 50257 tokens, 1024 positions
GPT2_SHAPES = {"124M": (768, 12, 12), "355M": (1024, 24, 16), "774M": (1280, 36, 20), "1558M": (1600, 48, 25)}


def gpt2_hparams(size):
    n_embd, n_layer, n_head = GPT2_SHAPES[size]
    return {"n_vocab": 50257, "n_ctx": 1024, "n_embd": n_embd, "n_head": n_head, "n_layer": n_layer}


def parameter_count(hparams):
    """GPT-2's parameters: token and position embeddings (the unembedding shares wte), per block two layer norms,
    attention's [E, 3E] and [E, E] and the MLP's [E, 4E] and [4E, E] with their biases, and the final norm."""
    E, L = hparams["n_embd"], hparams["n_layer"]
    block = 2 * 2 * E + (3 * E * E + 3 * E) + (E * E + E) + (4 * E * E + 4 * E) + (4 * E * E + E)
    return (hparams["n_vocab"] + hparams["n_ctx"]) * E + L * block + 2 * E


def weights_bytes(hparams, dtype):
    return parameter_count(hparams) * BYTES_PER_VALUE[dtype]


def kv_cache_bytes_per_token(hparams, dtype="float32", n_kv_head=None):
    """Keys and values of one token in every layer: 2 x n_layer x n_kv_head x head_dim values. Multi-head attention
    keeps n_kv_head = n_head (2 x n_layer x n_embd values); grouped-query attention shares each key and value head
    among n_head / n_kv_head query heads; multi-query attention keeps one (n_kv_head = 1)."""
    n_head = hparams["n_head"]
    n_kv_head = n_head if n_kv_head is None else n_kv_head
    if not 1 <= n_kv_head <= n_head or n_head % n_kv_head:
        raise ValueError(f"n_kv_head must divide n_head = {n_head}, got {n_kv_head}")
    head_dim = hparams["n_embd"] // n_head
    return 2 * hparams["n_layer"] * n_kv_head * head_dim * BYTES_PER_VALUE[dtype]


def kv_cache_bytes(hparams, dtype="float32", n_kv_head=None, n_tokens=None):
    """The cache of n_tokens (default: the full context, n_ctx)."""
    n_tokens = hparams["n_ctx"] if n_tokens is None else n_tokens
    return n_tokens * kv_cache_bytes_per_token(hparams, dtype, n_kv_head)


def grouped_kv_heads(n_head):
    """A grouped-query choice for n_head query heads: groups of 4 where n_head allows, else the smallest divisor
    above 1 (GPT-2 1558M's 25 heads: 5 groups of 5); 1 for a single head."""
    for group in (4, *range(2, n_head + 1)):
        if n_head % group == 0:
            return n_head // group
    return 1
