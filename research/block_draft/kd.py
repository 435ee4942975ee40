"""Soft labels for the block draft (train.py --kd): learn the target's distributions, not its
sampled tokens.

The training answers are the target's own, half of them sampled (T = 0.8), so a hard label is
often not the token the target would rank first. The features already hold what the target
thought: the output of its LAST layer at position i, through its final norm and head, is its
distribution of token i + 1. So block row j of an anchor a (token a + j) is trained towards the
target's distribution at position a + j - 1 (cross-entropy against it, over the training head),
which is what speculative acceptance rewards: acceptance at T > 0 is sum min(p, q), at T = 0 the
argmax of q equal to p's.

Example: anchor a = 10, block 4: rows 1..3 learn p(. | x_<=10), p(. | x_<=11), p(. | x_<=12), from
the last-layer features at positions 10, 11 and 12 of the sequence.
"""

from __future__ import annotations

import numpy as np

from research.block_draft.train import Anchors


class KdAnchors(Anchors):
    """Anchors whose draws also carry the target's last-layer outputs at positions a .. a + B - 2
    ([n, B - 1, d] float16; rows past the sequence repeat its last position, their labels are -1)."""

    def __init__(self, chunks, block: int, per_seq: int, mask_id: int, seed: int, width: int):
        super().__init__(chunks, block, per_seq, mask_id, seed)
        self.width = width  # the target's hidden size: the last `width` feature columns

    def sequence(self, pick: int | None = None):
        raw, anchors, toks, labels = super().sequence(pick)
        c, s = self.picked
        ch = self.chunks[c]
        lo, hi = int(ch["starts"][s]), int(ch["starts"][s + 1])
        pos = anchors[:, None] + np.arange(self.block - 1)[None, :]
        pos = np.minimum(pos, hi - lo - 1)
        soft = ch["feats"][lo + pos, -self.width :]
        return raw, anchors, toks, labels, soft


def kd_loss_fn(model, seqs, weights, final_norm):
    """Weighted cross-entropy of each block row against the target's distribution over the
    training head (rows with no label skipped); also the draft's logits per sequence."""
    import mlx.core as mx

    from research.block_draft.train import block_forward

    total, norm, all_logits = mx.array(0.0), mx.array(0.0), []
    for raw, anchors, toks, labels, soft in seqs:
        h = block_forward(model, raw, anchors, toks)[:, 1:]
        logits = h @ model.train_head.T
        t_logits = final_norm(soft.astype(mx.float32)) @ model.train_head.T
        p = mx.stop_gradient(mx.softmax(t_logits, axis=-1))
        ce = -(p * (logits - mx.logsumexp(logits, axis=-1, keepdims=True))).sum(-1)
        w = weights[None, :] * (labels >= 0)
        total, norm = total + (ce * w).sum(), norm + w.sum()
        all_logits.append(logits)
    return total / mx.maximum(norm, 1.0), all_logits


def target_agreement(model, seqs, final_norm) -> dict[str, float]:
    """Teacher-forced agreement of each block row's argmax with the TARGET's argmax (over the
    training head): what acceptance at T = 0 counts, free of the sampled answers' noise; tau as
    train.evaluate forms it."""
    import mlx.core as mx

    from research.block_draft.train import agreement, block_forward

    hits, counts = 0, 0
    for seq in seqs:
        raw, anchors, toks, labels, soft = (mx.array(x) for x in seq)
        logits = block_forward(model, raw, anchors, toks)[:, 1:] @ model.train_head.T
        want = mx.argmax(final_norm(soft.astype(mx.float32)) @ model.train_head.T, -1)
        ok = np.array(labels) >= 0
        hits = hits + ((np.array(mx.argmax(logits, -1)) == np.array(want)) & ok).sum(0)
        counts = counts + ok.sum(0)
    acc, tau = agreement(hits, counts)
    return {"tau_target": tau, **{f"top{j + 1}": float(x) for j, x in enumerate(acc)}}
