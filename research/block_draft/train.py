"""Stage 2 of the block draft's recipe: train a DFlash-style block draft on stored target features.

Each training example is an anchor position a of a stored sequence (in the answer, never the
prompt): the draft sees the target's layer outputs of the W positions before a (its context), the
block [token a, mask, ..., mask] and learns the tokens a + 1 .. a + B - 1 (cross-entropy, position
j weighted by exp(-(j - 1) / gamma): early positions decide acceptance most). Anchors are drawn at
random per sequence, as in DFlash's training: all anchors of a sequence share one pass of the
context through the fusion layer and each block sees only the context before its anchor.

The draft starts from target layers (--init-layers; target-initialised layers learn far faster
than fresh ones) and scores tokens with the target's own (tied) head, restricted during training to
the --head most frequent answer tokens (labels outside it are skipped); at run time it scores the
whole vocabulary. It resumes from --out/ckpt (weights, optimiser state, step).

    python -m research.block_draft.train --features WORK/features --out WORK/run \
        --minutes 60 --block 8 --init-layers 0,1,28,29
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np


def load_chunks(folder: Path, kind: str) -> list[dict[str, np.ndarray]]:
    chunks = []
    for path in sorted(folder.glob(f"{kind}-*.npz")):
        if ".tmp" in path.name:
            continue
        z = np.load(path)
        chunks.append({k: z[k] for k in ("feats", "tokens", "starts", "prompt_lens")})
    return chunks


class Anchors:
    """Random sequences and, in each, random anchor positions in the answer."""

    def __init__(self, chunks, block: int, per_seq: int, mask_id: int, seed: int):
        self.chunks, self.block, self.per_seq, self.mask_id = chunks, block, per_seq, mask_id
        self.rng = np.random.default_rng(seed)
        self.index = [
            (c, s)
            for c, ch in enumerate(chunks)
            for s in range(len(ch["prompt_lens"]))
            if ch["starts"][s + 1] - ch["starts"][s] - ch["prompt_lens"][s] >= 2
        ]

    def sequence(self, pick: int | None = None):
        """One sequence's arrays: raw features [S, F] float32, anchors [n] int32, block tokens
        [n, B] int32 ([token a, mask, ...]), labels [n, B - 1] int32 (-1: past the end)."""
        B = self.block
        c, s = self.index[self.rng.integers(len(self.index)) if pick is None else pick]
        self.picked = (c, s)  # the (chunk, sequence) of this draw, for subclasses (kd.py)
        ch = self.chunks[c]
        lo, hi = int(ch["starts"][s]), int(ch["starts"][s + 1])
        plen, seq = int(ch["prompt_lens"][s]), ch["tokens"][lo:hi]
        choices = np.arange(max(plen - 1, 1), hi - lo - 1)
        n = min(self.per_seq, len(choices))
        anchors = np.sort(self.rng.choice(choices, size=n, replace=False)).astype(np.int32)
        toks = np.full((n, B), self.mask_id, np.int32)
        labels = np.full((n, B - 1), -1, np.int32)
        for r, a in enumerate(anchors):
            toks[r, 0] = seq[a]
            lab = seq[a + 1 : a + B]
            labels[r, : len(lab)] = lab
        raw = ch["feats"][lo : lo + int(anchors.max())].astype(np.float32)
        return raw, anchors, toks, labels


def head_ids(chunks, size: int, vocab: int) -> np.ndarray:
    """The `size` most frequent answer tokens (sorted ids < vocab)."""
    counts = np.zeros(vocab, np.int64)
    for ch in chunks:
        for s in range(len(ch["prompt_lens"])):
            lo, hi = int(ch["starts"][s]), int(ch["starts"][s + 1])
            np.add.at(counts, ch["tokens"][lo + int(ch["prompt_lens"][s]) : hi], 1)
    return np.sort(np.argsort(-counts)[:size]).astype(np.int32)


def init_from_target(model, target, layers: list[int]) -> None:
    """Copy target layers' weights into the draft's layers (same names as llama blocks)."""
    from mlx.utils import tree_flatten

    tl = target.model.layers
    for j, i in enumerate(layers):
        model.layers[j].update(tl[i].parameters())
    d = model.args.hidden_size
    n = len(model.args.target_layer_ids)
    import mlx.core as mx

    w = mx.random.normal((d, n * d)) * 1e-3
    eye = mx.eye(d)
    w = mx.concatenate([w[:, : (n - 1) * d], eye], axis=1)  # start from the last layer's output
    model.fc.weight = w
    assert all(v.dtype == mx.float32 for _, v in tree_flatten(model.parameters()))


def build(args_ns, target, head: np.ndarray):
    import mlx.core as mx

    from edgespec.architectures.block_model import BlockArgs, BlockModel

    t = target.args
    feats_meta = json.loads((Path(args_ns.features) / "meta.json").read_text())
    cfg = {
        "hidden_size": t.hidden_size,
        "num_hidden_layers": len(args_ns.init_layers),
        "num_attention_heads": t.num_attention_heads,
        "num_key_value_heads": t.num_key_value_heads,
        "head_dim": t.hidden_size // t.num_attention_heads,
        "intermediate_size": t.intermediate_size,
        "vocab_size": t.vocab_size,
        "rms_norm_eps": t.rms_norm_eps,
        "rope_theta": t.rope_theta,
        "max_position_embeddings": t.max_position_embeddings,
        "block_size": args_ns.block,
        "target_layer_ids": feats_meta["layers"],
        "mask_token_id": args_ns.mask_id,
        "qk_norm": False,
        "num_target_layers": len(target.model.layers),
        "input_context": bool(getattr(args_ns, "input_context", False)),
    }
    model = BlockModel(BlockArgs.from_config(cfg))
    model.attach(target)
    init_from_target(model, target, args_ns.init_layers)
    object.__setattr__(model, "train_head", target.model.embed_tokens.weight[mx.array(head)])
    return model, cfg


def block_forward(model, raw, anchors, toks):
    """The draft's normed hidden states [n, B, d] for n blocks of one sequence, each anchored at
    its own position a (its block at positions a .. a + B - 1) and seeing the context positions
    before a: the same arithmetic as BlockModel.__call__ with a context of a positions, for n
    anchors at once (the context's keys and values computed once)."""
    import mlx.core as mx

    n, B = toks.shape
    S = raw.shape[0]
    ctx = model.context(raw[None])
    h = model.embedding(toks)
    if "ctx_in" in model:  # --input-context: each row also reads the context before its anchor
        h = h + model.ctx_in(ctx[0, anchors - 1])[:, None]
    seen = mx.arange(S)[None, :] < anchors[:, None]  # [n, S]
    mask = mx.concatenate(
        [mx.broadcast_to(seen[:, None, None, :], (n, 1, B, S)), mx.ones((n, 1, B, B), mx.bool_)],
        axis=-1,
    )
    for layer in model.layers:
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        q = attn.rope(attn._heads(attn.q_proj(x), attn.n_heads, "q_norm"), offset=anchors)
        k = attn.rope(attn._heads(attn.k_proj(x), attn.n_kv, "k_norm"), offset=anchors)
        v = attn._heads(attn.v_proj(x), attn.n_kv, None)
        ck = attn.rope(attn._heads(attn.k_proj(ctx), attn.n_kv, "k_norm"), offset=0)
        cv = attn._heads(attn.v_proj(ctx), attn.n_kv, None)
        keys = mx.concatenate([mx.broadcast_to(ck, (n, *ck.shape[1:])), k], axis=2)
        values = mx.concatenate([mx.broadcast_to(cv, (n, *cv.shape[1:])), v], axis=2)
        out = mx.fast.scaled_dot_product_attention(q, keys, values, scale=attn.scale, mask=mask)
        h = h + attn.o_proj(out.transpose(0, 2, 1, 3).reshape(n, B, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return model.norm(h)


def loss_fn(model, seqs, weights):
    """Weighted cross-entropy of the block positions over the training head, summed over the
    sequences' anchors; also the logits [per sequence] for evaluation."""
    import mlx.core as mx
    import mlx.nn as nn

    total, norm, all_logits = mx.array(0.0), mx.array(0.0), []
    for raw, anchors, toks, labels in seqs:
        h = block_forward(model, raw, anchors, toks)[:, 1:]
        logits = h @ model.train_head.T
        keep = labels >= 0
        ce = nn.losses.cross_entropy(logits, mx.maximum(labels, 0), reduction="none")
        w = weights[None, :] * keep
        total, norm = total + (ce * w).sum(), norm + w.sum()
        all_logits.append(logits)
    return total / mx.maximum(norm, 1.0), all_logits


def as_mx(seq):
    import mlx.core as mx

    return tuple(mx.array(x) for x in seq)


def to_head(labels: np.ndarray, head: np.ndarray) -> np.ndarray:
    """Token ids -> column of the training head (-1: not in it, or no label)."""
    col = np.full(int(head.max()) + 2, -1, np.int64)
    col[head] = np.arange(len(head))
    return np.where(labels >= 0, col[np.clip(labels, 0, len(col) - 1)], -1).astype(np.int32)


def evaluate(model, seqs, weights) -> dict[str, float]:
    """Teacher-forced agreement per block position (argmax == label, labels in the head), and
    tau = 1 + sum over k of the product of the first k agreements."""
    import mlx.core as mx

    hits, counts = 0, 0
    for seq in seqs:
        _, logits = loss_fn(model, [as_mx(seq)], weights)
        pred = np.array(mx.argmax(logits[0], -1))
        labels = seq[3]
        ok = labels >= 0
        hits = hits + ((pred == labels) & ok).sum(0)
        counts = counts + ok.sum(0)
    acc, tau = agreement(hits, counts)
    return {"tau_independent": tau, **{f"acc{j + 1}": float(a) for j, a in enumerate(acc)}}


def agreement(hits: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, float]:
    """Agreement per block position (hits / counts) and tau = 1 + the sum over k of the product
    of the first k agreements. E.g. hits [8, 4], counts [10, 8] -> [0.8, 0.5], 1 + 0.8 + 0.4."""
    acc = hits / np.maximum(counts, 1)
    return acc, 1 + sum(float(np.prod(acc[: k + 1])) for k in range(len(acc)))


def main(argv: list[str] | None = None) -> int:
    from edgespec.blas import reexec_with_blas

    argv = sys.argv[1:] if argv is None else argv
    reexec_with_blas(argv, module="research.block_draft.train")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--features", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--per-seq", type=int, default=48, help="anchors per sequence")
    ap.add_argument("--init-layers", default="0,1,28,29")
    ap.add_argument("--mask-id", type=int, default=16, help="a token id never in answers")
    ap.add_argument("--head", type=int, default=8192)
    ap.add_argument("--seqs", type=int, default=2, help="sequences per step")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--gamma", type=float, default=4.0)
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--total-steps", type=int, default=6000, help="the cosine schedule's length")
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--reload-every", type=int, default=400, help="pick up new feature chunks")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kd", action="store_true", help="soft labels from the target (kd.py)")
    ap.add_argument("--input-context", action="store_true", help="BlockArgs.input_context")
    ap.add_argument("--init-from", help="start from this checkpoint's weights (new ones zero)")
    a = ap.parse_args(argv)
    a.init_layers = [int(x) for x in a.init_layers.split(",")]

    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx.utils import tree_flatten, tree_unflatten

    from edgespec.loading.load import load_model
    from research.block_draft.kd import KdAnchors, kd_loss_fn, target_agreement

    out = Path(a.out)
    (out / "ckpt").mkdir(parents=True, exist_ok=True)
    target = load_model(a.target).model
    target.freeze()
    feats = Path(a.features)
    held = load_chunks(feats, "held")
    train = load_chunks(feats, "train")
    head_path = out / "head_ids.npy"
    if not head_path.exists():
        np.save(head_path, head_ids(train, a.head, target.args.vocab_size))
    head = np.load(head_path)
    model, cfg = build(a, target, head)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    opt = optim.AdamW(learning_rate=a.lr, weight_decay=0.0)
    step = 0
    state_file = out / "ckpt" / "state.json"
    if state_file.exists():
        step = json.loads(state_file.read_text())["step"]
        model.load_weights(str(out / "ckpt" / "model.safetensors"))
        opt_state = mx.load(str(out / "ckpt" / "opt.safetensors"))
        opt.state = tree_unflatten(list(opt_state.items()))
        print(f"resumed at step {step}", flush=True)
    if a.init_from and not state_file.exists():
        if "ctx_in" in model:
            model.ctx_in.weight = mx.zeros_like(model.ctx_in.weight)
        model.load_weights(a.init_from, strict=False)
        print(f"started from {a.init_from}", flush=True)
    weights = mx.array([math.exp(-j / a.gamma) for j in range(a.block - 1)])

    def draw(src: Anchors, pick: int | None = None):
        raw, anchors, toks, labels, *soft = src.sequence(pick)
        return (raw, anchors, toks, to_head(labels, head), *soft)

    def anchors_of(chunks, seed: int) -> Anchors:
        if not a.kd:
            return Anchors(chunks, a.block, a.per_seq, a.mask_id, seed)
        return KdAnchors(chunks, a.block, a.per_seq, a.mask_id, seed, target.args.hidden_size)

    held_src = Anchors(held, a.block, a.per_seq, a.mask_id, 1234)
    eval_seqs = [draw(held_src, i) for i in range(min(24, len(held_src.index)))]
    kd_seqs = []  # with --kd, the same held-out draws with the target's features (its argmax)
    if a.kd:
        kd_src = KdAnchors(held, a.block, a.per_seq, a.mask_id, 1234, target.args.hidden_size)
        kd_seqs = [draw(kd_src, i) for i in range(min(24, len(kd_src.index)))]
    data = anchors_of(train, a.seed + step)
    if a.kd:
        norm = target.model.norm
        grad = nn.value_and_grad(model, lambda m, seqs: kd_loss_fn(m, seqs, weights, norm)[0])
    else:
        grad = nn.value_and_grad(model, lambda m, seqs: loss_fn(m, seqs, weights)[0])

    def lr_at(s: int) -> float:
        warm = min(1.0, (s + 1) / 100)
        return a.lr * warm * 0.5 * (1 + math.cos(math.pi * min(s, a.total_steps) / a.total_steps))

    curve = out / "curve.csv"
    if not curve.exists():
        curve.write_text(
            "step,seconds,tokens_seen,loss,"
            + ",".join(["tau_independent"] + [f"acc{j + 1}" for j in range(a.block - 1)])
            + "\n"
        )
    t_end = time.time() + a.minutes * 60
    t0, losses = time.time(), []
    while time.time() < t_end:
        if step % a.reload_every == 0 and step:
            train = load_chunks(feats, "train")
            data = anchors_of(train, a.seed + step)
        seqs = [as_mx(draw(data)) for _ in range(a.seqs)]
        opt.learning_rate = lr_at(step)
        loss, g = grad(model, seqs)
        opt.update(model, g)
        mx.eval(model.parameters(), opt.state, loss)
        losses.append(float(loss))
        step += 1
        if step % a.eval_every == 0 or time.time() >= t_end:
            ev = evaluate(model, eval_seqs, weights)
            seen = step * a.seqs * a.per_seq * (a.block - 1)
            row = [step, round(time.time() - t0, 1), seen, round(float(np.mean(losses)), 4)]
            row += [round(ev["tau_independent"], 4)]
            row += [round(ev[f"acc{j + 1}"], 4) for j in range(a.block - 1)]
            with curve.open("a") as f:
                f.write(",".join(str(x) for x in row) + "\n")
            print(f"step {step} loss {np.mean(losses):.3f} {ev} ({len(train)} chunks)", flush=True)
            if kd_seqs:
                agree = target_agreement(model, kd_seqs, target.model.norm)
                print(f"step {step} vs target: {agree}", flush=True)
            losses = []
            mx.save_safetensors(
                str(out / "ckpt" / "model.safetensors"), dict(tree_flatten(model.parameters()))
            )
            mx.save_safetensors(
                str(out / "ckpt" / "opt.safetensors"), dict(tree_flatten(opt.state))
            )
            state_file.write_text(json.dumps({"step": step}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
