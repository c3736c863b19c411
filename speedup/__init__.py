"""What speculation gains and how to get more of it: the statistics every decoder keeps and Leviathan et
al.'s expected-speedup formula (stats.py, which imports nothing of the kit: sampling.py imports its
SpeculativeStats); this machine's measured costs, the best K, the alpha from which speculation pays, and
AutoK, which chooses K loop by loop (costs.py, `--K auto`); and drafts that need no model: prompt lookup
(drafts.py, `--draft_model_size prompt-lookup`). costs.py and drafts.py use sampling.py's primitives;
sampling.py's decoders call a draft's `propose` without importing them.
"""
