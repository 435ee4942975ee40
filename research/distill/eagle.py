"""Training a feature draft (edgespec.architectures.eagle) from the target's own answers.

Data: the distill data shards (prompt + target answer token ids). The target runs once over each
sequence (teacher-forced) to record its top hidden states f_i; they are cached on disk as fp16
chunks (`features-NNNNN.npz`) so the slow part resumes. Training then never runs the target again:
the target's distribution at position i + 1 is softmax(f_{i+1} @ head^T), recomputed from the cache.

Loss per position i (completion tokens only), with g = the draft's guess of f_{i+1}:
    soft cross-entropy between softmax(g @ head^T) and softmax(f_{i+1} @ head^T) over the head ids
    + reg_weight * smooth-L1(g, f_{i+1})   (EAGLE's feature regression: keeps later guesses usable)
Agreement = argmax over the head of the draft == argmax over the head of the target, i.e. the
acceptance of the first drafted token at temperature 0 (for tokens inside the head).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from edgespec.architectures.eagle import MODEL_TYPE, EagleModel, build
from edgespec.distill.shards import Sequence, atomic_write_npz
from edgespec.files import atomic_write_bytes, sha256_file
from edgespec.taps import TOP, target_features


@dataclass(frozen=True)
class Item:
    """One sequence with its target features: ids [L], feats [L, d] fp16, prompt_len."""

    ids: np.ndarray
    feats: np.ndarray
    prompt_len: int


def target_head_logits(model: Any, features: mx.array) -> mx.array:
    """The target's own logits over a feature draft's head ids from its features (training,
    evaluation): features [.., d] -> [.., H]."""
    return features @ model.head_weight.T


def feature_chunks(folder: Path) -> list[Path]:
    return sorted(folder.glob("features-*.npz"))


def load_items(folder: Path) -> list[Item]:
    items = []
    for path in feature_chunks(folder):
        with np.load(path) as z:
            for b in range(int(z["count"])):
                items.append(Item(z[f"ids{b}"], z[f"f{b}"], int(z[f"p{b}"])))
    return items


def extract_features(
    target: nn.Module,
    seqs: list[Sequence],
    folder: Path,
    max_tokens: int,
    batch: int = 16,
    log: Callable[[str], None] = print,
    layers: tuple[int, ...] = (TOP,),
) -> int:
    """Run the target over `seqs` (in order, skipping those already cached) until `max_tokens`
    tokens have features (of target `layers`, concatenated: taps.target_features); one chunk
    file per batch. Returns the number of tokens cached."""

    folder.mkdir(parents=True, exist_ok=True)
    done = {int(p.stem.split("-")[1]) for p in feature_chunks(folder)}
    have = sum(int(np.load(p)["tokens"]) for p in feature_chunks(folder))
    t0, fresh = time.perf_counter(), 0
    for index, start in enumerate(range(0, len(seqs), batch)):
        if have >= max_tokens:
            break
        if index in done:
            continue
        part = seqs[start : start + batch]
        feats = []
        for s in part:  # one sequence at a time: no padding to compute
            f, _ = target_features(target, mx.array(s.ids, dtype=mx.int32), None, layers)
            feats.append(f.astype(mx.float16))
        mx.eval(feats)
        out: dict[str, np.ndarray] = {"count": np.array(len(part))}
        n = sum(len(s.ids) for s in part)
        out["tokens"] = np.array(n)
        for b, s in enumerate(part):
            out[f"ids{b}"] = np.asarray(s.ids, np.int32)
            out[f"f{b}"] = np.array(feats[b])
            out[f"p{b}"] = np.array(s.prompt_len)
        atomic_write_npz(folder / f"features-{index:05d}.npz", out)
        have += n
        fresh += n
        log(f"features: {have} tokens ({fresh / (time.perf_counter() - t0):.0f} tokens/s)")
    return have


def _num(x: mx.array) -> float:
    return float(x.item())  # type: ignore[arg-type]


def _flat(tree: Any) -> list[tuple[str, mx.array]]:
    return cast(list[tuple[str, mx.array]], tree_flatten(tree))


def make_batch(items: list[Item]) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """(features f_i [B, L, d], tokens i + 1 [B, L], targets f_{i+1} [B, L, d], mask [B, L]).
    The mask keeps positions whose next-next token is a completion token."""
    width = max(len(it.ids) for it in items) - 1
    d = items[0].feats.shape[1]
    f = np.zeros((len(items), width, d), np.float32)
    ft = np.zeros_like(f)
    t = np.zeros((len(items), width), np.int32)
    m = np.zeros((len(items), width), np.float32)
    for b, it in enumerate(items):
        n = len(it.ids) - 1
        f[b, :n], ft[b, :n], t[b, :n] = it.feats[:-1], it.feats[1:], it.ids[1:]
        m[b, max(it.prompt_len - 2, 0) : n - 1] = 1.0  # f_{i+1} decides token i + 2
    return mx.array(f), mx.array(t), mx.array(ft), mx.array(m)


def top_block(model: EagleModel, raw: mx.array) -> mx.array:
    """The top hidden state's block of the target's concatenated features [..., k * d] (float32)."""
    if len(model.feature_layers) == 1:
        return raw
    d = model.args.hidden_size
    j = model.feature_layers.index(TOP)
    return raw[..., j * d : (j + 1) * d].astype(mx.float32)


def loss_fn(
    model: EagleModel, f: mx.array, t: mx.array, ft: mx.array, m: mx.array, reg_weight: float
) -> tuple[mx.array, mx.array]:
    guess = model(model.fuse(f), t)
    ft = top_block(model, ft)
    z_draft = model.head_logits(guess)
    z_target = target_head_logits(model, ft)
    p = mx.softmax(z_target, axis=-1)
    ce = -(p * nn.log_softmax(z_draft, axis=-1)).sum(-1)
    reg = nn.losses.smooth_l1_loss(guess, ft, reduction="none").mean(-1)
    hit = (mx.argmax(z_draft, -1) == mx.argmax(z_target, -1)).astype(mx.float32)
    den = mx.maximum(m.sum(), 1.0)
    return ((ce + reg_weight * reg) * m).sum() / den, (hit * m).sum() / den


def agreement(model: EagleModel, items: list[Item], batch: int = 8) -> float:
    hits = total = 0.0
    for i in range(0, len(items), batch):
        f, t, ft, m = make_batch(items[i : i + batch])
        _, acc = loss_fn(model, f, t, ft, m, 0.0)
        n = _num(m.sum())
        hits, total = hits + _num(acc) * n, total + n
    return hits / max(total, 1.0)


def new_eagle(target: nn.Module, target_config: dict, head_ids: np.ndarray, init_layer: int):
    """A one-layer feature draft: the layer copied from target layer `init_layer`, its norm from
    the target's final norm, fc = [I, I] (feature plus token embedding), attached to `target`."""
    config = eagle_config(target_config, 1, len(head_ids))
    model = build(config)
    model.layers[0].update(target.model.layers[init_layer].parameters())
    model.norm.update(target.model.norm.parameters())
    d = config["hidden_size"]
    model.fc.weight = mx.concatenate([mx.eye(d), mx.eye(d)], axis=1)
    model.fc.bias = mx.zeros((d,))
    model.head_ids = mx.array(np.asarray(head_ids, np.int32))
    model.attach(target)
    mx.eval(model.parameters())
    return model, config


def from_token_draft(target: nn.Module, target_config: dict, draft: nn.Module):
    """A feature draft that starts as exactly `draft` (an EdgeSpec token draft: layers, final norm,
    reduced head): fc = [0, I] passes the token embedding through and ignores the feature until
    training teaches it to use it. Position i of the feature draft reads token i + 1, so it makes
    the token draft's prediction of token i + 2 (the feature draft's target)."""
    config = eagle_config(
        target_config, len(draft.layers), int(draft.head_ids.shape[0]), True, chain="zero"
    )
    model = build(config)
    for mine, theirs in zip(model.layers, draft.layers, strict=True):
        mine.update(theirs.parameters())
    model.norm.update(draft.model.norm.parameters())
    model.lm_head.update(draft.lm_head.parameters())
    d = config["hidden_size"]
    model.fc.weight = mx.concatenate([mx.zeros((d, d)), mx.eye(d)], axis=1)
    model.fc.bias = mx.zeros((d,))
    model.head_ids = draft.head_ids
    model.attach(target)
    mx.eval(model.parameters())
    return model, config


def match_feature_scale(model: EagleModel, config: dict, items: list[Item]) -> float:
    """Set feature_scale so that scaled features have the RMS of the token embeddings they are
    mixed with (the target's features are ~17x larger for SmolLM2); stored in the config."""
    f = np.concatenate([it.feats[:64].astype(np.float32) for it in items[:64]])
    ids = mx.array(np.concatenate([it.ids[:64] for it in items[:64]]))
    e = np.array(model.embedding(ids), dtype=np.float32)
    scale = float(np.sqrt((e**2).mean() / (f**2).mean()))
    model.feature_scale = config["feature_scale"] = scale
    return scale


def export_grown(model: EagleModel, config: dict, out: Path, base: Path) -> Path:
    """Write a feature draft grown from the token draft in folder `base` (trained with only_fc):
    only the feature mixer (fp16, ~1.3 MB for SmolLM2) plus a pointer to `base` and the sha256 of
    its weights; the loader reads everything else from `base`."""
    out.mkdir(parents=True, exist_ok=True)
    base_config = json.loads((base / "config.json").read_text())
    config = dict(config)
    config["eagle_base"] = {
        "path": os.path.relpath(base.resolve(), out.resolve()),
        "sha256": sha256_file(base / "model.safetensors"),
    }
    if base_config.get("quantization"):
        config["quantization"] = base_config["quantization"]
    model.fc.weight = model.fc.weight.astype(mx.float16)
    model.fc.bias = model.fc.bias.astype(mx.float16)
    save_eagle(model, config, out)
    return out


def load_trained(model: EagleModel, out: Path) -> dict[str, mx.array]:
    """Load the weights of train_eagle's checkpoint in `out` into `model`; returns the whole
    checkpoint (weights "m.*" and optimizer state "o.*")."""
    flat = cast(dict[str, mx.array], mx.load(str(out / "train.safetensors")))
    model.load_weights([(k[2:], v) for k, v in flat.items() if k.startswith("m.")])
    return flat


LossFn = Callable[..., tuple[mx.array, mx.array]]


@dataclass(frozen=True)
class EagleTrainConfig:
    steps: int = 2000
    batch: int = 8
    lr: float = 5e-4
    warmup: int = 50
    reg_weight: float = 1.0
    eval_every: int = 250
    seed: int = 0
    only_fc: bool = False  # train the feature mixer only (a draft grown from a token draft)


def train_eagle(
    model: EagleModel,
    train: list[Item],
    held: list[Item],
    cfg: EagleTrainConfig,
    out: Path,
    log: Callable[[str], None] = print,
    until: int | None = None,
    loss_of: LossFn | None = None,
) -> list[dict[str, float]]:
    """AdamW (bias-corrected, betas 0.9/0.95), warm-up then cosine decay; length-bucketed batches.
    Checkpoints (weights + optimizer + step + curve) to `out/train` at every evaluation and
    resumes from there. `until`: stop at that step (a multiple of eval_every, so it checkpoints)
    with the schedule still that of cfg.steps, so a long run can be cut into calls that each see
    the data cached so far. `loss_of`: (model, f, t, ft, m) -> (loss, agreement) in place of
    loss_fn (e.g. distill.eagle3's training-time test). Returns the curve [{step, seen, loss,
    agreement}]."""
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / "train.safetensors"
    state_path = out / "train.json"
    schedule = optim.join_schedules(
        [optim.linear_schedule(0.0, cfg.lr, cfg.warmup), optim.cosine_decay(cfg.lr, cfg.steps)],
        [cfg.warmup],
    )
    opt = optim.AdamW(schedule, betas=[0.9, 0.95], weight_decay=0.0, bias_correction=True)
    step, seen, curve = 0, 0, []
    if ckpt.is_file() and state_path.is_file():
        flat = load_trained(model, out)
        opt.init(model.trainable_parameters())
        opt.state = tree_unflatten([(k[2:], v) for k, v in flat.items() if k.startswith("o.")])
        meta = json.loads(state_path.read_text())
        step, seen, curve = meta["step"], meta["seen"], meta["curve"]
        log(f"resumed at step {step}")
    model.unfreeze()
    keep_token_path = None
    if cfg.only_fc:  # grown from a token draft: train how the feature enters, nothing else
        model.freeze()
        model.fc.unfreeze()
        d = model.args.hidden_size
        keep_token_path = mx.concatenate([mx.ones((d, d)), mx.zeros((d, d))], axis=1)
    model.freeze(recurse=False, keys=["head_ids"])

    def objective(mdl: EagleModel, *b: mx.array) -> tuple[mx.array, mx.array]:
        if loss_of is not None:
            return loss_of(mdl, *b)
        return loss_fn(mdl, b[0], b[1], b[2], b[3], cfg.reg_weight)

    grad_fn = nn.value_and_grad(model, objective)
    rng = np.random.default_rng(cfg.seed + step)
    lengths = np.array([len(it.ids) for it in train])
    by_length = np.argsort(lengths)
    t0, loss = time.perf_counter(), float("nan")
    while step < (cfg.steps if until is None else min(cfg.steps, until)):
        j = int(rng.integers(len(train)))  # a random neighbourhood of similar lengths
        pos = int(np.searchsorted(lengths[by_length], lengths[j]))
        lo = max(0, min(pos - 32, len(train) - 64))
        pick = rng.choice(by_length[lo : lo + 64], min(cfg.batch, len(train)), replace=False)
        f, t, ft, m = make_batch([train[i] for i in pick])
        (lv, _), grads = grad_fn(model, f, t, ft, m)
        if keep_token_path is not None:  # the embedding's identity path stays exactly as it was
            grads["fc"]["weight"] = grads["fc"]["weight"] * keep_token_path
        opt.update(model, grads)
        mx.eval(model.parameters(), opt.state, lv)
        step, seen, loss = step + 1, seen + int(_num(m.sum())), _num(lv)
        if step % cfg.eval_every == 0 or step == cfg.steps:
            a = agreement(model, held)
            curve.append({"step": step, "seen": seen, "loss": round(loss, 4), "agreement": a})
            rate = seen / (time.perf_counter() - t0)
            log(f"step {step}: loss {loss:.3f}, held-out agreement {a:.3f} ({rate:.0f} tok/s)")
            flat = {f"m.{k}": v for k, v in _flat(model.parameters())}
            flat |= {f"o.{k}": v for k, v in _flat(opt.state)}
            mx.save_safetensors(str(ckpt), flat)
            meta = {"step": step, "seen": seen, "curve": curve}
            atomic_write_bytes(state_path, json.dumps(meta).encode())
    return curve


def save_eagle(model: EagleModel, config: dict[str, Any], path: str | Path) -> None:
    """Write config.json + model.safetensors (config must carry `quantization` if quantized)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(model.parameters()))
    if config.get("eagle_base"):  # only what the base draft does not hold
        weights = {k: v for k, v in weights.items() if k.startswith("fc.")}
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def eagle_config(
    target_config: dict[str, Any],
    n_layers: int,
    head_size: int,
    own_head: bool = False,
    chain: str = "guess",
) -> dict[str, Any]:
    """A feature draft's config.json for a llama target's config."""
    keep = (
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "rms_norm_eps",
        "vocab_size",
        "rope_theta",
        "rope_scaling",
        "max_position_embeddings",
        "head_dim",
        "attention_bias",
        "mlp_bias",
        "tie_word_embeddings",
        "rope_traditional",
    )
    cfg = {k: target_config[k] for k in keep if k in target_config}
    cfg.update(model_type=MODEL_TYPE, eagle_layers=n_layers, head_size=head_size)
    cfg["eagle_head"] = "own" if own_head else "target"
    cfg["eagle_chain"] = chain
    cfg["num_hidden_layers"] = n_layers
    return cfg
