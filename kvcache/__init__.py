"""The KV cache's bookkeeping, written once for every cached model (gpt2.GPT2Model, the JAX model, the classroom's
table model): which positions a call feeds and where (contract.py), and a token tree's checks, ancestry and mask
(tree.py). NumPy only; the models hold their own buffers."""
