"""Solutions to notebook 11's exercises on drafters, with the reasoning (classroom/drafter_exercises.py checks them).
A teacher may withhold this folder from a class.

d1. The break-even alpha at K = 1. A loop drafts one token (c) and scores two (v = v(2)); it yields 1 + alpha tokens
    where plain decoding yields one per step, so it pays when 1 + alpha > c + v: alpha* = c + v - 1. With v = 1 the
    bar is alpha > c (notebook 9's exercise 4). A v measured below 1 is noise around one step, not a free
    verification: alpha* comes out below 0 there, which says only that the bar is c + v - 1 at most.

d2. A step's cost from its weights. A step on one token multiplies each weight matrix it reads once. A GPT-2 block
    holds 12 d^2 matrix weights (c_attn 3 d^2, c_proj d^2, c_fc 4 d^2, the MLP's c_proj 4 d^2); the readout through
    the tied unembedding d x n_vocab. The target: n_layer 12 d^2 + d n_vocab. EAGLE's head: fc over [feature;
    embedding] 2 d^2, one block 12 d^2, the readout. An exit after L layers: L 12 d^2 + the readout. Kangaroo: the
    exit plus the adapter's attention, 4 d^2. On the bundled pair (8 x 384, 4,096 tokens): c = 0.231 (EAGLE), 0.325
    (exit after 2), 0.362 (Kangaroo): within a fifth of the c notebook 11's loop paid for EAGLE wherever a loop
    drafts two tokens or more. A loop of one draft carries the loop's own work alone, and the exit's and Kangaroo's
    loops also feed their last draft through the exit's blocks (Kangaroo's order): they pay more than the count.

d3. On a 7B-shaped target (32 layers, d = 4096, 32,000 tokens; Kangaroo's exit after 2 of 32): the target reads
    6.57 G weights a step; EAGLE's head 0.366 G, c = 0.056; the exit 0.534 G, c = 0.081; Kangaroo 0.601 G, c =
    0.091. At alpha 0.8, K 4, v = 1: 3.3616 / (4 x 0.0557 + 1) = 2.75x. One block is a quarter of an 8-layer model and
    a fortieth of a 32-layer one: the same head is cheap only on a large target.

d4. The rerank. Values (sums of log-probabilities down each path): " the" -0.2, " a" -1.9, " an" -2.5, " the first"
    -0.6, " the next" -2.2, " a new" -2.0, " the first line" -0.9, " the first value" -2.7. The five highest:
    " the" (0), " the first" (3), " the first line" (6), " a" (1), " a new" (5). " a new" at depth 2 beats " an" at
    depth 1: the tree keeps the runner-up's branch where it is more likely than a third guess.
d4b. b: a child's value is its parent's plus a log-probability <= 0, so the parent ranks at least as high, and
    ties go to the shallower node: a kept node's ancestors are always kept.

d5. The off-by-one pairing first: every draft step reads a feature beside the wrong token, and the head predicts
    next to nothing (alpha 0.75 -> 0.07 in the committed benchmark). Then the double norm: the feature is normed
    again before the readout at every step, a smaller distortion (a tenth of the tokens per call). The shared Medusa
    block and the stale draft cache cost little: Medusa's heads accept little anyway, and a stale cache holds the
    head's own predicted features only where its drafts were accepted, which are close to the target's there.

d6. a, b, c and d (Li et al. 2025, arXiv 2503.01840). Typical acceptance (e) is Medusa's and is not lossless; EAGLE-3's
    draft model is still one decoder layer (f).
"""

def break_even_alpha(c, v):
    return c + v - 1


def draft_step_weights(drafter, n_layer, n_embd, n_vocab, exit_layer):
    block, readout = 12 * n_embd**2, n_embd * n_vocab
    if drafter == "target":
        return n_layer * block + readout
    if drafter == "eagle":
        return 2 * n_embd**2 + block + readout
    exit_weights = exit_layer * block + readout
    return exit_weights if drafter == "early-exit" else exit_weights + 4 * n_embd**2


def scale_transfer():
    shape = {"n_layer": 32, "n_embd": 4096, "n_vocab": 32000, "exit_layer": 2}
    target = draft_step_weights("target", **shape)
    c = {drafter: draft_step_weights(drafter, **shape) / target for drafter in ("eagle", "early-exit", "kangaroo")}
    tokens = sum(0.8**i for i in range(5))
    return {**c, "eagle_speedup": tokens / (4 * c["eagle"] + 1)}


ANSWERS = {"d1": break_even_alpha, "d2": draft_step_weights, "d3": scale_transfer(), "d4": [0, 3, 6, 1, 5],
           "d4b": "b", "d5": ["feature_off_by_one", "feature_normed_twice", "one_shared_medusa_block",
                              "draft_cache_not_rebuilt"], "d6": {"a", "b", "c", "d"}}
