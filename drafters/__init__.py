"""Drafts made from the target itself, one file per paper, each read beside its paper.

early_exit.py: the target's first L layers read out through its own final norm and unembedding (LayerSkip, arXiv
2404.16710), sharing the target's KV cache, which the verification reuses; untrained. kangaroo.py: Kangaroo's
adapter on that exit (arXiv 2404.18911), one attention between two norms with a KV cache of its own, which starts as
the untrained exit, and its stop of the chain when the exit is unsure. eagle.py: EAGLE's draft head (arXiv
2401.15077), one block that predicts the target's next feature from its feature and the next token, with a KV cache
of its own, and EAGLE-3's fusion of lower layers' residual streams into the feature it reads. eagle2.py: EAGLE-2's
dynamic draft tree (arXiv 2406.16858), the same head growing a tree by its own confidence within a node budget.
frspec.py: FR-Spec's frequency-ranked draft vocabulary (arXiv 2502.14856), the same head reading out through the
target's unembedding sliced to the most frequent tokens, untrained. eagle3.py: EAGLE-3's draft (arXiv 2503.01840), a
low, a middle and a high layer's residual streams fused, one draft layer, and a readout of its own over a reduced
vocabulary, as a chain or EAGLE-2's tree. medusa.py: Medusa-1's heads (arXiv 2401.10774), each a residual block on the
target's feature predicting a token further ahead, drafting a chain or a sparse tree. A drafter plugs into the loop as
speedup/drafts.PromptLookup does (`propose(x, K, settings, rng, stats)` -> drafts, p), and a tree drafter through
`draft_tree` (verifiers/tree.py's drafts="dynamic"), so sampling.py and verifiers/ stay as they are; the chain
drafters (EAGLE's heads, the early exit, Kangaroo) share one proposal loop (chain.py), each giving its step. The
target's features (and the streams it taps for a fused head) come from drafters/features.true_states, which reads the
rows gpt2.GPT2Model keeps beside its KV cache. The heads are trained by tools/train_heads.py and kept on disk by
drafters/heads.py.

Why an untrained exit accepts little: ln_f and the unembedding were trained to read the residual stream after the
last layer only. After L < n_layer layers the stream has not yet been turned into a next-token prediction, and
nothing taught the final norm to read it early; LayerSkip trains the target with early-exit losses (and layer
dropout) for that, Kangaroo trains a small adapter on the exit. What each drafter costs and accepts, measured:
docs/DRAFTERS.md.
"""
