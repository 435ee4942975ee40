"""Reasoning models: where the `<think>...</think>` part of an answer is, and how many tokens it took.

Two shapes are recognised. The answer opens with ``<think>`` (leading whitespace allowed) and the
reasoning lasts until ``</think>`` (or to the end while it streams); or the chat template opened
the tag itself, so the answer holds only ``</think>`` with no ``<think>`` before it, and everything
before it was reasoning. No Textual imports.
"""

from __future__ import annotations

from dataclasses import dataclass

OPEN, CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class ThinkSplit:
    """Offsets into an answer: the reasoning is ``text[start:end]`` and the answer proper starts at
    `body`. `closed` is False while the reasoning still streams (then `end` == `body` == len)."""

    start: int
    end: int
    body: int
    closed: bool


def split_think(text: str) -> ThinkSplit | None:
    """Where the reasoning is, or None for an answer without any.

    >>> split_think("<think>hmm</think>\\nYes.")
    ThinkSplit(start=7, end=10, body=18, closed=True)
    >>> split_think("  <think>still")
    ThinkSplit(start=9, end=14, body=14, closed=False)
    >>> split_think("opened by the template</think>Yes.")
    ThinkSplit(start=0, end=22, body=30, closed=True)
    >>> split_think("Yes.") is None
    True
    """
    lead = len(text) - len(text.lstrip())
    if text.startswith(OPEN, lead):
        start = lead + len(OPEN)
        end = text.find(CLOSE, start)
        if end < 0:
            return ThinkSplit(start, len(text), len(text), closed=False)
        return ThinkSplit(start, end, end + len(CLOSE), closed=True)
    end = text.find(CLOSE)
    if end < 0 or OPEN in text[:end]:
        return None
    return ThinkSplit(0, end, end + len(CLOSE), closed=True)


@dataclass
class ThinkCounter:
    """Counts streamed tokens inside the reasoning apart from the answer's, O(1) per token.

    A token that holds (part of) a tag counts as reasoning. With a template-opened tag the tokens
    before ``</think>`` count as answer until that tag arrives, then move to reasoning.

    >>> c = ThinkCounter()
    >>> for piece in ["<think>", "so", "</think>", "\\n", "Yes"]:
    ...     c.add(piece)
    >>> (c.think, c.answer)
    (3, 2)
    """

    think: int = 0
    answer: int = 0
    pending: int = 0  # tokens before the opening tag is decided (blank, or a prefix of it)
    state: str = "start"  # start -> inside -> after, or start -> answer -> after (template tag)
    head: str = ""  # the answer's first non-blank characters, until the opening tag is decided
    tail: str = ""  # the last characters seen, to find a tag split over tokens

    def add(self, piece: str) -> None:
        """Fold one token's text in."""
        window = self.tail + piece
        self.tail = window[-(len(CLOSE) - 1) :]
        if self.state == "start":
            self.pending += 1
            self.head = (self.head + piece).lstrip()[: len(OPEN)]
            if self.head.startswith(OPEN):
                self.state, self.think, self.pending = "inside", self.think + self.pending, 0
            elif self.head and not OPEN.startswith(self.head):
                self.state, self.answer, self.pending = "answer", self.answer + self.pending, 0
            else:
                return
        elif self.state == "inside":
            self.think += 1
        else:
            self.answer += 1
        if self.state == "inside" and CLOSE in window:
            self.state = "after"
        elif self.state == "answer" and CLOSE in window:  # the template opened the tag
            self.think, self.answer, self.state = self.think + self.answer, 0, "after"
        elif self.state == "answer" and OPEN in window:  # a tag mid-answer: no reasoning part
            self.state = "after"

    @property
    def tokens(self) -> int:
        return self.think + self.answer + self.pending
