"""Record, once, what each drafter of the embedded pairs would have had accepted at every position
of the target's own answers: the acceptance half of the cost-profile replay (research/replay/).

For each prompt (the bench's built-in prompts, and its long contexts) and temperature, the target
answers alone (plain decoding, `Engine.generate`); then both models score that answer teacher-
forced, and every answer position i (a round that starts with prompt + answer[:i] committed)
gets:

- `draft`: T = 0: the rank of answer[i] among the token draft's candidates (0: its argmax, so a
  chain accepts it; 1..3: a tree's second..fourth candidate; 4: further down), from one draft
  forward over prompt + answer. T > 0: beta_i = sum_x min(p_i(x), q_i(x)), the chance that a
  draft token there passes the ratio test (p the target warped at T, q the draft), in 1/255.
- `lookup`: the n-gram lookup over prompt + answer[:i] (edgespec.drafting.ngram.NgramIndex,
  suffixes 1..8): its match length, and per proposed token (up to LOOKUP_K) whether it is
  answer[i + d] (T = 0) or the target's probability of it at i + d (T > 0, in 1/255; the context
  is the recorded answer's, exact for the first token).
- `block`: the block draft (pair smollm2-135m-block) after anchor answer[i - 1], one forward of
  BLOCK_K tokens (its longest block): T = 0 how many of its rows agree with the answer in a row;
  T > 0 beta per row (1/255).

Exact at T = 0 where the in-loop draft sees the same context (a chain's accepted drafts are the
answer's tokens), up to float rounding between a batched and a stepwise forward; at T > 0 the
per-position acceptance is exact in expectation for a first drafted token, an approximation after.

    python -m research.replay.record --out /tmp/r0.json.gz --temps 0 --limit 2 &
    python -m research.replay.record --out /tmp/r7.json.gz --temps 0.7 --limit 2 --context 1000
    python -m research.replay.record --merge /tmp/r0.json.gz /tmp/r7.json.gz \
        --out research/replay/records.json.gz

Slow (it runs the real models): the first about 45 minutes on a shared 2-core CPU (a 4K
prompt's answer scored by both models takes minutes), the second about 20.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time

from edgespec.blas import reexec_with_blas

if __name__ == "__main__":
    reexec_with_blas(sys.argv[1:], module="research.replay.record")

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

from edgespec.bench.context import build_prompts  # noqa: E402
from edgespec.bench.prompts import load_prompts  # noqa: E402
from edgespec.cache import target_features  # noqa: E402
from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig  # noqa: E402
from edgespec.drafting.ngram import NgramIndex  # noqa: E402
from edgespec.events import Token  # noqa: E402
from edgespec.runtime import Engine  # noqa: E402
from edgespec.sampling import warp  # noqa: E402

LOOKUP_K = 8  # tokens of each lookup's continuation recorded
RANKS = 4  # draft candidates ranked (trees: PRIOR_RANK's length)
CHUNK = 256  # teacher-forced forwards in chunks of this many tokens
BLOCK_PAIR = "smollm2-135m-block"


def scored(model, ids: list[int], start: int, layers=None):
    """Logits [len(ids) - start, V] of the positions that predict ids[start:], from forwards in
    chunks over a fresh cache; with `layers`, also the raw target features of every position
    [len(ids), width] (edgespec.cache.target_features)."""
    cache, rows, feats = make_prompt_cache(model), [], []
    for a in range(0, len(ids), CHUNK):
        chunk = mx.array(ids[a : a + CHUNK], dtype=mx.int32)
        if layers is not None:
            f, logits = target_features(model, chunk, cache, layers)
            feats.append(f)
        else:
            logits = model(chunk[None], cache=cache)[0]
        lo, hi = max(start - 1 - a, 0), min(len(ids) - 1 - a, len(chunk))
        if lo < hi:
            rows.append(logits[lo:hi].astype(mx.float32))
        mx.eval(rows[-1] if rows else logits, *feats[-1:])
    out = mx.concatenate(rows)
    return (out, mx.concatenate(feats)) if layers is not None else out


def q255(x) -> list[int]:
    """Probabilities as integers in 0..255."""
    return np.clip(np.round(np.asarray(x, dtype=np.float64) * 255), 0, 255).astype(int).tolist()


def draft_record(p: mx.array | None, logits: mx.array, answer: list[int], cfg) -> list[int]:
    """Per position: the answer token's rank among the draft's (T = 0, capped at RANKS) or beta."""
    if cfg.greedy:
        top = np.array(mx.argsort(-logits, axis=-1)[:, :RANKS])
        ranks = []
        for row, tok in zip(top, answer, strict=True):
            hit = np.nonzero(row == tok)[0]
            ranks.append(int(hit[0]) if hit.size else RANKS)
        return ranks
    assert p is not None  # T > 0: the target's warped distributions
    q = warp(logits, cfg)
    return q255(mx.sum(mx.minimum(p, q), axis=-1))


def lookup_record(prompt: list[int], answer: list[int], p_np, greedy: bool):
    """Per position: [match length, agreement flags or target probabilities of its tokens]."""
    index, out = NgramIndex(1, 8), []
    seq = prompt + answer
    for i in range(len(answer)):
        index.extend(seq[: len(prompt) + i])
        tokens, n = index.lookup(LOOKUP_K)
        if greedy:
            vals = [int(t == a) for t, a in zip(tokens, answer[i:], strict=False)]
        else:
            vals = [p_np[i + d, t] for d, t in enumerate(tokens) if i + d < len(answer)]
            vals = q255(vals)
        out.append([n, vals])
    return out


def block_record(engine: Engine, prompt, answer, feats, p, cfg) -> list:
    """Per position i: the block draft's BLOCK_K rows after anchor (prompt + answer)[P + i - 1]:
    agreeing rows in a row (T = 0) or beta per row (T > 0)."""
    st, seq, P = engine._draft, prompt + answer, len(prompt)
    k = st.block.args.block_size - 1
    st.reset()
    st.set_features(seq[:P], 0, feats[: P - 1])
    out: list = []
    for i in range(len(answer)):
        if i > 0:
            st.set_features(seq[: P + i], P + i - 2, feats[P + i - 2 : P + i - 1])
        rows = st.block_logits(seq[: P + i], k).astype(mx.float32)
        n = min(k, len(answer) - i)
        if cfg.greedy:
            agree = np.array(mx.argmax(rows[:n], axis=-1)) == np.array(answer[i : i + n])
            out.append(int(np.cumprod(agree).sum()))
        else:
            q = warp(rows[:n], cfg)
            out.append(q255(mx.sum(mx.minimum(p[i : i + n], q), axis=-1)))
    return out


def record_one(engines, name: str, prompt: list[int], temp: float, seed: int, max_tokens: int):
    """One trace: the answer and every record of it."""
    token, block = engines
    cfg = SamplingConfig(temperature=temp, seed=seed)
    gen = GenerationConfig(
        sampling=cfg, spec=SpecConfig(method="none", adaptive=False), max_tokens=max_tokens
    )
    answer = [e.id for e in token.generate(prompt, gen) if isinstance(e, Token)]
    seq, P = prompt + answer, len(prompt)
    t_logits, feats = scored(block.target.model, seq, P, block._draft.block.feature_layers)
    if cfg.greedy:
        agree = np.array(mx.argmax(t_logits, axis=-1)) == np.array(answer)
        print(f"  teacher-forced target argmax agrees at {agree.mean():.3f}", file=sys.stderr)
    p = None if cfg.greedy else warp(t_logits, cfg)
    p_np = None if p is None else np.array(p)
    d_logits = scored(token.draft.model, seq, P)
    return {
        "name": name,
        "temp": temp,
        "seed": seed,
        "context": P,
        "answer": len(answer),
        "draft": draft_record(p, d_logits, answer, cfg),
        "lookup": lookup_record(prompt, answer, p_np, cfg.greedy),
        "block": block_record(block, prompt, answer, feats, p, cfg),
    }


def merge(paths: list[str], out: str) -> None:
    """One records file from several runs' (e.g. one per temperature, run side by side)."""
    data: dict = {}
    for path in paths:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            part = json.load(f)
        data = {**part, "traces": data.get("traces", []) + part["traces"]}
    with gzip.open(out, "wt", encoding="utf-8") as f:
        json.dump(data, f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--merge", nargs="+", help="only merge these records files into --out")
    parser.add_argument("--temps", default="0,0.7")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--limit", type=int, default=None, help="built-in prompts per category")
    parser.add_argument("--context", default="1000,4000", help="long-context lengths (tokens)")
    args = parser.parse_args()
    if args.merge:
        merge(args.merge, args.out)
        return
    token, block = Engine.load(), Engine.load(pair=BLOCK_PAIR)
    prompts = [
        (f"{p.category}/{p.id}", token.encode_chat([{"role": "user", "content": p.text}]))
        for p in load_prompts(None, None, args.limit)
    ]
    lengths = [int(x) for x in args.context.split(",") if x]
    prompts += [
        (f"{c.kind}@{c.length // 1000}k", list(c.ids))
        for c in build_prompts(("doc", "code", "chat"), lengths, token.encode_chat)
    ]
    traces = []
    for temp in (float(t) for t in args.temps.split(",")):
        for name, ids in prompts:
            t0 = time.time()
            traces.append(record_one((token, block), name, ids, temp, 0, args.max_tokens))
            print(f"{name} T={temp}: {len(ids)} + {traces[-1]['answer']} tokens, "
                  f"{time.time() - t0:.1f} s", file=sys.stderr, flush=True)  # fmt: skip
            # written after every trace: a long run stopped early keeps what it recorded
            with gzip.open(args.out, "wt", encoding="utf-8") as f:
                json.dump({"pair": token.name, "block_pair": BLOCK_PAIR, "traces": traces}, f)


if __name__ == "__main__":
    main()
