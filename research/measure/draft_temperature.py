"""Would the draft accept more at T > 0 if it drafted at another temperature? Speculative sampling
stays exact for any draft distribution q, and a token's acceptance probability is
sum_x min(p(x), q(x)): this measures it on the embedded pair, p the target at --temp and q the
draft warped at each of --taus, over the positions of the target's own sampled answers (plain
decoding, two seeds per prompt, a few short prompts), each scored by one forward of both models.

    MKL_NUM_THREADS=1 taskset -c 0 python -m research.measure.draft_temperature --temp 0.7

Prints the running mean acceptance per draft temperature after each prompt.
"""

from __future__ import annotations

import argparse
import sys

from edgespec.blas import reexec_with_blas

if __name__ == "__main__":
    reexec_with_blas(sys.argv[1:], module="research.measure.draft_temperature")

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig  # noqa: E402
from edgespec.events import Token  # noqa: E402
from edgespec.runtime import Engine  # noqa: E402

PROMPTS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a hash map works and when to use one, with a Python example.",
    "What are the main causes of the French Revolution?",
    "Give me five tips for a job interview.",
    "Write a Python function that checks whether a string is a palindrome and explain it.",
    "Summarize the water cycle for a ten-year-old.",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--temp", type=float, default=0.7)
    parser.add_argument("--taus", default="0.4,0.5,0.6,0.7,0.8,0.9,1.0")
    parser.add_argument("--max-tokens", type=int, default=160)
    args = parser.parse_args()
    taus = [float(t) for t in args.taus.split(",")]
    engine = Engine.load()
    target, draft = engine.target.model, engine.draft.model
    accepted: dict[float, list[float]] = {tau: [] for tau in taus}
    for i, text in enumerate(PROMPTS):
        ids = engine.encode_chat([{"role": "user", "content": text}])
        for seed in (0, 1):
            config = GenerationConfig(
                sampling=SamplingConfig(temperature=args.temp, seed=seed),
                spec=SpecConfig(method="none", adaptive=False),
                max_tokens=args.max_tokens,
            )
            answer = [e.id for e in engine.generate(ids, config) if isinstance(e, Token)]
            seq = mx.array([ids + answer])
            scored = slice(len(ids) - 1, -1)  # the positions that predicted the answer's tokens
            p = mx.softmax(target(seq)[0, scored].astype(mx.float32) / args.temp, axis=-1)
            drafted = draft(seq)[0, scored].astype(mx.float32)
            for tau in taus:
                q = mx.softmax(drafted / tau, axis=-1)
                accepted[tau].extend(np.array(mx.sum(mx.minimum(p, q), axis=-1)).tolist())
        cells = " ".join(f"{tau}:{np.mean(accepted[tau]):.3f}" for tau in taus)
        print(f"prompt {i}, {len(accepted[taus[0]])} positions: {cells}", flush=True)


if __name__ == "__main__":
    main()
