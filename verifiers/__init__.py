"""Verifiers beyond Algorithm 2, each read beside its paper as sampling.py is read beside Chen et al. 2023.

The draft-then-verify loop stays; the rule that decides which drafted tokens the target keeps changes:

- block.py: block verification (Sun et al., "Block Verification Accelerates Speculative Decoding", 2024),
  which judges the K drafts as one block and keeps the longest prefix that passes;
- multi_draft.py: several drafts by recursive rejection sampling (SpecInfer, Miao et al. 2023; Recursive
  Speculative Decoding, Jeon et al. 2024), candidates tried in turn against a residual that shrinks;
- tree.py: the same rule over a token tree that the target scores in one call (SpecInfer; Medusa and EAGLE's
  tree attention), with top-k one-hot children and prompt lookup with several matches as trees.

Each decoder has sampling.speculative_sampling's contract (both model contracts, the same stats; n_drafts and
the other settings by keyword), runs loop.py's draft-then-verify loop with its own rule, and reuses sampling.py's
primitives (accepts, sample, max_fn, next_token_probs, draw_drafts). multi_draft_speculative_sampling is tree.py's
decoder with sampled drafts. classroom/exact_law.py proves each exact on small tables; classroom/lossless.py checks
each by sampling.
"""

from verifiers.block import block_speculative_sampling  # noqa: F401 (re-exported: from verifiers import ...)
from verifiers.multi_draft import multi_draft_speculative_sampling  # noqa: F401
from verifiers.tree import tree_speculative_sampling  # noqa: F401
