"""`edgespec generate --json` records: one line each, whatever a token's text holds."""

import json

import pytest

from edgespec.events import Token, json_line, to_json


@pytest.mark.parametrize("text", ["\x85", "a\u2028b", "\u2029", 'é\n\r\t"', "日本"])
def test_a_record_is_one_line_for_every_reader_and_round_trips(text):
    token = Token(id=7, text=text, kind="accepted", round=3)
    line = json_line(token)
    assert line.splitlines() == [line]  # str.splitlines breaks at U+0085, U+2028, U+2029 too
    assert json.loads(line) == to_json(token)


def test_readable_text_stays_raw():
    assert "日本" in json_line(Token(id=1, text="日本", kind="bonus", round=0))
