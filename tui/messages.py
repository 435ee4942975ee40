"""Typed messages the engine thread posts to the app. Each carries plain values only.

`turn` identifies one request; the app ignores messages of a turn it no longer waits for
(e.g. after "new chat"), so a late batch can never land in the wrong conversation.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from edgespec.events import Finished, Prefill, Round, Token


@dataclass
class LoadProgress(Message):
    """A loading step: `text` to show and a fraction in [0, 1] (None = indeterminate)."""

    text: str
    fraction: float | None


@dataclass
class EngineReady(Message):
    """The engine loaded. `name` is the pair's display name; `thinking` the chat template's
    thinking mode a turn gets when not told (None: the template has no thinking mode);
    `base_model`: the target has no chat template (a pretrained base model, which continues the
    text it is given)."""

    name: str
    has_draft: bool
    context_window: int
    thinking: bool | None = None
    base_model: bool = False


@dataclass
class EngineWarm(Message):
    """The engine compiled the shapes of a turn and calibrated adaptive K (`Engine.warm_up`)."""

    seconds: float


@dataclass
class EngineFailed(Message):
    """Loading failed; `error` is a one-line message for the user."""

    error: str


@dataclass
class StreamBatch(Message):
    """Tokens and rounds committed since the previous batch of the same turn (in order)."""

    turn: int
    tokens: list[Token]
    rounds: list[Round]


@dataclass
class PrefillProgress(Message):
    """The turn's prompt is being read: `progress.done` of `progress.total` tokens so far."""

    turn: int
    progress: Prefill


@dataclass
class TurnFinished(Message):
    """The turn ended (stop, length or cancelled); all its batches were posted before this.
    `peak_memory`: the most memory MLX held during the turn (bytes; None: not measured)."""

    turn: int
    finished: Finished
    peak_memory: int | None = None


@dataclass
class TurnFailed(Message):
    """The turn raised; `error` is a one-line message for the user."""

    turn: int
    error: str


@dataclass
class SaveFailed(Message):
    """The chat could not be written (posted from the saver's thread); `error` is one line."""

    error: str
