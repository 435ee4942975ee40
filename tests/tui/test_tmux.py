"""A real terminal: `edgespec chat` on tiny models under tmux, driven with send-keys.

Reads the screen back with `capture-pane -e -p` (escape codes kept) and checks that the answer is
on screen drawn in at least two different token styles (SGR attribute sets). Skipped only when
tmux is not installed (CI installs it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

REPO = Path(__file__).resolve().parents[2]
WIDTH, HEIGHT = 120, 36
CONVERSATION_COLS = 80  # the stats panel starts to the right of this column
SGR = re.compile(r"\x1b\[([0-9;:]*)m")


def _apply(state: dict[str, object], params: str) -> None:
    """Fold one SGR parameter list into `state` (bold, italic, underline, reverse, fg, bg)."""
    codes = [int(c) if c else 0 for c in re.split("[;:]", params)] if params else [0]
    i = 0
    flags = {1: "bold", 3: "italic", 4: "underline", 7: "reverse", 9: "strike", 2: "dim"}
    unflags = {22: ("bold", "dim"), 23: ("italic",), 24: ("underline",), 27: ("reverse",)}
    while i < len(codes):
        c = codes[i]
        if c == 0:
            state.clear()
        elif c in flags:
            state[flags[c]] = True
        elif c in unflags:
            for name in unflags[c]:
                state.pop(name, None)
        elif c in (38, 48):
            key = "fg" if c == 38 else "bg"
            if i + 1 < len(codes) and codes[i + 1] == 2:
                state[key], i = tuple(codes[i + 2 : i + 5]), i + 4
            elif i + 1 < len(codes) and codes[i + 1] == 5:
                state[key], i = codes[i + 2], i + 2
        elif c in (39, 49):
            state.pop("fg" if c == 39 else "bg", None)
        elif 30 <= c <= 37 or 90 <= c <= 97:
            state["fg"] = c
        elif 40 <= c <= 47 or 100 <= c <= 107:
            state["bg"] = c
        i += 1


def styled_chars(line: str) -> list[tuple[str, tuple]]:
    """Each printed character of an escaped line with its SGR style (a hashable tuple)."""
    state: dict[str, object] = {}
    out: list[tuple[str, tuple]] = []
    pos = 0
    for m in SGR.finditer(line):
        style = tuple(sorted(state.items()))
        out.extend((ch, style) for ch in line[pos : m.start()])
        _apply(state, m.group(1))
        pos = m.end()
    style = tuple(sorted(state.items()))
    out.extend((ch, style) for ch in line[pos:])
    return out


def _styles(line: str) -> list[tuple[str, dict]]:
    """The conversation's printed characters of an escaped line, each with its SGR state."""
    chars = styled_chars(line)[:CONVERSATION_COLS]
    return [(ch, dict(style)) for ch, style in chars if not ch.isspace()]


class Tmux:
    """A private tmux server per test (no shared sizes or options, and no race with the previous
    test's server while it shuts down); its errors carry tmux's own message."""

    def __init__(self, name: str) -> None:
        self.socket = f"edgespec-{name}-{os.getpid()}"

    def __call__(self, *args: str) -> str:
        cmd = ["tmux", "-L", self.socket, *args]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise AssertionError(
                f"tmux {args[0]} failed ({done.returncode}): {done.stderr.strip()}"
            )
        return done.stdout

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


@pytest.fixture
def tmux(request: pytest.FixtureRequest):  # noqa: ANN201
    tmux = Tmux(re.sub(r"\W+", "-", request.node.name)[:40])
    yield tmux
    tmux.kill()


def _wait(predicate, timeout: float, what: str):  # noqa: ANN001, ANN202
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _steady(capture, needle: str):  # noqa: ANN001, ANN202
    """A `_wait` predicate: the capture once it holds `needle` and two captures 0.25 s apart agree
    (a capture taken mid-repaint shows a half-drawn pane)."""
    last = [None]

    def check() -> str | None:
        now = capture()
        steady = needle in now and now == last[0]
        last[0] = now
        return now if steady else None

    return check


def test_chat_in_a_real_terminal(tmp_path: Path, tmux: Tmux) -> None:
    from tests.helpers.tiny import make_tiny_pair

    target, draft = make_tiny_pair(tmp_path / "pair", seed=0, draft="self")
    chats = tmp_path / "chats"
    session = "chat"
    cmd = (
        f"cd {REPO} && env -u COLUMNS -u LINES PYTHONPATH={REPO} EDGESPEC_DATA_DIR={chats} "
        f"EDGESPEC_HOME={tmp_path / 'home'} COLORTERM=truecolor "
        f"{sys.executable} -m edgespec chat --target {target} --draft {draft} "
        f"--max-tokens 40 -k 3 --no-adaptive --seed 0; sleep 60"
    )  # K fixed: the self-draft costs a target step, so adaptive K (rightly) starts it off
    tmux("new-session", "-d", "-s", session, "-x", str(WIDTH), "-y", str(HEIGHT), cmd)
    try:
        screen = lambda: tmux("capture-pane", "-t", session, "-p")  # noqa: E731
        _wait(lambda: "Ask something" in screen(), 240, "the app to load the models")
        tmux("send-keys", "-t", session, "hello model", "Enter")

        def finished_answer() -> dict | None:
            for path in chats.glob("*.json"):
                msgs = json.loads(path.read_text())["messages"]
                if len(msgs) == 2 and msgs[1].get("reason") in ("stop", "length"):
                    return msgs[1]
            return None

        answer = _wait(finished_answer, 120, "the answer to be saved")
        prefix = answer["content"].strip()[:6]
        _wait(lambda: "[max tokens]" in screen() or answer["reason"] == "stop", 10, "the redraw")
        time.sleep(0.5)
        escaped = tmux("capture-pane", "-t", session, "-e", "-p").splitlines()
        rows = [styled_chars(line) for line in escaped]
        plain = ["".join(ch for ch, _ in row) for row in rows]
        start = next(i for i, line in enumerate(plain) if "hello model" in line) + 1
        while not plain[start][:CONVERSATION_COLS].strip():
            start += 1
        end = start
        while end < len(plain) and plain[end][:CONVERSATION_COLS].strip():
            end += 1
        answer_rows = []
        for row, line in zip(rows[start:end], plain[start:end], strict=True):
            cut = line.find("[max tokens]")  # the dim note after the answer is not a token
            answer_rows.append(row[: cut if cut >= 0 else CONVERSATION_COLS])
        shown = "\n".join("".join(ch for ch, _ in row).rstrip() for row in answer_rows)
        # A token style is fg + attributes; the background varies with the cell's container.
        styles = {
            tuple(kv for kv in style if kv[0] != "bg")
            for row in answer_rows
            for ch, style in row
            if not ch.isspace()
        }
        print(f"\nanswer on screen:\n{shown}\nkinds saved: {[k for k, _ in answer['runs']]}")
        print(f"distinct SGR styles in the answer rows: {len(styles)}")
        for style in sorted(styles, key=str):
            print("  ", dict(style))
        assert prefix and prefix in shown
        assert len({k for k, _ in answer["runs"]}) >= 2
        assert len(styles) >= 2, "the answer shows fewer than two token styles"
    finally:
        tmux.kill()


def provenance_colours() -> dict[str, tuple[int, int, int]]:
    """The default theme's colours of accepted, corrected and bonus tokens, as RGB."""
    from textual.theme import BUILTIN_THEMES

    colours = BUILTIN_THEMES["textual-dark"].to_color_system().generate()
    names = {"accepted": "text-success", "corrected": "text-error", "bonus": "text-accent"}
    hexes = {kind: colours[name].lstrip("#") for kind, name in names.items()}
    return {kind: tuple(int(h[i : i + 2], 16) for i in (0, 2, 4)) for kind, h in hexes.items()}


def test_markdown_answer_shows_no_fences_in_a_real_terminal(tmp_path: Path, tmux: Tmux) -> None:
    """`edgespec chat --fake markdown`: a reasoning model's Markdown answer, drawn on a real
    terminal: no fence, emphasis marker or think tag on screen, the code and its label are, and
    the three provenance colours (the fake drafts: accepted, corrected and bonus tokens)."""
    cmd = (
        f"cd {REPO} && env -u COLUMNS -u LINES PYTHONPATH={REPO} "
        f"EDGESPEC_DATA_DIR={tmp_path / 'chats'} EDGESPEC_HOME={tmp_path / 'home'} "
        "COLORTERM=truecolor "
        f"{sys.executable} -m edgespec chat --fake markdown; sleep 60"
    )
    tmux("new-session", "-d", "-s", "md", "-x", str(WIDTH), "-y", str(HEIGHT), cmd)
    try:
        screen = lambda: tmux("capture-pane", "-t", "md", "-p")  # noqa: E731
        _wait(lambda: "Ask something" in screen(), 60, "the app to start")
        tmux("send-keys", "-t", "md", "Fibonacci?", "Enter")
        done = "• see the docs"
        shown_screen = _wait(_steady(screen, done), 60, "the answer to finish drawing")
        rows = [line[:CONVERSATION_COLS] for line in shown_screen.splitlines()]
        shown = "\n".join(rows)
        print(f"\nconversation on screen:\n{shown}")
        for raw in ("```", "**", "<think>", "</think>", "## ", "](https"):
            assert raw not in shown, raw
        assert "▶ Thought" in shown and "python" in shown
        assert "def fib(n: int) -> int:" in shown and "1. each value is computed once" in shown
        colours = provenance_colours()

        def missing() -> list[str]:
            escaped = tmux("capture-pane", "-t", "md", "-e", "-p").splitlines()
            fgs = {style.get("fg") for line in escaped for _, style in _styles(line)}
            return [f"{kind} {rgb}" for kind, rgb in colours.items() if rgb not in fgs]

        try:  # a capture taken mid-repaint may miss a colour; a steady screen has all three
            _wait(lambda: not missing(), 10, "the three provenance colours")
        except AssertionError:
            raise AssertionError(f"no token on screen coloured {missing()}") from None
    finally:
        tmux.kill()
