"""Markdown rendering that keeps provenance, reasoning splits and counts (pure: no app)."""

from __future__ import annotations

from edgespec.tui.answer_actions import last_code_block
from edgespec.tui.fake import MARKDOWN, FakeScript
from edgespec.tui.markdown import BOX_STEP, BlockCache, Look, blocks
from edgespec.tui.think import ThinkCounter, split_think
from rich.console import Console
from rich.style import Style
from rich.text import Text

KINDS = {
    "accepted": Style(color="green"),
    "corrected": Style(color="red", bold=True, underline=True),
    "bonus": Style(color="magenta", bgcolor="grey30", italic=True),
    "target": Style(),
}
MARKS = {
    "heading": Style(bold=True),
    "strong": Style(bold=True),
    "emphasis": Style(italic=True),
    "link": Style(underline=True),
    "code": Style(bgcolor="grey11"),
    "code_block": Style(bgcolor="grey15"),
    "label": Style(dim=True),
}
LOOK = Look(KINDS, MARKS)
CONSOLE = Console()


def kinds_for(src: str, marked: dict[str, str]) -> list[str]:
    """'target' everywhere except each marked substring (first occurrence) given its kind."""
    kinds = ["target"] * len(src)
    for word, kind in marked.items():
        at = src.index(word)
        kinds[at : at + len(word)] = [kind] * len(word)
    return kinds


def style_of(text: Text, word: str, nth: int = 0) -> list[Style]:
    at = -1
    for _ in range(nth + 1):
        at = text.plain.index(word, at + 1)
    return [text.get_style_at_offset(CONSOLE, i) for i in range(at, at + len(word))]


def render(src: str, marked: dict[str, str], look: Look = LOOK) -> Text:
    return BlockCache(look).render(src, kinds_for(src, marked))


def test_a_draft_token_inside_bold_keeps_the_accepted_colour() -> None:
    text = render("Here is a **fast** version", {"fast": "accepted", "version": "corrected"})
    assert text.plain == "Here is a fast version"
    for style in style_of(text, "fast"):
        assert style.color == KINDS["accepted"].color and style.bold
    for style in style_of(text, "version"):
        assert style.color == KINDS["corrected"].color and style.underline and not style.italic


def test_every_markdown_element_keeps_each_tokens_colour() -> None:
    src = (
        "# Title here\n\nsome *slanted* and `code_x` and [linked](https://x.org/a) words\n\n"
        "1. first\n2. second\n- bullet\n\n```python\nprint(42)\n```\n"
    )
    marked = {
        "Title": "bonus",
        "slanted": "corrected",
        "code_x": "accepted",
        "linked": "bonus",
        "words": "accepted",
        "second": "corrected",
        "bullet": "accepted",
        "print(42)": "corrected",
    }
    text = render(src, marked)
    attrs = {
        "Title": "bold",
        "slanted": "italic",
        "code_x": "bgcolor",
        "linked": "underline",
        "bullet": None,
        "words": None,
        "second": None,
        "print(42)": "bgcolor",
    }
    for word, attr in attrs.items():
        for style in style_of(text, word):
            assert style.color == KINDS[marked[word]].color, word
            if attr == "bgcolor":  # the code background, unless the token's own tint covers it
                assert style.bgcolor is not None, word
            elif attr:
                assert getattr(style, attr), (word, attr)
    assert "#" not in text.plain and "*" not in text.plain and "`" not in text.plain
    assert "https://x.org" not in text.plain and "2. second" in text.plain
    assert "• bullet" in text.plain and "python" in text.plain


def test_text_after_a_link_or_image_is_not_matched_inside_its_target() -> None:
    src = "[a](x.org)x and ![b](y.png)y"
    kinds = ["target"] * len(src)
    kinds[src.index(")x") + 1] = kinds[len(src) - 1] = "accepted"
    text = BlockCache(LOOK).render(src, kinds)
    assert text.plain == "ax and by"
    green = KINDS["accepted"].color
    assert [text.get_style_at_offset(CONSOLE, i).color == green for i in (1, 8)] == [True, True]
    assert text.get_style_at_offset(CONSOLE, 0).color != green


LISTS = (
    "1. one\n2. two\n   - nested **a**\n   - nested b\n\n3. after a blank\n\n   more of it\n"
    "10. ten\n\n```\ncode\n```\n- x\n- y\n  > quoted\n\n> end\n"
)


def test_streaming_gives_the_same_text_as_one_render_and_caches_finished_blocks() -> None:
    kinds_cycle = ("accepted", "corrected", "bonus", "target")
    for text in (MARKDOWN, LISTS):
        pieces = FakeScript(text=text).pieces() or []
        if text == LISTS:  # one character at a time: every cut inside a list item and a marker
            pieces = list(text)
        kinds = [kinds_cycle[i % 4] for i, piece in enumerate(pieces) for _ in piece]
        cache, shown = BlockCache(LOOK), ""
        for piece in pieces:
            shown += piece
            streamed = cache.render(shown, kinds)
            whole = BlockCache(LOOK).render(shown, kinds)
            assert streamed.plain == whole.plain, shown
            assert streamed.spans == whole.spans, shown
        assert cache.blocks == len(blocks(text)) - 1  # all but the last unit were cached
    assert len(blocks(LISTS)) == 4 + 1 + 2 + 1  # list items are units: 4 items, code, 2, quote


def test_provenance_off_shows_markdown_only_and_highlights_code() -> None:
    src = "Some **bold** text\n\n```python\ndef f(x):\n    return x\n```\n"
    marked = {"bold": "accepted", "def": "corrected", "return": "bonus"}
    off = render(src, marked, Look(KINDS, MARKS, provenance=False))
    on = render(src, marked)
    assert off.plain == on.plain
    colours = {style.color for style in KINDS.values() if style.color}
    assert all(s.bold and s.color not in colours for s in style_of(off, "bold"))
    keyword, plain_word = style_of(off, "def")[0], style_of(off, "f(x)")[0]
    assert keyword.color is not None and keyword.color not in colours
    assert keyword.color != plain_word.color  # syntax colours, not one colour for the code
    assert style_of(on, "def")[0].color == KINDS["corrected"].color


def test_fences_and_tags_never_reach_the_screen_while_streaming() -> None:
    pieces = FakeScript(text=MARKDOWN).pieces() or []
    shown = ""
    for piece in pieces:
        shown += piece
        split = split_think(shown)
        body = shown if split is None else shown[split.body :]
        text = BlockCache(LOOK).render(body, ["target"] * len(body))
        assert "```" not in text.plain and "**" not in text.plain and "</think>" not in text.plain


def test_split_think_shapes() -> None:
    assert split_think("Plain answer.") is None
    assert split_think("x <think> y") is None  # a tag mid-answer is text
    s = split_think("\n<think>\nwhy\n</think>\n\nAnswer")
    assert s is not None and s.closed and (s.start, s.end, s.body) == (8, 13, 21)
    s = split_think("<think>still thinking")
    assert s is not None and not s.closed and s.end == s.body == 21
    s = split_think("opened by the template\n</think>\nAnswer")
    assert s is not None and (s.start, s.end) == (0, 23)
    assert split_think("a <think> b </think> c") is None


def test_think_counter_counts_reasoning_apart_tags_split_over_tokens() -> None:
    counter = ThinkCounter()
    for piece in ["\n", "<th", "ink>", "Let", " me", " see", "</", "think>", "\n\n", "Yes", "."]:
        counter.add(piece)
    assert (counter.think, counter.answer) == (8, 3)
    template = ThinkCounter()  # the chat template opened the tag: only the closing one arrives
    for piece in ["Let", " me", " see", "</think>", "Yes"]:
        template.add(piece)
    assert (template.think, template.answer) == (4, 1)
    plain = ThinkCounter()
    for piece in ["Yes", " <think>", " is", " a", " tag", "</think>"]:
        plain.add(piece)
    assert (plain.think, plain.answer) == (0, 6)


def test_last_code_block_skips_reasoning_and_answers_without_code() -> None:
    assert last_code_block(["no code"]) is None
    answers = ["```sh\nls\n```", "<think>```\nnot this\n```</think>\nplain", "text"]
    assert last_code_block(answers) == "ls\n"
    assert last_code_block([MARKDOWN]) == (
        "from functools import cache\n\n@cache\ndef fib(n: int) -> int:\n"
        "    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
    )


def test_a_code_box_widens_in_steps_so_a_growing_line_leaves_the_others_as_drawn() -> None:
    """The box is as wide as its longest line rounded up to BOX_STEP cells: while a streaming
    line grows within a step, every other line of the box stays as it was drawn."""
    head = "```python\ndef f(x):\n    return "
    drawn = [render(head + "x" * n + "\n```\n", {}) for n in range(1, BOX_STEP)]
    widths = [{len(line) for line in t.plain.split("\n")} for t in drawn]
    assert all(len(w) == 1 and min(w) % BOX_STEP == 0 for w in widths)  # rectangles, in steps
    same = [t for t, w in zip(drawn, widths, strict=True) if w == widths[0]]
    assert len(same) > 1
    for t in same:  # the label and first line: the same text and styles as in the first box
        for a, b in zip(t.split("\n")[:2], drawn[0].split("\n")[:2], strict=True):
            assert (a.plain, a.spans) == (b.plain, b.spans)
    assert len({min(w) for w in widths}) > 1  # a line past the step widens the box
