"""Saved chats: one JSON file per conversation, written atomically. No Textual imports.

Folder: ``$EDGESPEC_DATA_DIR`` if set, else ``~/.local/share/edgespec/chats``. Every save writes a
temp file beside the destination, fsyncs it and `os.replace`s it into place, so a crash or kill -9
leaves either the previous complete file or the new complete file, never a torn one.

The chat saves an answer in progress every second: `Conversation.dumps` serializes again only the
messages that changed since the last save (each keeps its JSON text), and a `Saver` thread does the
writing, so neither a long chat nor a slow disk costs the UI thread.

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
import threading
import time
from collections.abc import Callable
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
    stats: dict[str, Any] | None = None  # replaced, never edited in place (json_text's key)
    _json: tuple[tuple[Any, ...], str] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.runs:
            d["runs"] = [list(r) for r in self.runs]
        if self.reason is not None:
            d["reason"] = self.reason
        if self.stats is not None:
            d["stats"] = self.stats
        return d

    def json_text(self) -> str:
        """`to_json` as JSON text, kept while the message is unchanged: a save of a long chat
        serializes again only the answer in progress."""
        key = (self.role, self.content, self.reason, tuple(self.runs), self.stats)
        if self._json is None or self._json[0] != key:
            self._json = key, json.dumps(self.to_json(), ensure_ascii=False)
        return self._json[1]

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

    def _head(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "id": self.id,
            "title": self.title,
            "model": self.model,
            "created": self.created,
            "updated": self.updated,
        }

    def to_json(self) -> dict[str, Any]:
        return {**self._head(), "messages": [m.to_json() for m in self.messages]}

    def dumps(self) -> str:
        """The file's text: `to_json` as JSON, one message a line, each from `json_text`."""
        head = json.dumps(self._head(), ensure_ascii=False)[:-1]
        body = ",\n ".join(m.json_text() for m in self.messages)
        return f'{head}, "messages": [\n {body}\n]}}\n'

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

    def prepare(self, conv: Conversation) -> tuple[Path, str]:
        """Stamp `updated`; the conversation's file and the text to write there (a `Saver`'s)."""
        conv.updated = time.time()
        return self.path(conv.id), conv.dumps()

    def save(self, conv: Conversation) -> Path:
        """Stamp `updated` and write the conversation atomically; returns its path."""
        path, text = self.prepare(conv)
        atomic_write_text(path, text)
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


class Saver:
    """Writes files on a thread of its own, so that the UI thread hands over a save's text and
    goes on (an fsync can take 100 ms). The latest text handed over for a path wins; `flush`
    waits until everything handed over is written. A write that fails calls `on_error` with one
    line, on the writer thread, once until a write succeeds again. A failed text is dropped:
    every save carries the whole conversation."""

    def __init__(self, on_error: Callable[[str], None]) -> None:
        self._on_error = on_error
        self._pending: dict[Path, str] = {}
        self._cond = threading.Condition()
        self._busy = self._closed = self._failing = False
        self._thread: threading.Thread | None = None  # started by the first put

    def put(self, path: Path, text: str) -> None:
        with self._cond:
            self._pending.pop(path, None)  # re-queued last: saves land in the order made
            self._pending[path] = text
            self._cond.notify_all()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="edgespec-saver")
                self._thread.daemon = True
                self._thread.start()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every text handed over is written (or failed); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not (self._pending or self._busy), timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Write what is pending, then stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closed)
                if not self._pending:
                    return
                path = next(iter(self._pending))
                text, self._busy = self._pending.pop(path), True
            error = None
            try:
                atomic_write_text(path, text)
            except Exception as exc:  # a writer that died would leave the chat unsaved, silently
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                error = f"cannot save the chat to {path}: {reason}"
            if error is not None and not self._failing:
                self._on_error(error)  # before flush() returns: a flush sees it reported
            self._failing = error is not None
            with self._cond:
                self._busy = False
                self._cond.notify_all()


def stats_to_json(stats: object) -> dict[str, Any]:
    """A Stats dataclass as a JSON-ready dict (tuples become lists)."""
    d = asdict(stats)  # type: ignore[call-overload]
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}
