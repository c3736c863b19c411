"""GPT-2 and both algorithms over a batch of sequences, each row exactly as it decodes alone: the batched forward
pass composed of gpt2.py's functions (gpt2_batched.py) and Algorithms 1 and 2 row by row over it, calling
sampling.py's rules (sampling_batched.py).
"""
