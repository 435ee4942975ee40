"""N-gram prompt lookup: draft the continuation that followed the most recent earlier occurrence of
the context's last n tokens (n from n_max down to n_min). No draft model.

The proposal is deterministic, so q is a point mass and the loop verifies it with the point-mass
path of `acceptance.verify` (accept x with probability p(x), else resample from p without x): the
output is still distributed exactly as the target's. At temperature 0 it is a plain argmax match.

Cost: the index is incremental. Each committed token adds one entry per n (a dict write), and a
lookup is at most n_max - n_min + 1 dict reads, so a round costs O(new tokens * n_max), not O(L^2).
"""

from __future__ import annotations

from typing import cast

import mlx.core as mx

from edgespec.drafting.base import Drafter, Proposal, point_mass


class NgramIndex:
    """For every n in [n_min, n_max]: n-gram -> position of the token that followed its most recent
    occurrence. Only n-grams whose next token is known are indexed, so the context's own suffix
    never matches itself.

    Example (n_min = n_max = 2): tokens [5, 6, 7, 5, 6] index (5,6)->2, (6,7)->3, (7,5)->4; the
    suffix (5, 6) maps to position 2, so `lookup(k=3)` proposes tokens[2:5] = [7, 5, 6].
    """

    def __init__(self, n_min: int, n_max: int):
        if not 1 <= n_min <= n_max:
            raise ValueError(f"need 1 <= n_min <= n_max, got {n_min}, {n_max}")
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[int] = []
        self._next: dict[tuple[int, ...], int] = {}  # n-gram -> index of the token after it

    def extend(self, context: list[int]) -> None:
        """Catch up with `context`, which must extend the tokens already indexed (a shorter context
        means a new conversation: the index is rebuilt)."""
        if len(context) < len(self.tokens):
            self.tokens, self._next = [], {}
        start = len(self.tokens)
        self.tokens.extend(context[start:])
        toks = self.tokens
        for i in range(max(start, 1), len(toks)):  # token i is known: index n-grams before it
            for n in range(self.n_min, min(self.n_max, i) + 1):
                self._next[tuple(toks[i - n : i])] = i

    def find(self, n_min: int | None = None) -> tuple[int, int]:
        """(position of the token that followed the longest matching suffix, that n); (0, 0) when
        nothing matches. n_min (default the index's) raises the shortest suffix accepted."""
        toks, lo = self.tokens, max(self.n_min, n_min or self.n_min)
        for n in range(min(self.n_max, len(toks)), lo - 1, -1):
            pos = self._next.get(tuple(toks[len(toks) - n :]))
            if pos is not None:
                return pos, n
        return 0, 0

    def lookup(self, k: int, n_min: int | None = None) -> tuple[list[int], int]:
        """Up to k tokens that followed the longest matching suffix, and that n (0: no match).

        The continuation stops at the end of the indexed tokens, so it may be shorter than k.
        n_min (default the index's) raises the shortest suffix accepted as a match.
        """
        pos, n = self.find(n_min)
        return (self.tokens[pos : pos + k], n) if n else ([], 0)


class NgramDrafter(Drafter):
    """Drafter proposing by prompt lookup over prompt + generated text.

    A fresh drafter per generation (the Engine builds one per request). Proposes fewer than k
    tokens when the matched continuation is short, and none when nothing matches: that round is a
    plain target step. Each proposal carries the suffix match length n (Proposal.match).

    Long matches propose long: a suffix match of at least `long_n` tokens (0: never) proposes up
    to max(k, long_k) tokens. A long match is a copy in progress (a quoted passage, a repeated
    list item), whose continuation is usually right for several tokens, while a one-token match is
    right ~40% of the time, so proposing one token on short matches and many on long ones beats
    any single length (docs/drafting.md).
    """

    method = "ngram"

    def __init__(self, n_min: int = 1, n_max: int = 8, long_n: int = 0, long_k: int = 1):
        self.index = NgramIndex(n_min, n_max)
        self.long_n, self.long_k = long_n, long_k

    def propose(self, context: list[int], k: int, key: mx.array | None = None) -> Proposal:
        return self.propose_min(context, k, None)

    def propose_min(self, context: list[int], k: int, n_min: int | None) -> Proposal:
        """propose(), accepting only suffix matches of length >= n_min."""
        return self.lookup(context, k, n_min)

    def lookup(self, context: list[int], k: int, n_min: int | None, skip: int = 0) -> Proposal:
        """Index `context`, find its longest suffix match n and propose up to k tokens of the
        continuation (max(k, long_k) on a long match), past its first `skip` tokens."""
        self.index.extend(context)
        pos, n = self.index.find(n_min)
        if not n:
            return point_mass([], self.method)
        if self.long_n and n >= self.long_n:
            k = max(k, self.long_k)
        return point_mass(self.index.tokens[pos + skip : pos + skip + k], self.method, n)

    def propose_behind(self, context: list[int], k: int, n_min: int | None = None) -> Proposal:
        """Up to k tokens for the positions after len(context), proposed while the token at
        len(context) is still being computed (pipelined plain steps, edgespec/rounds.py): the
        continuation of the longest earlier match of context's suffix, past its first token,
        which is the match's guess for the token being computed. Empty when nothing matches (or
        k <= 0: a plain step).
        Example: indexed [5, 6, 7, 8, 5, 6] (n 2): the suffix (5, 6) was followed by 7, 8, 5, so
        propose_behind(k=2) = [8, 5], the guess for the two tokens after the coming 7."""
        if k <= 0:
            return point_mass([], self.method)
        return self.lookup(context, k, n_min, skip=1)


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

    Mirrors loop.speculate and loop.plain_run: a round looks up K tokens from the whole context;
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
