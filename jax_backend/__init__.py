"""The JAX backend (`python main.py --backend jax`, `pip install -r requirements-jax.txt`): gpt2.py's model
under jax.jit with a static KV cache, the draft's K steps fused into one device call and optional bfloat16
(gpt2_jax.py); sampling.py's autoregressive and speculative loops as single device loops, vmapped over a
batch, fed the same Generator's uniform numbers so that a seed gives the NumPy backend's tokens
(sampling_jax.py). cli/backends.py builds a NumPy or a JAX model and picks the decoders that suit it; jax is
imported only when the JAX backend is asked for.
"""
