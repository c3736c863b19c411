"""main.py's command line: its flags read strictly, checked before any model is loaded, and its usage
(flags.py); the decoders run and compared, for one sequence or a batch, with warm-up, interleaved repeats,
medians and paired speedups (runs.py); and the report that words the result dict `--json` prints
(report.py). It uses the reading path (sampling, utils, encoder), speedup/ for the costs and drafts, and
backends.py to build a NumPy or a JAX model and pick the decoders that suit it.
"""
