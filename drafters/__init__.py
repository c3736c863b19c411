"""Drafts made from the target itself, one file per paper, each read beside its paper.

early_exit.py: the target's first L layers read out through its own final norm and unembedding (Draft & Verify,
arXiv 2309.08168; LayerSkip, arXiv 2404.16710), sharing the target's KV cache; untrained. eagle.py: EAGLE's draft
head (arXiv 2401.15077), one block that predicts the target's next feature from its feature and the next token,
with a KV cache of its own; untrained here. A drafter plugs into the loop as speedup/drafts.PromptLookup does
(`propose(x, K, settings, rng, stats)` -> drafts, p), so sampling.py and verifiers/ stay as they are; the target's
features a drafter reads come from drafters/features.true_features, which reads the rows gpt2.GPT2Model keeps beside
its KV cache (gpt2.hidden_states computes them).

Why an untrained exit accepts little: ln_f and the unembedding were trained to read the residual stream after the
last layer only. After L < n_layer layers the stream has not yet been turned into a next-token prediction, and
nothing taught the final norm to read it early; LayerSkip trains the target with early-exit losses (and layer
dropout) for that, Kangaroo trains a small adapter on the exit. What each drafter costs and accepts, measured:
docs/DRAFTERS.md.
"""
