"""Drafts made from the target itself, one file per paper, each read beside its paper.

early_exit.py: the target's first L layers read out through its own final norm and unembedding (Draft & Verify,
arXiv 2309.08168; LayerSkip, arXiv 2404.16710), sharing the target's KV cache; untrained. A drafter plugs into the
loop as speedup/drafts.PromptLookup does (`propose(x, K, settings, rng, stats)` -> drafts, p), so sampling.py and
verifiers/ stay as they are; the target's features a drafter reads come from gpt2.hidden_states.
"""
