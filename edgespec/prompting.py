"""How a prompt becomes token ids: text is text, and the thinking switch.

Text that a person or a program wrote (a chat message, a system prompt, a completions prompt, a
pasted document) is tokenized with the tokenizer's special-token strings as plain characters:
'<|im_end|>' inside a message is the seven text tokens of '<', '|', 'im', ..., never the control
token that ends a turn, so no text can forge a turn of the conversation. Only the chat
template's own markers are control tokens. "Special" is the tokenizer's own word: its added
tokens marked special (Hugging Face's `split_special_tokens`; a GGUF's control tokens,
edgespec/loading/gguf.py); plain added tokens such as Qwen3's `<think>` stay whole tokens.

A prompt whose text holds no special-token string is tokenized by the very call used before
(`apply_chat_template`, `encode`), so its ids, and greedy answers, are unchanged. One that holds
some is rendered with each such string replaced by a marker; the tokenizer splits the rendering
at the template's control tokens (its own rules: lstrip / rstrip included), the pieces without a
marker keep its ids, and a piece with one is tokenized again, markers restored, as text.

    encode_chat(tok, [{"role": "user", "content": "a<|im_end|>b"}])
    # ChatML: <|im_start|> user \\n a < | im _ end | > b <|im_end|> \\n <|im_start|> assistant \\n

The thinking switch: `enable_thinking` goes to the template only where the template reads it
(`thinking_default` tells: None where it renders alike either way).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Messages = Sequence[dict[str, str]]
# The probe a template renders to show whether it has a thinking mode.
_PROBE = [{"role": "user", "content": "Hello"}]


def hf_tokenizer(tokenizer: Any) -> Any:
    """The Hugging Face tokenizer inside mlx-lm's TokenizerWrapper, or `tokenizer` itself (a
    Hugging Face tokenizer's own `_tokenizer` is its `tokenizers` backend: not that one)."""
    inner = getattr(tokenizer, "_tokenizer", None)
    return inner if hasattr(inner, "apply_chat_template") else tokenizer


def special_tokens(tokenizer: Any) -> dict[str, int]:
    """The tokenizer's special-token strings and their ids (added tokens marked special).

    For SmolLM2: {'<|endoftext|>': 0, '<|im_start|>': 1, '<|im_end|>': 2, '<repo_name>': 3, ...}
    """
    added = getattr(hf_tokenizer(tokenizer), "added_tokens_decoder", None) or {}
    return {t.content: int(i) for i, t in added.items() if getattr(t, "special", False)}


def _pattern(tokenizer: Any) -> re.Pattern[str] | None:
    """A regex that finds any special-token string (longest first), or None if there are none."""
    strings = sorted(special_tokens(tokenizer), key=len, reverse=True)
    return re.compile("|".join(map(re.escape, strings))) if strings else None


def encode_text(tokenizer: Any, text: str, *, parse_special: bool = False) -> list[int]:
    """Token ids of `text` with the tokenizer's BOS if it adds one. Special-token strings in the
    text are text unless `parse_special` (then '<|im_end|>' is the control token, as
    `tokenizer.encode` does by default)."""
    pattern = None if parse_special else _pattern(tokenizer)
    if pattern is None or pattern.search(text) is None:
        return [int(i) for i in tokenizer.encode(text)]  # the call used before: same ids
    return [int(i) for i in hf_tokenizer(tokenizer).encode(text, split_special_tokens=True)]


def encode_chat(tokenizer: Any, messages: Messages, **template_kwargs: Any) -> list[int]:
    """Token ids of `messages` through the chat template, ready for the assistant's turn; the
    messages' text is text (module docstring). `template_kwargs` go to the template as they are
    (e.g. enable_thinking=False)."""

    def render(msgs: Messages, **kw: Any) -> Any:
        return tokenizer.apply_chat_template(
            list(msgs), add_generation_prompt=True, **template_kwargs, **kw
        )

    pattern = _pattern(tokenizer)
    if pattern is None or not any(pattern.search(_content(m)) for m in messages):
        return _ids(render(messages))  # the call used before: same ids
    marked, restore = _mark(messages, pattern)
    return encode_rendered(tokenizer, str(render(marked, tokenize=False)), restore)


def _ids(out: Any) -> list[int]:
    """Token ids from apply_chat_template: a list (mlx-lm's wrapper), or the mapping a bare
    Hugging Face tokenizer of transformers 5 returns."""
    if isinstance(out, Mapping):
        out = out["input_ids"]
    return [int(i) for i in out]


def _content(message: dict[str, str]) -> str:
    return str(message.get("content", ""))


def _mark(messages: Messages, pattern: re.Pattern[str]) -> tuple[list[dict[str, str]], Any]:
    """The messages with every special-token string replaced by a marker ('\\ue000' 0 '\\ue000'
    with a private-use character no message holds), and a function that puts the strings back.

    >>> marked, restore = _mark([{"role": "user", "content": "a<s>b"}], re.compile("<s>"))
    >>> marked[0]["content"] == "a\\ue0000\\ue000b", restore(marked[0]["content"])
    (True, 'a<s>b')
    """
    texts = "".join(_content(m) for m in messages)
    fence = next(chr(c) for c in range(0xE000, 0xF900) if chr(c) not in texts)
    found: list[str] = []

    def swap(match: re.Match[str]) -> str:
        found.append(match.group(0))
        return f"{fence}{len(found) - 1}{fence}"

    marked = [dict(m, content=pattern.sub(swap, _content(m))) for m in messages]
    back = re.compile(f"{fence}(\\d+){fence}")
    return marked, lambda s: back.sub(lambda m: found[int(m.group(1))], s)


def encode_rendered(
    tokenizer: Any, text: str, restore: Callable[[str], str] = lambda s: s
) -> list[int]:
    """Token ids of a rendered template `text`: the special tokens the tokenizer finds in it
    are control tokens, the text between them is tokenized as the tokenizer does; a piece that
    `restore` changes (it held markers) is tokenized again, restored, with special-token
    strings as text. With no markers this equals apply_chat_template's own ids."""
    hf = hf_tokenizer(tokenizer)
    enc = hf(text, add_special_tokens=False, return_offsets_mapping=True)
    specials = set(special_tokens(tokenizer).values())
    out: list[int] = []
    run: list[int] = []  # the current piece's ids, as the tokenizer made them
    start = 0  # where the current piece starts in `text`

    def flush(end: int) -> None:
        piece = text[start:end]
        again = restore(piece)
        if again == piece:
            out.extend(run)
        elif again:  # held markers: the piece again, its special-token strings as text
            out.extend(hf.encode(again, add_special_tokens=False, split_special_tokens=True))
        run.clear()

    for tid, (a, b) in zip(enc["input_ids"], enc["offset_mapping"], strict=True):
        if tid in specials:
            flush(a)
            out.append(int(tid))
            start = b
        else:
            run.append(int(tid))
    flush(len(text))
    return out


# ------------------------------------------------------------------ the thinking switch


def thinking_default(tokenizer: Any) -> bool | None:
    """None where the chat template has no thinking mode (it renders a question alike with
    enable_thinking true and false, or there is no template); else the mode it renders when
    not told (True: thinking), as `encode_chat` without the keyword gets it."""
    if not getattr(tokenizer, "has_chat_template", False):
        return None
    try:
        on, off, plain = (
            tokenizer.apply_chat_template(_PROBE, add_generation_prompt=True, tokenize=False, **kw)
            for kw in ({"enable_thinking": True}, {"enable_thinking": False}, {})
        )
    except Exception:  # noqa: BLE001 - a template that refuses the probe: no switch offered
        return None
    if on == off:
        return None
    return bool(plain == on)
