"""A block draft's reduced head (edgespec/architectures/block_model.py, `head_size`): the target
head's rows of the tokens the draft was trained on, scored alone. Scoring 8,192 of SmolLM2's 49,152
tokens reads a sixth of the head's weights, which on a CPU cost about as much as a whole target step
for a block of drafted positions. Every other token gets -inf, so its draft probability is 0:
it is never proposed, and the ratio test stays exact (the residual covers it).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from edgespec.architectures.token_draft import onto_vocab


class ReducedHead:
    """A head over `ids` alone: logits [..., vocab], -inf off `ids` (rows: their head rows)."""

    def __init__(self, rows: mx.array, ids: mx.array, vocab: int):
        self.rows, self.ids, self.vocab = rows, ids, vocab

    def __call__(self, hidden: mx.array) -> mx.array:
        return onto_vocab(hidden @ self.rows.T.astype(hidden.dtype), self.ids, self.vocab)


def head_rows(head: nn.Module, ids: mx.array) -> mx.array:
    """Rows `ids` of an output head, dense (a quantized one's rows dequantized)."""
    if isinstance(head, nn.QuantizedLinear):
        biases = head["biases"][ids] if "biases" in head else None
        return mx.dequantize(head.weight[ids], head.scales[ids], biases, head.group_size, head.bits)
    return head.weight[ids]
