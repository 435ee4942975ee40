"""Saved chats: one JSON file per conversation, written atomically. No Textual imports.

Folder: ``$EDGESPEC_DATA_DIR`` if set, else ``~/.local/share/edgespec/chats``. Every save writes a
temp file beside the destination, fsyncs it and `os.replace`s it into place, so a crash or kill -9
leaves either the previous complete file or the new complete file, never a torn one.

File schema (version 1)::

    {"version": 1, "id": "20250101-120000-1a2b3c", "title": "first prompt...", "model": "...",
     "created": 1735732800.0, "updated": 1735732811.5,
     "messages": [{"role": "user", "content": "hi"},
                  {"role": "assistant", "content": "Hello", "runs": [["accepted", "Hel"], ...],
                   "reason": "stop", "stats": {...}}]}

An assistant message saved while its answer is still streaming has ``"reason": "partial"``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

DATA_ENV = "EDGESPEC_DATA_DIR"
VERSION = 1


def data_dir() -> Path:
    """Where chats are saved: ``$EDGESPEC_DATA_DIR`` or ``~/.local/share/edgespec/chats``."""
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".local" / "share" / "edgespec" / "chats"


@dataclass
class ChatMessage:
    """One message. For an assistant message `runs` keeps the token provenance as
    run-length ``(kind, text)`` pairs whose texts concatenate to `content`."""

    role: str
    content: str
    runs: list[tuple[str, str]] = field(default_factory=list)
    reason: str | None = None  # stop / length / cancelled / partial (still streaming when saved)
    stats: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.runs:
            d["runs"] = [list(r) for r in self.runs]
        if self.reason is not None:
            d["reason"] = self.reason
        if self.stats is not None:
            d["stats"] = self.stats
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ChatMessage:
        return cls(
            role=str(d["role"]),
            content=str(d["content"]),
            runs=[(str(k), str(t)) for k, t in d.get("runs", [])],
            reason=d.get("reason"),
            stats=d.get("stats"),
        )


def new_id(now: float | None = None) -> str:
    """A sortable, unique conversation id, e.g. ``20250101-120000-1a2b3c``."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{stamp}-{secrets.token_hex(3)}"


@dataclass
class Conversation:
    """A whole chat. `history()` is what the engine is sent (role + content only)."""

    id: str = field(default_factory=new_id)
    model: str = ""
    messages: list[ChatMessage] = field(default_factory=list)
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)

    @property
    def title(self) -> str:
        """The first user message, shortened to one line of at most 60 characters."""
        for m in self.messages:
            if m.role == "user":
                line = " ".join(m.content.split())
                return line if len(line) <= 60 else line[:59] + "…"
        return "(empty chat)"

    def history(self) -> list[dict[str, str]]:
        """Messages for `Engine.chat`: partial answers excluded (they are still being written)."""
        return [
            {"role": m.role, "content": m.content} for m in self.messages if m.reason != "partial"
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "id": self.id,
            "title": self.title,
            "model": self.model,
            "created": self.created,
            "updated": self.updated,
            "messages": [m.to_json() for m in self.messages],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Conversation:
        return cls(
            id=str(d["id"]),
            model=str(d.get("model", "")),
            messages=[ChatMessage.from_json(m) for m in d.get("messages", [])],
            created=float(d.get("created", 0.0)),
            updated=float(d.get("updated", 0.0)),
        )


@dataclass(frozen=True)
class ChatSummary:
    """One line of the past-chats list."""

    id: str
    title: str
    updated: float
    messages: int


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` via a temp file in the same folder + fsync + os.replace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class ChatStore:
    """Reads and writes conversations under `root` (default: `data_dir()`)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else data_dir()

    def path(self, chat_id: str) -> Path:
        return self.root / f"{chat_id}.json"

    def save(self, conv: Conversation) -> Path:
        """Stamp `updated` and write the conversation atomically; returns its path."""
        conv.updated = time.time()
        path = self.path(conv.id)
        atomic_write_text(path, json.dumps(conv.to_json(), ensure_ascii=False, indent=1))
        return path

    def load(self, chat_id: str) -> Conversation:
        """Read one conversation (raises OSError / ValueError on a missing or corrupt file)."""
        return Conversation.from_json(json.loads(self.path(chat_id).read_text(encoding="utf-8")))

    def list(self) -> list[ChatSummary]:
        """Saved chats, most recently updated first; unreadable files are skipped."""
        out: list[ChatSummary] = []
        if not self.root.is_dir():
            return out
        for p in self.root.glob("*.json"):
            try:
                d = json.loads(p.read_text(encoding="utf-8"))
                out.append(
                    ChatSummary(
                        id=str(d["id"]),
                        title=str(d.get("title", "")),
                        updated=float(d.get("updated", 0.0)),
                        messages=len(d.get("messages", [])),
                    )
                )
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return sorted(out, key=lambda s: s.updated, reverse=True)


def stats_to_json(stats: object) -> dict[str, Any]:
    """A Stats dataclass as a JSON-ready dict (tuples become lists)."""
    d = asdict(stats)  # type: ignore[call-overload]
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}
