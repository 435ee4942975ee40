"""Rebuild a SentencePiece-style BPE tokenizer (`tokenizer.ggml.model == "llama"`: Gemma, Llama 2,
Mistral) from GGUF metadata with the `tokenizers` library.

The GGUF stores the SentencePiece model's pieces, their scores and their types (1 normal,
2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte), not merges. SentencePiece's BPE merges,
at each step, the adjacent pair whose joined piece is in the vocabulary with the highest score;
`tokenizers`' BPE merges the pair with the lowest rank. So every split of every normal piece into
two vocabulary pieces is a merge, ranked by the joined piece's score (higher first), which gives
the same merge order. Spaces become U+2581 ("▁") before BPE and back after decoding; text
outside the pieces falls back to byte tokens (<0x41>); control and user-defined pieces are
matched whole in the raw text first (as llama.cpp partitions them), control ones as special.
"""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

from edgespec.errors import ModelLoadError

SPACE = "\u2581"
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def spm_merges(pieces: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """All (left, right) splits of normal pieces into two vocabulary pieces, best joined piece
    first (higher score; then lower id), splits of one piece left to right.

    >>> spm_merges(["a", "b", "c", "ab", "abc", "bc"], [0, 0, 0, -1, -3, -2], [1] * 6)
    [('a', 'b'), ('b', 'c'), ('a', 'bc'), ('ab', 'c')]
    """
    vocab = {p: i for i, p in reversed(list(enumerate(pieces)))}
    ranked = []
    for i, (piece, t) in enumerate(zip(pieces, types, strict=True)):
        if t != NORMAL or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[i], i, cut, left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def build_spm_tokenizer(meta: dict[str, Any]) -> Tokenizer:
    """A `tokenizers.Tokenizer` equivalent to the GGUF's SentencePiece BPE model."""
    pieces: list[str] = list(meta["tokenizer.ggml.tokens"])
    scores = list(meta.get("tokenizer.ggml.scores") or [0.0] * len(pieces))
    types = list(meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(pieces))
    if not len(pieces) == len(scores) == len(types):
        raise ModelLoadError("GGUF tokenizer: tokens, scores and token types differ in length")
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = pieces[int(unk_id)] if unk_id is not None else None
    vocab = {p: i for i, p in reversed(list(enumerate(pieces)))}
    bpe = models.BPE(
        vocab=vocab,
        merges=spm_merges(pieces, scores, types),
        unk_token=unk,
        fuse_unk=True,
        byte_fallback=True,
    )
    tok = Tokenizer(bpe)
    steps: list[normalizers.Normalizer] = []
    if meta.get("tokenizer.ggml.add_space_prefix", True):
        steps.append(normalizers.Prepend(SPACE))
    steps.append(normalizers.Replace(" ", SPACE))
    tok.normalizer = normalizers.Sequence(steps)
    strip = (
        [decoders.Strip(SPACE, 1, 0)] if meta.get("tokenizer.ggml.add_space_prefix", True) else []
    )
    tok.decoder = decoders.Sequence(
        [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse(), *strip]
    )
    tok.add_special_tokens(
        [
            AddedToken(p, special=True, normalized=False)
            for p, t in zip(pieces, types, strict=False)
            if t == CONTROL
        ]
    )
    tok.add_tokens(
        [
            AddedToken(p, special=False, normalized=False)
            for p, t in zip(pieces, types, strict=False)
            if t == USER_DEFINED
        ]
    )
    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    if meta.get("tokenizer.ggml.add_bos_token", True) and bos_id is not None:
        bos = pieces[int(bos_id)]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0",
            pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
            special_tokens=[(bos, int(bos_id))],
        )
    return tok
