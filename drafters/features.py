"""The target's features, as the drafters read them: its state after ln_f at each position, the vector its
unembedding turns into the next token's logits (EAGLE's f_i, Medusa's last hidden state)."""

import gpt2


def true_features(target, x):  # [n] -> [n, n_embd]
    """The target's (a NumPy gpt2.GPT2Model's) features at x's positions, computed by a separate forward that leaves
    its cache untouched."""
    states, _ = gpt2.hidden_states(x, **target.params, n_head=target.hparams["n_head"], cache=None, start=0)
    return states[-1]
