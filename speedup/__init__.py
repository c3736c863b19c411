"""What speculation gains and how to get more of it: this machine's measured costs, the expected speedup at
those costs, the best K, the alpha from which speculation pays, and AutoK, which chooses K loop by loop
(costs.py, `--K auto`); and drafts that need no model: prompt lookup (drafts.py, `--draft_model_size
prompt-lookup`). It uses sampling.py's primitives; sampling.py's decoders call a draft's `propose` without
importing this folder.
"""
