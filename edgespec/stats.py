"""The summary of one generation: a small pure fold over its rounds and timestamps."""

from __future__ import annotations

from collections.abc import Sequence

from edgespec.events import Round, Stats


def accepted_histogram(rounds: Sequence[Round]) -> tuple[int, ...]:
    """hist[i] = rounds that accepted exactly i drafts. [acc 2, acc 0, acc 2] -> (1, 0, 2)."""
    if not rounds:
        return ()
    hist = [0] * (max(r.k for r in rounds) + 1)
    for r in rounds:
        hist[r.accepted] += 1
    return tuple(hist)


def summarize(
    rounds: Sequence[Round],
    tokens: int,
    *,
    t_request: float,
    t_first: float | None,
    t_last: float | None,
    prompt_tokens: int,
    prefilled_tokens: int,
) -> Stats:
    """Fold a generation into Stats. No rounds means plain decoding (tau = 1, one token a step).

    tau = mean tokens committed per round, correction/bonus included: sum(accepted + 1) / rounds.
    tokens_per_s counts decode only: (tokens - 1) / (t_last - t_first), the first token being TTFT.
    Example: rounds accepting 3 and 1 of K=4 -> drafted 8, accepted 4, acceptance .5, tau 3.0.
    """
    drafted = sum(r.drafted for r in rounds)
    accepted = sum(r.accepted for r in rounds)
    n_rounds = len(rounds) if rounds else tokens
    tau = (accepted + len(rounds)) / len(rounds) if rounds else (1.0 if tokens else 0.0)
    ttft = (t_first - t_request) if t_first is not None else 0.0
    decode = (t_last - t_first) if t_first is not None and t_last is not None else 0.0
    return Stats(
        tokens=tokens,
        rounds=n_rounds,
        drafted=drafted,
        accepted=accepted,
        acceptance=accepted / drafted if drafted else 0.0,
        tau=tau,
        ttft=ttft,
        decode_time=decode,
        tokens_per_s=(tokens - 1) / decode if tokens > 1 and decode > 0 else 0.0,
        prompt_tokens=prompt_tokens,
        prefilled_tokens=prefilled_tokens,
        accepted_hist=accepted_histogram(rounds),
    )
