"""Saved chats: round trips, atomic writes, listing order, the data-dir override."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from edgespec.tui.store import ChatMessage, ChatStore, Conversation, atomic_write_text, data_dir


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
