"""Train an EAGLE-3-style feature draft (research.distill.eagle3) for the embedded target on this
machine: features fused from a low, a middle and the top target layer, trained on its own
predictions for several steps ("training-time test"), warm-started from the first feature draft
(smollm2-135m-eagle, beside this recipe: its layer, norm and feature scale; the fusion starts as
the identity on the top block, so training starts from the old draft's quality).

Data: the token draft's data (models/smollm2-135m-draft/data, the target's answers to EdgeSpec's
generated instructions) plus real-text prompts answered by the target (--real: the full
shards of `research.recipes.real_data generate`); both split into train / held-out by edgespec.distill.train.split_data.
No benchmark prompt is ever read.

Phases, each resumable (run it again to continue):
1. features: the target runs over the held-out answers (first --held) and then over --tokens
   tokens of training answers (the two sources shuffled together, seeded); the hidden states of
   --layers are cached as fp16 chunks in WORK/held and WORK/features;
2. train: the training-time-test loss over --ttt steps, checkpointed every --eval-every steps;
3. export: --bits (default 8) weights and curve.csv to --out.

Run with an optimised BLAS preloaded on Linux (see docs/cpu-backend.md) and one thread per process.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

MODELS = Path(__file__).resolve().parents[2] / "models"  # the repository's models/
TOKEN_DRAFT = MODELS / "smollm2-135m-draft"
OLD_EAGLE = Path(__file__).resolve().parent / "smollm2-135m-eagle"  # beside this recipe
PHASES = ("features", "train", "export", "mtbench", "loop")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--phase", choices=PHASES, required=True)
    ap.add_argument("--out", type=Path, help="export the draft here (phase export)")
    ap.add_argument("--real", type=Path, help="a second data folder (real-text prompts)")
    ap.add_argument("--layers", default="2,15,-1", help="target layers read (-1: the top)")
    ap.add_argument("--tokens", type=int, default=400_000, help="tokens of features to cache")
    ap.add_argument("--held", type=int, default=48, help="held-out answers cached")
    ap.add_argument("--ttt", type=int, default=3, help="training-time-test steps")
    ap.add_argument("--decay", type=float, default=0.8, help="weight of step j: decay ** j")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--until", type=int, help="stop at this step (the schedule stays --steps')")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--context", type=int, default=128, help="prompt tokens kept in training")
    ap.add_argument("--bits", type=int, default=8, choices=(4, 6, 8))
    ap.add_argument("--prompts", help="mt_bench_question.jsonl (phase mtbench; read, never kept)")
    ap.add_argument("--drafts", nargs="*", type=Path, default=[], help="feature drafts (mtbench)")
    ap.add_argument("--pairs", default="smollm2-135m,smollm2-135m-eagle,smollm2-135m-eagle3")
    ap.add_argument("--per-category", type=int, default=2, help="MT-bench prompts (phase loop)")
    ap.add_argument("-k", default="1,2", help="K list (phase loop)")
    ap.add_argument("--limit", type=int, help="at most this many prompts (phase loop)")
    ap.add_argument("--shard", default="shard-00011.npz", help="token-draft data shard")
    return ap.parse_args(argv)


def layers_of(a: argparse.Namespace) -> tuple[int, ...]:
    return tuple(int(x) for x in a.layers.split(","))


def sequences(a: argparse.Namespace) -> tuple[list, list]:
    """(train, held-out) sequences: the token draft's shard plus --real's shards, each split by
    its own meta.json, the training part shuffled (seed --seed)."""
    from edgespec.distill.shards import Meta, read_shard, shard_paths
    from edgespec.distill.train import split_data

    data = TOKEN_DRAFT / "data"
    train, held = split_data(read_shard(data / a.shard), Meta.read(data))
    if a.real is not None:
        real = [s for p in shard_paths(a.real) for s in read_shard(p)]
        rt, rh = split_data(real, Meta.read(a.real))
        train, held = train + rt, held + rh
    rng = np.random.default_rng(a.seed)
    return [train[i] for i in rng.permutation(len(train))], [
        held[i] for i in rng.permutation(len(held))
    ]


def features(a: argparse.Namespace) -> None:
    from edgespec.runtime import Engine
    from research.distill.eagle import extract_features

    target = Engine.load().target.model
    train, held = sequences(a)
    print(f"{len(train)} training answers, {len(held)} held-out")
    layers = layers_of(a)
    extract_features(target, held[: a.held], a.work / "held", 1 << 40, layers=layers)
    extract_features(target, train, a.work / "features", a.tokens, layers=layers)


def start(a: argparse.Namespace) -> tuple:
    """(model warm-started from the shipped feature draft, its config, train items, held items)."""
    from edgespec.runtime import Engine
    from research.distill.eagle import load_items
    from research.distill.eagle3 import warm_start

    target = Engine.load().target.model
    items = [crop(it, a.context) for it in load_items(a.work / "features")]
    held = [crop(it, a.context) for it in load_items(a.work / "held")]
    model, cfg = warm_start(target, OLD_EAGLE, layers_of(a), items)
    return model, cfg, items, held


def crop(item, context: int):  # type: ignore[no-untyped-def]
    """The answer with at most `context` prompt tokens before it (prompt positions carry no
    loss; long real-text prompts would cost most of the compute)."""
    from research.distill.eagle import Item

    cut = max(0, item.prompt_len - context)
    return Item(item.ids[cut:], item.feats[cut:], item.prompt_len - cut)


def train(a: argparse.Namespace) -> None:
    from research.distill.eagle import EagleTrainConfig, train_eagle
    from research.distill.eagle3 import chain_agreement, ttt_loss

    model, _, items, held = start(a)
    print(f"training on {len(items)} answers, {sum(len(i.ids) for i in items)} tokens")
    print(f"held-out agreement per step before: {chain_agreement(model, held, a.ttt)}")
    tc = EagleTrainConfig(
        steps=a.steps,
        batch=a.batch,
        lr=a.lr,
        warmup=a.warmup,
        eval_every=a.eval_every,
        reg_weight=0.0,
        seed=a.seed,
    )

    def loss(mdl, *b):  # type: ignore[no-untyped-def]
        return ttt_loss(mdl, *b, steps=a.ttt, decay=a.decay)

    train_eagle(model, items, held, tc, a.work / "train", print, a.until, loss_of=loss)
    print(f"held-out agreement per step after: {chain_agreement(model, held, a.ttt)}")


def export(a: argparse.Namespace) -> None:
    from edgespec.distill.export import quantize
    from research.distill.eagle import load_trained, save_eagle
    from research.distill.eagle3 import chain_agreement

    model, cfg, _, held = start(a)
    load_trained(model, a.work / "train")
    save_eagle(model, quantize(model, cfg, a.bits), a.out)
    print(f"held-out agreement per step as exported: {chain_agreement(model, held, a.ttt)}")
    curve = json.loads((a.work / "train" / "train.json").read_text())["curve"]
    rows = [f"{r['step']},{r['seen']},{r['agreement']:.4f}" for r in curve]
    (a.out / "curve.csv").write_text("step,tokens_seen,agreement\n" + "\n".join(rows) + "\n")
    print(f"wrote {a.out} (config.json, model.safetensors, curve.csv)")


def mtbench(a: argparse.Namespace) -> None:
    """Teacher-forced agreement on MT-bench first turns (24 prompts x 128 greedy tokens, full
    vocabulary): the token draft's first token, and each feature draft's tokens 1 .. --ttt."""
    import mlx.core as mx

    from edgespec.architectures.eagle import load_eagle
    from edgespec.distill.data import SamplingPlan, answer
    from edgespec.distill.evaluate import find_prompt_file, load_prompts
    from edgespec.distill.train import agreement_counts, head_index
    from edgespec.runtime import Engine
    from edgespec.taps import target_features
    from research.distill.eagle import Item
    from research.distill.eagle3 import chain_agreement

    engine = Engine.load()
    target, token_draft = engine.target.model, engine.draft.model
    prompts = [q.text for q in load_prompts(find_prompt_file(a.prompts), 24)]
    plan = SamplingPlan(max_new_tokens=128, top_k_saved=1)
    seqs = answer(target, engine.tokenizer, [(i, p, True) for i, p in enumerate(prompts)], plan, 8)
    hidx = head_index(np.array(token_draft.head_ids), token_draft.vocab_size)
    counts = agreement_counts(token_draft, seqs, hidx, max_len=1 << 30)
    print(f"token draft: first token {counts[:, 0].sum() / counts[:, 1].sum():.3f}")
    for folder in a.drafts:
        draft, _ = load_eagle(folder, target)
        items = []
        for s in seqs:
            f, _ = target_features(target, mx.array(s.ids), None, draft.feature_layers)
            items.append(Item(np.asarray(s.ids), np.array(f), s.prompt_len))
        per_step = chain_agreement(draft, items, a.ttt, greedy=True)
        print(f"{folder}: tokens 1..{a.ttt} " + " ".join(f"{x:.3f}" for x in per_step))


def run_one(engine, prompt: str, k: int) -> tuple[list[int], object]:  # type: ignore[no-untyped-def]
    """One greedy answer (128 tokens; k = 0: plain decoding): (token ids, Stats)."""
    from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
    from edgespec.events import Finished, Token

    spec = SpecConfig(method="none") if k == 0 else SpecConfig(k=k, method="draft", adaptive=False)
    cfg = GenerationConfig(SamplingConfig(temperature=0.0), spec, max_tokens=128)
    engine.reset()
    events = list(engine.chat([{"role": "user", "content": prompt}], cfg))
    done = [e for e in events if isinstance(e, Finished)][-1]
    return [e.id for e in events if isinstance(e, Token)], done.stats


def loop(a: argparse.Namespace) -> None:
    """In the loop, side by side: plain decoding and each pair's speculative decoding at each K,
    T=0, on MT-bench first turns (--per-category per category), runs interleaved prompt by
    prompt; pooled acceptance, tau, decode tokens/s and the ratio to plain, greedy identity."""
    from edgespec.distill.evaluate import find_prompt_file, load_prompts
    from edgespec.runtime import Engine

    pairs = a.pairs.split(",")
    ks = [int(k) for k in a.k.split(",")]
    engines = {p: Engine.load(pair=p) for p in pairs}
    qs = load_prompts(find_prompt_file(a.prompts), 0, per_category=a.per_category)[: a.limit]
    runs = [(pairs[0], 0)] + [(p, k) for p in pairs for k in ks]
    for p in pairs:  # warm-up
        run_one(engines[p], qs[0].text, ks[0])
    tot: dict[tuple[str, int], list[float]] = {r: [0.0, 0.0, 0.0, 0.0, 0.0, 0.0] for r in runs}
    for q in qs:
        plain = None
        for r in runs:
            ids, st = run_one(engines[r[0]], q.text, r[1])
            plain = ids if r[1] == 0 else plain
            acc = tot[r]
            acc[0] += st.tokens  # type: ignore[attr-defined]
            acc[1] += st.decode_time  # type: ignore[attr-defined]
            acc[2] += st.drafted  # type: ignore[attr-defined]
            acc[3] += st.accepted  # type: ignore[attr-defined]
            acc[4] += st.rounds  # type: ignore[attr-defined]
            acc[5] += ids != plain
    base = tot[runs[0]][0] / tot[runs[0]][1]
    print(f"{len(qs)} MT-bench prompts x 128 tokens, T=0; plain {base:.1f} tok/s")
    print("| pair | K | acceptance | tau | tok/s | vs plain | greedy mismatches |")
    for r in runs[1:]:
        n, t, d, ac, rounds, bad = tot[r]
        print(
            f"| {r[0]} | {r[1]} | {ac / max(d, 1):.3f} | {n / max(rounds, 1):.2f} | "
            f"{n / t:.1f} | {n / t / base:.2f}x | {int(bad)} |"
        )


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.phase == "features":
        features(a)
    elif a.phase == "train":
        train(a)
    elif a.phase == "mtbench":
        mtbench(a)
    elif a.phase == "loop":
        loop(a)
    elif a.out is None:
        raise SystemExit("--phase export needs --out")
    else:
        export(a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
