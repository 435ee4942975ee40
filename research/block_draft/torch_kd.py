"""Soft labels for the GPU twin (gpu_train.py --kd): kd.py's loss and agreement in PyTorch.

Block row j of an anchor a is trained towards the target's distribution of token a + j: the
target's last-layer output at position a + j - 1, through its final norm and the training head
(kd.py says why: half the answers were sampled, and acceptance rewards the target's ranking, not
its samples). The last layer's outputs are already among the features the twin computes, as
the last `width` columns when the draft reads the target's final layer.

Example: anchor a = 10, block 4: rows 1..3 learn the target's distributions at positions 10, 11
and 12 of the sequence (positions past its end repeat its last one; their labels are -1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from research.block_draft import torch_block as tb
from research.block_draft.train import agreement


def soft_rows(raws: list[torch.Tensor], items, block: int, width: int, device) -> torch.Tensor:
    """[b, n, block - 1, width] float32: each anchor's last-layer outputs at positions
    a .. a + block - 2 (kd.KdAnchors' soft rows), for collated `items` whose whole-sequence
    features are `raws`; padding anchors are zero."""
    n = max(len(it[1]) for it in items)
    out = torch.zeros((len(items), n, block - 1, width), device=device)
    for r, it in enumerate(items):
        a = np.asarray(it[1], np.int64)
        pos = np.minimum(a[:, None] + np.arange(block - 1)[None, :], raws[r].shape[0] - 1)
        idx = torch.from_numpy(pos).to(raws[r].device)
        out[r, : len(a)] = raws[r][idx, -width:].to(device).float()
    return out


@dataclass(frozen=True)
class Kd:
    """The target's final norm (weight, epsilon): what turns its last-layer outputs into its
    distribution over the training head."""

    norm: torch.Tensor
    eps: float

    @classmethod
    def of(cls, target: dict, hp: dict, cfg: dict) -> Kd:
        """The rule for a draft (`cfg`) of `target`: its last --layers must be the target's last
        layer, whose outputs the soft labels are made of (else a one-line SystemExit)."""
        if cfg["target_layer_ids"][-1] != hp["layers"] - 1:
            raise SystemExit("--kd needs the target's last layer as the draft's last --layers")
        return cls(target["model.norm.weight"], hp["eps"])

    def target_logits(self, d, soft: torch.Tensor) -> torch.Tensor:
        return tb.rms_norm(soft, self.norm, self.eps) @ d.train_head.T

    def loss(self, d, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """kd_loss_fn: weighted cross-entropy of each block row against the target's
        distribution (rows whose label is -1 skipped); also the draft's logits."""
        logits, labels, soft = d.logits(batch), batch[3], batch[4]
        p = torch.softmax(self.target_logits(d, soft), -1)
        ce = -(p * torch.log_softmax(logits, -1)).sum(-1)
        wt = d.weights * (labels >= 0)
        return (ce * wt).sum() / wt.sum().clamp(min=1.0), logits

    @torch.no_grad()
    def agreement(self, d, batch, logits: torch.Tensor) -> dict[str, float]:
        """kd.target_agreement: each block row's argmax (of the draft's `logits` for `batch`)
        against the target's, over the training head, per block position, and tau from them."""
        labels, soft = batch[3], batch[4]
        want = self.target_logits(d, soft).argmax(-1)
        ok = labels >= 0
        hits = ((logits.argmax(-1) == want) & ok).sum((0, 1)).cpu().numpy()
        acc, tau = agreement(hits, ok.sum((0, 1)).cpu().numpy())
        return {"tau_target": tau, **{f"top{j + 1}": float(x) for j, x in enumerate(acc)}}
