"""Drafts made from the target itself, one file per paper, each read beside its paper.

early_exit.py: the target's first L layers read out through its own final norm and unembedding (Draft & Verify,
arXiv 2309.08168; LayerSkip, arXiv 2404.16710), sharing the target's KV cache; untrained. eagle.py: EAGLE's draft head (arXiv 2401.15077), one
block that predicts the target's next feature from its feature and the next token, with a KV cache of its own;
untrained here. A drafter plugs into the
loop as speedup/drafts.PromptLookup does (`propose(x, K, settings, rng, stats)` -> drafts, p), so sampling.py and
verifiers/ stay as they are; the target's features a drafter reads come from gpt2.hidden_states.

Why an untrained exit accepts little: ln_f and the unembedding were trained to read the residual stream after the
last layer only. After L < n_layer layers the stream has not yet been turned into a next-token prediction, and
nothing taught the final norm to read it early; LayerSkip trains the target with early-exit losses (and layer
dropout) for that, Kangaroo trains a small adapter on the exit. Measured with `python bench/early_exit.py`
(bench/results/early_exit_cpu_zen4.json; AMD EPYC family 25, model 17, Zen 4, AVX-512, OpenBLAS SkylakeX kernels,
2 cores shared with other work): the bundled 8-layer target, greedy, K 4, 4 prompts of the held-out sample:

    exit after   alpha   tokens per target call   c      v(5)   formula at K 4
    1 layer      0.14    1.16                     0.22   1.47   0.49x
    2 layers     0.15    1.18                     0.33   1.36   0.44x
    4 layers     0.20    1.24                     0.55   1.25   0.36x
    6 layers     0.49    1.86                     0.69   1.28   0.47x

c is about L / 8 plus the unembedding over 4,096 tokens and each call's overhead (a draft step that runs one block
still costs 0.22 of a decode step). At no L does any K pay (the best K is 0, autoregressive decoding); the distilled
2 x 192 draft model has alpha 0.69 at c 0.18 on the same CPU (bench/results/pair_cpu_zen4_stage14.json, K 4). The
default exit, a quarter of the layers (main.py --exit_layer), is where a trained exit is meant to sit: cheap enough
(c 0.33 here: the formula at K 4 gives 1.26x at alpha 0.8), where an exit after 6 layers breaks even only near
alpha 0.9.
"""
