"""Saved chats: round trips, atomic writes, listing order, the data-dir override."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from edgespec.tui.store import (
    ChatMessage,
    ChatStore,
    Conversation,
    Saver,
    atomic_write_text,
    data_dir,
)


def _conv() -> Conversation:
    return Conversation(
        model="t + d",
        messages=[
            ChatMessage("user", "hi  there\nfriend"),
            ChatMessage(
                "assistant",
                "Hello, world",
                runs=[("accepted", "Hello"), ("corrected", ","), ("bonus", " world")],
                reason="stop",
                stats={"tokens": 3, "accepted_hist": [0, 1]},
            ),
        ],
    )


def test_round_trip_keeps_runs_and_stats(tmp_path: Path) -> None:
    store = ChatStore(tmp_path)
    conv = _conv()
    store.save(conv)
    back = store.load(conv.id)
    assert back.messages == conv.messages
    assert back.model == "t + d" and back.id == conv.id
    assert json.loads(store.path(conv.id).read_text())["title"] == "hi there friend"


def test_history_excludes_an_answer_still_streaming() -> None:
    conv = _conv()
    conv.messages.append(ChatMessage("user", "more"))
    conv.messages.append(ChatMessage("assistant", "par", reason="partial"))
    assert [m["content"] for m in conv.history()] == ["hi  there\nfriend", "Hello, world", "more"]


def test_list_is_newest_first_and_skips_corrupt_files(tmp_path: Path) -> None:
    store = ChatStore(tmp_path)
    a, b = _conv(), _conv()
    b.messages[0].content = "second chat"
    store.save(a)
    store.save(b)
    os.utime(store.path(a.id))  # irrelevant: order comes from the saved 'updated' stamp
    (tmp_path / "broken.json").write_text("{not json")
    listed = store.list()
    assert [s.id for s in listed] == [b.id, a.id]
    assert listed[0].title == "second chat" and listed[0].messages == 2


def test_list_of_missing_folder_is_empty(tmp_path: Path) -> None:
    assert ChatStore(tmp_path / "nope").list() == []


def test_atomic_write_leaves_old_file_when_writing_fails(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    atomic_write_text(path, "old")

    with pytest.raises(TypeError):
        atomic_write_text(path, 123)  # type: ignore[arg-type]  # fails mid-write
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["c.json"]  # no temp file left behind


def test_data_dir_env_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EDGESPEC_DATA_DIR", str(tmp_path / "x"))
    assert data_dir() == tmp_path / "x"
    assert ChatStore().root == tmp_path / "x"
    monkeypatch.delenv("EDGESPEC_DATA_DIR")
    assert data_dir() == Path.home() / ".local/share/edgespec/chats"


def test_a_save_serializes_again_only_the_messages_that_changed(monkeypatch) -> None:
    """A long chat's save every second costs the answer in progress, not the whole chat: each
    message keeps its JSON text until it changes; the file reads back the same."""
    conv = _conv()
    conv.messages.append(ChatMessage("user", "more"))
    reply = ChatMessage("assistant", "par", runs=[("accepted", "par")], reason="partial")
    conv.messages.append(reply)
    made: list[str] = []
    to_json = ChatMessage.to_json
    monkeypatch.setattr(ChatMessage, "to_json", lambda m: made.append(m.content) or to_json(m))
    assert json.loads(conv.dumps()) == conv.to_json()
    made.clear()
    reply.content, reply.runs = "partly", [("accepted", "par"), ("bonus", "tly")]
    text = conv.dumps()
    assert made == ["partly"]
    reply.runs = [("accepted", "par"), ("corrected", "tly")]  # a kind changes, the text does not
    made.clear()
    assert conv.dumps() != text and made == ["partly"]
    back = Conversation.from_json(json.loads(conv.dumps()))
    assert back.messages == conv.messages and back.id == conv.id and back.title == conv.title


def test_the_saver_writes_on_its_own_thread_latest_text_last(tmp_path: Path, monkeypatch) -> None:
    """put() returns while a write is stuck (a slow fsync); texts handed over meanwhile for the
    same file collapse to the latest; flush() waits for them; close() writes what is pending."""
    import threading

    from edgespec.tui import store

    gate, wrote = threading.Event(), []
    write = store.atomic_write_text

    def slow_write(path: Path, text: str) -> None:
        gate.wait(10)
        wrote.append(text)
        write(path, text)

    monkeypatch.setattr(store, "atomic_write_text", slow_write)
    saver = Saver(on_error=lambda e: pytest.fail(e))
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    saver.put(a, "a1")
    assert not saver.flush(timeout=0.2)  # the first write waits at the gate: put did not
    saver.put(a, "a2")
    saver.put(b, "b1")
    saver.put(a, "a3")
    gate.set()
    assert saver.flush(timeout=10)
    assert wrote == ["a1", "b1", "a3"] and a.read_text() == "a3" and b.read_text() == "b1"
    saver.put(b, "b2")
    saver.close()
    assert b.read_text() == "b2"


def test_the_saver_reports_a_failing_folder_once_until_it_writes_again(tmp_path: Path) -> None:
    errors: list[str] = []
    saver = Saver(errors.append)
    blocked = tmp_path / "file"
    blocked.write_text("")
    bad, good = blocked / "chat.json", tmp_path / "chat.json"
    for text in ("1", "2"):
        saver.put(bad, text)
        assert saver.flush()
    assert len(errors) == 1 and errors[0].startswith(f"cannot save the chat to {bad}: ")
    assert "\n" not in errors[0]
    saver.put(good, "3")
    saver.put(bad, "4")
    saver.close()
    assert good.read_text() == "3" and len(errors) == 2
