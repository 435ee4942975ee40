"""Draft trees: several candidate continuations per round, verified in one target forward and
exact at any temperature (docs/drafting.md, Trees).

- shapes: a tree's topology, its mask and positions, fixed and dynamic shapes, the closed form
- tree_acceptance: pure verification of one tree round (greedy path, recursive rejection sampling)
- forward: one forward of a model's llama-style blocks under a tree mask; cache compaction
- draft, dynamic, eagle_tree, block_tree, ngram_branch: tree drafters (token draft, EAGLE-2
  shapes, feature draft, block draft, lookup branch)
- policy: the adaptive choice between chains, trees and plain steps
- loop: the draft-verify loop over trees; build: drafter and policy for a SpecConfig
"""
