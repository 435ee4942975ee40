"""The shipped 4-bit draft as a PyTorch module, for gpu_finetune.py: MLX's affine rounding in
torch (mlx_affine's arithmetic, so training sees exactly what the export writes), the draft whose
every Linear trains through it, and its export in MLX's 4-bit files.

Like the recipes it runs where MLX is not installed, and is imported by its bare name from the
scripts beside it.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx_affine
import numpy as np
import torch
from gpu_common import hf_config

BITS_DEFAULT = 4

GROUP = mlx_affine.GROUP

QUANTIZED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


# ----------------------------------------------------------------------------- MLX 4-bit files


def quantize_groups(w: torch.Tensor, bits: int, group: int = GROUP):
    """mlx_affine.quantize in torch (on the GPU, inside every training step): (q, scales,
    biases), flat by group. tests/research/test_mlx_affine.py compares the two where torch is
    installed."""
    x = w.reshape(-1, group)
    n = float(2**bits - 1)
    wmin = x.min(-1, keepdim=True).values
    wmax = x.max(-1, keepdim=True).values
    mask = wmin.abs() > wmax.abs()
    scales = ((wmax - wmin) / n).clamp(min=1e-7)
    scales = torch.where(mask, scales, -scales)
    edge = torch.where(mask, wmin, wmax)
    q0 = torch.round(edge / scales)
    scales = torch.where(q0 != 0, edge / q0, scales)
    biases = torch.where(q0 == 0, torch.zeros_like(edge), edge)
    q = torch.clamp(torch.round((x - biases) / scales), 0, n)
    return q, scales, biases


def fake_quantize(w: torch.Tensor, bits: int) -> torch.Tensor:
    """w rounded as MLX rounds it at export, with an identity gradient (bits 0: w)."""
    if not bits:
        return w
    q, s, b = quantize_groups(w.detach(), bits)
    return w + ((q * s + b).reshape(w.shape) - w).detach()


def mlx_pack(w: torch.Tensor, bits: int) -> dict[str, np.ndarray]:
    """weight (uint32 words), scales, biases as mx.quantize returns them (float32 scales): the
    rounding the training saw (quantize_groups), packed by mlx_affine."""
    q, s, b = quantize_groups(w.detach().float(), bits)
    rows = w.shape[0]
    return {
        "weight": mlx_affine.pack(q.reshape(rows, -1).cpu().numpy(), bits),
        "scales": s.reshape(rows, -1).cpu().numpy().astype(np.float32),
        "biases": b.reshape(rows, -1).cpu().numpy().astype(np.float32),
    }


class FQLinear(torch.nn.Linear):
    """nn.Linear whose forward sees its weight through the export's rounding."""

    bits = BITS_DEFAULT

    def forward(self, x):
        return torch.nn.functional.linear(x, fake_quantize(self.weight, self.bits), self.bias)


# ----------------------------------------------------------------------------- the draft


class Draft(torch.nn.Module):
    """The shipped draft: its layers (LlamaModel trunk sharing the target's frozen embedding),
    final norm and reduced head, every Linear a FQLinear."""

    def __init__(self, target, hp: dict, draft_dir: Path, bits: int):
        super().__init__()
        from safetensors.numpy import load_file
        from transformers import LlamaModel

        cfg = json.loads((draft_dir / "config.json").read_text())
        self.config = cfg
        flat = load_file(str(draft_dir / "model.safetensors"))
        qbits = int(cfg.get("quantization", {}).get("bits", 0))
        dense: dict[str, np.ndarray] = {}
        for k, v in flat.items():
            if k.endswith((".scales", ".biases")):
                continue
            stem = k[: -len(".weight")] if k.endswith(".weight") else k
            if v.dtype == np.uint32 and f"{stem}.scales" in flat:
                v = mlx_affine.dequantize(v, flat[f"{stem}.scales"], flat[f"{stem}.biases"], qbits)
            dense[k] = v
        self.register_buffer("head_ids", torch.from_numpy(dense.pop("head_ids").astype(np.int64)))
        self.trunk = LlamaModel(hf_config(hp, int(cfg["num_hidden_layers"])))
        sd = {
            k[len("model.") :]: torch.from_numpy(np.ascontiguousarray(v))
            for k, v in dense.items()
            if k.startswith("model.")
        }
        sd["embed_tokens.weight"] = target.model.embed_tokens.weight.detach().cpu()
        missing, unexpected = self.trunk.load_state_dict(sd, strict=False)
        assert not [m for m in missing if "rotary" not in m] and not unexpected, (
            missing,
            unexpected,
        )
        self.trunk.embed_tokens.weight.requires_grad_(False)
        self.head = FQLinear(hp["hidden"], len(self.head_ids), bias=False)
        self.head.weight.data.copy_(torch.from_numpy(dense["lm_head.weight"]))
        for layer in self.trunk.layers:
            for mod in (layer.self_attn, layer.mlp):
                for name in QUANTIZED:
                    if hasattr(mod, name):
                        old = getattr(mod, name)
                        new = FQLinear(old.in_features, old.out_features, bias=old.bias is not None)
                        new.load_state_dict(old.state_dict())
                        setattr(mod, name, new)
        self.set_bits(bits)

    def set_bits(self, bits: int) -> None:
        for m in self.modules():
            if isinstance(m, FQLinear):
                m.bits = bits

    def hidden(self, x):
        return self.trunk(input_ids=x).last_hidden_state

    def export(self, dest: Path, bits: int) -> None:
        """model.safetensors in MLX's names and 4-bit layout, head_ids included."""
        from safetensors.numpy import save_file

        out: dict[str, np.ndarray] = {"head_ids": self.head_ids.cpu().numpy().astype(np.int32)}
        for k, v in self.trunk.state_dict().items():
            if "embed_tokens" in k or "rotary" in k:
                continue
            name = f"model.{k}"
            if k.endswith(".weight") and any(f".{q}." in k for q in QUANTIZED):
                for part, arr in mlx_pack(v, bits).items():
                    out[name[: -len("weight")] + part] = arr
            else:
                out[name] = v.detach().float().cpu().numpy()
        for part, arr in mlx_pack(self.head.weight, bits).items():
            out[f"lm_head.{part}"] = arr
        dest.mkdir(parents=True, exist_ok=True)
        save_file(out, str(dest / "model.safetensors"))
