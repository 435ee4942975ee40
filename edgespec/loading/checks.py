"""Whether a target and a draft can speculate together: the same tokenizer, caches that can go
back to an earlier position."""

from __future__ import annotations

from typing import Any

import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from edgespec.cache import check_trimmable as check_cache
from edgespec.cache import common_prefix
from edgespec.errors import TokenizerMismatchError

PROBES = (
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces\tand\ttabs\nnew line",
    "def f(x):\n    return x ** 2  # 12345",
    "Émile a mangé 3 crêpes à Paris. 東京は大きい。 Привет! 🙂",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>",
)


def _id_to_token(tokenizer: Any) -> dict[int, str]:
    return {i: t for t, i in tokenizer.get_vocab().items()}


def check_tokenizers(target: Any, draft: Any, probes: tuple[str, ...] = PROBES) -> None:
    """Raise TokenizerMismatchError unless target and draft tokenize alike.

    target, draft: LoadedModel-like records (tokenizer, name). Two checks: (1) the same ids for every probe string; (2) the same token at every id of the
    shared vocabulary range (tables may be padded past the real vocabulary, so only
    min(len_t, len_d) ids are compared)."""
    tt, dt = target.tokenizer, draft.tokenizer
    if tt is dt:  # a draft without tokenizer files shares its target's (loading.folder)
        return
    who = f"target {target.name!r} and draft {draft.name!r}"
    for text in probes:
        a, b = tt.encode(text, add_special_tokens=False), dt.encode(text, add_special_tokens=False)
        if a != b:
            i = common_prefix(a, b)
            ta = tt.decode(a[i : i + 1]) if i < len(a) else "<end>"
            tb = dt.decode(b[i : i + 1]) if i < len(b) else "<end>"
            raise TokenizerMismatchError(
                f"{who} tokenize {text[:30]!r} differently: token {i} is {ta!r} (id {a[i] if i < len(a) else '-'}) "
                f"vs {tb!r} (id {b[i] if i < len(b) else '-'})"
            )
    va, vb = _id_to_token(tt), _id_to_token(dt)
    for i in range(min(len(va), len(vb))):
        if va.get(i) != vb.get(i):
            raise TokenizerMismatchError(
                f"{who} have different vocabularies: id {i} is {va.get(i)!r} vs {vb.get(i)!r}"
            )


def check_trimmable(model: nn.Module, name: str = "model") -> None:
    """Raise CacheNotTrimmableError if the model's prompt cache has layers that can be neither
    rewound nor restored (edgespec/rewind.py: attention, sliding-window and recurrent layers can)."""
    check_cache(make_prompt_cache(model), name)
