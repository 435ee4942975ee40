"""Replaying greedy n-gram drafting on a known answer, without running a model: how the n-gram
defaults (SpecConfig.ngram_min / ngram_max / long_match) were chosen on real answers
(docs/drafting.md). tests/loop/test_ngram.py checks the replay against the loop."""

from __future__ import annotations

from typing import cast

from edgespec.drafting.ngram import NgramDrafter


def replay_rounds(
    prompt: list[int],
    answer: list[int],
    k: int,
    max_tokens: int,
    n_min: int = 1,
    n_max: int = 8,
    long_n: int = 0,
    long_k: int = 1,
) -> list[tuple[int, int]]:
    """The (drafted, accepted) of every round the loop runs for greedy n-gram drafting at a fixed
    K, replayed on `answer`, the target's greedy continuation of `prompt` (at least max_tokens
    long, or ended by the model). No model runs: at temperature 0 a proposal is accepted up to its
    first token that differs from the answer, so the rounds follow from the lookups alone.

    Mirrors loop.speculate and rounds.plain_run: a round looks up K tokens from the whole context;
    a miss starts pipelined plain steps, each of which looks up one token behind
    (NgramDrafter.propose_behind) while it computes, and the first such proposal is verified with
    that step's token and ends the run. Used to choose the n-gram defaults on real answers (docs/drafting.md); the tests check it
    against the loop."""
    drafter = NgramDrafter(n_min, n_max, long_n, long_k)
    end = min(max_tokens, len(answer))
    rounds: list[tuple[int, int]] = []
    pos, direct = 0, True

    def verify(tokens: list[int]) -> None:
        nonlocal pos
        accepted = 0
        for token in tokens:
            if pos + accepted >= len(answer) or answer[pos + accepted] != token:
                break
            accepted += 1
        rounds.append((len(tokens), accepted))
        pos += accepted + 1

    while pos < end:
        context = prompt + answer[:pos]
        if direct:
            tokens = cast(list[int], drafter.propose(context, k).tokens.tolist())
            if tokens:
                verify(tokens)
                continue
        rounds.append((0, 0))  # a plain step computes answer[pos]; the lookup runs one behind
        behind = (
            cast(list[int], drafter.propose_behind(context, k).tokens.tolist())
            if pos + 1 < end
            else []
        )
        pos += 1
        direct = bool(behind)
        if behind:
            verify(behind)
    return rounds
