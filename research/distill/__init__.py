"""Corpus builders and training variants behind EdgeSpec's own drafts (not part of `edgespec distill`).

debian, passages, phrasings, requests, pool, sources, realdata: the real-text prompt pool and its
answers; finetune, qat: round 2's fine-tuning through 4-bit rounding; eagle, eagle3: feature
drafts (EAGLE- and EAGLE-3-style) trained from cached target hidden states.
"""
