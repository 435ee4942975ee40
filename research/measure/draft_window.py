"""A token draft's attention bound (SpecConfig.draft_window) on the embedded pair, measured side by
side in one process on real text (this repository's docs/, chat-templated, a question at the end):

    python -m research.measure.draft_window steps 1024 2048 4096 8000
    python -m research.measure.draft_window answers 4000 --windows 0,1024,512

`steps`: at each context length, one-token draft steps (head only, as the drafter runs them)
alternating between a full-cache draft state and a bounded one (40 each, medians), and each
state's reading of the prompt. `answers`: one target prefill of an N-token prompt (reused), then
a 128-token greedy answer with `--method draft -k 4` per window (0: the whole context), the
draft's prompt read again each time: time to first token, tokens per round, the draft's
acceptance and its median cost per drafted token, and whether the text is the same.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from edgespec.blas import reexec_with_blas

if __name__ == "__main__":
    reexec_with_blas(sys.argv[1:], module="research.measure.draft_window")

import mlx.core as mx  # noqa: E402

from edgespec.blas import active, cpu_model  # noqa: E402
from edgespec.bound import Bound  # noqa: E402
from edgespec.config import (  # noqa: E402
    DRAFT_SINKS,
    DRAFT_WINDOW,
    GenerationConfig,
    SpecConfig,
)
from edgespec.events import Finished, Round  # noqa: E402
from edgespec.runtime import Engine  # noqa: E402

DOCS = Path(__file__).resolve().parents[2] / "docs"
QUESTION = "\n\nSummarize the document above in five bullet points."
STEPS = 40


def document(engine: Engine) -> list[int]:
    text = "\n\n".join(p.read_text() for p in sorted(DOCS.glob("*.md")))
    return engine.encode_raw(text)


def steps(engine: Engine, lengths: list[int]) -> None:
    ids = document(engine)
    full, bounded = engine.new_states()[1], engine.new_states()[1]
    bounded.bound = Bound(DRAFT_WINDOW, DRAFT_SINKS)
    for n in lengths:
        ctx = ids[: n + STEPS + 1]
        reads = {}
        for name, st in (("full", full), ("bound", bounded)):
            st.reset()
            t0 = time.perf_counter()
            st.prefill(ctx[: n + 1])
            mx.eval([c.state for c in st.cache])
            reads[name] = time.perf_counter() - t0
        times: dict[str, list[float]] = {"full": [], "bound": []}
        order = [("full", full), ("bound", bounded)]
        for i in range(STEPS):
            for name, st in order if i % 2 else order[::-1]:
                t0 = time.perf_counter()
                mx.eval(st.forward(mx.array([ctx[n + i]], dtype=mx.int32), head_only=True))
                times[name].append(time.perf_counter() - t0)
                st.tokens = ctx[: n + i + 1]
        f, b = (statistics.median(times[k]) * 1e3 for k in ("full", "bound"))
        print(
            f"n={n}: draft step full {f:6.2f} ms, bound {b:6.2f} ms | prompt reading "
            f"full {reads['full']:6.2f} s, bound {reads['bound']:6.2f} s",
            flush=True,
        )


def answers(engine: Engine, n: int, windows: list[int]) -> None:
    body = engine.tokenizer.decode(document(engine)[:n])
    prompt = engine.encode_chat([{"role": "user", "content": body + QUESTION}])
    print("prompt tokens", len(prompt), flush=True)
    t0 = time.perf_counter()
    list(engine.generate(prompt, GenerationConfig(spec=SpecConfig(method="none"), max_tokens=1)))
    print(f"target prefill {time.perf_counter() - t0:.1f} s (reused below)", flush=True)
    texts = set()
    for w in windows:
        spec = SpecConfig(method="draft", k=4, draft_window=w, adaptive=False)
        engine._draft.reset()
        t0, first, rounds, fin = time.perf_counter(), None, [], None
        for ev in engine.generate(prompt, GenerationConfig(spec=spec, max_tokens=128)):
            first = first if first is not None else time.perf_counter() - t0
            if isinstance(ev, Round):
                rounds.append(ev)
            elif isinstance(ev, Finished):
                fin = ev
        assert fin is not None
        drafted = [r for r in rounds if r.drafted and r.timed]
        c = statistics.median(r.t_draft / r.drafted for r in drafted) if drafted else 0.0
        acc = sum(r.accepted for r in drafted) / max(1, sum(r.drafted for r in drafted))
        texts.add(fin.text)
        print(
            f"window {w or 'whole context'}: ttft {first:.2f} s, tau {fin.stats.tau:.2f}, "
            f"draft acceptance {acc:.3f}, c {c * 1e3:.1f} ms per drafted token, "
            f"{fin.stats.tokens_per_s:.2f} tok/s",
            flush=True,
        )
    print("same text for every window:", len(texts) == 1, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    s = sub.add_parser("steps")
    s.add_argument("lengths", type=int, nargs="+")
    a = sub.add_parser("answers")
    a.add_argument("length", type=int)
    a.add_argument("--windows", default=f"0,{DRAFT_WINDOW}")
    args = parser.parse_args()
    engine = Engine.load()
    print(f"cpu: {cpu_model()} | blas: {active()} | window {DRAFT_WINDOW}, sinks {DRAFT_SINKS}")
    if args.what == "steps":
        steps(engine, args.lengths)
    else:
        answers(engine, args.length, [int(w) for w in args.windows.split(",")])


if __name__ == "__main__":
    main()
