"""The draft window per family (issue 72 item 4): greedy acceptance with and without the draft's
attention bound (SpecConfig.draft_window, bound.Bound) at 4K and 8K tokens of context, on the
embedded pairs and the long prompts `edgespec bench --context` builds (edgespec/bench/context.py:
the doc, code and chat kinds, cut to 4000 and 8000 tokens).

    python -m research.measure.window_families --out window.json
    python -m research.measure.window_families --out window.json --report

Per pair, prompt and window: the draft's own cache starts over (the target's cache of the
prompt, and a feature or block draft's record of its features, are reused: the target reads each
prompt once; the draft reads it afresh, bounded or whole, for each window), then a greedy answer of `--max-tokens` with a fixed K (the chain
method "draft", adaptive K off): drafted and accepted tokens, rounds, tau, the truncated-geometric
alpha (events.alpha_mle) and the answer's text, checked equal across windows (the target verifies
every token over the whole context, so output never depends on the window). Each cell is written
to `--out` as it finishes (key pair|kind@length|window; kind#1: the same text, MORE_TASKS'
instruction); a rerun skips the cells already there. Window 4096 is not run at these
lengths: the bound is on past 2 windows (8192 tokens), so it is the whole context at 4K and 8K.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from edgespec.blas import reexec_with_blas

if __name__ == "__main__":
    reexec_with_blas(sys.argv[1:], module="research.measure.window_families")

from edgespec.bench import context  # noqa: E402
from edgespec.bench.context import build_prompts  # noqa: E402
from edgespec.blas import active, cpu_model  # noqa: E402
from edgespec.config import GenerationConfig, SpecConfig  # noqa: E402
from edgespec.events import Finished, Round, alpha_mle  # noqa: E402
from edgespec.runtime import Engine  # noqa: E402

# pair -> K per round: the token and feature drafts a chain of 4; the block draft its block
# (block size 8: 7 drafted rows a forward).
PAIRS = {
    "smollm2-135m": 4,
    "smollm2-135m-eagle": 4,
    "smollm2-135m-eagle3": 4,
    "smollm2-135m-block": 7,
}


# More answers per prompt at the lengths in --more (the decision's: 8K): the same cut text with
# another instruction at its end, so the target's cache of the text is reused.
MORE_TASKS = {
    "doc": "List every command-line option the document above mentions, each with one sentence "
    "on what it does.",
    "code": "Write a one-line summary of each function in the code above, one line per function.",
    "chat": "Answer briefly: which part of our conversation was the most technical, and why?",
}


def prompts_of(engine: Engine, kinds: list[str], n: int, task: int) -> list:
    """The bench's long prompts of `n` tokens, each kind's instruction the bench's (task 0) or
    MORE_TASKS' (task 1)."""
    saved = context.DOC_TASK, context.CODE_TASK, context.CHAT_TASK
    if task:
        context.DOC_TASK, context.CODE_TASK = MORE_TASKS["doc"], MORE_TASKS["code"]
        context.CHAT_TASK = MORE_TASKS["chat"]
    try:
        return build_prompts(kinds, [n], engine.encode_chat)
    finally:
        context.DOC_TASK, context.CODE_TASK, context.CHAT_TASK = saved


def forget_draft(engine: Engine) -> None:
    """The draft's own cache starts over; the target's cache (and a feature or block draft's
    record of the target's features) stay, so the next request reuses the prompt's prefill."""
    state = engine._draft
    (state.kv if hasattr(state, "kv") else state).reset()


def cell(engine: Engine, prompt: list[int], k: int, window: int, max_tokens: int) -> dict:
    forget_draft(engine)
    spec = SpecConfig(method="draft", k=k, adaptive=False, draft_window=window)
    rounds, fin = [], None
    t0 = time.perf_counter()
    for ev in engine.generate(prompt, GenerationConfig(spec=spec, max_tokens=max_tokens)):
        if isinstance(ev, Round):
            rounds.append(ev)
        elif isinstance(ev, Finished):
            fin = ev
    assert fin is not None
    drafted = sum(r.drafted for r in rounds)
    accepted = sum(r.accepted for r in rounds)
    rejections = sum(1 for r in rounds if r.drafted and r.accepted < r.drafted)
    return {
        "tokens": fin.stats.tokens,
        "rounds": len(rounds),
        "drafted": drafted,
        "accepted": accepted,
        "rejections": rejections,
        "acceptance": accepted / drafted if drafted else None,
        "alpha": alpha_mle(accepted, rejections),
        "tau": fin.stats.tau,
        "reason": fin.reason,
        "seconds": round(time.perf_counter() - t0, 1),
        "text": fin.text,
    }


def run(args: argparse.Namespace) -> None:
    out = Path(args.out)
    data = json.loads(out.read_text()) if out.exists() else {}
    data.setdefault("meta", {"cpu": cpu_model(), "blas": active(), "max_tokens": args.max_tokens})
    cells = data.setdefault("cells", {})
    windows = [int(w) for w in args.windows.split(",")]
    lengths = [int(n) for n in args.lengths.split(",")]
    kinds = args.kinds.split(",")
    more = [int(n) for n in args.more.split(",") if n]
    for n, pair in ((n, pair) for n in lengths for pair in args.pairs.split(",")):
        tasks = (0, 1) if n in more else (0,)
        names = [f"{kind}#{t}" if t else kind for kind in kinds for t in tasks]
        keys = [f"{pair}|{name}@{n}|{w}" for name in names for w in windows]
        if all(key in cells for key in keys):
            continue
        engine = Engine.load(pair=pair)
        todo = [(t, p) for t in tasks for p in prompts_of(engine, kinds, n, t)]
        todo.sort(key=lambda tp: kinds.index(tp[1].kind))  # a text's tasks one after another
        for t, p in todo:
            for w in windows:
                key = f"{pair}|{p.kind}{f'#{t}' if t else ''}@{p.length}|{w}"
                if key in cells:
                    continue
                res = cell(engine, list(p.ids), PAIRS[pair], w, args.max_tokens)
                res["prompt_tokens"] = len(p.ids)
                cells[key] = res
                out.write_text(json.dumps(data, indent=1))
                print(
                    f"{key}: acceptance {res['acceptance']:.3f} alpha {res['alpha']:.3f} "
                    f"tau {res['tau']:.2f} rounds {res['rounds']} tokens {res['tokens']} "
                    f"({res['seconds']} s)",
                    flush=True,
                )
        del engine


def report(args: argparse.Namespace) -> None:
    data = json.loads(Path(args.out).read_text())
    cells = data["cells"]
    print(f"cpu: {data['meta']['cpu']} | blas: {data['meta']['blas']}")
    print("| pair | context | window | drafted | rounds | acceptance | alpha | tau | same text |")
    print("|---|---|---|---|---|---|---|---|---|")
    groups: dict[tuple[str, str, str], list[dict]] = {}
    texts: dict[tuple[str, str], set[str]] = {}
    for key, c in cells.items():
        pair, prompt, w = key.split("|")
        kind, n = prompt.split("@")
        groups.setdefault((pair, n, w), []).append(c)
        texts.setdefault((pair, prompt), set()).add(c["text"])
    for (pair, n, w), cs in sorted(groups.items(), key=lambda g: (g[0][0], int(g[0][1]), g[0][2])):
        d, a = sum(c["drafted"] for c in cs), sum(c["accepted"] for c in cs)
        r, rej = sum(c["rounds"] for c in cs), sum(c["rejections"] for c in cs)
        tokens = sum(c["tokens"] for c in cs)
        same = all(len(t) == 1 for (p, prompt), t in texts.items() if p == pair)
        print(
            f"| {pair} | {n} | {w} | {d} | {r} | {a / d:.3f} | {alpha_mle(a, rej):.3f} | "
            f"{tokens / r:.2f} | {same} |"
        )

    print()
    print("| pair | context | texts | acceptance, window - whole (points) | relative | per text |")
    print("|---|---|---|---|---|---|")
    pairs = sorted({(k.split("|")[0], k.split("|")[1].split("@")[1]) for k in cells})
    for pair, n in sorted(pairs, key=lambda p: (p[0], int(p[1]))):
        prompts = sorted(
            {k.split("|")[1] for k in cells if k.startswith(pair + "|") and k.endswith(f"@{n}|0")}
        )
        both = [p for p in prompts if f"{pair}|{p}|1024" in cells]
        if not both:
            continue
        acc = {
            w: sum(cells[f"{pair}|{p}|{w}"]["accepted"] for p in both)
            / sum(cells[f"{pair}|{p}|{w}"]["drafted"] for p in both)
            for w in ("1024", "0")
        }
        per = [
            cells[f"{pair}|{p}|1024"]["acceptance"] - cells[f"{pair}|{p}|0"]["acceptance"]
            for p in both
        ]
        print(
            f"| {pair} | {n} | {len(both)} | {100 * (acc['1024'] - acc['0']):+.1f} | "
            f"{100 * (acc['1024'] / acc['0'] - 1):+.1f}% | "
            f"{', '.join(f'{100 * d:+.1f}' for d in per)} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--pairs", default=",".join(PAIRS))
    parser.add_argument("--kinds", default="doc,code,chat")
    parser.add_argument("--lengths", default="8000,4000")
    parser.add_argument("--windows", default="1024,0")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--more", default="8000", help="lengths with a second task per text")
    parser.add_argument("--report", action="store_true")
    args = parser.parse_args()
    report(args) if args.report else run(args)


if __name__ == "__main__":
    main()
